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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tour", help="print a short tour of the package")
    args = parser.parse_args(argv)
    if args.command == "tour":
        tour()
    return 0


if __name__ == "__main__":
    sys.exit(main())
