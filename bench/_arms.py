"""A benchmark's arms, each in a fresh Python process: the script runs itself once per arm with hidden
options (``--child``, which arm; ``--out``, where the arm writes its result as JSON), so that no arm inherits
another's heap, allocator state or threads, and a memory high-water mark measures one arm alone."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_child_options(parser: argparse.ArgumentParser, **child: Any) -> None:
    """The hidden options of a run as one arm; ``child`` are ``add_argument``'s keywords for ``--child``."""
    parser.add_argument("--child", help=argparse.SUPPRESS, **child)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)


def write_result(out: Path, result: Any) -> None:
    """An arm's result, for the process that started it (:func:`run_fresh`) to read back."""
    out.write_text(json.dumps(result))


def run_fresh(script: str | Path, *arms: Sequence[Any], together: bool = False) -> list:
    """Run ``python script ARGS --out FILE`` for each arm's ``ARGS``, each in a process of its own, and return
    what each wrote to its ``FILE`` (:func:`write_result`), in the order of ``arms``. The arms run one after
    the other, or all at once with ``together`` (so that the machine's noise falls on every arm alike). An arm
    that fails stops the benchmark, naming the arm; its own traceback is printed above."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"arm{i}.json" for i in range(len(arms))]
        commands = [[sys.executable, str(script), *map(str, args), "--out", str(out)]
                    for args, out in zip(arms, outs)]
        if together:
            procs = [subprocess.Popen(cmd) for cmd in commands]
            codes = [proc.wait() for proc in procs]
        else:
            codes = []
            for cmd in commands:  # a failed arm stops the rest: they would be compared with nothing
                codes.append(subprocess.run(cmd).returncode)
                if codes[-1]:
                    break
        for args, code in zip(arms, codes):
            if code:
                arm = " ".join([Path(script).name, *map(str, args)])
                raise SystemExit(f"the arm `{arm}` failed (exit {code}); its output is above")
        return [json.loads(out.read_text()) for out in outs]
