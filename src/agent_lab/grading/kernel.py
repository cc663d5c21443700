"""The grading kernel: ``python -m agent_lab.grading.kernel --rpc SOCKET -f CONNECTION_FILE``.

It connects the call server (:mod:`agent_lab.grading.server`) to the grader's socket first, then starts an
ordinary IPython kernel, so the server exists before any student code runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

# The grading kernel's view of the package: destination inside the view -> file of this package.
VIEW = {"agent_lab/__init__.py": "kernel_view.py", "agent_lab/grading/__init__.py": "__init__.py",
        "agent_lab/grading/checks.py": "checks.py", "agent_lab/grading/wire.py": "wire.py",
        "agent_lab/grading/server.py": "server.py", "agent_lab/grading/kernel.py": "kernel.py"}


def view_files() -> dict[str, Path]:
    """Destination in the kernel's view -> the file that goes there."""
    here = Path(__file__).resolve().parent
    return {dest: here / src for dest, src in VIEW.items()}


def kernel_argv(python: str, rpc_path: str) -> list[str]:
    """The kernelspec argv of a grading kernel whose call server connects to ``rpc_path``."""
    return [python, "-m", "agent_lab.grading.kernel", "--rpc", rpc_path, "-f", "{connection_file}"]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--rpc":
        raise SystemExit("usage: python -m agent_lab.grading.kernel --rpc SOCKET [ipykernel options]")
    from agent_lab.grading import server

    server.start(argv[1])
    sys.argv = [sys.argv[0], *argv[2:]]
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance()


if __name__ == "__main__":
    main(sys.argv[1:])
