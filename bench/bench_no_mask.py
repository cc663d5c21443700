"""Why pure RL without the candidate mask stalls below the optimum on number search, and what reaches it.

Recipe ``number-search/dr_grpo-no-mask`` samples from the whole vocabulary, so the policy must find the
``guess <n>`` format and then make each guess depend on the answers so far. For each seed it trains for
``--budget`` seconds (the issue's 120 s); in the same run and budget, the two recipes that do reach 15/16
without the mask at evaluation time or with it at sampling time: ``number-search`` (an SFT cold start on the
planner's demonstrations, then Dr.GRPO, never masked) and ``number-search/dr_grpo`` (pure RL with the mask).

Every policy is then probed as it was trained (512 sampled episodes, targets 1..16 in turn, and the 16 greedy
ones): success; the share of turns the environment refused (``rejected_share``, also logged by the trainer every
step); whether a guess follows the last answer (above the last guess after ``higher``, below it after ``lower``:
1 for the planner, 31/48 for uniform guesses that ignore them); and the share of greedy turns that repeat
an earlier guess. Beside them, exactly: the planner's 15/16 and the two policies that ignore every answer, four
distinct fixed guesses (4/16) and four uniform draws (1 - (15/16)^4).

    python bench/bench_no_mask.py                 # seeds 0 1 2, 120 s per recipe and seed
    python bench/bench_no_mask.py --budget 600 --seeds 1
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from fractions import Fraction
from pathlib import Path

import torch

from _results import RESULTS, save_section

from agent_lab.envs import make_env
from agent_lab.recipes import recipe
from agent_lab.rollout import SamplingConfig, collect_rollouts
from agent_lab.trainer import build_env, rejected_share, train

OUT = RESULTS / "bench_no_mask.json"
NO_MASK = "number-search/dr_grpo-no-mask"
ARMS = (NO_MASK, "number-search", "number-search/dr_grpo")


def blind_optimum(n: int = 16, k: int = 4) -> tuple[Fraction, Fraction]:
    """Exact success of two policies that ignore every answer: the best fixed sequence of ``k`` guesses, by
    enumeration of all ``n ** k`` (a target is found iff it is among them), and ``k`` uniform draws."""
    fixed = max(Fraction(len(set(seq)), n) for seq in itertools.product(range(1, n + 1), repeat=k))
    return fixed, 1 - Fraction(n - 1, n) ** k


def blind_follows(n: int = 16) -> Fraction:
    """Exact share of uniform guesses that move the way the last answer says, for a guesser that ignores it:
    over target t, last guess g != t and next guess x, all uniform. It is above one half because an answer is
    informative about g (after ``higher`` g is more often small). Every pair of an episode has this law: the
    guesses are independent of the target, and t stays uniform given that earlier guesses missed it."""
    agree = total = 0
    for t, g, x in itertools.product(range(1, n + 1), repeat=3):
        if g != t:
            total += 1
            agree += x > g if t > g else x < g
    return Fraction(agree, total)


def follows_answers(logs: list[dict]) -> float | None:
    """Share of executed guesses after a ``higher``/``lower`` answer that move the way it says (above the
    previous guess after ``higher``, below after ``lower``); ``None`` if no guess came after such an answer."""
    moves = []
    for log in logs:
        last = None  # (guess, answer) of the last executed guess
        for turn in log["turns"]:
            if turn["action"] is None:
                continue
            if last is not None and last[1] in ("higher", "lower"):
                moves.append(turn["action"] > last[0] if last[1] == "higher" else turn["action"] < last[0])
            last = (turn["action"], turn["observation"])
    return sum(moves) / len(moves) if moves else None


def repeats(logs: list[dict]) -> float | None:
    """Share of executed guesses that repeat an earlier guess of the same episode (always a wasted turn)."""
    flags = []
    for log in logs:
        seen = set()
        for turn in log["turns"]:
            if turn["action"] is not None:
                flags.append(turn["action"] in seen)
                seen.add(turn["action"])
    return sum(flags) / len(flags) if flags else None


def probe(result, samples: int = 512) -> dict:
    """The trained policy as it was trained (its candidate-mask setting): sampled and greedy episodes."""
    env = build_env(result.config)  # with the candidate mask's allowed actions when the run sampled under it
    mask = result.config.sampling.candidate_mask
    out = {}
    for decoding, tasks in (("sampled", [1 + i % 16 for i in range(samples)]), ("greedy", list(range(1, 17)))):
        b = collect_rollouts(result.policy, result.tokenizer, env, tasks,
                             SamplingConfig(decoding=decoding, candidate_mask=mask),
                             generator=torch.Generator().manual_seed(0))
        logs = b.episode_logs
        out[decoding] = {"success": float(b.success.float().mean()), "rejected_share": rejected_share(logs),
                         "follows_answers": follows_answers(logs), "repeats": repeats(logs)}
    return out


def run_arm(name: str, seed: int, budget: float, steps: int | None) -> dict:
    over = dict(seed=seed, time_limit_s=budget)
    if steps is not None:  # the tests: a handful of steps
        over.update(steps=steps, sft_steps=min(steps, recipe(name).sft.steps))
    r = train(recipe(name, **over), progress=False)
    hit = r.reached_optimum_at or {}
    first = [h for h in r.history if h.get("phase") != "sft"][:1]
    p = probe(r)
    return {"recipe": name, "seed": seed, "steps": len(r.history), "seconds": r.seconds,
            "reached_s": hit.get("seconds"), "reached_episodes": hit.get("episodes"),
            "first_rejected_share": first[0].get("rejected_share") if first else None,
            "final_greedy": r.final_eval.success, **{f"{d}_{k}": v for d, fig in p.items() for k, v in fig.items()}}


def references() -> list[dict]:
    """The planner (its exact value from the DP; "follows" measured on its own demonstrations) and the two blind
    policies, exactly."""
    env = make_env("number-search")
    targets = list(range(1, env.n + 1))
    demos = env.demonstrations(targets)
    env.reset(targets)
    for turn in range(env.guesses):
        env.step([d[turn][1] if turn < len(d) else "" for d in demos])
    fixed, uniform = blind_optimum(env.n, env.guesses)
    return [{"policy": "planner (binary search)", "success": env.dp.optimal_value(),
             "follows_answers": follows_answers(env.episode_logs())},
            {"policy": "four distinct fixed guesses, answers ignored", "success": float(fixed),
             "follows_answers": None},
            {"policy": "four uniform guesses, answers ignored", "success": float(uniform),
             "follows_answers": float(blind_follows(env.n))}]


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The runs and references, by the section of ``--results`` they were saved as."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--budget", type=float, default=120.0, help="seconds per recipe and seed")
    p.add_argument("--results", type=Path, default=OUT)
    p.add_argument("--tiny", action="store_true", help="two steps per recipe and one seed (the tests)")
    args = p.parse_args(argv)
    rows = []
    for seed in range(1 if args.tiny else args.seeds):
        for name in ARMS:
            row = run_arm(name, seed, args.budget, 2 if args.tiny else None)
            rows.append(row)
            got = f"15/16 at {row['reached_s']:.1f} s" if row["reached_s"] else "15/16 not reached"
            print(f"  seed {seed} {name:24s} {row['steps']:4d} steps {row['seconds']:6.1f} s  {got}; greedy "
                  f"{row['final_greedy']:.3f}, sampled {row['sampled_success']:.3f}, refused "
                  f"{row['sampled_rejected_share']:.3f}, follows answers {row['sampled_follows_answers'] or 0:.3f}, "
                  f"greedy repeats {row['greedy_repeats'] or 0:.3f}", flush=True)
    no_mask = [r for r in rows if r["recipe"] == NO_MASK]
    summary = {"reached": f"{sum(r['reached_s'] is not None for r in no_mask)}/{len(no_mask)}",
               "median_final_greedy": statistics.median(r["final_greedy"] for r in no_mask)}
    print(f"no mask: 15/16 reached on {summary['reached']} seeds")
    command = "python bench/bench_no_mask.py" + (" --tiny" if args.tiny else f" --budget {args.budget:g} --seeds "
                                                                           f"{args.seeds}")
    result = {"runs": rows, "references": references(), **summary}
    section = "tiny" if args.tiny else "main"
    save_section(args.results, section, [result], command)
    return {section: [result]}


if __name__ == "__main__":
    main()
