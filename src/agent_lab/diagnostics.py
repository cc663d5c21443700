"""Per-step training diagnostics: the run's description, a step's row from its rollouts and updates, JSONL and
CSV files, a PNG of curves, the progress of a run and what to try when it ends below the optimum
(book/part2/08_diagnostics.md; foundations chapter section 17, "Estimator diagnostics").

:mod:`agent_lab.update` computes each update's statistics and the algorithm its own; this module gathers them
into the step's row (:func:`rollout_diagnostics`, :func:`summarise_updates`, :func:`phase_times`), stores, draws
and reads them. Every row is a flat dict of floats plus ``step`` and ``phase``.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from torch import Tensor

from agent_lab import timing
from agent_lab.estimators.statistics import degenerate_group_fraction
from agent_lab.update import KL_NEW_REF, KL_OLD_NEW


@dataclass(frozen=True)
class Panel:
    """One panel of ``curves.png``: its keys, y label and scale. ``low``/``high`` fix the y range where the
    quantity has a natural one (a share lies in [0, 1]; a KL starts at 0); ``span`` is the least range shown
    above ``low`` (or around ``centre``), so a curve that is constant by construction (an on-policy ratio of 1,
    a KL of 1e-14) is drawn flat on a meaningful scale instead of as magnified rounding noise."""

    title: str
    keys: tuple[str, ...]
    ylabel: str
    low: float | None = None
    high: float | None = None
    span: float | None = None
    centre: float | None = None


#: The curves drawn by :func:`plot_curves`, in panel order (keys: book/part2/08_diagnostics.md, agent_lab.update).
PANELS: tuple[Panel, ...] = (
    Panel("success", ("success", "eval_success", "optimum"), "share of episodes", 0.0, 1.02),
    Panel("reward", ("reward_mean",), "mean return"),
    Panel("degenerate groups", ("degenerate_fraction",), "share of groups", 0.0, 1.02),
    Panel("entropy", ("entropy",), "nats per action token", 0.0),
    Panel("KL", (KL_OLD_NEW, KL_NEW_REF), "nats per token", 0.0, span=1e-2),
    Panel("clip fraction", ("clip_fraction", "clip_frac_pos", "clip_frac_neg"), "share of tokens", 0.0, span=0.1),
    Panel("importance ratio", ("ratio_mean", "ratio_max", "ratio_min"), "pi / mu per token", 0.0, span=0.4,
          centre=1.0),
    Panel("gradient norm", ("grad_norm_before", "grad_norm_after"), "L2 norm", 0.0),
    Panel("ESS / B", ("ess_fraction",), "share of the batch", 0.0, 1.02),
    Panel("sampler vs trainer", ("logprob_gap_max", "logprob_gap_mean"), "|log mu - log pi|", 0.0, span=1e-3),
    Panel("refused actions", ("rejected_share",), "share of sampled turns", 0.0, 1.02),
    Panel("episode length", ("episode_turns", "action_tokens"), "turns / tokens", 0.0),
    Panel("loss", ("loss",), "loss"),
    Panel("seconds", ("elapsed_s",), "seconds since start", 0.0),
)
#: Legend labels: the direction and sampling distribution of each KL, in symbols.
LABELS = {KL_OLD_NEW: "KL(old||new), k3 on old", KL_NEW_REF: "KL(new||ref), rho-weighted k3 on old",
          "eval_success": "greedy (held out)", "success": "training batch", "optimum": "planner"}


# ----------------------------------------------------------------------------- what a run says and logs
# ``run`` below is the trainer's Run (agent_lab.trainer), read by attribute: this module sits below the trainer.
def describe_run(run: Any, phases: tuple[str, ...]) -> str:
    """The exact loss and settings of the run, as printed at its start and saved to loss.txt."""
    cfg, m, s = run.cfg, run.cfg.model, run.cfg.sampling
    options = f" {cfg.env_options}" if cfg.env_options else ""
    prefix_lm = "" if m.prompt_attention == "causal" else f" prompt_attention={m.prompt_attention}"
    lines = [f"agent-lab train: env={cfg.env}{options} seed={cfg.seed}",
             f"policy: decoder-only transformer d_model={m.d_model} n_layers={m.n_layers} n_heads={m.n_heads} "
             f"positions={m.positions}{prefix_lm} ({run.model.num_parameters()} parameters)",
             f"sampling: temperature={s.temperature} top_p={s.top_p} candidate_mask={s.candidate_mask} "
             "(behaviour log-probs recorded under this transform)"]
    if "sft" in phases and cfg.sft.steps:
        lines.append(f"SFT ({cfg.sft.steps} steps, {cfg.sft.batch_size} demonstrations/step, "
                     f"lr={cfg.sft.lr or cfg.optimizer.lr}"
                     + (f", linear warmup over the first {cfg.sft.warmup_steps}" if cfg.sft.warmup_steps else "")
                     + (f", linear to 0 over the last {cfg.sft.lr_decay_steps}" if cfg.sft.lr_decay_steps else "")
                     + f"): {run.sft_algo.describe()}")
    a = cfg.algorithm
    if "rl" in phases and a.steps:
        lines.append(f"RL ({a.steps} steps, batch {a.batch_size} = {a.batch_size // a.group_size} tasks x "
                     f"{a.group_size}, lr={cfg.optimizer.lr}): {run.algo.describe()}")
        if a.entropy_coef > 0:
            lines.append(f"entropy bonus: s_ij += {a.entropy_coef} * H(pi(. | x_<ij))")
    lines += [p.describe(cfg) for p in run.plugins]
    lines.append(f"precision: {run.precision}")
    if cfg.run.micro_batch_size:
        lines.append(f"micro-batches of {cfg.run.micro_batch_size} episodes, gradients accumulated; every "
                     "normaliser is the whole step's")
    if run.advantage_fn is not None:
        lines.append("advantage: replaced by the user's advantage_fn(rewards, group_size)")
    if run.loss_fn is not None:
        lines.append(f"loss: replaced by the user's {run.algo.loss_fn_signature}")
    o = cfg.optimizer
    lines.append(f"optimizer: AdamW(lr={o.lr}, betas=(0.9, 0.99), weight_decay={o.weight_decay}); "
                 f"gradient-norm clipping at {o.grad_clip}"
                 + ("; its moments cleared when RL takes over from SFT" if o.rl_fresh_optimizer else ""))
    return "\n".join(lines)


def rollout_diagnostics(run: Any, batch, sampled, adv: Tensor) -> dict:
    """Reward, success, all-equal groups and refused actions of every sampled episode; the update batch's
    advantages and lengths, and what the algorithm itself logs (``Algorithm.statistics``)."""
    every = sampled.episode_return
    row = dict(reward_mean=float(every.mean()), reward_std=float(every.std()) if len(every) > 1 else 0.0,
               success=float(sampled.success.float().mean()),
               degenerate_fraction=float(degenerate_group_fraction(every, run.cfg.algorithm.group_size)),
               advantage_abs_mean=float(adv.abs().mean()), episode_turns=float(batch.num_turns.float().mean()),
               action_tokens=float(batch.num_action_tokens.float().mean()), policy_lag=0,
               **run.algo.statistics(batch))
    refused = rejected_share(sampled.episode_logs)
    if refused is not None:  # an environment without logs has no refusals to count
        row["rejected_share"] = refused
    return row


def rejected_share(episode_logs: list[dict]) -> float | None:
    """The share of the logged turns whose action the environment refused (a turn logged with an ``error``:
    unparseable text, or a well-formed action its rules forbid), pooled over episodes; ``None`` without logs.
    Near 1 early in pure RL without the candidate mask: the policy has not yet found the action format."""
    errors = [t.get("error") is not None for log in episode_logs for t in log["turns"]]
    return sum(errors) / len(errors) if errors else None


def summarise_updates(updates: list[dict]) -> dict:
    """One row from a step's updates: the last update's statistics, the first update's gradient norms and
    sampler-trainer gap (theta = theta_old there), the largest ratio over all of them, and the tokens of every
    update's passes (an episode trained on in two epochs counts twice)."""
    first, last = updates[0], updates[-1]
    row = dict(last, train_tokens=sum(u["train_tokens"] for u in updates))
    for k in ("grad_norm_before", "grad_norm_after", "logprob_gap_max", "logprob_gap_mean"):
        if k in first:
            row[k] = first[k]
    if "ratio_mean" in first:
        row["ratio_first_epoch"] = first["ratio_mean"]
        row["ratio_max"] = max(u.get("ratio_max", float("nan")) for u in updates)
    return row


