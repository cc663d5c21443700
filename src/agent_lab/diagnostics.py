"""Per-step training diagnostics: JSONL and CSV files and a PNG of curves (seed 004 §17).

Book chapter "Estimator diagnostics". The trainer computes the numbers (with the estimator library);
this module only stores and draws them. Every row is a flat dict of floats plus ``step`` and ``phase``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

#: The curves drawn by :func:`plot_curves`, in panel order: (title, keys).
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("success", ("success", "eval_success", "optimum")),
    ("reward", ("reward_mean",)),
    ("degenerate groups", ("degenerate_fraction",)),
    ("entropy / token", ("entropy",)),
    ("approx. KL", ("kl_behaviour", "kl_reference")),
    ("clip fraction", ("clip_fraction",)),
    ("ratio", ("ratio_mean", "ratio_max")),
    ("grad norm", ("grad_norm_before", "grad_norm_after")),
    ("ESS / B", ("ess_fraction",)),
    ("episode length", ("episode_turns", "action_tokens")),
    ("loss", ("loss",)),
    ("seconds", ("elapsed_s",)),
)


class MetricsWriter:
    """Append one row per step to ``metrics.jsonl`` and rewrite ``metrics.csv`` (all keys seen so far)."""

    def __init__(self, run_dir: str | Path, resume: bool = False):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "metrics.jsonl"
        self.csv = self.dir / "metrics.csv"
        self.rows: list[dict] = []
        if resume and self.jsonl.exists():
            self.rows = [json.loads(x) for x in self.jsonl.read_text().splitlines() if x.strip()]
        elif self.jsonl.exists():
            self.jsonl.unlink()

    def truncate(self, step: int) -> None:
        """Drop rows at or after ``step`` (a resumed run rewrites them)."""
        self.rows = [r for r in self.rows if r.get("step", -1) < step]
        self.jsonl.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def write(self, row: dict) -> None:
        self.rows.append(row)
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def flush_csv(self) -> None:
        keys: list[str] = []
        for r in self.rows:
            keys += [k for k in r if k not in keys]
        with self.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)


def plot_curves(history: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Draw the :data:`PANELS` that have data in ``history`` to a PNG at ``path``; return the path."""
    # A standalone Figure (no pyplot): saving curves must not switch the caller's backend, or a notebook
    # that trains and then calls plt.show() would silently show nothing.
    from matplotlib.figure import Figure

    panels = [(t, ks) for t, ks in PANELS if any(k in r and _finite(r[k]) for r in history for k in ks)]
    n = max(len(panels), 1)
    cols = 4
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4 * cols, 2.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (t, ks) in zip(axes.flat, panels):
        for k in ks:
            pts = [(r["step"], r[k]) for r in history if k in r and _finite(r[k])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="." if len(pts) < 30 else None, label=k)
        ax.set_title(t, fontsize=9)
        ax.tick_params(labelsize=7)
        if len(ks) > 1:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=80)
    return path


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def summary_table(rows: Sequence[dict], keys: Sequence[str]) -> str:
    """A plain-text table of ``keys`` (columns) over ``rows``; floats to 3 decimals."""
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    cells = [[fmt(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) if cells else len(k) for i, k in enumerate(keys)]
    line = "  ".join(k.ljust(w) for k, w in zip(keys, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(cs, widths)) for cs in cells]
    return "\n".join(out)
