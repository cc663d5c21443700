"""Training benchmarks: time and episodes to the planner's optimum on number search; crafting success.

1. Number search (N=16, K=4; the planner's exact optimum is 15/16): every recipe of ``agent_lab.recipes`` that
   names this section, from random initialisation, the seconds and episodes until the *greedy* policy reaches
   the optimum on all 16 targets (checked every ``eval_every`` steps), median over seeds; each seed's greedy
   success at every evaluation is kept as its learning curve. "number-search/<algo>"
   recipes are pure RL sampling with the structured action mask; "number-search" starts with SFT on the
   planner's demonstrations. Targets on 2 CPU cores: Dr.GRPO < 2 min, the SFT cold start < 30 s.
2. Crafting: recipe ``crafting-quick`` (``--full``: ``crafting-full``; ``--crafting-budget`` picks any): greedy
   success on each evaluation split and level after the cold start and after Dr.GRPO, with and without the
   candidate mask, next to the planner. Target (full budget): >= 95% of the planner's success at depth <= 2 and
   >= 80% at depth 3. Beside them: each phase's peak resident memory and where its time went (the trainer's
   ``time_<phase>_s``; ``bench_crafting_profile.py`` sets them against this CPU's matmul peak).

``--quick`` (default): 3 seeds for every recipe but the full-only ones, each seed given at most 200 RL steps;
``--full``: those too, each given its recipe's steps and at most 900 s. Number search runs
on every core (``--threads``, default torch's own count): a benchmark has the machine to itself, while the recipes
keep one thread for the tests and the book, which share it. Every figure is printed and written, with the
command, the date, the machine and the commit, to ``bench/results/bench_trainer.json`` (``--results``), which
``agent-lab recipes`` reads.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _profile import format_profile, peak_memory  # noqa: E402
from _results import RESULTS, save_section  # noqa: E402

from agent_lab.diagnostics import summary_table, time_profile  # noqa: E402
from agent_lab.recipes import RECIPES, recipe  # noqa: E402
from agent_lab.trainer import train, train_rl, train_sft  # noqa: E402

QUICK_STEPS = 200  # number search, --quick: RL steps per seed at most


def number_search(names, seeds: int, time_limit: float | None, threads: int = 0,
                  max_steps: int | None = None) -> list[dict]:
    """Each recipe's seeds until the greedy optimum, within ``max_steps`` RL steps (the recipe's own when None)
    or ``time_limit`` seconds, whichever ends first."""
    rows = []
    for name in names:
        runs = []
        for seed in range(seeds):
            cfg = recipe(name, seed=seed, time_limit_s=time_limit, cpu_threads=threads)
            if max_steps is not None and cfg.algorithm.steps > max_steps:
                cfg = cfg.replace(steps=max_steps)
            c0 = time.process_time()
            r = train(cfg, progress=False)
            cpu = time.process_time() - c0  # CPU seconds of this process: less inflated by a busy machine
            hit = r.reached_optimum_at
            got = hit or {}
            runs.append({"seed": seed, "reached_s": got.get("seconds"), "reached_episodes": got.get("episodes"),
                         "reached_step": got.get("step"), "steps": len(r.history), "run_s": r.seconds, "cpu_s": cpu,
                         "final_greedy": r.final_eval.success, "curve": greedy_curve(r.history)})
            print(f"  {name} seed {seed}: " + (f"optimum at step {got.get('step')}, {got.get('seconds', 0):.1f} s, "
                                               f"{got.get('episodes')} episodes; {cpu:.1f} CPU-s for the whole run"
                                               if hit else f"not reached in {len(r.history)} steps, {r.seconds:.0f} s "
                                               f"(greedy {r.final_eval.success:.3f})"), flush=True)
        secs = [x["reached_s"] if x["reached_s"] is not None else float("inf") for x in runs]
        eps = [x["reached_episodes"] if x["reached_episodes"] is not None else float("inf") for x in runs]
        reached = sum(s < float("inf") for s in secs)
        row = {"recipe": name, "seeds": len(runs), "cpu_threads": threads, "reached": f"{reached}/{len(runs)}",
               "median_s": statistics.median(secs), "median_episodes": statistics.median(eps),
               "final_greedy": statistics.median(x["final_greedy"] for x in runs), "runs": runs}
        row["summary"] = (f"optimum 15/16 reached in {reached} of {len(runs)} seeds, median {row['median_s']:.1f} s "
                          f"({row['median_episodes']} episodes)" if reached else
                          f"optimum not reached in {len(runs)} seeds (median final greedy {row['final_greedy']:.3f})")
        rows.append(row)
    return rows


def greedy_curve(history: list[dict]) -> list[dict]:
    """A run's learning curve: the greedy success at each of its evaluations, with the steps (counted as
    ``reached_step`` counts them), seconds and episodes by then."""
    return [{"step": h["step"] + 1, "seconds": h["elapsed_s"], "episodes": h["episodes"], "greedy": h["eval_success"]}
            for h in history if "eval_success" in h]


def crafting(name: str, seed: int = 0, eval_size: int = 150, run_dir: str | None = None, reread: bool = True,
             **overrides) -> tuple[list[dict], dict]:
    """The crafting benchmark's rows for recipe ``name``. ``reread``: the environment shows the prompt twice, in
    training and evaluation alike; False is the plain recipe. ``run_dir``: keep the run there, checkpointed every
    100 steps, and resume it if it holds one (the full budget takes hours; an interrupted run continues exactly
    where it stopped). ``overrides`` replace recipe settings (the tests shrink the policy)."""
    base = recipe(name)
    env_options = {**base.env_options, "reread": reread}  # the evaluation below uses the same options
    cfg = base.replace(seed=seed, env_options=env_options, checkpoint_every=100 if run_dir else 0, **overrides)
    work = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="bench-crafting-"))
    with peak_memory() as sft_memory:
        cold = train_sft(cfg, run_dir=str(work / "sft"), resume=(work / "sft" / "checkpoint.pt").exists(),
                         progress=False)
    with peak_memory() as rl_memory:
        if (work / "rl" / "checkpoint.pt").exists():
            agent = train_rl(cfg, run_dir=str(work / "rl"), resume=True, progress=False)
        else:
            agent = train_rl(cfg, init=cold, run_dir=str(work / "rl"), progress=False)
    print(f"  {name}: {cfg.sft.steps} SFT steps in {cold.seconds:.0f} s ({cold.episodes} demonstrations), then "
          f"{cfg.algorithm.steps} Dr.GRPO steps in {agent.seconds - cold.seconds:.0f} s "
          f"({agent.episodes - cold.episodes} episodes)", flush=True)
    costs = {"SFT": {"peak_gb": sft_memory["peak_gb"], **time_profile(agent.history, "sft")},
             "RL": {"peak_gb": rl_memory["peak_gb"], **time_profile(agent.history, "rl")}}
    for piece, c in costs.items():
        print(format_profile(piece, c) + f"; peak resident memory {c['peak_gb']:.2f} GB")
    rows = evaluation_rows(env_options, {"cold start": cold, "after Dr.GRPO": agent}, eval_size)
    if not run_dir:
        shutil.rmtree(work, ignore_errors=True)
    return rows, costs


def evaluation_rows(env_options: dict, policies: dict, eval_size: int) -> list[dict]:
    """Greedy success of each named result's policy per split and level, decoded without and with the candidate
    mask, next to the planner's, on ``eval_size`` crafting worlds per level."""
    from agent_lab.envs import make_env
    from agent_lab.evaluation import evaluate

    rows = []
    for masked in (False, True):
        env = make_env("crafting", **env_options, mask_actions=masked, eval_size=eval_size)  # worlds are cached
        for policy, result in policies.items():
            for split in env.splits:
                rep = evaluate(result.policy, env, split, "greedy", tokenizer=result.tokenizer, candidate_mask=masked)
                for level, g in sorted(rep.by_group.items()):
                    rows.append({"policy": policy, "mask": masked, "split": split, "group": level, "n": g["n"],
                                 "greedy": g["success"], "planner": g["optimum"],
                                 "share_of_planner": g["success"] / g["optimum"] if g["optimum"] else float("nan")})
    return rows


