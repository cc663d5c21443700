"""Estimator diagnostics: sparse-reward odds, degenerate groups, ESS, per-sample contributions, policy lag.

Lecture sections: "Trajectories couple a policy to an environment" (P(at least one success)), "The score-function
identity" (per-sample contribution norms, lecture notes section 3), "Group-relative advantages" (degenerate groups);
"Estimator diagnostics" (foundations chapter section 17).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ._validation import as_float_like, as_float_tensor, as_mask, check_ndim, group_count, positive_int

__all__ = [
    "prob_at_least_one_success",
    "degenerate_group_probability",
    "degenerate_group_fraction",
    "effective_sample_size",
    "per_sample_gradient_norms",
    "top_share",
    "policy_lag",
    "explained_variance",
]


def _probability(p: Any) -> Tensor:
    # Plain Python numbers become float64: these are closed-form figures quoted to several digits.
    if not isinstance(p, Tensor):
        try:
            p = torch.as_tensor(p, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"p must be a probability or a tensor of probabilities, got {p!r}") from exc
    p = as_float_tensor("p", p)
    if bool(((p < 0) | (p > 1)).any()):
        raise ValueError(f"p must lie in [0, 1], got values in [{float(p.min())!r}, {float(p.max())!r}]")
    return p


def prob_at_least_one_success(p: Any, n: int) -> Tensor:
    r"""Probability that n independent rollouts with success probability p contain at least one success.

    .. math:: P(\ge 1) = 1 - (1-p)^N

    Computed as ``-expm1(N * log1p(-p))`` so tiny p keep their digits. ``p`` is a number or a tensor of
    probabilities (element-wise); returns a tensor of the same shape. E.g. p=0.01, N=100 gives 0.634.
    Book: part1/01_trajectories_and_support.
    """
    p = _probability(p)
    n = positive_int("n", n)
    return -torch.expm1(n * torch.log1p(-p))


def degenerate_group_probability(p: Any, group_size: int) -> Tensor:
    r"""Probability that a group of G independent binary rewards is all-equal (no centred signal).

    .. math:: P(\text{degenerate}) = p^G + (1-p)^G

    Batched form of the lecture's ``degenerate_binary_group_probability``; element-wise over a tensor p.
    Book: part1/06_group_relative_advantages.
    """
    p = _probability(p)
    size = positive_int("group_size", group_size)
    return p.pow(size) + (1.0 - p).pow(size)


def degenerate_group_fraction(rewards: Any, group_size: int) -> Tensor:
    """Observed share of groups whose rewards are all equal (they get zero centred advantage).

    Shapes: ``rewards`` ``[B]`` in contiguous groups; returns a 0-dim tensor in [0, 1].
    Book: part2/08_diagnostics.
    """
    rewards = as_float_tensor("rewards", rewards)
    groups = group_count(rewards, group_size)
    grouped = rewards.reshape(groups, group_size)
    return (grouped == grouped[:, :1]).all(dim=1).to(rewards.dtype).mean()


def effective_sample_size(weights: Any, *, log_weights: bool = False) -> Tensor:
    r"""Effective sample size of importance weights along the last dimension.

    .. math:: \text{ESS} = \frac{(\sum_i w_i)^2}{\sum_i w_i^2}

    Between 1 (one weight dominates) and N (all equal). ``log_weights=True`` takes :math:`\log w` (e.g.
    sequence log-ratios) and evaluates :math:`\exp(2\,\mathrm{LSE}(\log w) - \mathrm{LSE}(2 \log w))`,
    which cannot overflow. Weights must be non-negative and not all zero. Shapes: ``[..., N]`` -> ``[...]``.
    Book: part2/08_diagnostics.
    """
    if log_weights:
        log_w = as_float_tensor("weights", weights, finite=False)
        if bool(torch.isnan(log_w).any() | (log_w == float("inf")).any()):
            raise ValueError("weights (log space) must not hold NaN or +inf")
        if bool((log_w == float("-inf")).all(dim=-1).any()):
            raise ValueError("weights must not be all zero (all log-weights -inf) along the last dimension")
        # ESS is scale-free, so subtract the row maximum first: keeps float32 digits for log-weights ~1e3.
        log_w = log_w - log_w.max(dim=-1, keepdim=True).values
        return torch.exp(2 * torch.logsumexp(log_w, dim=-1) - torch.logsumexp(2 * log_w, dim=-1))
    w = as_float_tensor("weights", weights)
    if bool((w < 0).any()):
        raise ValueError(f"weights must be non-negative, got minimum {float(w.min())!r}")
    squares = w.square().sum(dim=-1)
    if bool((squares == 0).any()):
        raise ValueError("weights must not be all zero along the last dimension")
    return w.sum(dim=-1).square() / squares


def per_sample_gradient_norms(contributions: Tensor, parameters: Iterable[Tensor]) -> Tensor:
    r"""L2 norm of each sample's gradient contribution :math:`\lVert g_i \rVert = \lVert \nabla_\theta c_i \rVert`.

    ``contributions`` ``[N]`` holds one differentiable scalar per sample, e.g. the per-sequence sum of the
    surrogate, :math:`c_i = A_i \log p_\theta(\tau_i)`, so :math:`g_i = A_i \nabla \log p_\theta(\tau_i)`
    (lecture notes section 3). One backward pass per sample (a diagnostic, not for every step). Returns ``[N]``,
    detached. Parameters a sample does not touch contribute zero.
    Book: part1/03_score_function_reinforce.
    """
    if not isinstance(contributions, Tensor) or contributions.ndim != 1 or contributions.numel() == 0:
        got = tuple(contributions.shape) if isinstance(contributions, Tensor) else type(contributions).__name__
        raise ValueError(f"contributions must be a non-empty [N] tensor of per-sample scalars, got {got}")
    if not contributions.requires_grad:
        raise ValueError("contributions must require grad (compute them from the parameters without no_grad)")
    params = [p for p in parameters if p.requires_grad]
    if not params:
        raise ValueError("parameters must contain at least one tensor that requires grad")
    norms = []
    for i in range(contributions.shape[0]):
        grads = torch.autograd.grad(contributions[i], params, retain_graph=True, allow_unused=True)
        # Sum squares in at least float32 (half-precision sums of many squares lose the small ones).
        squared = [g.detach().to(torch.promote_types(g.dtype, torch.float32)).square().sum() for g in grads if g is not None]
        norms.append(torch.stack(squared).sum().sqrt() if squared else contributions.new_zeros(()))
    return torch.stack(norms).to(contributions.dtype)


def top_share(values: Any, k: int = 1) -> Tensor:
    r"""Share of the total carried by the k largest entries: :math:`\sum_{\text{top } k} v / \sum v`.

    Applied to per-sample gradient norms it shows whether a few rare samples dominate the batch
    (lecture notes section 3). ``values`` ``[N]`` non-negative, not all zero; ``1 <= k <= N``. Returns 0-dim.
    Book: part1/03_score_function_reinforce.
    """
    values = as_float_tensor("values", values)
    check_ndim("values", values, (1,), "[N]")
    k = positive_int("k", k)
    if k > values.shape[0]:
        raise ValueError(f"k must be at most the number of values {values.shape[0]}, got {k}")
    if bool((values < 0).any()):
        raise ValueError(f"values must be non-negative (norms), got minimum {float(values.min())!r}")
    total = values.sum()
    if not bool(total > 0):
        raise ValueError("values must not all be zero")
    return values.topk(k).values.sum() / total


def policy_lag(policy_version: Any, current_version: int) -> Tensor:
    """Optimizer steps between the policy that sampled each sequence and the one being updated.

    ``policy_version`` ``[B]`` integer tags recorded at sampling time; returns ``[B]`` (0 = on-policy).
    A tag newer than ``current_version`` means the tags are wrong, so it raises.
    Book: part2/08_diagnostics.
    """
    if not isinstance(policy_version, Tensor):
        policy_version = torch.as_tensor(policy_version)
    if policy_version.dtype.is_floating_point or policy_version.dtype == torch.bool or policy_version.numel() == 0:
        raise ValueError(f"policy_version must be a non-empty integer tensor, got dtype {policy_version.dtype}")
    if isinstance(current_version, bool) or not isinstance(current_version, int):
        raise ValueError(f"current_version must be an int, got {current_version!r}")
    lag = current_version - policy_version
    if bool((lag < 0).any()):
        raise ValueError(
            f"policy_version must not exceed current_version {current_version}, got {int(policy_version.max())}"
        )
    return lag


def explained_variance(predictions: Any, targets: Any, mask: Tensor | None = None) -> Tensor:
    r"""How much of the targets' variance a critic's predictions explain.

    .. math:: \mathrm{EV} = 1 - \frac{\operatorname{Var}[y - \hat y]}{\operatorname{Var}[y]}

    over the entries inside ``mask`` (all entries by default; both variances over the same entries, so dividing
    by n or n - 1 does not matter). The residual's variance, not its mean square: a constant offset costs
    nothing. 1 is a perfect critic (up to a constant), 0 one no better than the targets' mean, and it is
    negative for a critic worse than that. Constant targets have no variance to explain: the result is
    NaN then, and for an empty mask. Shapes: ``predictions``, ``targets`` (e.g. values and
    lambda-returns ``[B, T]``) and ``mask`` of one shape; returns a detached 0-dim tensor.
    Book: part2/06_credit_assignment, part2/08_diagnostics.
    """
    y_hat = as_float_tensor("predictions", predictions).detach()
    y = as_float_like("targets", targets, y_hat).detach()
    if y.shape != y_hat.shape:
        raise ValueError(f"targets has shape {tuple(y.shape)} but predictions has shape {tuple(y_hat.shape)}; "
                         "they must match")
    keep = torch.ones_like(y, dtype=torch.bool) if mask is None else as_mask("mask", mask, y.shape)
    y, residual = y[keep], (y - y_hat)[keep]
    nan = torch.full((), float("nan"), dtype=y_hat.dtype, device=y_hat.device)
    if y.numel() == 0:
        return nan
    var_y = (y - y.mean()).square().mean()
    var_r = (residual - residual.mean()).square().mean()
    return torch.where(var_y > 0, 1 - var_r / torch.where(var_y > 0, var_y, torch.ones_like(var_y)), nan)
