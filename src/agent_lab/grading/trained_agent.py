"""Grading an agent handed in as a checkpoint: read safely, evaluated by the grader's own code on worlds the
student never saw.

A training run takes far longer than a grader can spend on one submission, so an assignment's student trains in
their own notebook and hands in the policy (a checkpoint file beside the notebook). The grader then

1. reads the file with :func:`agent_lab.checkpoints.load_checkpoint` (weights only, size-capped, the
   architecture of the assignment's recipe and the environment's vocabulary required: anything else is a
   :class:`~agent_lab.checkpoints.CheckpointError` and zero points);
2. evaluates the frozen policy greedily, decoding as the recipe trains (its candidate mask), on private worlds
   drawn from seeds that only the instructor's hidden tests hold, with the planner's success on the same worlds
   beside it (:func:`agent_lab.evaluation.evaluate`).

Nothing of the student's code runs here: the policy is a tensor file and the evaluation is the library's.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from agent_lab.checkpoints import CheckpointError, load_checkpoint
from agent_lab.evaluation import EvalReport, evaluate
from agent_lab.policy import WordTokenizer

__all__ = ["MAX_CHECKPOINT_BYTES", "evaluate_checkpoint", "leaderboard_row"]

#: The largest checkpoint an assignment accepts (the assignment's policy is a few MB at most).
MAX_CHECKPOINT_BYTES = 32 << 20


def evaluate_checkpoint(path: str | Path, recipe_name: str, groups: dict[str, tuple[int, str, list[int]]], *,
                        max_bytes: int = MAX_CHECKPOINT_BYTES) -> dict[str, EvalReport]:
    """Per named group ``(level, goal pool, seeds)``, the greedy evaluation of the policy in ``path`` on those
    private worlds (:meth:`agent_lab.envs.crafting.Crafting.private_worlds`; goal pool ``"train"`` or
    ``"held_out"``).

    The policy must have the model of recipe ``recipe_name`` and its environment's vocabulary; it is evaluated
    with the recipe's environment options and candidate mask.
    """
    from agent_lab.recipes import recipe
    from agent_lab.trainer import build_env

    cfg = recipe(recipe_name)
    env = build_env(cfg)
    vocab = WordTokenizer.from_env(env)
    expect = dataclasses.replace(cfg.model, vocab_size=len(vocab))
    policy, tok, _ = load_checkpoint(path, expect=expect, max_bytes=max_bytes)
    if tok.vocab != vocab.vocab:
        raise CheckpointError(f"the checkpoint's vocabulary is not the {cfg.env} environment's of recipe "
                              f"{recipe_name!r}; train with that recipe's environment options")
    return {name: evaluate(policy, env, "private", tasks=env.private_worlds(seeds, level, goals), tokenizer=tok,
                           candidate_mask=cfg.sampling.candidate_mask)
            for name, (level, goals, seeds) in groups.items()}


def leaderboard_row(reports: dict[str, EvalReport]) -> dict:
    """One leaderboard row: per group, the success with its 95% Wilson interval, the planner's and ``n``."""
    row: dict = {}
    for name, r in reports.items():
        key = name.replace(" ", "_").replace("-", "_")
        row[f"{key}_success"] = round(r.success, 4)
        row[f"{key}_ci"] = f"[{r.ci_low:.3f}, {r.ci_high:.3f}]"
        row[f"{key}_planner"] = round(r.optimum, 4)
        row[f"{key}_n"] = r.n
    return row
