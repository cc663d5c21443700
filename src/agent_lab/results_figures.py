"""The book's results page as figures: one function per benchmark draws its figure from the rows that
``bench/_results.py`` reads back, and one computes the figures its conclusion states, so the page can assert
them (a rerun that changes a ranking fails the build instead of printing a false sentence).

Curves of several seeds are drawn the way benchmark reports draw them: each seed a thin line, the median over
seeds a bold one.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, NullFormatter

from agent_lab.envs.crafting import ITEM_ROLES

#: Figures are drawn this many inches wide: at the book's resolution they fit its text column unscaled.
WIDTH = 7.0
THIN = {"lw": 0.8, "alpha": 0.45}
THOUSANDS = FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0")
BOLD = {"lw": 2.2}
COLORS = plt.get_cmap("tab10").colors


def legend_below(rows: int, panel_height: float = 2.6) -> tuple[float, float]:
    """For a figure whose legend of ``rows`` lines sits under its panels: the figure's height, and the share
    of it (the bottom of ``tight_layout``'s rect) the legend keeps for itself."""
    height = panel_height + 0.2 * rows
    return height, min(0.2 * rows / height, 0.5)


def subplots(ncols: int = 1, height: float = 3.0, **kw):
    """A figure of ``ncols`` panels side by side, :data:`WIDTH` inches wide."""
    fig, axes = plt.subplots(1, ncols, figsize=(WIDTH, height), squeeze=False, **kw)
    return fig, list(axes[0])


# ----------------------------------------------------------------------------- curves over seeds
Curve = list[tuple[float, float]]


def held(curve: Curve, x: float) -> float:
    """The curve's value at ``x``: its last point at or before ``x`` (an evaluation holds until the next)."""
    value = curve[0][1]
    for cx, cy in curve:
        if cx > x:
            break
        value = cy
    return value


def median_curve(curves: list[Curve], hold: bool = True) -> Curve:
    """The median over seeds at every point of any seed from where all seeds have started. ``hold``: a seed
    that has ended holds its last value (runs that stop at the optimum stay there); else the median ends with
    the shortest seed (runs cut by a budget say nothing past their end)."""
    curves = [sorted(c) for c in curves if c]
    if not curves:
        return []
    start = max(c[0][0] for c in curves)
    end = max(c[-1][0] for c in curves) if hold else min(c[-1][0] for c in curves)
    xs = sorted({x for c in curves for x, _ in c if start <= x <= end})
    return [(x, statistics.median(held(c, x) for c in curves)) for x in xs]


def draw_seeds(ax, curves: list[Curve], color, label: str, hold: bool = True) -> None:
    """Each seed's curve thin, their median bold (labelled), as steps held until the next evaluation;
    ``hold`` as in :func:`median_curve`."""
    for c in curves:
        ax.plot(*zip(*sorted(c)), color=color, drawstyle="steps-post", **THIN)
    med = median_curve(curves, hold)
    if med:
        ax.plot(*zip(*med), color=color, drawstyle="steps-post", label=label, **BOLD)


def rows_panels(fig, axes, names: list[str]):
    """Finish panels that share one row per name: the names down the first, top to bottom, the legend in the
    last, a grid along x."""
    for ax in axes:
        ax.grid(alpha=0.3, axis="x")
    axes[0].set_yticks(range(len(names)), names, fontsize=8)
    axes[0].invert_yaxis()
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def optimum_line(ax, optimum: float, label: str = "optimum 15/16") -> None:
    ax.axhline(optimum, color="black", ls="--", lw=1, label=label)


# ----------------------------------------------------------------------------- number search
def run_curve(run: dict, x: str) -> Curve:
    """A seed's greedy success against ``x`` ("episodes" or "seconds") at each recorded evaluation."""
    return [(point[x], point["greedy"]) for point in run.get("curve") or []]


def has_curves(rows: list[dict]) -> bool:
    """Whether every seed of every recipe recorded its learning curve (earlier runs kept only the end)."""
    return bool(rows) and all(run.get("curve") for row in rows for run in row["runs"])


def number_search_curves(rows: list[dict], optimum: float):
    """Greedy success against episodes and against seconds, every recipe, each seed thin, the median bold."""
    fig, axes = subplots(2, height=4.2, sharey=True)
    for i, row in enumerate(rows):
        for ax, x in zip(axes, ("episodes", "seconds")):
            draw_seeds(ax, [run_curve(run, x) for run in row["runs"]], COLORS[i % 10], row["recipe"])
    for ax, x in zip(axes, ("episodes", "seconds")):
        optimum_line(ax, optimum)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy success")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.22, 1, 1))
    return fig


def number_search_dots(rows: list[dict]):
    """Episodes and seconds to the greedy optimum, one dot per seed, the median a bold bar, per recipe."""
    fig, axes = subplots(2, height=0.3 * len(rows) + 1.2, sharey=True)
    for y, row in enumerate(rows):
        for ax, key in zip(axes, ("reached_episodes", "reached_s")):
            got = [run[key] for run in row["runs"] if run[key] is not None]
            ax.plot(got, [y] * len(got), "o", color=COLORS[0], ms=4, alpha=0.6)
            if len(got) == len(row["runs"]):
                ax.plot([statistics.median(got)], [y], "|", color="black", ms=14, mew=2.5)
    axes[0].set_yticks(range(len(rows)), [f"{r['recipe']} ({r['reached']})" for r in rows], fontsize=8)
    axes[0].invert_yaxis()
    for ax, label in zip(axes, ("episodes to 15/16", "seconds to 15/16")):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks collide on short ranges
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def number_search_facts(rows: list[dict], starts_supervised: set[str]) -> dict:
    """Which recipes reached the optimum in every seed, and the fastest with and without supervised steps."""
    medians = {r["recipe"]: r["median_episodes"] for r in rows}
    everywhere = [r["recipe"] for r in rows if all(run["reached_episodes"] is not None for run in r["runs"])]
    ranked = sorted((m, name) for name, m in medians.items() if m is not None)
    rl = [(m, name) for m, name in ranked if name not in starts_supervised]
    sup = [(m, name) for m, name in ranked if name in starts_supervised]
    return {"recipes": len(rows), "reached_everywhere": len(everywhere), "ranked": [n for _, n in ranked],
            "fastest_supervised": sup[0] if sup else None, "fastest_rl": rl[0] if rl else None,
            "slowest_rl": rl[-1] if rl else None}


# ----------------------------------------------------------------------------- beside TRL
def side_name(row: dict) -> str:
    """"agent-lab" or "TRL": the first word of the row's side."""
    return row["side"].split()[0]


def trl_facts(rows: list[dict]) -> dict:
    """Per seed: each side's updates per second and their ratio, greedy success at equal episodes."""
    by_seed = defaultdict(dict)
    for r in rows:
        by_seed[r["seed"]][side_name(r)] = r
    seeds = {}
    for seed, sides in sorted(by_seed.items()):
        ours, trl = sides["agent-lab"], sides["TRL"]
        rate = {k: s["steps"] / s["seconds"] for k, s in sides.items()}
        seeds[seed] = {"rate": rate, "ratio": rate["agent-lab"] / rate["TRL"],
                       "trl_greedy": trl["final_greedy"],
                       "ours_at_trl_episodes": trl["agent_lab_greedy_at_these_episodes"],
                       "best_greedy": {k: max(p[1] for p in s["curve"]) for k, s in sides.items()}}
    ratios = [s["ratio"] for s in seeds.values()]
    gaps = [abs(s["ours_at_trl_episodes"] - s["trl_greedy"]) for s in seeds.values()]
    best = {k: max(s["best_greedy"][k] for s in seeds.values()) for k in ("agent-lab", "TRL")}
    return {"seeds": seeds, "ratio_min": min(ratios), "ratio_max": max(ratios), "greedy_gap_max": max(gaps),
            "best_greedy": best}


def trl_figure(rows: list[dict], optimum: float):
    """Updates per second of each side per seed; greedy success against episodes, seeds thin, median bold."""
    fig, (rate_ax, curve_ax) = subplots(2, height=3.2, gridspec_kw={"width_ratios": [1, 2.2]})
    sides = sorted({side_name(r) for r in rows})
    for i, side in enumerate(sides):
        mine = [r for r in rows if side_name(r) == side]
        rates = [r["steps"] / r["seconds"] for r in mine]
        rate_ax.plot([i] * len(rates), rates, "o", color=COLORS[i], alpha=0.6)
        rate_ax.plot([i], [statistics.median(rates)], "_", color="black", ms=22, mew=2.5)
        # each side ran for the same seconds, not episodes: its median ends with its shortest seed
        curves = [[tuple(p) for p in r["curve"]] for r in mine]
        draw_seeds(curve_ax, curves, COLORS[i], side, hold=False)
    rate_ax.set_xticks(range(len(sides)), sides)
    rate_ax.set_xlim(-0.6, len(sides) - 0.4)
    rate_ax.set_ylim(bottom=0)
    rate_ax.set_ylabel("updates per second")
    optimum_line(curve_ax, optimum)
    curve_ax.xaxis.set_major_formatter(THOUSANDS)
    curve_ax.set_xlabel("episodes")
    curve_ax.set_ylabel("greedy success")
    curve_ax.set_ylim(-0.03, 1)
    curve_ax.legend(fontsize=8)
    for ax in (rate_ax, curve_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- without the mask
def no_mask_facts(runs: list[dict]) -> dict:
    """Per recipe: seeds that reached the optimum, median seconds to it, median final and sampled success."""
    out = {}
    for name in dict.fromkeys(r["recipe"] for r in runs):
        mine = [r for r in runs if r["recipe"] == name]
        got = [r["reached_s"] for r in mine if r["reached_s"] is not None]
        out[name] = {"seeds": len(mine), "reached": len(got),
                     "median_s": statistics.median(got) if len(got) == len(mine) else None,
                     "greedy": statistics.median(r["final_greedy"] for r in mine),
                     "sampled": statistics.median(r["sampled_success"] for r in mine)}
    return out


def no_mask_figure(runs: list[dict], short: dict, optimum: float):
    """Final greedy and sampled success of each seed, per recipe, against the optimum."""
    fig, (ax,) = subplots(1, height=2.8)
    names = list(dict.fromkeys(r["recipe"] for r in runs))
    for y, name in enumerate(names):
        mine = [r for r in runs if r["recipe"] == name]
        for k, (key, label) in enumerate((("final_greedy", "greedy"), ("sampled_success", "sampled"))):
            ax.plot([r[key] for r in mine], [y + 0.12 * (k - 0.5) * 2] * len(mine), "os"[k], ls="",
                    color=COLORS[k], alpha=0.6, label=label if y == 0 else None)
    ax.axvline(optimum, color="black", ls="--", lw=1, label="optimum 15/16")
    ax.set_yticks(range(len(names)), [short.get(n, n) for n in names])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("success at the end of the budget (each seed)")
    ax.legend(fontsize=8, loc="center left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- crafting
CRAFTING_ARMS = (("cold start", False), ("after Dr.GRPO", False),
                 ("cold start", True), ("after Dr.GRPO", True))


def crafting_success(rows: list[dict]) -> dict:
    """``{(policy, mask, split, level): greedy success}`` of the crafting benchmark's rows."""
    return {(r["policy"], r["mask"], r["split"], r["group"]): r["greedy"] for r in rows}


def crafting_change(rows: list[dict], split: str, level: str, mask: bool) -> tuple[float, float]:
    """(cold start, after Dr.GRPO) greedy success on one split and level, decoded with or without the mask."""
    got = crafting_success(rows)
    return got[("cold start", mask, split, level)], got[("after Dr.GRPO", mask, split, level)]


def crafting_figure(rows: list[dict]):
    """Greedy success per level on each split: the SFT cold start (light) and after RL (dark), without the
    mask (hatched) and with it."""
    got = crafting_success(rows)
    splits = list(dict.fromkeys(r["split"] for r in rows))
    levels = {s: sorted({r["group"] for r in rows if r["split"] == s}) for s in splits}
    fig, axes = subplots(len(splits), height=3.0, sharey=True,
                         gridspec_kw={"width_ratios": [len(levels[s]) for s in splits]})
    width = 0.2
    for ax, split in zip(axes, splits):
        for k, (policy, mask) in enumerate(CRAFTING_ARMS):
            xs = [i + (k - 1.5) * width for i in range(len(levels[split]))]
            ys = [got[(policy, mask, split, lv)] for lv in levels[split]]
            color = COLORS[0] if policy == "after Dr.GRPO" else "#9ecae1"
            label = f"{'SFT' if policy == 'cold start' else 'SFT + RL'}, {'mask' if mask else 'no mask'}"
            ax.bar(xs, ys, width, color=color, hatch="" if mask else "///", edgecolor="white", label=label)
        ax.set_xticks(range(len(levels[split])), [lv.removeprefix("level ") for lv in levels[split]])
        ax.set_xlabel("level")
        ax.set_title(split.replace("_", " "))
        ax.axhline(1.0, color="black", ls="--", lw=1)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("greedy success (planner: 1)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


# ----------------------------------------------------------------------------- where the time goes
def arm_label(arm: dict) -> str:
    return f"{arm['arm']}, {arm['piece']}"


def profile_peak(row: dict) -> tuple[str, float]:
    """The float32 matmul peak measured in the same run at the arms' thread count: (its name, GFLOP/s)."""
    threads = row["threads"]
    name = f"float32, {threads} thread" + ("s" if threads != 1 else "")
    return name, row["matmul_peak_gflops"][name]


def profile_facts(row: dict) -> dict:
    """Per arm and piece: its largest phase, each phase's share, and its passes' share of the matmul peak."""
    _, peak = profile_peak(row)
    out = {}
    for arm in row["arms"]:
        shares = arm["shares"]
        out[arm_label(arm)] = {"largest": max(shares, key=shares.get), "shares": shares,
                               "gflops": arm["train_gflops"], "of_peak": arm["train_gflops"] / peak,
                               "recorded_of_peak": arm["share_of_matmul_peak"]}
    return {"peak": peak, "arms": out}


def profile_figure(row: dict):
    """Each arm's share of seconds per phase (stacked), and its passes' GFLOP/s against the matmul peak."""
    fig, (share_ax, flop_ax) = subplots(2, height=3.4, sharey=True, gridspec_kw={"width_ratios": [1.6, 1]})
    arms = row["arms"]
    phases = list(dict.fromkeys(p for arm in arms for p in arm["shares"]))
    ys = range(len(arms))
    left = [0.0] * len(arms)
    for k, phase in enumerate(phases):
        width = [arm["shares"].get(phase, 0.0) for arm in arms]
        share_ax.barh(ys, width, left=left, color=COLORS[k % 10], label=phase)
        left = [a + b for a, b in zip(left, width)]
    share_ax.set_yticks(list(ys), [arm_label(a) for a in arms], fontsize=8)
    share_ax.invert_yaxis()
    share_ax.set_xlim(0, 1)
    share_ax.set_xlabel("share of the piece's seconds")
    share_ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    name, peak = profile_peak(row)
    flop_ax.barh(list(ys), [a["train_gflops"] for a in arms], color=COLORS[0])
    flop_ax.axvline(peak, color="black", ls="--", lw=1, label=f"matmul peak ({name})")
    flop_ax.set_xlabel("forward + backward GFLOP/s")
    flop_ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    for ax in (share_ax, flop_ax):
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- levers beside the recipe
PIECES = ("SFT", "RL")


def per_arm(row: dict, key: str, over=statistics.median) -> dict[str, float]:
    """``key`` of each arm and piece (:func:`arm_label`, in the run's order), ``over`` its rounds."""
    got = defaultdict(list)
    for arm in row["arms"]:
        got[arm_label(arm)].append(arm[key])
    return {label: over(values) for label, values in got.items()}


def lever_facts(row: dict, base: str = "recipe", step: str = "s_per_step") -> dict:
    """Each arm and piece beside arm ``base`` of the same run: its speed-up (``base``'s seconds per step over
    the arm's, the median of rounds; above 1 the arm is faster; ``step="median_step_s"`` compares median steps
    instead, which leave out a compiled arm's first compilation) and its peak memory (the highest of rounds);
    per piece, the arms from fastest to slowest; the highest peak, and the range of peaks per dtype the arms
    computed in (a record without one computed in float32). A piece ``base`` did not run is left out, since
    nothing in the run says how fast it would have been."""
    if not any(arm["arm"] == base for arm in row["arms"]):
        raise ValueError(f"the run has no arm {base!r} to compare with: rerun with --arms {base} ...")
    seconds, peak = per_arm(row, step), per_arm(row, "peak_gb", max)
    speedup, ranked = {}, {}
    for piece in PIECES:
        own = f"{base}, {piece}"
        if own not in seconds:
            continue
        mine = {label: seconds[own] / s for label, s in seconds.items() if label.endswith(f", {piece}")}
        speedup.update(mine)
        ranked[piece] = [label.rsplit(", ", 1)[0] for label in sorted(mine, key=mine.get, reverse=True)]
    top = max(peak, key=peak.get)
    by_dtype = defaultdict(list)
    for arm in row["arms"]:
        by_dtype[arm.get("peak_dtype", "float32")].append(arm["peak_gb"])
    return {"base": base, "threads": row["threads"], "speedup": speedup, "ranked": ranked,
            "peak_gb": peak, "highest_peak": (top, peak[top]),
            "peak_range": {dtype: (min(gb), max(gb)) for dtype, gb in by_dtype.items()}}


def lever_figure(row: dict, limit_gb: float, base: str = "recipe", step: str = "s_per_step"):
    """Each arm's speed-up per step (``step``, as :func:`lever_facts`) against arm ``base`` of the same run
    (bars, 1: as fast), and its peak memory against the ceiling ``limit_gb`` (dashed), one row per arm and
    piece."""
    f = lever_facts(row, base, step)
    names = list(f["peak_gb"])
    fig, (speed_ax, peak_ax) = subplots(2, height=0.3 * len(names) + 1.2, sharey=True)
    for k, piece in enumerate(PIECES):
        ys = [i for i, n in enumerate(names) if n.endswith(f", {piece}") and n in f["speedup"]]
        bars = speed_ax.barh(ys, [f["speedup"][names[i]] for i in ys], color=COLORS[k], label=piece)
        speed_ax.bar_label(bars, fmt="%.2fx", fontsize=7, padding=2)
    speed_ax.axvline(1.0, color="black", lw=1)
    speed_ax.set_xlim(0, max(f["speedup"].values()) * 1.25)  # room for the labels
    which = "median step" if step == "median_step_s" else "s/step"
    speed_ax.set_xlabel(f"speed-up per step: {base}'s {which} ÷ the arm's")
    peak_ax.barh(range(len(names)), [f["peak_gb"][n] for n in names], color=COLORS[7])
    peak_ax.axvline(limit_gb, color="black", ls="--", lw=1, label=f"ceiling {limit_gb:g} GB")
    peak_ax.set_xlim(0, max(limit_gb, f["highest_peak"][1]) * 1.1)
    peak_ax.set_xlabel("peak resident memory, GB")
    rows_panels(fig, [speed_ax, peak_ax], names)
    for ax in (speed_ax, peak_ax):  # above the panels, where no bar or label can lie under them
        ax.legend(fontsize=7, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _built_share(arm: dict) -> float:
    """The share of an arm's seconds, its evaluation left out, that the step's own thread spent on the
    environment and the demonstrations (with ``prepare_ahead``: waiting for them)."""
    s = arm["shares"]
    return (s.get("environment", 0.0) + s.get("demonstrations", 0.0)) / (1.0 - s.get("evaluation", 0.0))


def ahead_facts(row: dict) -> dict:
    """Arm ``ahead`` (each SFT step's demonstrations built on a second thread while the step before trains)
    beside arm ``recipe`` of the same run: the SFT speed-up of median steps (:func:`lever_facts`) and of each
    round; the share ``h`` of the recipe's SFT seconds (evaluation left out) its thread spent building
    demonstrations, so that hiding all of it gains at most ``1 / (1 - h)`` (``bound``); the share the ahead
    arm's thread still waited for them; and each arm's share of seconds no phase covered (``other``; medians of
    rounds)."""
    sft = {name: {a["round"]: a for a in row["arms"] if a["arm"] == name and a["piece"] == "SFT"}
           for name in ("recipe", "ahead")}
    if not sft["recipe"] or not sft["ahead"]:
        raise ValueError("the run needs arms recipe and ahead: rerun with --arms recipe ahead")
    rounds = sorted(set(sft["recipe"]) & set(sft["ahead"]))
    hidden = statistics.median(_built_share(a) for a in sft["recipe"].values())
    return {"threads": row["threads"], "speedup": lever_facts(row, step="median_step_s")["speedup"]["ahead, SFT"],
            "per_round": [sft["recipe"][k]["median_step_s"] / sft["ahead"][k]["median_step_s"] for k in rounds],
            "hidden_share": hidden, "bound": 1.0 / (1.0 - hidden),
            "waited_share": statistics.median(_built_share(a) for a in sft["ahead"].values()),
            "other": {name: statistics.median(a["shares"].get("other", 0.0) for a in arms.values())
                      for name, arms in sft.items()}}


def ahead_figure(rows: list[dict]):
    """Per run (one per thread count): the ahead arm's SFT speed-up (diamond: the ratio of the arms' median steps,
    each the median of rounds; dots: each round's) and the most that hiding the demonstrations could gain
    (black tick), against 1 (as fast as the recipe)."""
    facts = [ahead_facts(r) for r in rows]
    fig, (ax,) = subplots(1, height=0.5 * len(rows) + 1.3)
    ys = range(len(facts))
    ax.plot([f["speedup"] for f in facts], list(ys), "D", color=COLORS[0], ms=8, label="ratio of medians")
    for y, f in zip(ys, facts):
        ax.plot(f["per_round"], [y] * len(f["per_round"]), "o", color=COLORS[1], ms=4,
                label="one round" if y == 0 else None)
        ax.plot([f["bound"]] * 2, [y - 0.35, y + 0.35], color="black", lw=2,
                label="bound: no demonstration time left" if y == 0 else None)
    ax.axvline(1.0, color="grey", lw=1, ls=":")
    low = min(min(f["per_round"] + [f["speedup"]]) for f in facts)
    high = max(max(f["per_round"] + [f["bound"]]) for f in facts)
    ax.set_xlim(min(0.95, low - 0.02), high + 0.03)
    ax.set_ylim(-0.6, len(facts) - 0.4)
    ax.set_yticks(list(ys), [f"{f['threads']} torch thread{'s' * (f['threads'] > 1)}" for f in facts])
    ax.set_xlabel("SFT speed-up: the recipe's median step ÷ the ahead arm's")
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- memory
def memory_figure(rows: list[dict], target_gb: float):
    """Peak resident memory of each recipe group's pieces, against the target."""
    fig, (ax,) = subplots(1, height=0.3 * len(rows) + 1.0)
    letters = {g: letter for letter, g in memory_groups(rows).items()}
    order = list(letters)
    ax.barh(range(len(rows)), [r["peak_gb"] for r in rows],
            color=[COLORS[order.index(r["recipes"]) % 10] for r in rows])
    ax.set_yticks(range(len(rows)), [f"{r['piece']} ({letters[r['recipes']]})" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(target_gb, color="black", ls="--", lw=1, label=f"target {target_gb:g} GB")
    ax.set_xlabel("peak resident memory, GB")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def memory_groups(rows: list[dict]) -> dict[str, str]:
    """The letter each recipe group carries in :func:`memory_figure`."""
    groups = list(dict.fromkeys(r["recipes"] for r in rows))
    return {chr(ord("A") + i): g for i, g in enumerate(groups)}


# ----------------------------------------------------------------------------- the SFT batch
def sft_batch_figure(seeds: dict[str, list[dict]]):
    """The imitation loss against seconds of each batch size, one panel per seed."""
    fig, axes = subplots(len(seeds), height=3.0, sharey=True)
    for ax, (name, rows) in zip(axes, seeds.items()):
        for k, r in enumerate(sorted(rows, key=lambda r: r["batch"])):
            ax.plot([c["seconds"] for c in r["curve"]], [c["loss"] for c in r["curve"]], "o-", ms=3,
                    color=COLORS[k], label=f"batch {r['batch']}")
        ax.set_title(name)
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean loss in the window")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def by_final_loss(rows: list[dict]) -> list[int]:
    """The batch sizes, lowest final loss first."""
    return [r["batch"] for r in sorted(rows, key=lambda r: r["last_loss"])]


# ----------------------------------------------------------------------------- the crafting assignment
def assignment_success(sections: dict[str, list[dict]]) -> list[dict]:
    """One record per (section, seed, split): the greedy success the grader gives that trained agent."""
    return [{"section": name, "seed": r["seed"], "split": split, "success": e["success"]}
            for name, rows in sections.items() for r in rows for split, e in r["evaluation"].items()]


def assignment_figure(sections: dict[str, list[dict]], thresholds: dict[str, float]):
    """Each seed's success per split, one marker per section, against the notebook's thresholds."""
    points = assignment_success(sections)
    splits = list(dict.fromkeys(p["split"] for p in points))
    fig, (ax,) = subplots(1, height=2.8)
    for k, name in enumerate(sections):
        mine = [p for p in points if p["section"] == name]
        ax.plot([p["success"] for p in mine], [splits.index(p["split"]) + 0.15 * (k - 0.5) * 2 for p in mine],
                "os"[k % 2], ls="", color=COLORS[k], alpha=0.7, label=name)
    for y, split in enumerate(splits):
        limit = next((v for goals, v in thresholds.items() if split.endswith(goals)), None)
        if limit is not None:
            ax.plot([limit, limit], [y - 0.4, y + 0.4], color="black", lw=1.5)
    ax.set_yticks(range(len(splits)), splits)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("greedy success, masked (black bar: the notebook's threshold)")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- grading
def grading_facts(rows: list[dict]) -> dict:
    """Per grader and worker count: seconds per submission of each run; the spread within a grader's runs
    against the difference between graders' means."""
    runs = defaultdict(list)
    for r in rows:
        runs[(r["grader"], r["workers"])].append(r["s_per_submission"])
    out = {}
    for workers in sorted({w for _, w in runs}):
        mine = {g: v for (g, w), v in runs.items() if w == workers}
        means = {g: statistics.fmean(v) for g, v in mine.items()}
        out[workers] = {"means": means, "spread": max(max(v) - min(v) for v in mine.values()),
                        "between": max(means.values()) - min(means.values())}
    return out


def grading_figure(rows: list[dict]):
    """Seconds per submission of every run, per grader and number of workers, in the order they ran."""
    fig, (ax,) = subplots(1, height=2.6)
    graders = list(dict.fromkeys(r["grader"] for r in rows))
    workers = sorted({r["workers"] for r in rows})
    for r in rows:
        x = workers.index(r["workers"]) + 0.25 * (graders.index(r["grader"]) - 0.5) * 2
        k = graders.index(r["grader"])
        ax.plot(x, r["s_per_submission"], "os"[k % 2], color=COLORS[k])
        ax.annotate(r["run"], (x, r["s_per_submission"]), textcoords="offset points", xytext=(5, -3),
                    fontsize=7)
    for k, g in enumerate(graders):
        ax.plot([], [], "os"[k % 2], color=COLORS[k], label=g)
    ax.set_xticks(range(len(workers)), [f"{w} worker{'s' if w > 1 else ''}" for w in workers])
    ax.set_xlim(-0.8, len(workers) - 0.2)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("seconds per submission")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- credit assignment
def estimator_errors(rows: list[dict]) -> dict[tuple[str, int], dict[str, float]]:
    """``{(policy, budget): {estimator: mean squared error per turn against the exact advantage}}``."""
    return {(r["policy"], r["budget"]): {n: e["turn"]["mse"] for n, e in r["estimators"].items()}
            for r in rows}


def estimators_figure(rows: list[dict]):
    """Each estimator's error per turn against the exact advantage: a panel per policy, a bar per budget."""
    errors = estimator_errors(rows)
    policies = list(dict.fromkeys(p for p, _ in errors))
    budgets = sorted({b for _, b in errors})
    names = list(dict.fromkeys(n for e in errors.values() for n in e))
    fig, axes = subplots(len(policies), height=0.28 * len(names) + 1.4, sharey=True)
    height = 0.8 / len(budgets)
    for ax, policy in zip(axes, policies):
        for k, budget in enumerate(budgets):
            got = errors.get((policy, budget), {})
            ys = [i + (k - (len(budgets) - 1) / 2) * height for i in range(len(names))]
            ax.barh(ys, [got.get(n, float("nan")) for n in names], height, color=COLORS[k],
                    label=f"{budget} episodes")
        ax.set_title(policy, fontsize=9)
        ax.set_xlabel("MSE per turn")
    return rows_panels(fig, axes, names)


def two_lowest(errors: dict[str, float]) -> set[str]:
    return set(sorted(errors, key=errors.get)[:2])


def interval_above(a: dict, b: dict) -> bool:
    """Whether ``a``'s 95% interval lies wholly above ``b``'s."""
    return a["ci_low"] > b["ci_high"]


def arms_facts(rows: list[dict], split: str, baseline: str = "cold start") -> dict:
    """Per seed: the arms whose interval on ``split`` lies wholly above the baseline's, and whether the RL
    arms' intervals share a common point (no arm told apart from another)."""
    out = {}
    for seed in dict.fromkeys(r["seed"] for r in rows):
        mine = {r["arm"]: r["eval"][split] for r in rows if r["seed"] == seed}
        base = mine.pop(baseline)
        out[seed] = {"above": [a for a, e in mine.items() if interval_above(e, base)], "arms": len(mine),
                     "overlap": max(e["ci_low"] for e in mine.values())
                     <= min(e["ci_high"] for e in mine.values())}
    return out


def arms_figure(rows: list[dict], splits: list[str]):
    """Each arm's success with its 95% interval, per seed, on each split."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    fig, axes = subplots(len(splits), height=0.35 * len(arms) + 1.5, sharey=True)
    for ax, split in zip(axes, splits):
        for k, seed in enumerate(seeds):
            mine = {r["arm"]: r["eval"][split] for r in rows if r["seed"] == seed}
            ys = [arms.index(a) + 0.2 * (k - (len(seeds) - 1) / 2) for a in mine]
            xs = [e["success"] for e in mine.values()]
            err = [[e["success"] - e["ci_low"] for e in mine.values()],
                   [e["ci_high"] - e["success"] for e in mine.values()]]
            ax.errorbar(xs, ys, xerr=err, fmt="o", ms=3, capsize=2, color=COLORS[k], label=f"seed {seed}")
        ax.set_title(split.replace("_", " "), fontsize=9)
        ax.set_xlabel("success, 95% interval")
    return rows_panels(fig, axes, arms)


# ----------------------------------------------------------------------------- micro-batches and mutation
def micro_batch_figure(rows: list[dict]):
    """The training step's peak memory at each micro-batch size (0: the whole batch at once)."""
    fig, (ax,) = subplots(1, height=2.4)
    labels = [str(r["micro_batch_size"] or "whole") for r in rows]
    ax.barh(range(len(rows)), [r["peak_step_mib"] for r in rows], color=COLORS[0])
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_ylabel("micro-batch")
    ax.set_xlabel("peak memory of one step, MiB")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def mutation_figure(rows: list[dict]):
    """The share of planted bugs the tests kill in each module, against the share over all of them."""
    modules = [r for r in rows if r["module"] != "all"]
    overall = next((r for r in rows if r["module"] == "all"), None)
    fig, (ax,) = subplots(1, height=0.25 * len(modules) + 1.0)
    # dots, not bars: the axis starts near the lowest score, where a bar's length would mislead
    ax.plot([r["score"] for r in modules], range(len(modules)), "o", color=COLORS[2])
    ax.set_yticks(range(len(modules)), [r["module"].removeprefix("agent_lab.") for r in modules], fontsize=8)
    ax.invert_yaxis()
    if overall:
        ax.axvline(overall["score"], color="black", ls="--", lw=1, label="all modules")
        ax.legend(fontsize=8, loc="lower left")
    low = min(r["score"] for r in modules)
    ax.set_xlim(max(0.0, low - 0.05), 1.0)
    ax.set_xlabel("share of mutants killed")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- the crafting learning curve
#: What a crafting curve can be drawn against: a line's training seconds (evaluations excluded), or the
#: demonstrations and RL episodes it has trained on so far (the data a recipe spends).
CURVE_X = {"train_s": "training seconds", "budget": "demonstrations + RL episodes"}
RL_SHADE = {"color": "grey", "alpha": 0.12, "lw": 0}


def curve_x(line: dict, x: str = "train_s") -> float:
    """Where one curve line lies on the axis ``x`` (a key of :data:`CURVE_X`)."""
    if x == "budget":
        return line.get("demonstrations", 0) + line.get("episodes", 0)
    return line[x]


def evaluations(lines: list[dict], kind: str = "sample") -> list[dict]:
    """The curve's lines of one ``kind`` ("sample" or "confirm") that carry an evaluation: the header and a
    line cut short carry none, and are left out instead of stopping the figure."""
    return [line for line in lines if isinstance(line, dict) and line.get("kind") == kind
            and isinstance(line.get("splits"), dict) and "train_s" in line]


def curve_points(lines: list[dict], split: str, level: str, kind: str = "sample",
                 x: str = "train_s") -> Curve:
    """(``x``, greedy success) of one split and level at each ``kind`` line of a crafting curve."""
    return [(curve_x(line, x), line["splits"][split][level]["success"]) for line in evaluations(lines, kind)
            if level in line["splits"].get(split, {})]


def phase_lines(lines: list[dict], phase: str) -> list[dict]:
    return [line for line in evaluations(lines) if line.get("phase") == phase]


def rl_start(lines: list[dict], x: str = "train_s") -> float | None:
    """Where RL took over from SFT on the axis ``x`` (the last SFT evaluation's); None before any RL."""
    sft, rl = phase_lines(lines, "sft"), phase_lines(lines, "rl")
    return curve_x(sft[-1], x) if sft and rl else None


def level_number(level: str) -> int:
    """``"level 3"`` -> 3."""
    return int(level.split()[-1])


def level_target(target: dict, level: str) -> float | None:
    """The share of the planner's success that ``level`` ("level N") must reach, from a curve header's
    ``target`` (rules such as ``{"level <= 2": 0.95, "level >= 3": 0.8}``); None where no rule names it."""
    n = level_number(level)
    for rule, share in target.items():
        word, op, bound = (rule.split() + ["", "", ""])[:3]
        if word == "level" and bound.isdigit() and {"<=": n <= int(bound), ">=": n >= int(bound)}.get(op):
            return share
    return None


def curve_levels(lines: list[dict]) -> tuple[list[str], list[str]]:
    """The splits and levels a curve's evaluations cover, in the order they first appear."""
    body = evaluations(lines) + evaluations(lines, "confirm")
    splits = list(dict.fromkeys(s for line in body for s in line["splits"]))
    levels = sorted({lv for line in body for by in line["splits"].values() for lv in by},
                    key=level_number)
    return splits, levels


def shade_rl(ax, lines: list[dict], x: str) -> None:
    """Grey from where RL took over to the curve's last evaluation: the RL phase."""
    start = rl_start(lines, x)
    if start is not None:
        ax.axvspan(start, curve_x(phase_lines(lines, "rl")[-1], x), **RL_SHADE)


def crafting_curve_figure(lines: list[dict], x: str = "train_s"):
    """One crafting curve: greedy success per level against ``x``, a panel per split; the RL phase shaded,
    confirmations on more worlds as diamonds, each level's target dashed."""
    splits, levels = curve_levels(lines)
    target = (lines[0].get("target") or {}) if lines else {}
    fig, axes = subplots(max(len(splits), 1), height=2.9, sharey=True)
    for ax, split in zip(axes, splits):
        shade_rl(ax, lines, x)
        for k, level in enumerate(levels):
            points = curve_points(lines, split, level, x=x)
            if points:
                ax.plot(*zip(*points), color=COLORS[k], drawstyle="steps-post", label=level, **BOLD)
            confirm = curve_points(lines, split, level, "confirm", x)
            ax.plot([p for p, _ in confirm], [s for _, s in confirm], "D", color=COLORS[k], ms=5, ls="")
        for i, share in enumerate(sorted({level_target(target, lv) for lv in levels} - {None})):
            ax.axhline(share, color="black", ls="--", lw=0.8, label=None if i else "targets")
        ax.set_title(split.replace("_", " "))
        finish_curve_axis(ax, x, CURVE_X[x] + " (grey: RL)")
    axes[0].set_ylabel("greedy success")
    if axes[-1].get_legend_handles_labels()[0]:
        axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def finish_curve_axis(ax, x: str, label: str) -> None:
    ax.set_xlabel(label)
    if x == "budget":
        ax.xaxis.set_major_formatter(THOUSANDS)
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)


def curve_label(name: str, lines: list[dict]) -> str:
    """A curve's name and how it decodes (the setting it trains in): with the candidate mask or without."""
    mask = (lines[0].get("candidate_mask") if lines else None)
    return name if mask is None else f"{name} ({'mask' if mask else 'no mask'})"


def compare_curves_figure(curves: dict[str, list[dict]], split: str = "test", level: str = "level 3"):
    """Every curve's greedy success on one split and level, against training seconds and against
    demonstrations plus RL episodes, one line per curve: solid while it trains by SFT, dashed in RL;
    confirmations as diamonds; the level's target dashed black."""
    height, legend = legend_below((len(curves) + 5) // 2)  # the curves, then the four keys, two columns
    fig, axes = subplots(2, height=height, sharey=True)
    targets = {level_target(lines[0].get("target") or {}, level) for lines in curves.values() if lines}
    for ax, x in zip(axes, CURVE_X):
        for k, (name, lines) in enumerate(curves.items()):
            color = COLORS[k % 10]
            for phase, style in (("sft", "-"), ("rl", "--")):
                mine = phase_lines(lines, phase)
                if phase == "rl" and mine:
                    mine = phase_lines(lines, "sft")[-1:] + mine  # the dashed part starts where SFT ended
                points = curve_points(mine, split, level, x=x)
                if points:
                    ax.plot(*zip(*points), color=color, ls=style, drawstyle="steps-post", lw=1.6,
                            label=curve_label(name, lines) if phase == "sft" else None)
            confirm = curve_points(lines, split, level, "confirm", x)
            ax.plot([p for p, _ in confirm], [s for _, s in confirm], "D", color=color, ms=5, ls="")
        for share in targets - {None}:
            ax.axhline(share, color="black", ls="--", lw=0.8, label="target")
        finish_curve_axis(ax, x, CURVE_X[x])
    for style, label in (("-", "SFT"), ("--", "RL")):
        axes[0].plot([], [], color="grey", ls=style, label=label)
    axes[0].plot([], [], "D", color="grey", ms=5, ls="", label="confirmed on more worlds")
    axes[0].set_ylabel(f"{split.replace('_', ' ')}, {level}")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig


def mistake_points(lines: list[dict], split: str = "test", level: str = "level 3",
                   kind: str = "off the goal's tree") -> dict[str, Curve]:
    """Along a curve (its sample evaluations that count failed episodes by first mistake, ``mistakes``), the
    share of the sample's episodes at ``split`` and ``level`` whose first mistake was ``kind``
    (``"mistake"``), and the share of every other failed one (``"other"``), against demonstrations plus RL
    episodes. Evaluations from before the curve counted mistakes are left out."""
    out: dict[str, Curve] = {"mistake": [], "other": []}
    for line in evaluations(lines):
        g = line["splits"].get(split, {}).get(level)
        if not g or "mistakes" not in g:
            continue
        failed = g["n"] - g["successes"]
        if sum(g["mistakes"].values()) != failed:
            raise ValueError(f"step {line['step']}: {sum(g['mistakes'].values())} failed episodes counted by "
                             f"first mistake, {failed} failed: the curve line is damaged")
        mine = g["mistakes"].get(kind, 0)
        x = curve_x(line, "budget")
        out["mistake"].append((x, mine / g["n"]))
        out["other"].append((x, (failed - mine) / g["n"]))
    return out


def mistakes_figure(curves: dict[str, list[dict]], level: str = "level 3", kind: str = "off the goal's tree"):
    """For each curve that counts failed episodes by first mistake, a panel per split: the share of the
    sample's episodes at ``level`` that failed first at ``kind`` (solid) and at any other mistake (dotted),
    against demonstrations plus RL episodes."""
    splits = ("test", "held_out_goals")
    shown = {n: lines for n, lines in curves.items() if mistake_points(lines, splits[0], level, kind)["mistake"]}
    height, legend = legend_below((len(shown) + 3) // 2)
    fig, axes = subplots(len(splits), height=height, sharey=True)
    for ax, split in zip(axes, splits):
        for k, (name, lines) in enumerate(shown.items()):
            points = mistake_points(lines, split, level, kind)
            ax.plot(*zip(*points["mistake"]), color=COLORS[k % 10], lw=1.6, label=curve_label(name, lines))
            ax.plot(*zip(*points["other"]), color=COLORS[k % 10], lw=1.2, ls=":")
        finish_curve_axis(ax, "budget", CURVE_X["budget"])
        ax.set_title(f"{split.replace('_', ' ')}, {level}", fontsize=9)
    axes[0].plot([], [], color="grey", label=f"first mistake: {kind}")
    axes[0].plot([], [], color="grey", ls=":", label="any other first mistake")
    axes[0].set_ylabel("share of the sample's episodes")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig


# ----------------------------------------------------------------------------- the imitation loss by role
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def role_loss_points(lines: list[dict], level: str) -> dict[str, Curve]:
    """Along a curve, per role, the planner's tokens' mean negative log-likelihood (nats per token) at ``level``
    of the test worlds against demonstrations plus RL episodes, from the sample evaluations that carry ``nll``
    (curves trained before the harness scored it carry none)."""
    out: dict[str, Curve] = {}
    for line in evaluations(lines):
        for role, r in line.get("nll", {}).get(level, {}).items():
            out.setdefault(role, []).append((curve_x(line, "budget"), r["nll"]))
    return out


def role_loss_facts(curves: dict[str, list[dict]], levels: tuple[str, ...] = ("level 2", "level 3")) -> dict:
    """For each curve whose sample evaluations carry ``nll``, its first and last such evaluation (``first``,
    ``last``: step and demonstrations + episodes ``x``) and there, per level of ``levels``: each role's
    ``nll`` and ``share`` of the level's summed nats, ``items`` (the summed share of :data:`~agent_lab.envs.crafting.ITEM_ROLES`)
    and ``largest`` (the role with the largest share)."""
    out = {}
    for name, lines in curves.items():
        scored = [line for line in evaluations(lines) if line.get("nll")]
        if not scored:
            continue

        def at(line: dict) -> dict:
            by = {}
            for level in levels:
                roles = line["nll"].get(level, {})
                if abs(sum(r["share"] for r in roles.values()) - 1) > 1e-6:
                    raise ValueError(f"{name} step {line['step']}: the shares of {level}'s loss do not sum to 1")
                by[level] = {"roles": roles, "items": sum(roles[r]["share"] for r in ITEM_ROLES if r in roles),
                             "largest": max(roles, key=lambda r: roles[r]["share"])}
            return {"step": line["step"], "x": curve_x(line, "budget"), "levels": by}
        out[name] = {"first": at(scored[0]), "last": at(scored[-1])}
    return out


def role_loss_figure(curves: dict[str, list[dict]], levels: tuple[str, ...] = ("level 1", "level 2", "level 3"),
                     least_share: float = 0.05):
    """A panel per level of the test worlds: the planner's tokens' mean nats per token under each curve's
    policy, a colour per role (those that ever hold at least ``least_share`` of a level's loss) and a line
    style per curve, against demonstrations plus RL episodes."""
    shown = {n: lines for n, lines in curves.items() if any(line.get("nll") for line in evaluations(lines))}
    held = [(role, r["share"]) for lines in shown.values() for line in evaluations(lines)
            for by_role in line.get("nll", {}).values() for role, r in by_role.items()]
    roles = list(dict.fromkeys(role for role, share in held if share >= least_share))  # in the record's order
    height, legend = legend_below((len(roles) + len(shown) + 1) // 2)
    fig, axes = subplots(len(levels), height=height, sharey=True)
    for ax, level in zip(axes, levels):
        for k, lines in enumerate(shown.values()):
            points = role_loss_points(lines, level)
            for j, role in enumerate(roles):
                if points.get(role):
                    ax.plot(*zip(*points[role]), color=COLORS[j % 10], ls=LINESTYLES[k % len(LINESTYLES)], lw=1.4,
                            marker="o", ms=2)
        ax.set_xlabel(CURVE_X["budget"], fontsize=8)
        ax.xaxis.set_major_formatter(THOUSANDS)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(f"test, {level}", fontsize=9)
    axes[0].set_ylabel("nats per token")
    for j, role in enumerate(roles):
        axes[0].plot([], [], color=COLORS[j % 10], label=role)
    for k, (name, lines) in enumerate(shown.items()):
        axes[0].plot([], [], color="grey", ls=LINESTYLES[k % len(LINESTYLES)], label=name)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig


def total_steps(header: dict) -> int | None:
    """The recipe's SFT plus RL steps, from the header's configuration (None if it has none)."""
    cfg = header.get("config") or {}
    try:
        return cfg["sft"]["steps"] + cfg["algorithm"]["steps"]
    except (KeyError, TypeError):
        return None


def crafting_curve_facts(lines: list[dict]) -> dict:
    """Where one crafting curve stands: its settings; the first sample that met the target and the first
    confirmation that did (step, training seconds, demonstrations + RL episodes), or how far the curve has
    got without one; where RL took over; whether the run has finished (a confirmation met the target, or
    one came after the recipe's last step) or the curve is partial."""
    header = lines[0] if lines else {}
    samples, confirms = evaluations(lines), evaluations(lines, "confirm")
    met = next((line for line in confirms if line.get("target_met")), None)
    sample_met = next((line for line in samples if line.get("target_met")), None)
    body = sorted(samples + confirms, key=lambda line: line["step"])
    last = body[-1] if body else None
    end = total_steps(header)
    ended = end is not None and any(line["step"] >= end for line in confirms)
    sft = phase_lines(lines, "sft")
    return {"recipe": header.get("recipe"), "seed": header.get("seed"), "mask": header.get("candidate_mask"),
            "met_s": met["train_s"] if met else None, "met_step": met["step"] if met else None,
            "met_budget": curve_x(met, "budget") if met else None,
            "confirmed_on": met["per_level"] if met else None,
            "sample_met_step": sample_met["step"] if sample_met else None,
            "last_s": last["train_s"] if last else None, "last_step": last["step"] if last else None,
            "last_budget": curve_x(last, "budget") if last else None,
            "rl_start_step": sft[-1]["step"] if rl_start(lines) is not None else None,
            "confirmed": bool(confirms), "finished": met is not None or ended}


def rl_change(lines: list[dict], split: str, level: str) -> dict | None:
    """What RL changed on one split and level: the success at the end of SFT against the curve's last RL
    sample (the same fixed worlds), each with its 95% interval, whether the intervals overlap, and the RL
    steps and training seconds in between; None while the curve has no RL evaluation."""
    sft, rl = phase_lines(lines, "sft"), phase_lines(lines, "rl")
    if not sft or not rl or level not in sft[-1]["splits"].get(split, {}) \
            or level not in rl[-1]["splits"].get(split, {}):
        return None
    before, after = sft[-1]["splits"][split][level], rl[-1]["splits"][split][level]
    return {"before": before, "after": after, "steps": rl[-1]["step"] - sft[-1]["step"],
            "seconds": rl[-1]["train_s"] - sft[-1]["train_s"],
            "overlap": not interval_above(after, before) and not interval_above(before, after)}


def is_branch(lines: list[dict]) -> bool:
    """Whether a curve is RL branched from another curve's cold start (``crafting_curve.py --branch-from``):
    its header names the parent."""
    return bool(lines) and isinstance(lines[0].get("parent"), dict)


def is_sft_branch(lines: list[dict]) -> bool:
    """Whether a branch goes on with SFT alone past its source's end (more SFT steps than its parent's): the
    control that sets SFT beside RL from the same cold start."""
    if not is_branch(lines):
        return False
    mine, theirs = lines[0].get("config") or {}, lines[0]["parent"].get("config") or {}
    return (mine.get("sft") or {}).get("steps", 0) > (theirs.get("sft") or {}).get("steps", 0)


#: How a branch's progress is counted: training steps, or training seconds, since its cold start.
BRANCH_AXES = {"step": "RL steps from the cold start", "train_s": "training seconds since the cold start"}


def branch_points(lines: list[dict], split: str, level: str, by: str = "step") -> list[tuple[float, dict]]:
    """(steps, or training seconds with ``by="train_s"``, since the cold start; the sample's record) of one
    split and level along a branch, the cold start first at 0."""
    body = evaluations(lines)
    if not body:
        return []
    start = body[0][by]
    return [(line[by] - start, line["splits"][split][level]) for line in body
            if level in line["splits"].get(split, {})]


def equal_seconds(rl: list[dict], sft: list[dict], split: str, level: str = "level 3") -> dict | None:
    """An RL branch against SFT alone from the same cold start at equal training seconds: the horizon is the
    shorter branch's last evaluation, each branch read at its last sample at or before it; whether either's
    95% interval lies wholly above the other's. None until both have evaluated past the cold start."""
    a, b = branch_points(rl, split, level, "train_s"), branch_points(sft, split, level, "train_s")
    if len(a) < 2 or len(b) < 2:
        return None
    horizon = min(a[-1][0], b[-1][0])
    (sa, ra), (sb, rb) = [p for p in a if p[0] <= horizon][-1], [p for p in b if p[0] <= horizon][-1]
    return {"seconds": horizon, "rl": ra, "rl_s": sa, "sft": rb, "sft_s": sb,
            "rl_above": interval_above(ra, rb), "sft_above": interval_above(rb, ra)}


def distinct_names(names: list[str], sep: str = "-") -> tuple[dict[str, str], str]:
    """Each name without the ``sep``-separated words all of them begin and end with, and the shared words as
    ``"begin…end"`` ("" when there are none): a legend of several long names shows what tells them apart.
    Every name keeps at least one word; a single name is kept whole."""
    if len(names) < 2:
        return {n: n for n in names}, ""
    words = [n.split(sep) for n in names]
    head = tail = 0
    while all(len(w) > head + 1 and w[head] == words[0][head] for w in words):
        head += 1
    while all(len(w) > head + tail + 1 and w[-1 - tail] == words[0][-1 - tail] for w in words):
        tail += 1
    short = {n: sep.join(w[head:len(w) - tail]) for n, w in zip(names, words)}
    begin, end = sep.join(words[0][:head]), sep.join(words[0][len(words[0]) - tail:])
    shared = f"{begin}{sep if begin else ''}…{sep if end else ''}{end}" if head or tail else ""
    return short, shared


def branches_figure(curves: dict[str, list[dict]], level: str = "level 3", by: str = "step"):
    """The branches of one cold start side by side: ``level`` success against steps (or training seconds,
    ``by="train_s"``) since the cold start, a panel per split, each evaluation with its Wilson 95% interval
    as an error bar; the legend names each branch by what its name does not share with the others."""
    splits = list(dict.fromkeys(s for lines in curves.values() for s in curve_levels(lines)[0]))
    height, legend = legend_below(len(curves) + 2)  # one line per branch, and the shared words
    short, shared = distinct_names(list(curves))
    fig, axes = subplots(max(len(splits), 1), height=height, sharey=True)
    for ax, split in zip(axes, splits):
        for k, (name, lines) in enumerate(curves.items()):
            points = branch_points(lines, split, level, by)
            if not points:
                continue
            x = [p + (2 if by == "step" else 20) * k for p, _ in points]  # keeps each branch's bars apart
            y = [r["success"] for _, r in points]
            err = [[r["success"] - r["ci_low"] for _, r in points],
                   [r["ci_high"] - r["success"] for _, r in points]]
            ax.errorbar(x, y, yerr=err, color=COLORS[k % 10], marker="o", ms=4, capsize=3, lw=1.4,
                        label=short[name])
        ax.set_title(f"{split.replace('_', ' ')}, {level}", fontsize=9)
        ax.set_xlabel(BRANCH_AXES[by])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy success")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=1, fontsize=7,
               title=shared or None, title_fontsize=7)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig


def branches_facts(curves: dict[str, list[dict]], level: str = "level 3") -> dict:
    """Per branch, per split: what RL changed at ``level`` (:func:`rl_change`); the branches that moved a
    split so that the intervals do not overlap, up or down; and the largest gain on any split."""
    changes = {name: {s: c for s in curve_levels(lines)[0] if (c := rl_change(lines, s, level))}
               for name, lines in curves.items()}
    up = sorted((n, s) for n, by in changes.items() for s, c in by.items()
                if not c["overlap"] and c["after"]["success"] > c["before"]["success"])
    down = sorted((n, s) for n, by in changes.items() for s, c in by.items()
                  if not c["overlap"] and c["after"]["success"] < c["before"]["success"])
    gains = [(c["after"]["success"] - c["before"]["success"], n, s) for n, by in changes.items()
             for s, c in by.items()]
    return {"changes": changes, "up": up, "down": down, "best": max(gains) if gains else None}


def failures_facts(records: dict[str, dict], level: str = "level 3") -> dict:
    """From ``bench/results/crafting_curve/failures.json``'s records (``bench/crafting_failures.py``): per
    record and split, at ``level``, the episodes ``n``, the ``failed`` ones and their kinds ``by_kind`` (most
    common first); ``by``, what the records count them by (their ``"by"``: "first mistake", or "first refused
    action" in records from before there was one), and ``ValueError`` if records count differently; and
    ``top``, the kind that is the most common in every record and split, or None when no one kind is."""
    counted = {r.get("by", "first refused action") for r in records.values()}
    if len(counted) > 1:
        raise ValueError(f"the records count failed episodes in different ways ({sorted(counted)}): rerun "
                         "bench/crafting_failures.py on every run of the file, so that they count alike")

    def ranked(counts: dict) -> dict:  # most common first, whatever order the file keeps
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    facts = {name: {split: {"n": g["n"], "failed": g["n"] - g["successes"], "by_kind": ranked(g["failures"])}
                    for split, levels in r["splits"].items() if (g := levels.get(level))}
             for name, r in records.items()}
    tops = {max(f["by_kind"], key=f["by_kind"].get) if f["by_kind"] else None
            for by in facts.values() for f in by.values()}
    return {"records": facts, "by": counted.pop() if counted else None, "top": tops.pop() if len(tops) == 1 else None}


def failures_figure(records: dict[str, dict], level: str = "level 3"):
    """Why greedy episodes fail at ``level``: a panel per split, a bar per record whose length is the share of
    episodes failed, split by the failed episodes' kinds (the records' ``by``)."""
    facts, by = (failures_facts(records, level)[k] for k in ("records", "by"))
    splits = sorted({s for by in facts.values() for s in by}, key=lambda s: (s != "test", s))  # test first
    kinds = list(dict.fromkeys(k for by in facts.values() for f in by.values() for k in f["by_kind"]))
    height, legend = legend_below((len(kinds) + 1) // 2, panel_height=1.2 + 0.35 * len(facts))
    fig, axes = subplots(max(len(splits), 1), height=height, sharey=True)
    names = list(facts)
    for ax, split in zip(axes, splits):
        left = [0.0] * len(names)
        for k, kind in enumerate(kinds):
            width = [facts[n][split]["by_kind"].get(kind, 0) / facts[n][split]["n"] if split in facts[n] else 0.0
                     for n in names]
            ax.barh(range(len(names)), width, left=left, color=COLORS[k % 10], label=kind)
            left = [a + b for a, b in zip(left, width)]
        ax.set_title(f"{split.replace('_', ' ')}, {level}", fontsize=9)
        ax.set_xlabel("share of episodes failed")
        ax.grid(alpha=0.3, axis="x")
    axes[0].set_yticks(range(len(names)), names, fontsize=7)
    axes[0].invert_yaxis()  # the first record at the top
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7,
               title=by)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig


def first_to_target(curves: dict[str, list[dict]], x: str = "train_s") -> tuple[str, float] | None:
    """The curve whose confirmation met the target first on the axis ``x`` ("train_s" or "budget"), and
    where; None while no curve has."""
    key = {"train_s": "met_s", "budget": "met_budget"}[x]
    met = [(f[key], name) for name, f in ((n, crafting_curve_facts(c)) for n, c in curves.items())
           if f[key] is not None]
    return (min(met)[1], min(met)[0]) if met else None


def curve_sentence(name: str, lines: list[dict]) -> str:
    """Where one crafting curve stands, in a sentence built from :func:`crafting_curve_facts`."""
    f = crafting_curve_facts(lines)
    how = (f"`{name}` ({f['recipe']}, seed {f['seed']}, "
           f"{'with' if f['mask'] else 'without'} the candidate mask)")
    if f["last_s"] is None:
        return f"{how} has no evaluation yet."
    if f["met_s"] is not None:
        return (f"{how} met the crafting target after {f['met_s']:.0f} s of training (step {f['met_step']}, "
                f"{f['met_budget']:,} demonstrations and RL episodes), confirmed on {f['confirmed_on']} "
                "worlds per level.")
    state = "the run ended without meeting it" if f["finished"] else "the curve is partial"
    return (f"{how} has not met the target by {f['last_s']:.0f} s of training (step {f['last_step']}, "
            f"{f['last_budget']:,} demonstrations and RL episodes); {state}.")


def interval_text(r: dict) -> str:
    return f"{r['success']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


#: The RL diagnostics a curve line may carry (``bench/crafting_curve.py``'s ``rl`` field), as a sentence names
#: them, and whether each is a share (written as a percentage) or a plain number.
RL_WORDS = {"success": ("sampled success", True), "rejected_share": ("refused actions", True),
            "degenerate_fraction": ("groups whose episodes all scored the same", True),
            "entropy": ("the policy's entropy (nats per action token)", False)}


def rl_diagnostics_sentence(lines: list[dict]) -> str:
    """How the sampled batches changed over the RL phase: each diagnostic of :data:`RL_WORDS` in the first
    RL window against the last (the means the curve's lines record since their previous line); "" when the
    curve records none."""
    windows = [line["rl"] for line in phase_lines(lines, "rl") if isinstance(line.get("rl"), dict)]
    if not windows:
        return ""
    first, last = windows[0], windows[-1]

    def show(value: float, share: bool) -> str:
        return f"{value:.0%}" if share else f"{value:.3f}"
    moves = [f"{words} {show(first[k], share)} → {show(last[k], share)}"
             for k, (words, share) in RL_WORDS.items() if k in first and k in last]
    return ("From its first RL window to its last, in the batches it sampled: " + "; ".join(moves) + "."
            if moves else "")


def rl_sentence(lines: list[dict], level: str = "level 3") -> str:
    """What RL changed at ``level`` on each split against the end of SFT (:func:`rl_change`), and whether the
    95% intervals tell the two apart, in a sentence."""
    splits, _ = curve_levels(lines)
    changes = {s: c for s in splits if (c := rl_change(lines, s, level))}
    if not changes:
        ended = crafting_curve_facts(lines)["finished"]
        return "It ended before any RL step." if ended else "It has no RL evaluation yet."
    first = next(iter(changes.values()))
    moves = "; ".join(f"{s.replace('_', ' ')} {interval_text(c['before'])} → {interval_text(c['after'])}"
                      for s, c in changes.items())
    apart = [s.replace("_", " ") + (" up" if c["after"]["success"] > c["before"]["success"] else " down")
             for s, c in changes.items() if not c["overlap"]]
    verdict = (f"the intervals do not overlap on {', '.join(apart)}" if apart else
               "the intervals overlap on every split: no change this sample can tell apart")
    return (f"Its {first['steps']} RL steps ({first['seconds']:.0f} s of training) took {level} success from "
            f"the end of SFT to its last RL evaluation, on the same {first['after']['n']} worlds per level: "
            f"{moves}; {verdict}.")


# ----------------------------------------------------------------------------- levers against the recipe
#: What a lever's interval says against the recipe's at equal demonstrations, and the colour its dot takes.
VERDICTS = {"ahead": COLORS[2], "within": COLORS[0], "behind": COLORS[3]}
RECORD = ("successes", "n", "ci_low", "ci_high")


def lever_points(lines: list[dict], base_lines: list[dict], split: str = "test") -> list[dict]:
    """A lever curve against the recipe's curve (``base_lines``, ``crafting-full-seed0``) at equal data: the
    lever's last sample evaluation at whose demonstrations + RL episodes (:func:`curve_x`, "budget") the
    recipe also has a sample evaluation; per level of ``split`` both carry, ``{"level", "x", "lever",
    "base"}``, the two records' successes, n, success and Wilson 95% interval. Empty where the two share no
    such point. Only sample evaluations (the recipe's are 20 fixed worlds per level) are compared: the
    recipe's curve was confirmed on 200 worlds at its end alone, so a lever's confirmation has nothing to
    meet at equal data; on 20 worlds only a large difference lies outside both intervals."""
    base = {curve_x(line, "budget"): line for line in evaluations(base_lines)}
    shared = [line for line in evaluations(lines) if curve_x(line, "budget") in base]
    if not shared:
        return []
    mine = shared[-1]
    x = curve_x(mine, "budget")
    theirs = base[x]["splits"].get(split, {})

    def record(r: dict) -> dict:
        return {**{k: r[k] for k in RECORD}, "success": r["successes"] / r["n"]}
    return [{"level": level, "x": x, "lever": record(r), "base": record(theirs[level])}
            for level, r in sorted(mine["splits"].get(split, {}).items(), key=lambda kv: level_number(kv[0]))
            if level in theirs]


def verdict(point: dict) -> str:
    """"ahead" where the lever's 95% interval lies wholly above the recipe's, "behind" wholly below, else
    "within" (the intervals overlap: this sample does not tell them apart)."""
    if interval_above(point["lever"], point["base"]):
        return "ahead"
    return "behind" if interval_above(point["base"], point["lever"]) else "within"


def lever_name(name: str) -> str:
    """A lever curve's name without the ``lever-`` its file names all carry, nor a ``-seed0``."""
    return name.removeprefix("lever-").removesuffix("-seed0")


SEED_SUFFIX = re.compile(r"-seed\d+$")  # a curve file's seed: crafting-full-seed1, lever-x-seed1


def same_seed(name: str, base: str) -> str:
    """The curve of recipe ``base`` (``crafting-full-seed0``) on curve ``name``'s seed (its ``-seed<k>``; none:
    ``base``'s own): a lever is compared with the recipe trained from the same random draws."""
    seed = SEED_SUFFIX.search(name)
    return SEED_SUFFIX.sub("", base) + seed.group() if seed else base


def levers_vs_baseline_facts(curves: dict[str, list[dict]], base: str = "crafting-full-seed0",
                             split: str = "test") -> dict:
    """Every ``lever-*`` curve against the recipe's curve on the lever's seed (:func:`same_seed` of ``base``) at
    equal demonstrations (:func:`lever_points`): ``rows``, per lever, the recipe curve ``base`` it was compared
    with, the demonstrations ``x`` compared at, the ``points`` and each level's ``verdict`` (:func:`verdict`);
    ``bases``, the recipe curves used; ``counts``, per level, how many levers are ahead, within and behind;
    ``ahead`` and ``behind``, per level, the levers that are; ``left_out``, the levers that share no sample point
    with the recipe on their seed (or have no such curve)."""
    levers = [n for n in curves if n.startswith("lever-")]
    rows, left_out = {}, []
    for name in levers:
        mine = same_seed(name, base)
        points = lever_points(curves[name], curves[mine], split) if mine in curves else []
        if not points:
            left_out.append(name)
            continue
        rows[name] = {"base": mine, "x": points[0]["x"], "points": points,
                      "verdict": {p["level"]: verdict(p) for p in points}}
    levels = sorted({lv for r in rows.values() for lv in r["verdict"]}, key=level_number)
    counts = {lv: {v: sum(r["verdict"].get(lv) == v for r in rows.values()) for v in VERDICTS}
              for lv in levels}
    return {"base": base, "bases": sorted({r["base"] for r in rows.values()}), "split": split, "rows": rows,
            "levels": levels, "counts": counts,
            "ahead": {lv: [n for n, r in rows.items() if r["verdict"].get(lv) == "ahead"] for lv in levels},
            "behind": {lv: [n for n, r in rows.items() if r["verdict"].get(lv) == "behind"] for lv in levels},
            "left_out": left_out}


def levers_vs_baseline_figure(curves: dict[str, list[dict]], base: str = "crafting-full-seed0",
                              split: str = "test"):
    """Each lever against the recipe at equal demonstrations (:func:`levers_vs_baseline_facts`), a panel per
    level, a row per lever (named with the demonstrations + episodes it was compared at): the recipe's greedy
    success as a grey dot, the lever's coloured by its verdict, each with its Wilson 95% interval as a bar."""
    f = levers_vs_baseline_facts(curves, base, split)
    names = list(f["rows"])
    height, legend = legend_below(2, panel_height=0.3 * len(names) + 1.3)
    fig, axes = subplots(max(len(f["levels"]), 1), height=height, sharey=True)
    worlds = {p["base"]["n"] for r in f["rows"].values() for p in r["points"]}
    xlabel = "greedy success" + (f" ({min(worlds)} worlds)" if len(worlds) == 1 else "")

    def label(name: str) -> str:  # where it was compared, and its worlds where the recipe's were fewer
        ns = {p["lever"]["n"] for p in f["rows"][name]["points"]} - worlds
        return f"{lever_name(name)} ({f['rows'][name]['x']:,}" + "".join(f"; n={n}" for n in ns) + ")"
    for ax, level in zip(axes, f["levels"]):
        for i, name in enumerate(names):
            point = next((p for p in f["rows"][name]["points"] if p["level"] == level), None)
            if point is None:
                continue
            for who, dy, color in (("base", 0.17, "grey"), ("lever", -0.17, VERDICTS[verdict(point)])):
                r = point[who]
                ax.errorbar([r["success"]], [i + dy], xerr=[[r["success"] - r["ci_low"]],
                                                            [r["ci_high"] - r["success"]]],
                            fmt="o", ms=4, capsize=2, lw=1.2, color=color)
        ax.set_xlim(-0.03, 1.03)
        ax.set_title(f"{split.replace('_', ' ')}, {level}", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    axes[len(axes) // 2].set_xlabel(xlabel, fontsize=8)  # one label: the panels are narrow
    axes[0].set_yticks(range(len(names)), [label(n) for n in names], fontsize=7)
    axes[0].set_ylim(len(names) - 0.5, -0.5)  # the first lever at the top
    recipe = base if set(f["bases"]) <= {base} else SEED_SUFFIX.sub("", base) + " on the lever's seed"
    axes[0].plot([], [], "o", color="grey", label=f"{recipe}, same demonstrations + episodes")
    for v, color in VERDICTS.items():
        axes[0].plot([], [], "o", color=color, label=f"lever, {v}")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig


# ----------------------------------------------------------------------------- levers' imitation loss
#: Environment settings that change only the prompt a demonstration is read from, not its actions.
PROMPT_ONLY = ("reread", "tag_ingredients")
#: Where a lever's logged SFT loss lies against the recipe seeds' at the same demonstrations.
LOSS_VERDICTS = {"below": COLORS[2], "within": COLORS[0], "above": COLORS[3]}


def same_actions(header: dict, base: dict) -> str | None:
    """Why a lever's logged SFT loss cannot be set beside the recipe's (None where it can). The loss is the mean
    over the demonstrated actions' tokens, so both must imitate the same actions of worlds drawn alike (settings
    in :data:`PROMPT_ONLY` aside), and the lever may run no plug-in the recipe does not (a plug-in adds a loss
    term or changes the data)."""
    mine, theirs = header.get("config") or {}, base.get("config") or {}

    def actions(cfg: dict) -> dict:
        return {k: v for k, v in (cfg.get("env_options") or {}).items() if k not in PROMPT_ONLY}
    a, b = actions(mine), actions(theirs)
    if a != b:
        changed = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
        return "other demonstrations (" + ", ".join(f"{k}={a.get(k)}, the recipe's {b.get(k)}" for k in changed) + ")"
    added = sorted(set(mine.get("plugins") or {}) - set(theirs.get("plugins") or {}))
    return f"a plug-in the recipe does not run ({', '.join(added)})" if added else None


def recovery_from(header: dict) -> float:
    """The demonstrations after which the run mixes in recovery demonstrations (other data from then on)."""
    cfg = header.get("config") or {}
    plugin = (cfg.get("plugins") or {}).get("recovery_demonstrations")
    return plugin["from_step"] * cfg["sft"]["batch_size"] if plugin else math.inf


def sft_losses(lines: list[dict], until: float = math.inf) -> dict[float, float]:
    """A curve's logged SFT loss (the mean since the evaluation before) by demonstrations, up to ``until``."""
    return {curve_x(line, "budget"): line["loss"] for line in evaluations(lines)
            if line.get("phase") == "sft" and line.get("loss") is not None and curve_x(line, "budget") <= until}


def loss_vs_recipe_facts(curves: dict[str, list[dict]], bases: tuple[str, ...] = (
        "crafting-full-seed0", "crafting-full-seed1", "crafting-full-seed2")) -> dict:
    """Every ``lever-*`` curve whose SFT loss can be set beside the recipe's (:func:`same_actions`) against the
    recipe's seeds (``bases`` that are committed) at equal demonstrations: its last sample evaluation before
    either mixes in recovery demonstrations at which at least two recipe seeds also evaluated. ``rows``, per
    lever: ``x``, its ``loss``, the seeds' losses there (``recipe``, by seed curve), ``ratio`` (its loss over
    the seeds' mean), ``verdict`` (:data:`LOSS_VERDICTS`: below every seed, above every seed or within) and,
    per seed, the demonstrations at which the seed's loss first came down to the lever's (``reached``; None
    where it had not before it mixed in recovery demonstrations) and ``x`` over them (``demo_share``: the share
    of the recipe's demonstrations the lever needed for the same loss), and ``own_share``, that share against
    the recipe on the lever's own seed (:func:`same_seed`; None where it is not committed or never came down
    to it): the seeds differ among themselves, and the same draws set the lever apart from the seed's noise;
    ``counts`` per verdict; ``left_out``, the other levers with the reason."""
    seeds = [b for b in bases if b in curves]
    rows, left_out = {}, {}
    for name in (n for n in curves if n.startswith("lever-")):
        reason = same_actions(curves[name][0], curves[seeds[0]][0]) if seeds else "no recipe curve"
        if reason:
            left_out[name] = reason
            continue
        until = min(recovery_from(curves[n][0]) for n in (name, *seeds))
        mine, theirs = sft_losses(curves[name], until), {b: sft_losses(curves[b], until) for b in seeds}
        shared = [x for x in mine if sum(x in t for t in theirs.values()) >= 2]
        if not shared:
            left_out[name] = "no evaluation at demonstrations two recipe seeds also evaluated at"
            continue
        x = max(shared)
        recipe = {b: t[x] for b, t in theirs.items() if x in t}
        loss = mine[x]
        verdict = "below" if loss < min(recipe.values()) else "above" if loss > max(recipe.values()) else "within"
        whole = {b: sft_losses(curves[b], recovery_from(curves[b][0])) for b in seeds}
        reached = {b: min((x2 for x2, l2 in t.items() if l2 <= loss), default=None) for b, t in whole.items()}
        share = {b: x / r for b, r in reached.items() if r is not None}
        rows[name] = {"x": x, "loss": loss, "recipe": recipe, "ratio": loss / (sum(recipe.values()) / len(recipe)),
                      "verdict": verdict, "reached": reached, "demo_share": share,
                      "own_share": share.get(same_seed(name, seeds[0]))}
    return {"seeds": seeds, "rows": rows, "left_out": left_out,
            "counts": {v: sum(r["verdict"] == v for r in rows.values()) for v in LOSS_VERDICTS}}


def loss_vs_recipe_figure(curves: dict[str, list[dict]], bases: tuple[str, ...] = (
        "crafting-full-seed0", "crafting-full-seed1", "crafting-full-seed2")):
    """A row per lever of :func:`loss_vs_recipe_facts` (named with the demonstrations it was compared at): the
    recipe seeds' logged SFT loss there as grey dots and the lever's coloured by its verdict, each over the
    seeds' mean there, so that every row reads against 1."""
    f = loss_vs_recipe_facts(curves, bases)
    names = list(f["rows"])
    height, legend = legend_below(2, panel_height=0.25 * len(names) + 1.3)
    fig, (ax,) = subplots(height=height)
    for i, name in enumerate(names):
        r = f["rows"][name]
        mean = r["loss"] / r["ratio"]
        ax.plot([v / mean for v in r["recipe"].values()], [i] * len(r["recipe"]), "o", ms=4, color="grey",
                alpha=0.7)
        ax.plot([r["ratio"]], [i], "o", ms=5, color=LOSS_VERDICTS[r["verdict"]])
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("logged SFT loss over the recipe seeds' mean at equal demonstrations", fontsize=8)
    ax.set_yticks(range(len(names)), [f"{lever_name(n)} ({f['rows'][n]['x']:,.0f})" for n in names], fontsize=7)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.grid(alpha=0.3, axis="x")
    ax.plot([], [], "o", color="grey", label="recipe, each seed with a sample there")
    for v, color in LOSS_VERDICTS.items():
        ax.plot([], [], "o", color=color, label=f"lever, {v} every seed" if v != "within" else "lever, within")
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig


# ----------------------------------------------------------------------------- which items the goal needs
def membership_label(name: str, fields: dict) -> str:
    """An arm of ``bench/crafting_membership.py`` named with the fields it sets (model, training worlds or
    optimisation), values as JSON the way its ``--arm`` wrote them: ``l8 (n_layers=8)``, ``lines
    (line_positions=true)``; an arm that sets none is its name alone."""
    sets = ", ".join(f"{k}={json.dumps(v)}" for k, v in fields.items())
    return f"{name} ({sets})" if sets else name


def membership_facts(record: dict, threshold: float = 0.8) -> dict:
    """From ``bench/results/crafting_membership.json`` (``bench/crafting_membership.py``, written as it runs):
    per arm, in the record's order, its ``fields``, ``label`` (:func:`membership_label`), how many ``scores``
    it has, the ``last_step``, ``last_worlds`` and ``last_balanced`` of its last score (None without one) and
    ``reached_at``, the first training worlds seen at which its balanced accuracy is at least ``threshold``
    (None where it never is); ``first``, the arms that reach it at the fewest worlds (several where they tie),
    and ``first_worlds`` (an empty list and None while none does); ``steps``, the steps an arm runs to (the
    record's ``steps``, or the longest arm's last step where it has none or that is longer); and
    ``partial``, the arms scored short of it (no score yet, or a last step before ``steps``): arms train one
    after another and the file is written as they go."""
    arms = {}
    for name, arm in record["arms"].items():
        rows = arm["rows"]
        last = rows[-1] if rows else {}
        reached = next((r["worlds_seen"] for r in rows if r["balanced"] >= threshold), None)
        arms[name] = {"fields": arm["fields"], "label": membership_label(name, arm["fields"]),
                      "scores": len(rows), "last_step": last.get("step"), "last_worlds": last.get("worlds_seen"),
                      "last_balanced": last.get("balanced"), "reached_at": reached}
    longest = max((a["last_step"] for a in arms.values() if a["last_step"] is not None), default=0)
    steps = max(record.get("steps") or 0, longest)
    at = [a["reached_at"] for a in arms.values() if a["reached_at"] is not None]
    first_worlds = min(at) if at else None
    return {"threshold": threshold, "steps": steps, "arms": arms,
            "first": [n for n, a in arms.items() if at and a["reached_at"] == first_worlds],
            "first_worlds": first_worlds,
            "partial": [n for n, a in arms.items() if a["last_step"] is None or a["last_step"] < steps]}


def membership_figure(record: dict, threshold: float = 0.8):
    """Balanced accuracy on the fixed test worlds against training worlds seen, a line per arm that has a
    score (named with its fields, and "partial" while it is), the 0.5 of a policy that calls every item needed
    dotted and ``threshold`` dashed."""
    f = membership_facts(record, threshold)
    shown = [n for n, a in f["arms"].items() if a["scores"]]
    height, legend = legend_below((len(shown) + 3) // 2, panel_height=3.0)
    fig, (ax,) = subplots(height=height)
    low = 0.5
    for k, name in enumerate(f["arms"]):
        rows, a = record["arms"][name]["rows"], f["arms"][name]
        if not rows:
            continue
        ys = [r["balanced"] for r in rows]
        low = min(low, *ys)
        label = a["label"] + (", partial" if name in f["partial"] else "")
        ax.plot([r["worlds_seen"] for r in rows], ys, color=COLORS[k % 10], lw=1.6, marker=".", ms=3,
                label=label)
    ax.axhline(0.5, color="grey", ls=":", lw=1.2, label="calls every item needed")
    ax.axhline(threshold, color="black", ls="--", lw=1, label=f"{threshold:g} balanced accuracy")
    ax.set_ylim(min(low - 0.03, 0.45), 1.01)
    ax.set_xlabel("training worlds seen")
    ax.xaxis.set_major_formatter(THOUSANDS)
    ax.set_ylabel("balanced accuracy, test worlds")
    ax.grid(alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, legend, 1, 1))
    return fig