def phase_times(spans: dict[str, float], seconds: float) -> dict[str, float]:
    """``time_<phase>_s`` for each phase a step spent time in and ``time_other_s``, the rest of its ``seconds``."""
    out = {f"time_{name}_s": spans[name] for name in timing.PHASES if name in spans}
    out["time_other_s"] = max(0.0, seconds - sum(spans.values()))
    return out


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


class Progress:
    """A run's progress. On a terminal: one bar updated in place (tqdm). Anywhere else (CI, a log file, a
    notebook's captured output): one plain line every ``every_fraction`` of the steps or every ``every_s``
    seconds, whichever comes first, and at the last step; never a carriage return."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", enabled: bool = True,
                 stream: TextIO | None = None, every_fraction: float = 0.1, every_s: float = 30.0):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.desc = total, initial, desc
        self.enabled = enabled and total > initial
        self.bar = None
        if self.enabled and _is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, file=self.stream, leave=True)
        self.every = max(1, math.ceil(every_fraction * total))
        self.every_s, self.last_t = every_s, time.perf_counter()

    def update(self, row: dict) -> None:
        self.done += 1
        if not self.enabled:
            return
        self.last_row, self.printed = row, False
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(_figures(row))
            return
        now = time.perf_counter()
        if self.done % self.every == 0 or now - self.last_t >= self.every_s or self.done == self.total:
            self.last_t, self.printed = now, True
            self._line(row)

    def _line(self, row: dict) -> None:
        text = " ".join(f"{k} {v}" for k, v in _figures(row).items())
        print(f"{self.desc}: step {self.done}/{self.total} ({100 * self.done / self.total:.0f}%) {text} "
              f"[{row.get('elapsed_s', 0.0):.0f} s]", file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar; in line mode, write the last step if the phase stopped between two lines."""
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and not getattr(self, "printed", True):
            self._line(self.last_row)


