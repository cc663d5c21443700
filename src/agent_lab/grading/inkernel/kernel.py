"""The grading kernel: ``python -m agent_lab.grading.inkernel.kernel --rpc SOCKET -f CONNECTION_FILE``.

It connects the call server (:mod:`agent_lab.grading.inkernel.server`) to the grader's socket first, then
starts an ordinary IPython kernel, so the server exists before any student code runs.
"""
from __future__ import annotations

import sys


def kernel_argv(python: str, rpc_path: str) -> list[str]:
    """The kernelspec argv of a grading kernel whose call server connects to ``rpc_path``."""
    return [python, "-m", "agent_lab.grading.inkernel.kernel", "--rpc", rpc_path, "-f", "{connection_file}"]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--rpc":
        raise SystemExit("usage: python -m agent_lab.grading.inkernel.kernel --rpc SOCKET "
                         "[ipykernel options]")
    from agent_lab.grading.inkernel import server

    server.start(argv[1])
    sys.argv = [sys.argv[0], *argv[2:]]
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance()


if __name__ == "__main__":
    main(sys.argv[1:])
