"""The lecture's own API (CMU 11-768 Lecture 9, notes sections 4-6): plain sequences in, tuples out.

These four functions are the scalar, one-trajectory-at-a-time forms used by the lecture's examples.
The batched torch versions used by the trainer live in :mod:`agent_lab.estimators`; a test checks that
both agree wherever both apply. Book: book/part1/04_baselines.md (reinforce_estimate),
book/part1/05_reward_to_go_td_gae.md (reward_to_go), book/part1/06_group_relative_advantages.md
(centered_group_advantages, degenerate_binary_group_probability).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "reinforce_estimate",
    "reward_to_go",
    "centered_group_advantages",
    "degenerate_binary_group_probability",
]


def _finite_floats(name: str, values: Sequence[float]) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a sequence of real numbers, got {values!r}") from exc
    if not out:
        raise ValueError(f"{name} must not be empty; pass at least one value")
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{name} must be finite, got {bad[0]!r} in {values!r}; drop or fix NaN/inf entries")
    return out


def _unit_interval(name: str, value: float) -> float:
    value = float(value)
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return value


def reinforce_estimate(
    score_gradients: Sequence[Sequence[float]],
    rewards: Sequence[float],
    baselines: Sequence[float] | None = None,
) -> tuple[float, ...]:
    r"""Monte Carlo policy-gradient estimate averaged over N samples.

    .. math:: \hat g = \frac{1}{N} \sum_{i=1}^{N} (R_i - b_i)\, \nabla_\theta \log p_\theta(\tau_i)

    ``score_gradients[i]`` is the score vector of sample i (all of the same dimension D), ``rewards[i]``
    its return and ``baselines[i]`` its action-independent baseline (zero when omitted).
    Normalisation: divide by the number of samples N. Returns a D-tuple.
    """
    rewards_t = _finite_floats("rewards", rewards)
    n = len(rewards_t)
    if len(score_gradients) != n:
        raise ValueError(
            f"score_gradients has {len(score_gradients)} entries but rewards has {n}; pass one score vector per reward"
        )
    base_t = (0.0,) * n if baselines is None else _finite_floats("baselines", baselines)
    if len(base_t) != n:
        raise ValueError(f"baselines has {len(base_t)} entries but rewards has {n}; pass one baseline per reward")
    scores = [_finite_floats(f"score_gradients[{i}]", g) for i, g in enumerate(score_gradients)]
    dim = len(scores[0])
    if any(len(g) != dim for g in scores):
        raise ValueError(
            f"score_gradients must all have the same dimension; got dimensions {[len(g) for g in scores]}"
        )
    return tuple(
        math.fsum((r - b) * g[d] for r, b, g in zip(rewards_t, base_t, scores)) / n for d in range(dim)
    )


def reward_to_go(rewards: Sequence[float], gamma: float = 1.0) -> tuple[float, ...]:
    r"""Discounted reward-to-go of one finite trajectory, in one reverse pass.

    .. math:: G_t = \sum_{k=t}^{T-1} \gamma^{k-t} r_k = r_t + \gamma G_{t+1}, \qquad G_T = 0

    No terminal bootstrap value is added: the trajectory is assumed to have terminated. Returns a T-tuple.
    """
    rewards_t = _finite_floats("rewards", rewards)
    gamma = _unit_interval("gamma", gamma)
    out = [0.0] * len(rewards_t)
    running = 0.0
    for t in range(len(rewards_t) - 1, -1, -1):
        running = rewards_t[t] + gamma * running
        out[t] = running
    return tuple(out)


def centered_group_advantages(rewards: Sequence[float]) -> tuple[float, ...]:
    r"""Group-centred advantages for G samples of one task (Dr.GRPO style, no std division).

    .. math:: \hat A_j = R_j - \bar R, \qquad \bar R = \frac{1}{G}\sum_{k=1}^{G} R_k

    The advantages sum to zero. Returns a G-tuple.
    """
    rewards_t = _finite_floats("rewards", rewards)
    mean = math.fsum(rewards_t) / len(rewards_t)
    return tuple(r - mean for r in rewards_t)


def degenerate_binary_group_probability(p: float, group_size: int) -> float:
    r"""Probability that G independent binary rewards with success probability p are all equal.

    .. math:: P(\text{degenerate}) = p^G + (1-p)^G

    Such a group has all-zero centred advantages and gives no policy-gradient signal.
    """
    p = _unit_interval("p", p)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    return p**group_size + (1.0 - p) ** group_size