def _figures(row: dict) -> dict[str, str]:
    """What a progress line shows: the loss, greedy success when evaluated, and (RL) sampled success."""
    figures = {"loss": row.get("loss"), "greedy": row.get("eval_success")}
    if row.get("phase") != "sft":  # an SFT batch's success is the planner's, not the policy's
        figures["sampled"] = row.get("success")
    return {k: f"{v:.3f}" if k == "loss" else f"{v:.2f}" for k, v in figures.items() if _finite(v)}


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def curves_figure(history: Sequence[dict], title: str = ""):
    """The :data:`PANELS` that have data in ``history``, as a matplotlib Figure (no pyplot state)."""
    # A standalone Figure (no pyplot): saving curves must not switch the caller's backend, or a notebook
    # that trains and then calls plt.show() would silently show nothing.
    from matplotlib.figure import Figure

    panels = [p for p in PANELS if any(k in r and _finite(r[k]) for r in history for k in p.keys)]
    cols = 4
    rows = max(1, math.ceil(len(panels) / cols))
    fig = Figure(figsize=(4.2 * cols, 3.1 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        values = []
        for k in panel.keys:
            pts = [(r["step"], r[k]) for r in history if k in r and _finite(r[k])]
            if pts:
                xs, ys = zip(*pts)
                values += ys
                ax.plot(xs, ys, marker="." if len(pts) < 30 else None, label=LABELS.get(k, k))
        ax.set_ylim(*_y_range(panel, values))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_title(panel.title, fontsize=10, pad=16 if len(panel.keys) > 1 else 6)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        if len(panel.keys) > 1:  # above the axes, under the title: never over a curve
            ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(ax.lines), frameon=False,
                      borderaxespad=0.1, handlelength=1.2, columnspacing=0.8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _y_range(panel: Panel, values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if panel.centre is not None:  # symmetric around the centre, at least span wide
        half = max(panel.span / 2, abs(lo - panel.centre), abs(hi - panel.centre)) * 1.05
        bottom = panel.centre - half if panel.low is None else max(panel.low, panel.centre - half)
        return bottom, panel.centre + half
    low = panel.low if panel.low is not None else lo
    high = panel.high if panel.high is not None else hi
    if panel.high is None and panel.span is not None:
        high = max(high, low + panel.span)
    if high <= low:  # a constant curve with no natural scale: a small band around it
        pad = abs(low) * 0.05 or 1.0
        return low - pad, high + pad
    margin = 0.0 if panel.high is not None else (high - low) * 0.05
    return low - (margin if panel.low is None else 0.0), high + margin


def plot_curves(history: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Draw :func:`curves_figure` to a PNG at ``path``; return the path."""
    path = Path(path)
    curves_figure(history, title).savefig(path, dpi=80)
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


def next_steps(result, recipe: str | None = None) -> list[str]:
    """What to try when a run ended below the planner's optimum, read from its own diagnostics (empty when it
    reached it). ``result`` is a :class:`~agent_lab.trainer.TrainResult`; ``recipe`` the recipe it ran."""
    rep = result.final_eval
    if rep is None or rep.success >= rep.optimum - 1e-9:
        return []
    cfg, hist = result.config, result.history
    rl = [h for h in hist if h.get("phase") != "sft"][-10:]
    tips = [f"below the planner's optimum ({rep.success:.3f} < {rep.optimum:.3f}). Likely reasons, from this run's "
            "diagnostics:"]
    if result.stopped == "time limit":
        tips.append("- it stopped at its time limit: raise --time-limit-s")
    if not rl:
        tips.append("- imitation alone: add RL steps (--steps) or more SFT steps (--sft-steps)")
    else:
        equal = sum(h.get("degenerate_fraction", 0.0) for h in rl) / len(rl)
        entropy = rl[-1].get("entropy", float("nan"))
        success = sum(h.get("success", 0.0) for h in rl) / len(rl)
        if equal > 0.75:
            tips.append(f"- {equal:.0%} of the last steps' groups had all-equal rewards, so no centred advantage: "
                        "start from an SFT cold start (--sft-steps 200) or sample larger groups (--group-size)")
        if _finite(entropy) and entropy < 0.05:
            tips.append(f"- entropy fell to {entropy:.3f} nats per action token: the policy stopped exploring; add "
                        "an entropy bonus (--entropy-coef 0.03) or lower --lr")
        refused = [h["rejected_share"] for h in rl if _finite(h.get("rejected_share"))]
        if cfg is not None and not cfg.sampling.candidate_mask and success < 0.2:
            tips.append(f"- only {success:.0%} of the sampled episodes succeeded: sample with the candidate mask "
                        "(--candidate-mask)")
        elif cfg is not None and not cfg.sampling.candidate_mask and refused and max(refused) < 0.2:
            tips.append(f"- at most {max(refused):.0%} of the sampled actions were refused, so the format is learned, "
                        "yet the policy stays below the optimum: it may ignore the observations (on number search "
                        "bench/bench_no_mask.py measures it); start from an SFT cold start (--sft-steps 200) or sample "
                        "with the candidate mask (--candidate-mask)")
        if len(tips) == 1:
            tips.append(f"- still improving? train longer (--steps {2 * cfg.algorithm.steps if cfg else 'more'})")
    if recipe != "number-search" and cfg is not None and cfg.env == "number-search":
        tips.append("the recipe that reaches the optimum in seconds: agent-lab train --recipe number-search")
    return tips


def time_profile(history: Sequence[dict], phase: str | None = None) -> dict:
    """Where the steps of ``history`` spent their time (``time_<phase>_s``, :mod:`agent_lab.timing`): the steps
    (only SFT's with ``phase="sft"``, only RL's with ``phase="rl"``), their seconds, the seconds and share of
    each phase, and the tokens they trained on and sampled."""
    rows = [r for r in history if phase is None or (r.get("phase") == "sft") == (phase == "sft")]
    seconds: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("time_") and k.endswith("_s"):
                seconds[k[5:-2]] = seconds.get(k[5:-2], 0.0) + v
    total = sum(seconds.values())
    return {"steps": len(rows), "seconds": total, "phase_seconds": seconds,
            "shares": {k: v / total for k, v in seconds.items()} if total else {},
            "train_tokens": sum(r.get("train_tokens", 0.0) for r in rows),
            "rollout_tokens": sum(r.get("rollout_tokens", 0.0) for r in rows)}


def format_shares(shares: dict[str, float], top: int | None = None) -> str:
    """``"loss 88%, demonstrations 7%"``: the ``top`` largest shares (all of them by default), largest first."""
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {v:.0%}" for k, v in ranked)


def time_summary(history: Sequence[dict], top: int = 3) -> str:
    """One line per phase of the run (SFT, RL): its steps, seconds and its ``top`` phases by share."""
    lines = []
    for name, phase in (("SFT", "sft"), ("RL", "rl")):
        p = time_profile(history, phase)
        if p["steps"] and p["seconds"] > 0:
            lines.append(f"{name}: {p['steps']} steps, {p['seconds']:.1f} s ({format_shares(p['shares'], top)})")
    return "where the time went: " + "; ".join(lines) if lines else ""
