"""Crafting's supervised cold start at several batch sizes, for the same seconds: which learns most per second.

The crafting target asks for a policy trained in 900 s on 2 cores, and the recipe's imitation loss is still high
after that long. A step's cost grows with its batch, so if the loss falls per *update* more than per demonstration,
smaller batches win per second. Each arm here is the crafting recipe's SFT with only ``sft_batch_size`` changed, no
recovery demonstrations and a constant learning rate (the recipe adds both near its end), stopped by the time limit
``--seconds``. The arms run at once, one thread each, so the machine's noise falls on all of them alike; an arm's
seconds are those of one core shared with the others, not of the recipe with the machine to itself. Each arm ends
with the trainer's own final evaluation: greedy success with the candidate mask on ``--eval-size`` test-split
worlds, levels in turn, beside the planner's.

Usage: ``python bench/bench_sft_batch.py [--seconds 900] [--batches 32,8,4] [--seed 0] [--eval-size 150]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _arms import add_child_options, run_fresh, write_result
from _results import RESULTS, save_section

from agent_lab.diagnostics import summary_table
from agent_lab.recipes import recipe
from agent_lab.trainer import train_sft

RECIPE = "crafting-quick"  # the crafting recipes share every SFT setting but their step budgets
WINDOW_S = 150.0  # the loss curve: the mean loss of the steps that ended in each window of this many seconds
ENOUGH_STEPS = 10**6  # more than any arm takes in its seconds: the time limit ends every arm


def loss_curve(history: list[dict], window_s: float = WINDOW_S) -> list[dict]:
    """Per window of ``window_s`` seconds (labelled by its end): the steps done by then and the mean loss of the
    steps that ended in it. Windows in which no step ended are left out."""
    out: list[dict] = []
    losses: list[float] = []
    end = window_s
    for row in history:
        while row["elapsed_s"] > end:
            if losses:
                out.append({"seconds": end, "steps": row["step"], "loss": sum(losses) / len(losses)})
            losses, end = [], end + window_s
        losses.append(row["loss"])
    if losses:  # the last window, labelled by its end like the others, though the run stopped inside it
        out.append({"seconds": end, "steps": history[-1]["step"] + 1, "loss": sum(losses) / len(losses)})
    return out


def arm(batch: int, seconds: float, seed: int, eval_size: int, run_dir: str, **overrides) -> dict:
    """One arm: the recipe's SFT at ``batch`` demonstrations a step, on one thread, until ``seconds`` pass.
    ``overrides`` replace recipe settings (the tests shrink the policy)."""
    base = recipe(RECIPE, seed=seed, **overrides)
    cfg = base.replace(sft_batch_size=batch, sft_steps=ENOUGH_STEPS, sft_slip_from=ENOUGH_STEPS - 1,
                       sft_lr_decay_steps=0, steps=0, cpu_threads=1, time_limit_s=seconds,
                       env_options={**base.env_options, "eval_size": eval_size})
    result = train_sft(cfg, run_dir=run_dir, progress=False)
    steps = len(result.history)
    # the run stops after the step during which its seconds ran out: leave out the window of that one step
    curve = [c for c in loss_curve(result.history, min(WINDOW_S, seconds)) if c["seconds"] <= seconds]
    levels = {str(level): g for level, g in sorted(result.final_eval.by_group.items())}
    return {"batch": batch, "seed": seed, "lr": cfg.sft.lr, "steps": steps, "demonstrations": steps * batch,
            "seconds": result.history[-1]["elapsed_s"], "last_loss": curve[-1]["loss"], "curve": curve,
            "greedy_by_level": " / ".join(f"{g['success']:.2f}" for g in levels.values()),
            "planner_by_level": " / ".join(f"{g['optimum']:.2f}" for g in levels.values()),
            "levels": levels}


def run_arms(args: argparse.Namespace) -> list[dict]:
    """Every arm at once, each in a process of its own."""
    return run_fresh(__file__, *(["--child", batch, "--seconds", args.seconds, "--seed", args.seed,
                                  "--eval-size", args.eval_size] for batch in args.batches), together=True)


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The arms' rows, by the section of ``--results`` they were saved as (none from an arm's process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=900.0, help="training seconds per arm")
    p.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[32, 8, 4],
                   help="SFT batch sizes, comma-separated; the first is the recipe's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-size", type=int, default=150, help="test-split worlds in the final evaluation")
    add_child_options(p, type=int)
    p.add_argument("--results", type=Path, default=RESULTS / "bench_sft_batch.json")
    args = p.parse_args(argv)
    if args.child is not None:
        with tempfile.TemporaryDirectory() as tmp:
            row = arm(args.child, args.seconds, args.seed, args.eval_size, f"{tmp}/run")
        write_result(args.out, row)
        return {}
    rows = run_arms(args)
    print(summary_table(rows, ["batch", "steps", "demonstrations", "seconds", "last_loss", "greedy_by_level",
                               "planner_by_level"]))
    save_section(args.results, f"seed {args.seed}", rows, " ".join(["python bench/bench_sft_batch.py", *argv]))
    return {f"seed {args.seed}": rows}


if __name__ == "__main__":
    main()
