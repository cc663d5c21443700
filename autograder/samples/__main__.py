"""``python -m autograder.samples OUT``: build the sample submissions for the current assignment."""
import sys
from pathlib import Path

import nbformat

from autograder import grade
from autograder.samples import build

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m autograder.samples OUT_DIR")
    name = grade.DEFAULT_ASSIGNMENT
    release = grade.prepare_course(grade.DEFAULT_OUT.resolve(), grade.DEFAULT_SOURCE, name)
    source = nbformat.read(grade.DEFAULT_SOURCE / name / f"{name}.ipynb", as_version=4)
    entries = build(Path(sys.argv[1]), source, nbformat.read(release, as_version=4), name)
    print(f"built {len(entries)} sample submissions in {sys.argv[1]}")
