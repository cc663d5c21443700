"""The grading worker caps its own heap: past the cap, an allocation fails inside the worker, where the test
that made it is marked failed, instead of growing the grader's process without bound."""
from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import resource, torch
from autograder import worker
worker.cap_memory(1 << 30)
print(resource.getrlimit(resource.RLIMIT_DATA)[0] == 1 << 30)
for allocate in (lambda: bytearray(2 << 30), lambda: torch.empty(1 << 29, dtype=torch.float32)):
    try:
        allocate()
        print("allocated")
    except (MemoryError, RuntimeError) as exc:
        print(type(exc).__name__)
"""


def test_an_allocation_past_the_workers_cap_fails_in_the_worker():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "MemoryError", "RuntimeError"], out.stderr[-2000:]


def test_the_cap_never_raises_a_hard_limit():
    code = ("import resource; from autograder import worker\n"
            "resource.setrlimit(resource.RLIMIT_DATA, (8 << 30, 8 << 30))\n"
            "worker.cap_memory(16 << 30); print(*resource.getrlimit(resource.RLIMIT_DATA))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [str(8 << 30), str(8 << 30)], out.stderr[-2000:]
