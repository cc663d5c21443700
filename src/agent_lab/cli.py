"""Command line: ``agent-lab tour`` (and, from the trainer, ``train`` and ``eval``)."""

from __future__ import annotations

import argparse
import sys


def tour() -> None:
    """Print a short tour of the package: where each step of the data flow lives."""
    from agent_lab import training

    print("agent-lab: reinforcement learning for LLM agents (after CMU 11-768, Lecture 9)\n")
    print("The lecture's own API, agent_lab.training:")
    print("  reward_to_go([0.2, 1.0], gamma=0.9)          ->", training.reward_to_go([0.2, 1.0], gamma=0.9))
    print("  centered_group_advantages([1, 0, 0, 1])      ->", training.centered_group_advantages([1.0, 0.0, 0.0, 1.0]))
    print(
        "  degenerate_binary_group_probability(0.01, 8) ->",
        round(training.degenerate_binary_group_probability(0.01, group_size=8), 4),
    )
    print("\nWhere things live (data flows top to bottom):")
    for mod, what in [
        ("agent_lab.envs", "number search and crafting environments, exact planners"),
        ("agent_lab.policy", "tokenizer and the tiny transformer with a KV cache"),
        ("agent_lab.rollout", "batched multi-turn sampling with behaviour log-probabilities"),
        ("agent_lab.estimators", "returns, baselines, advantages, losses, aggregation, diagnostics"),
        ("agent_lab.trainer", "REINFORCE, RLOO, GRPO, Dr.GRPO, ReST-EM, PPO, SFT"),
        ("agent_lab.evaluation", "frozen-checkpoint evaluation against the planner's optimum"),
    ]:
        print(f"  {mod:<22} {what}")
    print("\nNext: `make book` (read), assignments/ (do), `make grade SUBMISSIONS=dir` (grade).")


_OPTIONAL_TYPES = {"sft_lr": float, "objective": str, "run_dir": str, "stop_after": int, "time_limit_s": float}
_HELP = {
    "env": "environment name (agent_lab.envs.ENV_NAMES)", "algo": "reinforce | rloo | grpo | dr_grpo | rest_em | ppo | sft",
    "steps": "RL steps (after the SFT cold start)", "sft_steps": "supervised steps on planner demonstrations first",
    "batch_size": "episodes per RL step", "group_size": "samples per task (contiguous groups)",
    "device": "auto | cuda | mps | cpu", "stop_at_optimum": "stop once greedy success reaches the planner's optimum",
}


def _parse_value(text: str):
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _add_train_args(p: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (``--batch-size``), defaults taken from the dataclass."""
    from dataclasses import MISSING, fields

    from agent_lab.trainer import TrainConfig

    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        if f.name == "env_options":
            p.add_argument("--env-option", dest="env_options", action="append", default=[], metavar="KEY=VALUE",
                           help="environment option, e.g. --env-option n=16 (repeatable; values parsed as JSON)")
        elif isinstance(default, bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                           help=_HELP.get(f.name, f.name.replace("_", " ")))
        else:
            typ = _OPTIONAL_TYPES.get(f.name, type(default))
            p.add_argument(flag, dest=f.name, type=typ, default=default,
                           help=f"{_HELP.get(f.name, f.name.replace('_', ' '))} (default: {default})")


def _env_options(items: list[str]) -> dict:
    """``--env-option KEY=VALUE`` flags as a dict, each value parsed as JSON where it parses."""
    opts = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--env-option must look like KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        opts[k] = _parse_value(v)
    return opts


def _train(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from agent_lab.diagnostics import summary_table
    from agent_lab.trainer import TrainConfig, train

    kw = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    kw["env_options"] = _env_options(kw["env_options"])
    result = train(TrainConfig(**kw), progress=not args.quiet)
    rep = result.final_eval
    reached = result.reached_optimum_at
    row = {
        "env": kw["env"], "algo": kw["algo"], "seed": kw["seed"], "steps": len(result.history),
        "episodes": result.episodes, "seconds": round(result.seconds, 1),
        "greedy success": f"{rep.success:.3f} [{rep.ci_low:.3f}, {rep.ci_high:.3f}]",
        "planner": f"{rep.optimum:.3f}", "gap": f"{rep.gap:+.3f}",
        "optimum reached": f"step {reached['step']} ({reached['seconds']:.1f} s)" if reached else "no",
    }
    print()
    print(summary_table([row], list(row)))
    print(f"run directory: {result.run_dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from agent_lab.envs import make_env
    from agent_lab.evaluation import evaluate, load_checkpoint

    policy, tok, state = load_checkpoint(args.checkpoint, "cpu")
    cfg = state.get("config", {})
    env_name = args.env or cfg.get("env")
    if env_name is None:
        raise ValueError("--env is required: the checkpoint does not record its environment")
    same_env = env_name == cfg.get("env")
    # the checkpoint's environment and mask unless told otherwise: a policy is evaluated as it was trained
    opts = {**(cfg.get("env_options", {}) if same_env else {}), **_env_options(args.env_options)}
    masked = args.mask if args.mask is not None else bool(same_env and cfg.get("candidate_mask"))
    if masked:
        opts["mask_actions"] = True
    env = make_env(env_name, **opts)
    rep = evaluate(policy, env, args.split, args.decoding, tokenizer=tok, temperature=args.temperature,
                   seed=args.seed, samples_per_task=args.samples_per_task, candidate_mask=masked)
    print(rep)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tour", help="print a short tour of the package")
    pt = sub.add_parser("train", help="train a policy from scratch (see agent_lab.trainer.TrainConfig)")
    _add_train_args(pt)
    pt.add_argument("--quiet", action="store_true", help="no progress bar or loss description")
    pe = sub.add_parser("eval", help="evaluate a frozen checkpoint on held-out tasks")
    pe.add_argument("checkpoint", help="checkpoint.pt or the run directory holding it")
    pe.add_argument("--env", default=None, help="environment (default: the one the checkpoint was trained on)")
    pe.add_argument("--split", default="test")
    pe.add_argument("--decoding", choices=("greedy", "sampled"), default="greedy")
    pe.add_argument("--temperature", type=float, default=1.0)
    pe.add_argument("--samples-per-task", type=int, default=1)
    pe.add_argument("--seed", type=int, default=0)
    pe.add_argument("--env-option", dest="env_options", action="append", default=[], metavar="KEY=VALUE",
                    help="override an environment option of the checkpoint, e.g. --env-option eval_size=600")
    pe.add_argument("--mask", action=argparse.BooleanOptionalAction, default=None,
                    help="decode with the candidate mask (default: as the checkpoint was trained)")
    args = parser.parse_args(argv)
    if args.command == "tour":
        tour()
        return 0
    try:
        return _train(args) if args.command == "train" else _eval(args)
    except ValueError as e:  # bad configuration: one clear line, no traceback
        print(f"agent-lab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
