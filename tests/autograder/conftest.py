"""Shared set-up for the autograder tests: they need root and bubblewrap (make sysdeps)."""
from __future__ import annotations

import sys
from pathlib import Path

# The grader is the top-level package `autograder/` (not installed): make the repository importable.
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
