"""Grading an agent handed in as a checkpoint: read safely, evaluated by the grader's own code on worlds the
student never saw.

A training run takes far longer than a grader can spend on one submission, so an assignment's student trains in
their own notebook and hands in the policy (a checkpoint file beside the notebook). The grader then

1. reads the file with :func:`agent_lab.checkpoints.load_checkpoint` (weights only, size-capped, the
   architecture of the assignment's recipe and the environment's vocabulary required: anything else is a
   :class:`~agent_lab.checkpoints.CheckpointError` and zero points);
2. refuses a copy of a reference agent that ships with the course's repository (the same weights, or all but:
   :func:`copied_reference`), so it earns no points and its message flags it for review;
3. evaluates the frozen policy greedily, decoding as the recipe trains (its candidate mask), on private worlds
   drawn from seeds that only the instructor's hidden tests hold, with the planner's success on the same worlds
   beside it (:func:`agent_lab.evaluation.evaluate`).

Nothing of the student's code runs here: the policy is a tensor file and the evaluation is the library's.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from agent_lab.checkpoints import CheckpointError, load_checkpoint
from agent_lab.evaluation import EvalReport, evaluate
from agent_lab.policy import WordTokenizer

__all__ = ["MAX_CHECKPOINT_BYTES", "REVIEW_FLAG", "ReferenceCopy", "copied_reference", "evaluate_checkpoint",
           "leaderboard_row", "reference_checkpoints"]

#: The largest checkpoint an assignment accepts (the assignment's policy is a few MB at most).
MAX_CHECKPOINT_BYTES = 32 << 20
#: The reference agents of the course (``autograder/samples/*.pt``): public with the repository, so a student may
#: have them.  Never counted as a student's own work.
REFERENCE_DIR = Path(__file__).resolve().parents[3] / "autograder" / "samples"
#: Set to ``1`` only by the grader of the bundled samples, whose reference student hands the reference in on purpose.
ACCEPT_REFERENCE_ENV = "AGENT_LAB_ACCEPT_REFERENCE_CHECKPOINT"
#: A policy whose weights lie within this relative distance of a reference's, ``|w - w_ref| / |w_ref|`` over all
#: weights at once, is a copy: a re-save, a cast to half or bfloat16 precision and back, or a little noise stay
#: inside it.  A student's run with the reference's seed, on a machine whose arithmetic gives the reference run's
#: cold start (that phase runs no student code), ends all but equal to the reference whatever small numerical
#: differences the student's functions make, because the short RL phase moves the weights only a little: such a
#: run is flagged too, and a person decides.
COPY_TOLERANCE = 3e-3
#: The words a test's message carries when a person must look at the submission (the grader's review column).
REVIEW_FLAG = "flagged for review"


class ReferenceCopy(CheckpointError):
    """The checkpoint handed in is (all but) a reference agent of the course."""


def reference_checkpoints() -> list[Path]:
    """The reference agents no student may hand in as their own (none when the grader grades its samples)."""
    if os.environ.get(ACCEPT_REFERENCE_ENV) == "1":
        return []
    return sorted(REFERENCE_DIR.glob("*.pt"))


def _flat(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().double().flatten() for k, v in policy.state_dict().items()}


_REFERENCES: dict[tuple, dict[str, torch.Tensor] | None] = {}  # read once per grading process


def _reference_weights(path: Path, expect: object) -> dict[str, torch.Tensor] | None:
    key = (str(path), path.stat().st_mtime_ns, repr(expect))
    if key not in _REFERENCES:
        try:
            _REFERENCES[key] = _flat(load_checkpoint(path, expect=expect)[0])
        except CheckpointError:  # a reference of another architecture: not one this policy could copy
            _REFERENCES[key] = None
    return _REFERENCES[key]


def copied_reference(policy: torch.nn.Module, references: Sequence[Path], expect: object) -> Path | None:
    """The reference in ``references`` whose weights ``policy`` has within :data:`COPY_TOLERANCE`, or None."""
    mine = _flat(policy)
    for ref in references:
        theirs = _reference_weights(ref, expect)
        if theirs is None or theirs.keys() != mine.keys() \
                or any(theirs[k].shape != mine[k].shape for k in mine):
            continue
        diff = sum(float((mine[k] - theirs[k]).square().sum()) for k in mine) ** 0.5
        norm = sum(float(theirs[k].square().sum()) for k in mine) ** 0.5
        if diff <= COPY_TOLERANCE * norm:
            return ref
    return None


def evaluate_checkpoint(path: str | Path, recipe_name: str, groups: dict[str, tuple[int, str, list[int]]], *,
                        max_bytes: int = MAX_CHECKPOINT_BYTES,
                        references: Sequence[Path] | None = None) -> dict[str, EvalReport]:
    """Per named group ``(level, goal pool, seeds)``, the greedy evaluation of the policy in ``path`` on those
    private worlds (:meth:`agent_lab.envs.crafting.Crafting.private_worlds`; goal pool ``"train"`` or
    ``"held_out"``).

    The policy must have the model of recipe ``recipe_name`` and its environment's vocabulary; it is evaluated
    with the recipe's environment options and candidate mask.  A copy of one of ``references`` (default:
    :func:`reference_checkpoints`) raises :class:`ReferenceCopy`, whose message flags it for review.
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
    copied = copied_reference(policy, reference_checkpoints() if references is None else references, expect)
    if copied is not None:
        raise ReferenceCopy(f"{REVIEW_FLAG}: its weights are those of the course's reference agent "
                            f"({copied.name}), which ships with the course's materials, so it earns no points; "
                            "if you trained it yourself, show your instructor the run")
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