def crafting_summary(name: str, rows: list[dict], seconds: float, costs: dict | None = None) -> dict:
    def levels(mask):
        return " / ".join(f"{r['greedy']:.2f}" for r in rows
                          if r["policy"] == "after Dr.GRPO" and r["mask"] is mask and r["split"] == "test")
    return {"recipe": name, "seconds": seconds, "rows": rows, "costs": costs,
            "summary": f"after Dr.GRPO, test split by level: masked {levels(True)}, unmasked {levels(False)} "
                       f"({seconds:.0f} s)"}


def main(argv=None) -> dict[str, list[dict]]:
    """The figures, by the section of ``--results`` they were saved as."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", default=True)
    mode.add_argument("--full", action="store_true")
    p.add_argument("--only", choices=("number-search", "crafting"), default=None)
    p.add_argument("--run-dir", default=None, help="crafting: keep the run here and resume it if interrupted")
    p.add_argument("--plain", action="store_true", help="crafting: show the prompt once, not twice")
    p.add_argument("--crafting-budget", choices=("quick", "full", "long"), default=None,
                   help="crafting: recipe crafting-<budget>; default quick, or full with --full")
    p.add_argument("--seeds", type=int, default=None, help="number search: seeds per recipe (default: see --quick)")
    p.add_argument("--threads", type=int, default=0,
                   help="number search: torch threads per run (default 0: torch's default, every core)")
    p.add_argument("--results", type=Path, default=RESULTS / "bench_trainer.json", help="where to write the figures")
    args = p.parse_args(argv)
    # The quick run's budget is in steps, so whether a seed reaches the optimum does not depend on how fast this
    # machine is today (the steps are reproducible; the seconds are not); --full keeps each recipe's steps and
    # stops a seed after 900 s.
    limit, max_steps = (900.0, None) if args.full else (None, QUICK_STEPS)
    t, saved = time.perf_counter(), {}
    if args.only in (None, "number-search"):
        print("1. number search (N=16, K=4; planner optimum 15/16): time to greedy optimum")
        names = [n for n, r in RECIPES.items() if r.bench == "number-search" and (args.full or not r.full_only)]
        rows = number_search(names, args.seeds or 3, limit, args.threads, max_steps)
        print(summary_table(rows, ["recipe", "seeds", "reached", "median_s", "median_episodes", "final_greedy"]))
        save_section(args.results, "number-search", rows, " ".join(["python bench/bench_trainer.py", *argv]))
        saved["number-search"] = rows
    if args.only in (None, "crafting"):
        name = f"crafting-{args.crafting_budget or ('full' if args.full else 'quick')}"
        print(f"\n2. crafting ({name}): greedy success after a fixed budget, next to the planner")
        t_craft = time.perf_counter()
        rows, costs = crafting(name, run_dir=args.run_dir, reread=not args.plain)
        print(summary_table(rows, ["policy", "mask", "split", "group", "n", "greedy", "planner", "share_of_planner"]))
        if not args.plain:
            saved["crafting"] = [crafting_summary(name, rows, time.perf_counter() - t_craft, costs)]
            save_section(args.results, "crafting", saved["crafting"],
                         " ".join(["python bench/bench_trainer.py", *argv]))
    print(f"\nbench_trainer finished in {time.perf_counter() - t:.0f} s")
    return saved


if __name__ == "__main__":
    main()
