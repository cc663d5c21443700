"""Peak resident memory of every crafting recipe, at the longest transcripts it can make, in minutes.

What a training step holds is set by the recipe's shapes (policy, batch, micro-batch, context) and by the
lengths of its transcripts, not by how many steps came before it: a run has the C allocator unmap large tensors
as they are freed, and trims the rest of its heap after each collect and step (``agent_lab.device``). So rather
than the hours a whole ``crafting-long`` run takes, each recipe's pieces run briefly, at its own settings, with
transcripts as long as the recipe makes them:

* ``SFT``: ``--sft-steps`` supervised steps with recovery demonstrations from the first step (a recovery
  demonstration holds its slip as well as the plan, so these are the longest demonstrations the recipe imitates);
* ``RL, random weights``: ``--rl-steps`` RL steps from random weights. Every episode fails, so it runs to the end
  of its world's step budget: the longest transcript that world allows;
* ``RL, trained``: ``--rl-steps`` RL steps from the committed ``crafting-full`` policy
  (``bench/results/crafting-full/``), for the recipes of its shape: its episodes fill their inventories as late in
  a real run;
* ``evaluation``: ``bench_trainer.py``'s evaluation (both decodings, every split, ``--eval-size`` worlds per
  level) of the policy the random-weights piece ends with.

Recipes whose settings differ only in their step budgets share one measurement. Each group runs in a fresh
process, and each piece under a fresh resident-memory high-water mark (``VmHWM``). What short pieces cannot show
is growth over thousands of steps; ``bench_trainer.py`` measures a whole run of the recipe it runs.

Usage: ``python bench/bench_memory.py [--sft-steps 100] [--rl-steps 5] [--eval-size 150]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _arms import add_child_options, run_fresh, write_result
from _profile import peak_memory
from _results import RESULTS, save_section
from bench_trainer import evaluation_rows

from agent_lab.diagnostics import summary_table
from agent_lab.recipes import RECIPES, recipe
from agent_lab.trainer import train_rl, train_sft

TRAINED = ("crafting-full", RESULTS / "crafting-full" / "checkpoint.pt")  # the committed policy and its recipe
LIMIT_GB = 2.0  # the target: a student's 8 GB laptop trains any crafting recipe without swapping


def without_budget(name: str) -> dict:
    """Recipe ``name``'s settings less its step budgets: everything that sets what a step holds."""
    d = recipe(name).to_dict()
    for section, key in (("sft", "steps"), ("sft", "lr_decay_steps"), ("algorithm", "steps")):
        d[section].pop(key)
    d["plugins"].get("recovery_demonstrations", {}).pop("from_step", None)
    return d


def groups() -> list[list[str]]:
    """The crafting recipes in groups: recipes whose settings differ only in their step budgets share one."""
    out: list[list[str]] = []
    for name in RECIPES:
        if recipe(name).env != "crafting":
            continue
        same = next((g for g in out if without_budget(g[0]) == without_budget(name)), None)
        if same is None:
            out.append([name])
        else:
            same.append(name)
    return out


def pieces(names: list[str], sft_steps: int, rl_steps: int, eval_size: int, **overrides) -> list[dict]:
    """The pieces of the recipes ``names`` (one group), each timed and under a fresh memory mark.
    ``overrides`` replace recipe settings (the tests shrink the policy)."""
    base = recipe(names[0], **overrides)
    sft_cfg = base.replace(sft_steps=sft_steps, sft_slip_from=0, sft_lr_decay_steps=0)
    rl_cfg = base.replace(sft_steps=0, sft_slip_prob=0.0, sft_lr_decay_steps=0, steps=rl_steps)
    rows: list[dict] = []

    def measure(piece: str, steps: int, run):
        t = time.perf_counter()
        with peak_memory() as mem:
            out = run()
        rows.append({"recipes": ", ".join(names), "piece": piece, "steps": steps,
                     "seconds": time.perf_counter() - t, "peak_gb": mem["peak_gb"]})
        print(f"  {rows[-1]['recipes']}: {piece}, {steps} steps, {rows[-1]['seconds']:.0f} s, peak resident "
              f"{mem['peak_gb']:.2f} GB", flush=True)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        measure("SFT", sft_steps, lambda: train_sft(sft_cfg, run_dir=f"{tmp}/sft", progress=False))
        random = measure("RL, random weights", rl_steps,
                         lambda: train_rl(rl_cfg, run_dir=f"{tmp}/rl", progress=False))
        name, policy = TRAINED
        if name in names and policy.exists():
            trained_cfg = recipe(name, steps=rl_steps, **overrides)
            measure("RL, trained", rl_steps,
                    lambda: train_rl(trained_cfg, init=policy, run_dir=f"{tmp}/trained", progress=False))
        measure("evaluation", 0, lambda: evaluation_rows(base.env_options, {"random weights": random}, eval_size))
    return rows


def run_group(names: list[str], args: argparse.Namespace) -> list[dict]:
    """:func:`pieces` in a fresh process, so no group inherits another's heap."""
    (rows,) = run_fresh(__file__, ["--child", ",".join(names), "--sft-steps", args.sft_steps, "--rl-steps",
                                   args.rl_steps, "--eval-size", args.eval_size])
    return rows


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The pieces' rows, by the section of ``--results`` they were saved as (none from a group's process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft-steps", type=int, default=100)
    p.add_argument("--rl-steps", type=int, default=5)
    p.add_argument("--eval-size", type=int, default=150, help="evaluation worlds per level")
    add_child_options(p)
    p.add_argument("--results", type=Path, default=RESULTS / "bench_memory.json")
    args = p.parse_args(argv)
    if args.child:
        rows = pieces(args.child.split(","), args.sft_steps, args.rl_steps, args.eval_size)
        write_result(args.out, rows)
        return {}
    rows = []
    for names in groups():
        print(f"{', '.join(names)}:", flush=True)
        rows += run_group(names, args)
    for r in rows:
        r["within_target"] = r["peak_gb"] <= LIMIT_GB
    print(summary_table(rows, ["recipes", "piece", "steps", "seconds", "peak_gb", "within_target"]))
    save_section(args.results, "crafting", rows, " ".join(["python bench/bench_memory.py", *argv]))
    return {"crafting": rows}


if __name__ == "__main__":
    main()
