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


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The processor's model name (Linux), or None: machines of one kind differ by more than 2x in speed, so a
    figure names the processor it came from."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name") and ":" in line]
    return names[0] if names else platform.processor() or None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict | None:
    """Whether the processor has AVX2, AVX-512 (foundation) and AMX (tiles and bf16), which decide its
    float32 and bfloat16 matmul speed; None where /proc/cpuinfo lists no flags (not Linux)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return None
    found = next((set(line.split(":", 1)[1].split()) for line in lines
                  if line.startswith("flags") and ":" in line), None)
    if found is None:
        return None
    return {"avx2": "avx2" in found, "avx512": "avx512f" in found, "amx": {"amx_tile", "amx_bf16"} <= found}


def machine() -> dict:
    import torch

    return {"cores": os.cpu_count(), "cpu": cpu_model(), "cpu_flags": cpu_flags(),
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}


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


#: The commit of the code a benchmark runs: taken when it starts, since a long run may outlast a commit.
STARTED_AT = commit()


def save_section(path: Path, section: str, rows: list[dict], command: str) -> None:
    """Write ``rows`` as ``section`` of the JSON file at ``path``, keeping its other sections."""
    data = json.loads(path.read_text()) if path.exists() else {"sections": {}}
    data["sections"][section] = {"command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                 "machine": machine(), "commit": STARTED_AT, "rows": rows}
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


# ----------------------------------------------------------------------------- reading them back (the results page)
def load(name: str, directory: Path = RESULTS) -> dict | None:
    """The sections of ``directory/name`` (``bench_trainer.json``), or None when that benchmark has not run."""
    path = directory / name
    return json.loads(path.read_text())["sections"] if path.exists() else None


def provenance(section: dict) -> str:
    """One Markdown line: the command, date, machine and commit that produced a section's figures."""
    m = section.get("machine") or {}
    machine = f"{m.get('cores', '?')} cores" + (f" ({m['cpu']})" if m.get("cpu") else "")
    machine += f", device {m.get('device', 'cpu')}"
    machine += f", torch {m['torch']}" if m.get("torch") else ""
    return (f"`{section.get('command')}` on {section.get('date')}; {machine}; "
            f"commit `{section.get('commit') or 'unknown'}`")


def flatten(row: dict, prefix: str = "") -> dict:
    """``{"turn": {"mse": x}}`` -> ``{"turn.mse": x}``; lists are left out (they become tables of their own)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            out[f"{prefix}{key}"] = value
    return out


def cell(value) -> str:
    """A figure as the page prints it: None (never reached, or not measured) as a dash, floats to 3 decimals."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1000 or (value and abs(value) < 0.001) else f"{value:.3f}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: list[dict], columns: list[str], headers: list[str] | None = None) -> str:
    """A Markdown table of ``columns`` (dotted names reach into nested dicts) over ``rows``."""
    if headers is not None and len(headers) != len(columns):
        raise ValueError(f"{len(headers)} headers for {len(columns)} columns")
    flat = [flatten(r) for r in rows]
    missing = [c for c in columns if not any(c in f for f in flat)]
    if rows and missing:
        raise ValueError(f"no row has the column(s) {missing}; the rows have {sorted(set().union(*flat))}")
    head = headers or columns
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(f.get(c)) for c in columns) + " |" for f in flat]
    return "\n".join(lines)


# --------------------------------------------------------------- the results page's folds and machines
#: What tells two machine records apart (the Python and torch versions are software, not the machine).
MACHINE_KEYS = ("cores", "cpu", "cpu_flags", "platform", "device")


def describe_machine(m: dict) -> str:
    """The machine of a record in words: cores, CPU model and its matmul flags, platform, device."""
    cpu = m.get("cpu") or "CPU model not recorded"
    flags = m.get("cpu_flags")
    if flags is None:
        flags = "flags not recorded"
    else:
        flags = ", ".join(f"{name.upper()} {'yes' if has else 'no'}" for name, has in flags.items())
    where = m.get("platform", "platform not recorded")
    return f"{m.get('cores', '?')} cores, {cpu} ({flags}), {where}, device {m.get('device', 'cpu')}"


def machine_line(section: dict, previous: dict | None = None) -> str:
    """One Markdown line naming the machine a section was measured on, and whether its record differs from
    ``previous`` (the machine record of the section shown before it)."""
    m = section.get("machine") or {}
    line = f"Measured on {describe_machine(m)}."
    if previous is not None:
        # A field one record lacks (older benchmarks did not record the CPU) tells nothing either way.
        both = [k for k in MACHINE_KEYS if None not in (m.get(k), previous.get(k))]
        differ = [k for k in both if m[k] != previous[k]]
        if differ:
            line += f" A different machine from the section above: the records differ in {', '.join(differ)}."
        elif {"cpu", "platform"} & set(both):
            line += " Its record shows no difference from the machine of the section above."
        else:
            line += (" Whether the section above ran on the same machine is not known: the two records"
                     " share no CPU model or platform.")
    return line


def folded(title: str, body: str) -> str:
    """``body`` (Markdown) folded under ``title``: a dropdown the reader opens to check a number."""
    if ":::" in body:
        raise ValueError("a folded body cannot hold ':::', which would close its dropdown early")
    return f":::{{dropdown}} {title}\n{body}\n:::\n"


def load_curves(directory: Path = RESULTS / "crafting_curve") -> tuple[dict[str, list[dict]], list[str]]:
    """Every ``*.jsonl`` learning curve under ``directory`` (``bench/crafting_curve.py``'s ``curve.jsonl``,
    copied there) as its records, by file name; and one line per file that could not be read, which the page
    names while it still draws the others."""
    curves, problems = {}, []
    for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
        try:
            text = path.read_text(encoding="utf-8")
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems.append(f"{path.name} is not readable as JSON lines ({exc}): "
                            "copy the run's curve.jsonl again")
            continue
        if not records or not isinstance(records[0], dict) or records[0].get("kind") != "header":
            problems.append(f"{path.name} does not start with the curve's header line: "
                            "copy the whole curve.jsonl")
            continue
        curves[path.stem] = records
    return curves, problems
