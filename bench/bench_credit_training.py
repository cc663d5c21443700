"""Credit estimators in the trainer, on crafting: one supervised cold start per seed, then each RL algorithm from
those same weights for the same number of steps and episodes, and the success each reaches.

The algorithms differ only in how they credit turns: Dr.GRPO gives every turn its episode's group-centred
return; GiGPO adds a step term from anchor states, with the environment's state (inventory, crafted items, steps
spent) or the whole history as the anchor (``agent_lab.algorithms.GiGPO``); PPO with a turn-level critic credits
each turn by GAE over turns, its critic starting untrained when RL starts (``agent_lab.algorithms.PPOCritic``);
VinePPO credits each turn by the TD residual of Monte Carlo values from 2 continuations sampled from the state
before every turn (``agent_lab.algorithms.VinePPO``), which it plays in addition to the step's episodes and counts
among them. The cold start is the crafting
assignment's (level-1 worlds, 600 supervised steps), the RL phase is the crafting recipe's (lr 3e-4, 16 tasks x 8
samples per step, candidate mask). Each agent is evaluated greedily and sampled (4 per world) on the test and
held-out-goal worlds, with 95% Wilson intervals; seconds and episodes per arm are recorded.

    .venv/bin/python bench/bench_credit_training.py           # quick: seed 0, 20 RL steps, 150 worlds per split
    .venv/bin/python bench/bench_credit_training.py --full    # seeds 0 1 2, 60 RL steps, 300 worlds

Figures go to bench/results/bench_credit_training.json (section "quick" or "full"); the results page shows them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _results import RESULTS, save_section

from agent_lab.config import TrainConfig, flat_keywords
from agent_lab.envs import make_env
from agent_lab.evaluation import evaluate
from agent_lab.recipes import CRAFTING, RECIPES
from agent_lab.trainer import train_rl, train_sft

OUT = RESULTS / "bench_credit_training.json"
QUICK = {"seeds": (0,), "steps": 20, "eval_size": 150}
FULL = {"seeds": (0, 1, 2), "steps": 60, "eval_size": 300}
#: The arms: (label, algorithm, its options).
ARMS = (("Dr.GRPO", "dr_grpo", {}), ("GiGPO, state anchors", "gigpo", {"anchor": "state"}),
        ("GiGPO, history anchors", "gigpo", {"anchor": "history"}),
        ("PPO, turn critic (GAE)", "ppo_gae", {"gae_lambda": 0.95}),
        ("VinePPO, 2 branches per turn", "vineppo", {"branches": 2}))


def settings(**overrides) -> dict:
    """The assignment's cold start (its algorithm's own options dropped) with the crafting recipe's RL phase."""
    options = {k for k, s in flat_keywords().items() if s.place == "options"}  # algorithms' own settings
    base = {k: v for k, v in RECIPES["crafting-assignment"].settings.items() if k not in options}
    rl = {k: CRAFTING[k] for k in ("lr", "batch_size", "group_size")}
    return {**base, **rl, "objective": None, **overrides}


def evaluation(result, env) -> dict:
    """Greedy and sampled success per split and per level within it, each with its Wilson interval."""
    out = {}
    for split in env.splits:
        for decoding, k in (("greedy", 1), ("sampled", 4)):
            rep = evaluate(result.policy, env, split, decoding, tokenizer=result.tokenizer, candidate_mask=True,
                           samples_per_task=k, seed=1)
            out[f"{split} {decoding}"] = {"success": rep.success, "ci_low": rep.ci_low, "ci_high": rep.ci_high,
                                          "n": rep.n, "planner": rep.optimum,
                                          "by_level": {str(d): {k: g[k] for k in ("n", "success", "ci_low", "ci_high")}
                                                       for d, g in sorted(rep.by_group.items())}}
    return out


def run_seed(seed: int, steps: int, eval_size: int, **overrides) -> list[dict]:
    s = settings(seed=seed, **overrides)
    env = make_env("crafting", **s["env_options"], mask_actions=True, eval_size=eval_size)
    cold = train_sft(TrainConfig(**s), progress=False)
    rows = [{"seed": seed, "arm": "cold start", "seconds": round(cold.seconds, 1), "episodes": 0,
             "eval": evaluation(cold, env)}]
    for label, algo, options in ARMS:
        cfg = TrainConfig(**{**s, "algo": algo, "steps": steps, **options})
        agent = train_rl(cfg, init=cold, progress=False)
        rows.append({"seed": seed, "arm": label, "algo": algo, "options": options, "steps": steps,
                     "seconds": round(agent.seconds - cold.seconds, 1), "episodes": agent.episodes - cold.episodes,
                     "eval": evaluation(agent, env)})
    for r in rows:
        print(f"  seed {seed} {r['arm']:24s} {r['seconds']:7.1f} s  "
              + "  ".join(f"{k} {v['success']:.3f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]"
                          for k, v in r["eval"].items()), flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The arms' rows, by the section of ``--results`` they were saved as."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="seeds 0 1 2, 60 RL steps, 300 worlds per split")
    p.add_argument("--results", type=Path, default=OUT)
    p.add_argument("--tiny", action="store_true", help="a seconds-long run of every code path (the tests)")
    args = p.parse_args(argv)
    size = FULL if args.full else QUICK
    tiny = dict(d_model=16, n_layers=1, n_heads=2, sft_steps=2, sft_slip_from=1, sft_lr_decay_steps=1,
                batch_size=16, max_len=256) if args.tiny else {}
    steps, eval_size = (1, 4) if args.tiny else (size["steps"], size["eval_size"])
    start = time.time()
    rows = [r for seed in size["seeds"][:1 if args.tiny else None] for r in run_seed(seed, steps, eval_size, **tiny)]
    command = "python bench/bench_credit_training.py" + (" --full" if args.full else "") + (" --tiny" if args.tiny
                                                                                          else "")
    section = "tiny" if args.tiny else "full" if args.full else "quick"
    save_section(args.results, section, rows, command)
    print(f"{len(rows)} rows in {time.time() - start:.0f} s -> {args.results}")
    return {section: rows}


if __name__ == "__main__":
    main()
