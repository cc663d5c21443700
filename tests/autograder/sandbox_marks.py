"""Marks of the tests that grade whole batches in the sandbox (root and bubblewrap needed)."""
import os
import shutil

import pytest

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="the grading sandbox needs root and bubblewrap (run `make sysdeps` as root)")

#: A batch test: sandboxed, slow, and on one xdist worker with the other autograder batches.
BATCH = [needs_sandbox, pytest.mark.slow, pytest.mark.xdist_group("autograder")]
