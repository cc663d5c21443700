"""Frozen-checkpoint evaluation on held-out tasks (book/part3/00_number_search.md).

Evaluation is separate from training: it loads a checkpoint (or takes a policy and copies nothing into
it), runs without gradients under a declared decoding ("greedy" or "sampled" with a temperature), and
reports the success rate with a 95% Wilson interval next to the environment planner's exact optimum on
the *same* tasks, and the gap between them.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

# checkpoints are read and written by agent_lab.checkpoints; these names stay importable from here
from agent_lab.checkpoints import CheckpointError, load_checkpoint, model_config, save_checkpoint  # noqa: F401
from agent_lab.device import release_freed_memory
from agent_lab.policy import TinyTransformer, WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``p_hat = successes / n``.

    ``(p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``; unlike the normal interval it stays
    inside [0, 1] and is not degenerate at p_hat = 0 or 1. ``z = 1.96`` gives 95%.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes}")
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # At p_hat = 0 or 1 one bound is exactly 0 or 1; in floating point centre -/+ half can miss it by an ulp,
    # and an interval must contain the observed proportion.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


@dataclass
class EvalReport:
    """Success of a frozen policy on ``n`` tasks with its 95% CI, the planner's optimum and the gap."""

    env: str
    split: str
    decoding: str
    n: int
    successes: int
    success: float
    ci_low: float
    ci_high: float
    optimum: float  # the planner's exact success on the same tasks
    gap: float  # optimum - success
    mean_return: float
    mean_turns: float
    temperature: float = 1.0
    #: e.g. crafting level -> {n, success, ci_low, ci_high, optimum, failures}; ``failures`` counts the failed
    #: episodes by evaluate's ``classify`` (:func:`first_refusal` unless told), most common first
    by_group: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)  # the same count over all tasks

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        s = (f"{self.env}/{self.split} {self.decoding}: success {self.success:.3f} "
             f"[{self.ci_low:.3f}, {self.ci_high:.3f}] on {self.n} tasks; planner {self.optimum:.3f}, "
             f"gap {self.gap:+.3f}")
        for g, r in sorted(self.by_group.items(), key=lambda kv: str(kv[0])):
            s += (f"\n  {g}: success {r['success']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] (n={r['n']}), "
                  f"planner {r['optimum']:.3f}")
        return s


#: How :func:`first_refusal` names a failed episode none of whose actions was refused (it ran out of turns).
NO_REFUSAL = "no refusal"


def first_refusal(log: dict) -> str:
    """Why an episode went wrong first: the error of its first refused action (``"missing ingredients"``,
    ``"unknown item"``, ...), or :data:`NO_REFUSAL` when every action executed."""
    return next((t["error"] for t in log["turns"] if t.get("error")), NO_REFUSAL)


def _task_group(task: Any) -> Any:
    """Group key for per-level reports: a task's ``depth`` or ``level`` if it has one."""
    if isinstance(task, dict):
        for k in ("depth", "level"):
            if k in task:
                return f"{k} {task[k]}"
    return None


def _by_group(tasks: list, succ: list, opt: list[float], why: list[str | None]) -> dict:
    """Per task group (:func:`_task_group`): episodes, success with its Wilson interval, the planner's success
    and the failed episodes by their kind (most common first); tasks without a group are left out."""
    groups: dict = defaultdict(lambda: {"n": 0, "successes": 0, "opt": 0.0, "failures": Counter()})
    for task, s, o, w in zip(tasks, succ, opt, why):
        g = _task_group(task)
        if g is not None:
            groups[g]["n"] += 1
            groups[g]["successes"] += int(s)
            groups[g]["opt"] += o
            groups[g]["failures"].update([w] if w else [])
    by_group = {}
    for g, v in groups.items():
        g_lo, g_hi = wilson_interval(v["successes"], v["n"])
        by_group[g] = {"n": v["n"], "success": v["successes"] / v["n"], "ci_low": g_lo, "ci_high": g_hi,
                       "optimum": v["opt"] / v["n"], "failures": dict(v["failures"].most_common())}
    return by_group


def _planner_success(env, tasks: list) -> list[float]:
    """Per-task planner success (``env.optimal_success`` on one task at a time, or a batch mean)."""
    return [float(env.optimal_success([t])) for t in tasks]


