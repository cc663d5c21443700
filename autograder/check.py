"""Student-side check: run the visible tests of your notebook with the grader's messages.

    .venv/bin/python autograder/check.py my_notebook.ipynb [--skip-training]
    .venv/bin/python -m autograder.check my_notebook.ipynb

Your notebook is read the way the grader reads it (metadata restored, cells in the assignment's
order, the visible test cells reset to the released version), run top to bottom in a fresh local
kernel, and each test is reported with its points and the same message the grader's feedback
shows.  Hidden tests are not in your copy: they run only when the grader grades your submission.
This check runs your code on your own machine, without the grader's sandbox.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nbformat
from nbclient import NotebookClient

from autograder import submissions
from autograder.grade import DEFAULT_ASSIGNMENT, REPO, _cell_message

RELEASE = REPO / "assignments" / "release" / DEFAULT_ASSIGNMENT / f"{DEFAULT_ASSIGNMENT}.ipynb"


def restore_tests(nb: nbformat.NotebookNode, release_nb: nbformat.NotebookNode) -> None:
    """Give every released test cell its released source, re-inserting missing ones in place."""
    released = [(c.metadata["nbgrader"]["grade_id"], c) for c in release_nb.cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")]
    for position, (gid, cell) in enumerate(released):
        if not cell.metadata["nbgrader"].get("grade"):
            continue
        index = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): i
                 for i, c in enumerate(nb.cells)}
        if gid in index:
            nb.cells[index[gid]].source = cell.source
            continue
        before = [index[g] for g, _ in released[:position] if g in index]
        nb.cells.insert(before[-1] + 1 if before else len(nb.cells), nbformat.from_dict(cell))


def check(path: Path, release_path: Path = RELEASE, skip_training: bool = False,
          timeout: int = 600) -> list[tuple[str, float, float, str]]:
    """Run the notebook; return (grade_id, points earned, points, message) per test cell."""
    if not release_path.exists():
        raise SystemExit(f"{release_path} is missing: run `make assignments` first")
    release_nb = nbformat.read(release_path, as_version=4)
    nb, problem = submissions.parse_notebook(path)
    if nb is None:
        raise SystemExit(problem)
    for note in submissions.normalise(nb, submissions.release_metadata(release_nb),
                                      submissions.locked_sources(release_nb)):
        print("note:", note)
    restore_tests(nb, release_nb)
    if skip_training:
        for cell in nb.cells:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "test_train_agent":
                cell.source = "raise RuntimeError('skipped by --skip-training')"
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    report = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade"):
            continue
        hidden = "_hidden" in meta["grade_id"]
        message = _cell_message(cell)
        points = float(meta.get("points", 0))
        if hidden:
            report.append((meta["grade_id"], float("nan"), points, "hidden: run by the grader"))
        elif skip_training and meta["grade_id"] == "test_train_agent":
            report.append((meta["grade_id"], float("nan"), points, "skipped (--skip-training)"))
        else:
            report.append((meta["grade_id"], 0.0 if message else points, points,
                           message or "passed"))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the visible tests with the grader's messages.")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--skip-training", action="store_true",
                        help="do not run the training test (it takes about a minute)")
    parser.add_argument("--release", type=Path, default=RELEASE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"{args.notebook} is not a file")
    start = time.monotonic()
    report = check(args.notebook, args.release, args.skip_training)
    width = max(len(r[0]) for r in report)
    failed = 0
    for gid, got, points, message in report:
        shown = "  --" if got != got else f"{got:4g}"
        print(f"{gid:<{width}}  {shown} / {points:g}  {message}")
        failed += got == got and got < points
    visible = [r for r in report if r[1] == r[1]]
    print(f"\nvisible tests: {sum(r[1] for r in visible):g} / {sum(r[2] for r in visible):g} points "
          f"({time.monotonic() - start:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
