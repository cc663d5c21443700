"""Start formgrader on a grader's course: ``python -m autograder.formgrader COURSE [jupyter server options]``.

It runs ``jupyter server`` in the course folder with ``autograder/jupyter_formgrader_config.py``, which makes
formgrader's pages carry a Content-Security-Policy (:mod:`autograder.formgrader_csp`). Open the printed URL
followed by ``/formgrader``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "jupyter_formgrader_config.py"


def command(course: Path, extra: list[str]) -> list[str]:
    """The ``jupyter server`` command line for ``course``."""
    return [sys.executable, "-m", "jupyter_server", f"--config={CONFIG}", "--no-browser",
            f"--ServerApp.root_dir={course}", *extra]


def environment() -> dict[str, str]:
    """This process's environment with the repository importable (the extension lives in ``autograder``)."""
    paths = [str(HERE.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def main(argv: list[str]) -> int:
    if not argv or not (Path(argv[0]) / "gradebook.db").is_file():
        print("usage: python -m autograder.formgrader COURSE [jupyter server options]\n"
              "COURSE is a grader's course folder (it holds gradebook.db), e.g. "
              "autograder/_work/crafting_agent/course", file=sys.stderr)
        return 2
    course = Path(argv[0]).resolve()
    os.chdir(course)   # formgrader reads the course's nbgrader_config.py from the working folder
    os.execve(sys.executable, command(course, argv[1:]), environment())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