#: The key/value cache one evaluation batch may hold, in bytes.
EVAL_CACHE_BYTES = 512e6


def eval_batch_size(policy: TinyTransformer, cache_bytes: float = EVAL_CACHE_BYTES, most: int = 1024) -> int:
    """Episodes per evaluation batch: at most ``most``, and no more than fit ``cache_bytes`` of keys and values at
    ``2 * max_len`` cache slots a row (``2 * n_layers * d_model`` numbers a slot). Rows advance in step, so a row
    also holds padding slots while others finish their turn, and its slots can pass ``max_len``. Larger batches
    sample faster; this bounds their memory, which grows with the policy's size and context."""
    cfg = policy.cfg
    per_row = 2 * cfg.n_layers * cfg.d_model * 2 * cfg.max_len * policy.tok_emb.weight.element_size()
    return max(1, min(most, int(cache_bytes // per_row)))


@torch.no_grad()
def evaluate(
    policy_or_checkpoint: TinyTransformer | str | Path,
    env,
    split: str = "test",
    decoding: str = "greedy",
    *,
    tasks: list | None = None,
    tokenizer: WordTokenizer | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    candidate_mask: bool = False,
    seed: int = 0,
    batch_size: int | None = None,
    samples_per_task: int = 1,
    device: str | torch.device | None = None,
    classify: Callable[[dict], str] = first_refusal,
) -> EvalReport:
    """Evaluate a frozen policy on held-out tasks; return an :class:`EvalReport`.

    ``env`` is an environment or its name (built with ``make_env``); ``tasks`` defaults to
    ``env.eval_tasks(split)``. ``decoding="sampled"`` draws ``samples_per_task`` episodes per task at
    ``temperature`` with a generator seeded by ``seed``. No gradients are taken and the policy's weights
    are left untouched (it is put in eval mode for the duration). Episodes run ``batch_size`` at a time
    (default :func:`eval_batch_size`). Failed episodes are counted by ``classify(log)`` of their episode log
    (default :func:`first_refusal`; crafting's :func:`~agent_lab.envs.crafting.first_mistake` says more).
    """
    if isinstance(policy_or_checkpoint, (str, Path)):
        policy, tokenizer, _ = load_checkpoint(policy_or_checkpoint, device or "cpu")
    else:
        policy = policy_or_checkpoint
        if tokenizer is None:
            raise ValueError("tokenizer must be given when evaluating a policy object (not a checkpoint path)")
    if isinstance(env, str):
        from agent_lab.envs import make_env

        env = make_env(env)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, decoding=decoding, candidate_mask=candidate_mask)
    if tasks is None:
        tasks = list(env.eval_tasks(split))
    if not tasks:
        raise ValueError(f"no evaluation tasks for split {split!r}")
    if not isinstance(samples_per_task, int) or samples_per_task < 1:
        raise ValueError(f"samples_per_task must be a positive int, got {samples_per_task!r}")
    if decoding == "greedy":
        samples_per_task = 1
    run = [t for t in tasks for _ in range(samples_per_task)]
    batch_size = batch_size or eval_batch_size(policy)
    dev = policy.tok_emb.weight.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    succ, rets, turns, why = [], [], [], []
    for i in range(0, len(run), batch_size):
        b = collect_rollouts(policy, tokenizer, env, run[i : i + batch_size], sampling, gen)
        succ += b.success.tolist()
        rets += b.episode_return.tolist()
        turns += b.num_turns.tolist()
        why += [None if ok else classify(log) for ok, log in zip(b.success.tolist(), b.episode_logs)]
    del b
    release_freed_memory()  # the batches' caches, of a new shape each time: held, they add up over evaluations
    opt = _planner_success(env, tasks)
    opt_run = [o for o in opt for _ in range(samples_per_task)]
    n, k = len(run), int(sum(succ))
    lo, hi = wilson_interval(k, n)
    by_group = _by_group(run, succ, opt_run, why)
    optimum = sum(opt_run) / n
    return EvalReport(
        env=getattr(env, "name", type(env).__name__), split=split, decoding=decoding, n=n, successes=k,
        success=k / n, ci_low=lo, ci_high=hi, optimum=optimum, gap=optimum - k / n,
        mean_return=sum(rets) / n, mean_turns=sum(turns) / n, temperature=temperature, by_group=by_group,
        failures=dict(Counter(w for w in why if w).most_common()),
    )
