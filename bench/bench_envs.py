"""Environment throughput: episode-steps per second for B = 256 episodes, random valid/invalid actions.

Read next to the trainer's token throughput: an environment step here serves one decision of one
episode, so the environment is never the bottleneck if this figure is far above the rollout's
decisions per second. The random action texts are drawn before timing (half valid, half invalid or
malformed), so only ``env.step`` is timed; ``sample_tasks`` + ``reset`` are timed separately.

It first prints the exact planner figures (number-search optimum and reference policies from the
dynamic programme, crafting planner success and plan length per level). Everything printed is saved to
``bench/results/bench_envs.json``: sections ``number-search policies`` and ``crafting planner`` (the exact
figures) and ``steps per second``.

    .venv/bin/python bench/bench_envs.py [--batch 256] [--repeats 5] [--seed 0] [--no-figures]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from _results import RESULTS, save_section

from agent_lab.envs import make_env


def random_texts(env_name: str, task, rng: random.Random, count: int) -> list[str]:
    """``count`` action texts for one episode: about half valid, the rest invalid or malformed."""
    if env_name == "number-search":
        valid = [f"guess {rng.randint(1, 16)}" for _ in range(count)]
        bad = ["guess 0", "guess 99", "Guess  7 ", "hello", "", "guess eight"]
    else:
        items = list(task["recipes"])
        valid = [
            f"get {rng.choice(task['base'])} {rng.randint(1, 8)}" if rng.random() < 0.5 else f"craft {rng.choice(items)}"
            for _ in range(count)
        ]
        bad = ["get dragon 2", "craft", "get wood 0", "CRAFT  " + task["goal"].upper(), "x" * 300, ""]
    return [v if rng.random() < 0.5 else rng.choice(bad) for v in valid]


def bench(env_name: str, batch: int, repeats: int, seed: int, **options) -> dict:
    env = make_env(env_name, **options)
    rng = random.Random(seed)
    step_rates, reset_times, decisions = [], [], 0
    for r in range(repeats):
        t0 = time.perf_counter()
        tasks = env.sample_tasks(seed + r, batch)
        env.reset(tasks)
        reset_times.append(time.perf_counter() - t0)
        plans = [random_texts(env_name, t, rng, env.max_turns) for t in tasks]
        acted = 0
        elapsed = 0.0
        for turn in range(env.max_turns):
            live = int((~env.done).sum())
            if live == 0:
                break
            texts = [p[turn] for p in plans]
            t0 = time.perf_counter()
            env.step(texts)
            elapsed += time.perf_counter() - t0
            acted += live
        step_rates.append(acted / elapsed)
        decisions += acted
    return {
        "steps_per_s": statistics.median(step_rates),
        "min": min(step_rates),
        "max": max(step_rates),
        "reset_ms": 1000 * statistics.median(reset_times),
        "decisions": decisions,
    }


def exact_figures() -> dict[str, list[dict]]:
    """The planners' figures the benchmarks are read against (exact, not timed): printed, and their rows by
    section."""
    return {"number-search policies": number_search_figures(), "crafting planner": crafting_figures()}


def number_search_figures() -> list[dict]:
    """Exact success and expected return of the reference policies of number search (N = 16, K = 4)."""
    from fractions import Fraction

    from agent_lab.envs import (
        NumberSearchDP,
        median_policy,
        sequential_policy,
        uniform_consistent_policy,
    )

    print("number search, N = 16, K = 4: exact success (expected return under 1 - 0.05 T)")
    binary, length = NumberSearchDP(16, 4), NumberSearchDP(16, 4, reward="length")
    policies = [
        ("optimal (DP)", binary.optimal_policy()),
        ("median binary search", median_policy(16)),
        ("guess 1, 2, 3, 4", sequential_policy(16)),
        ("uniform consistent guess", uniform_consistent_policy(16)),
    ]
    rows = []
    for label, policy in policies:
        ev, ev_len = binary.evaluate_policy(policy), length.evaluate_policy(policy)
        frac = Fraction(ev.success).limit_denominator(1000)
        exact = f"= {frac}" if abs(float(frac) - ev.success) < 1e-12 else ""
        print(f"  {label:<26} success {ev.success:.6f} {exact:<8} return(1-0.05T) {ev_len.expected_return:.6f}")
        rows.append({"policy": label, "success": ev.success, "success_fraction": str(frac) if exact else None,
                     "length_return": ev_len.expected_return})
    return rows


def crafting_figures() -> list[dict]:
    """The crafting planner per level on 300 worlds: its success when executed, plan lengths, step budgets."""
    from agent_lab.envs import LEVELS, generate_world, optimal_steps

    make = __import__("agent_lab.envs", fromlist=["make_env"]).make_env
    env = make("crafting")
    print("crafting planner per level (300 worlds each): success when executed, optimal plan length, budget")
    rows = []
    for level in sorted(LEVELS):
        worlds = [generate_world(1_000_000 + s, level) for s in range(300)]
        plans = [optimal_steps(w) for w in worlds]
        success = env.optimal_success(worlds) if level <= 3 else make("crafting", train_levels=[4]).optimal_success(worlds)
        budget = statistics.mean(w["budget"] for w in worlds)
        print(
            f"  level {level} (depth {LEVELS[level].depth}): success {success:.3f}  plan mean {statistics.mean(plans):.2f}"
            f" max {max(plans)}  budget mean {budget:.2f}"
        )
        rows.append({"level": level, "depth": LEVELS[level].depth, "worlds": len(worlds), "success": success,
                     "plan_mean": statistics.mean(plans), "plan_max": max(plans), "budget_mean": budget})
    return rows


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The figures, by the section of ``--results`` they were saved as."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-figures", action="store_true", help="skip the exact planner figures")
    parser.add_argument("--results", type=Path, default=RESULTS / "bench_envs.json",
                        help="where to write the figures")
    args = parser.parse_args(argv)
    sections = {} if args.no_figures else exact_figures()
    configs = [
        ("number-search", {}),
        ("number-search", {"mask_actions": True, "reward": "length"}),
        ("crafting", {}),
        ("crafting", {"shaping": "distance"}),
    ]
    print(f"environment steps per second, B = {args.batch}, median of {args.repeats} batches (min..max)")
    sections["steps per second"] = []
    for name, options in configs:
        out = bench(name, args.batch, args.repeats, args.seed, **options)
        label = name + (" " + " ".join(f"{k}={v}" for k, v in options.items()) if options else "")
        print(
            f"  {label:<45} {out['steps_per_s']:>10,.0f} steps/s ({out['min']:,.0f}..{out['max']:,.0f})"
            f"   sample_tasks+reset {out['reset_ms']:.1f} ms   [{out['decisions']} decisions]"
        )
        sections["steps per second"].append({"env": label, "batch": args.batch, "repeats": args.repeats,
                                             "seed": args.seed, **out})
    command = " ".join(["python bench/bench_envs.py", *argv])
    for section, rows in sections.items():
        save_section(args.results, section, rows, command)
    return sections


if __name__ == "__main__":
    main()
