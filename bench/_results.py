"""Where the benchmarks' figures go: JSON under bench/results/, one section per benchmark part, each with the
command, the date, the machine and the commit that produced it (the book's results page reads these files)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import torch

    return {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}


def commit() -> str | None:
    """The checkout's commit, marked when tracked files differ from it."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("+uncommitted" if dirty else "") if out.returncode == 0 else None


def save_section(path: Path, section: str, rows: list[dict], command: str) -> None:
    """Write ``rows`` as ``section`` of the JSON file at ``path``, keeping its other sections."""
    data = json.loads(path.read_text()) if path.exists() else {"sections": {}}
    data["sections"][section] = {"command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                 "machine": machine(), "commit": commit(), "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite_or_null(data), indent=1) + "\n")


def _finite_or_null(x):
    """JSON has no infinity: a figure never reached (an infinite median) is written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_null(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite_or_null(v) for v in x]
    return x
