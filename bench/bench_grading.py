"""Grading throughput: seconds per submission, and N submissions in parallel against one at a time.

    .venv/bin/python bench/bench_grading.py [--n 20] [--full]

Builds N copies of the reference solution (by default with the training part left as released, so
each notebook runs every graded function's visible and hidden tests but not the training; ``--full``
includes training), then grades them twice through the whole pipeline (a worker process per
submission, the sandboxed kernel, the tests in the worker calling into it, gradebook merge, feedback,
export): with one worker, then with one worker per core.  Prints wall time, seconds per submission and
the parallel speed-up.
Needs root and bubblewrap, like ``make grade``.  Scratch goes to bench/_out (git-ignored).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import nbformat
from _results import RESULTS, save_section

REPO = Path(__file__).resolve().parent.parent
# The grader is not an installed package (``make grade`` runs it as ``python -m autograder.grade`` from the
# checkout), so this script reaches it through the checkout's root.
sys.path.insert(0, str(REPO))
from autograder import grade  # noqa: E402
from autograder.samples import fill, solution_sources  # noqa: E402

NAME = grade.DEFAULT_ASSIGNMENT


def build(out: Path, n: int, full: bool) -> Path:
    release = grade.prepare_course(out / "course-build", grade.DEFAULT_SOURCE, NAME)
    source = nbformat.read(grade.DEFAULT_SOURCE / NAME / f"{NAME}.ipynb", as_version=4)
    bodies = solution_sources(source)
    if not full:
        bodies.pop("train_agent", None)
    nb = fill(nbformat.read(release, as_version=4), bodies)
    subs = out / "submissions"
    for i in range(n):
        (subs / f"student{i:03d}").mkdir(parents=True)
        nbformat.write(nb, subs / f"student{i:03d}" / f"{NAME}.ipynb")
    return subs


def timed(subs: Path, out: Path, jobs: int) -> tuple[float, list]:
    start = time.perf_counter()
    results = grade.grade_all(subs, out=out, jobs=jobs)
    return time.perf_counter() - start, results


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The rows of both gradings, by the section of ``--results`` they were saved as (none when skipped)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="number of submissions")
    parser.add_argument("--full", action="store_true", help="include the training part")
    parser.add_argument("--results", type=Path, default=None,
                        help="JSON file for the figures (default bench/results/bench_grading.json)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n must be >= 1, got {args.n}")
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        print("bench_grading: skipped (grading needs root and bubblewrap; run `make sysdeps`)")
        return {}
    out = REPO / "bench" / "_out" / "grading"
    shutil.rmtree(out, ignore_errors=True)
    subs = build(out, args.n, args.full)
    cores = len(os.sched_getaffinity(0))
    rows = []
    for jobs in (1, cores):
        seconds, results = timed(subs, out / f"jobs{jobs}", jobs)
        scores = {r.score for r in results}
        rows.append((jobs, seconds, scores))
    print(f"grading {args.n} reference submissions ({'with' if args.full else 'without'} training) "
          f"on {cores} cores")
    print(f"{'workers':>8} {'wall s':>8} {'s/submission':>13}  scores")
    for jobs, seconds, scores in rows:
        print(f"{jobs:>8} {seconds:8.1f} {seconds / args.n:13.2f}  {sorted(scores)}")
    print(f"parallel speed-up ({cores} workers vs 1): {rows[0][1] / rows[1][1]:.2f}x")
    section = "full" if args.full else "without-training"
    saved = [{"workers": jobs, "wall_s": seconds, "s_per_submission": seconds / args.n, "submissions": args.n,
              "speedup": rows[0][1] / seconds} for jobs, seconds, _ in rows]
    save_section(args.results or RESULTS / "bench_grading.json", section, saved,
                 "bench/bench_grading.py " + " ".join(argv))
    return {section: saved}


if __name__ == "__main__":
    main()
