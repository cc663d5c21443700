"""Shared fixtures of the grading tests."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Iterator

import pytest

from agent_lab.grading import remote
from agent_lab.grading.inkernel import server


@pytest.fixture()
def serve_student() -> Iterator[Callable[[str], remote.Channel]]:
    """``start(source)``: a channel to a call server in a thread, serving the functions ``source`` defines.

    The kernel side is the code that runs in the sandbox (:func:`agent_lab.grading.inkernel.server.serve`);
    only the process boundary is left out. The channel has 20 s for its calls.
    """
    sockets = []

    def start(source: str) -> remote.Channel:
        namespace: dict = {}
        exec(source, namespace)  # noqa: S102 - the tests' own student code
        grader_end, kernel_end = socket.socketpair()
        sockets.append(grader_end)
        threading.Thread(target=server.serve, args=(kernel_end, lambda: namespace), daemon=True).start()
        channel = remote.Channel(grader_end)
        channel.deadline, channel.budget = time.monotonic() + 20, 20
        return channel

    yield start
    for sock in sockets:
        sock.close()
