"""Student-side check: run the visible tests of your notebook the way the grader runs them.

    .venv/bin/python autograder/check.py my_notebook.ipynb [--skip-training]
    .venv/bin/python -m autograder.check my_notebook.ipynb

Your notebook is read the way the grader reads it (your answer cells and the cells you added, put into the
released notebook), your cells run top to bottom in a fresh local kernel, and then each visible test runs
against your functions and is reported with its points and the grader's message.  Hidden tests are not in your
copy: they run only when the grader grades your submission.  (See :mod:`agent_lab.grading.check`.)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nbformat

from agent_lab.grading.check import check_notebook

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "assignments" / "release"
TRAINING_TESTS = ("test_train_agent", "test_trained_agent_visible")


def release_for(notebook: Path) -> Path:
    """The release of the assignment a notebook belongs to: the one with its file name, else the first one's."""
    mine = RELEASES / notebook.stem / f"{notebook.stem}.ipynb"
    return mine if mine.exists() else RELEASES / "policy_gradients" / "policy_gradients.ipynb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the visible tests with the grader's messages.")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--skip-training", action="store_true",
                        help="do not run the training test or the trained agent's evaluation")
    parser.add_argument("--release", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"{args.notebook} is not a file")
    args.release = args.release or release_for(args.notebook)
    if not args.release.exists():
        parser.error(f"{args.release} is missing: run `make assignments` first")
    start = time.monotonic()
    try:
        lines, notes = check_notebook(args.notebook, nbformat.read(args.release, as_version=4),
                                      skip=TRAINING_TESTS if args.skip_training else ())
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    for note in notes:
        print("note:", note)
    width = max(len(line.grade_id) for line in lines)
    failed = 0
    for line in lines:
        shown = "  --" if line.score != line.score else f"{line.score:4g}"
        print(f"{line.grade_id:<{width}}  {shown} / {line.points:g}  {line.message}")
        failed += line.score == line.score and line.score < line.points
    ran = [line for line in lines if line.score == line.score]
    print(f"\nvisible tests: {sum(x.score for x in ran):g} / {sum(x.points for x in ran):g} points "
          f"({time.monotonic() - start:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
