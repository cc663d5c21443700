"""One update: the loss of a batch, the exact diagnostics of the step, and a clipped optimizer step that may
split the batch into micro-batches (book/part2/05_loss_normalisation.md, book/part2/08_diagnostics.md).

``loss = -reduce_loss(aggregate(surrogate, mask, objective))``: the algorithm gives the surrogate, the mask and
the objective (:mod:`agent_lab.algorithms`), the estimator library does the rest. Micro-batches change only how
much is held in memory at once: every micro-batch's numerator is divided by the *whole* step's denominator
(summed over micro-batches here and over workers by ``reduce_loss``), so the accumulated gradient equals the
gradient of the unsplit batch for every objective.

Logged statistics (each recomputed exactly in tests/trainer/test_statistics.py); mu is the behaviour policy
that sampled the batch (its log-probs recorded at sampling; "old" in the keys' names), pi the policy being
trained ("new"), pi_ref the frozen reference; means are over policy tokens (``action_mask``), ``rho = pi / mu``
per token; each KL key names its direction, its estimator and the policy whose samples it averages over:

============================  ====================================================================
``entropy``                   mean over policy tokens of H(pi(. | x_<j)) under the sampling masks and temperature
``ratio_mean/max/min``        mean, max, min of rho
``kl_old_new_k3_on_old``      KL(mu || pi) per token, k3 estimate (rho - 1) - log rho on mu's samples (unbiased; the
                              statistic PPO's surrogate returns under the same name, estimators.KL_OLD_NEW)
``kl_new_ref_k3_on_old``      KL(pi || pi_ref) per token: k3 = (r - 1) - log r, r = pi_ref / pi, weighted by rho on
                              mu's samples; E_mu[rho k3] = E_pi[k3] = KL(pi || pi_ref) at each visited context, at
                              every epoch (unweighted k3 on mu's samples would be biased once pi != mu)
``ess_fraction``              (sum_i w_i)^2 / sum_i w_i^2 / B with w_i = prod_j rho_ij per episode
``clip_frac_pos/neg``         PPO: share of tokens with A > 0 (A < 0) whose ratio the clip holds flat
``clip_fraction``             PPO: clipped tokens over tokens with A != 0
``grad_norm_before/after``    global gradient norm before and after clipping
``logprob_gap_max/mean``      max and mean |log mu - log pi| before the first update (theta = theta_old), pi
                              recomputed under the sampler's own transform (masks, temperature, top-p)
``train_tokens``              real tokens (``attention_mask``) through the update's forward and backward passes
============================  ====================================================================
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from agent_lab.estimators.aggregation import aggregate, reduce_loss
from agent_lab.estimators.logprobs import entropy_from_logits, kl_estimate, token_log_ratios, token_logprobs
from agent_lab.estimators.policy_gradient import KL_OLD_NEW
from agent_lab.estimators.statistics import effective_sample_size
from agent_lab.policy.model import prompt_arguments
from agent_lab.policy.packing import packed_logits
from agent_lab.rollout import RolloutBatch, top_p_logprobs
from agent_lab.timing import span

#: The logged key of the KL to the frozen reference: KL(new || ref), estimated on the old policy's samples.
KL_NEW_REF = "kl_new_ref_k3_on_old"

#: A plug-in's loss term: (micro-batch, its log-probs [b, L-1] with gradient, the whole batch, last micro-batch?)
#: -> (a 0-dim term added to the loss or None, statistics summed over micro-batches).
LossTerm = Callable[[RolloutBatch, Tensor, RolloutBatch, bool], tuple[Tensor | None, dict]]


def policy_logits(model, batch: RolloutBatch, temperature: float) -> Tensor:
    """Teacher-forced logits ``[B, L-1, V]`` under the sampling transform (recorded masks, temperature),
    so that with unchanged weights ``token_logprobs`` equals the recorded behaviour log-probs.

    Top-p truncation is *not* re-applied (it is not differentiable in the support): with ``top_p < 1`` the
    behaviour policy differs from the trained one, and PPO's ratio is what corrects for it. The pass runs on
    packed rows (:func:`~agent_lab.policy.packing.packed_logits`): same logits, less padding."""
    prompt = prompt_arguments(model, batch.prompt_lengths)  # a prefix-LM's prompt lengths
    out = packed_logits(model, batch.input_ids, batch.attention_mask, **prompt)
    V = batch.allowed_tokens.shape[-1]
    z = out[:, :-1, :V].to(torch.promote_types(out.dtype, torch.float32))  # bf16 -> float32; float64 stays
    return z.masked_fill(~batch.allowed_tokens, float("-inf")) / temperature


@dataclass
class Forward:
    """One (micro-)batch's forward pass: its loss and the per-token quantities the statistics need."""

    loss: Tensor  # 0-dim, normalised by the whole step's denominator
    logprobs: Tensor  # [B, L-1] log pi of each target token, with gradient
    entropy: Tensor  # [B, L-1] detached
    sampler_logprobs: Tensor | None = None  # [B, L-1] detached, under the sampler's transform (top-p included)
    user_stats: dict = field(default_factory=dict)  # what a user's loss_fn reported (PPO's), logged as it is


def student_loss(loss: Any) -> Tensor:
    """What a user's ``loss_fn`` returned (called by the algorithm's ``user_loss``): a 0-dim tensor is used as
    it is (only ``.backward()`` and ``.detach()`` are ever called on it), a pair ``(numerator, denominator)`` is
    normalised over workers by ``reduce_loss``."""
    if isinstance(loss, tuple) and len(loss) == 2 and all(isinstance(x, Tensor) and x.ndim == 0 for x in loss):
        return reduce_loss(*loss)  # the normaliser summed over workers
    if not (isinstance(loss, Tensor) and loss.ndim == 0):
        raise ValueError(f"loss_fn must return a 0-dim tensor or a pair (numerator, denominator) of 0-dim "
                         f"tensors, got {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}")
    return loss


def batch_loss(model, batch: RolloutBatch, advantages: Tensor, algo, *, entropy_coef: float = 0.0,
               ref_logprobs: Tensor | None = None, loss_fn: Callable | None = None,
               denominator: Tensor | None = None, sampler_view: bool = False) -> Forward:
    """The loss of one (micro-)batch, globally normalised: by ``denominator`` when given (the whole step's,
    for micro-batches), else by this batch's own. ``loss_fn`` replaces the surrogate and its normalisation."""
    z = policy_logits(model, batch, batch.temperature)
    logprobs = token_logprobs(z, batch.input_ids[:, 1:])  # [B, L-1]
    mask = algo.loss_mask(batch, advantages)
    with torch.set_grad_enabled(entropy_coef > 0 and torch.is_grad_enabled()):
        ent = entropy_from_logits(z)  # [B, L-1]
    user_stats: dict = {}
    if loss_fn is not None:
        result, user_stats = algo.user_loss(loss_fn, logprobs, mask, batch, advantages, ref_logprobs)
        loss = student_loss(result)
    else:
        s, _ = algo.surrogate(logprobs, batch, advantages, ref_logprobs)
        if entropy_coef > 0:
            s = s + entropy_coef * ent
        num, den = aggregate(s, mask, algo.objective, turn_ids=batch.turn_ids, max_tokens=algo.max_tokens)
        loss = reduce_loss(-num, den if denominator is None else denominator)
    sampler = None
    if sampler_view:
        with torch.no_grad():
            view = top_p_logprobs(torch.log_softmax(z.detach(), -1), batch.top_p) if batch.top_p < 1 else None
            sampler = logprobs.detach() if view is None else view.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return Forward(loss, logprobs, ent.detach(), sampler, user_stats)


# ----------------------------------------------------------------------------- statistics
def step_statistics(algo, batch: RolloutBatch, advantages: Tensor, logprobs: Tensor, entropy: Tensor,
                    ref_logprobs: Tensor | None = None) -> dict[str, float]:
    """The logged statistics of one update (see the module docstring), from detached ``[B, L-1]`` tensors."""
    with torch.no_grad():
        logprobs = logprobs.detach()
        am = batch.action_mask
        n_tok = am.sum().clamp(min=1)
        stats = {"entropy": float((entropy * am).sum() / n_tok)}
        if algo.uses_rollouts and bool(am.any()):
            log_ratio = token_log_ratios(logprobs, batch.old_logprobs, am)  # log pi/mu on policy tokens, 0 elsewhere
            ratio = log_ratio.exp()[am]
            stats.update(ratio_mean=float(ratio.mean()), ratio_max=float(ratio.max()), ratio_min=float(ratio.min()))
            # kl_estimate(x, y, "k3") = (r - 1) - log r with log r = y - x; here log r = log pi - log mu = log rho
            stats[KL_OLD_NEW] = float(kl_estimate(batch.old_logprobs, logprobs, "k3", am).sum() / n_tok)
            stats["ess_fraction"] = float(effective_sample_size(log_ratio.sum(-1), log_weights=True)) / len(am)
            _, ppo = algo.surrogate(logprobs, batch, advantages, ref_logprobs)
            if "clip_frac_pos" in ppo:
                n_pos, n_neg = float(ppo["n_pos"]), float(ppo["n_neg"])
                pos, neg = float(ppo["clip_frac_pos"]), float(ppo["clip_frac_neg"])
                stats.update(clip_frac_pos=pos, clip_frac_neg=neg,
                             clip_fraction=(pos * n_pos + neg * n_neg) / max(n_pos + n_neg, 1))
        if ref_logprobs is not None:
            stats[KL_NEW_REF] = kl_to_reference(logprobs, batch.old_logprobs, ref_logprobs, am)
    return stats


def kl_to_reference(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, action_mask: Tensor) -> float:
    """KL(pi || pi_ref) per policy token from tokens sampled by mu: the mean of ``rho * k3`` with ``rho = pi / mu``
    and ``k3 = (r - 1) - log r``, ``r = pi_ref / pi``. For each context, E_mu[rho k3] = E_pi[k3] = KL(pi || pi_ref)
    exactly, whether or not pi has moved away from mu (later PPO epochs); while pi = mu, rho = 1."""
    rho = token_log_ratios(logprobs, old_logprobs, action_mask).exp()
    k3 = kl_estimate(logprobs, ref_logprobs, "k3", action_mask)  # 0 outside the mask
    return float((rho * k3).sum() / action_mask.sum().clamp(min=1))


def logprob_gap(batch: RolloutBatch, sampler_logprobs: Tensor) -> dict[str, float]:
    """Largest and mean ``|old_logprobs - sampler_logprobs|`` over policy tokens (the sampler-trainer agreement)."""
    am = batch.action_mask
    if not bool(am.any()):
        return {}
    gap = (batch.old_logprobs - sampler_logprobs)[am].abs()
    return {"logprob_gap_max": float(gap.max()), "logprob_gap_mean": float(gap.mean())}


def loss_and_stats(model, batch: RolloutBatch, advantages: Tensor, algo, *, entropy_coef: float = 0.0,
                   ref_logprobs: Tensor | None = None, loss_fn: Callable | None = None) -> tuple[Tensor, dict]:
    """The loss of one batch and its statistics (one forward pass, no micro-batches)."""
    f = batch_loss(model, batch, advantages, algo, entropy_coef=entropy_coef, ref_logprobs=ref_logprobs,
                   loss_fn=loss_fn)
    return f.loss, step_statistics(algo, batch, advantages, f.logprobs, f.entropy, ref_logprobs)


# ----------------------------------------------------------------------------- the optimizer step
def micro_batches(n: int, size: int) -> list[slice]:
    """Rows ``[0, n)`` in consecutive slices of ``size`` rows (the last may be shorter); ``size=0``: one slice."""
    if size <= 0 or size >= n:
        return [slice(0, n)]
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def take(batch: RolloutBatch, advantages: Tensor, ref_logprobs: Tensor | None, rows: slice):
    """Rows ``rows`` of the batch (trimmed to their longest transcript), their advantages and reference log-probs."""
    part = batch.select(torch.arange(len(batch))[rows])
    ref = None if ref_logprobs is None else ref_logprobs[rows][:, : part.input_ids.shape[1] - 1]
    return part, advantages[rows], ref


def step_denominator(batch: RolloutBatch, advantages: Tensor, algo) -> Tensor:
    """This worker's share of the step's loss denominator (a count: it depends on the masks only)."""
    mask = algo.loss_mask(batch, advantages)
    zeros = torch.zeros(mask.shape, device=mask.device)
    return aggregate(zeros, mask, algo.objective, turn_ids=batch.turn_ids, max_tokens=algo.max_tokens)[1]


def _pad(t: Tensor, width: int) -> Tensor:
    return F.pad(t, (0, width - t.shape[1]))


def gradient_step(model, optimizer, batch: RolloutBatch, advantages: Tensor, algo, *, grad_clip: float,
                  entropy_coef: float = 0.0, ref_logprobs: Tensor | None = None, loss_fn: Callable | None = None,
                  micro_batch_size: int = 0, terms: Sequence[LossTerm] = (), ddp=None, amp=None,
                  sampler_view: bool = False) -> dict[str, Any]:
    """Forward and backward every micro-batch, clip the global gradient norm, take one optimizer step.

    ``ddp``: the DistributedDataParallel wrapper of ``model`` (gradients are averaged once, on the last
    micro-batch); ``amp``: an autocast context for the forward passes; ``terms``: plug-in loss terms, added to
    each micro-batch's loss. Returns the step's statistics, its loss and its gradient norms.
    """
    parts = micro_batches(len(batch), micro_batch_size)
    if len(parts) > 1 and loss_fn is not None:
        raise ValueError("micro_batch_size splits the loss's normaliser, which a loss_fn keeps to itself: "
                         "set micro_batch_size=0 with loss_fn")
    den = step_denominator(batch, advantages, algo) if len(parts) > 1 else None
    optimizer.zero_grad(set_to_none=True)
    loss_value, extra, views = 0.0, {}, []
    for i, rows in enumerate(parts):
        mb, adv, ref = (batch, advantages, ref_logprobs) if len(parts) == 1 else take(batch, advantages,
                                                                                      ref_logprobs, rows)
        last = i == len(parts) - 1
        with (ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext()), span("loss"):
            with amp or contextlib.nullcontext():
                f = batch_loss(ddp or model, mb, adv, algo, entropy_coef=entropy_coef, ref_logprobs=ref,
                               loss_fn=loss_fn, denominator=den, sampler_view=sampler_view)
                loss = f.loss
                extra.update(f.user_stats)
                for term in terms:
                    value, st = term(mb, f.logprobs, batch, last)
                    loss = loss if value is None else loss + value
                    for k, v in st.items():
                        extra[k] = extra.get(k, 0.0) + v
            loss.backward()
        loss_value += float(loss.detach())
        views.append((f.logprobs.detach(), f.entropy, f.sampler_logprobs))
    with span("optimizer"):
        norms = clip_and_step(model, optimizer, grad_clip)
    width = batch.action_mask.shape[1]
    lp, ent = (torch.cat([_pad(v[k], width) for v in views]) for k in (0, 1))
    stats = step_statistics(algo, batch, advantages, lp, ent, ref_logprobs)
    if sampler_view:
        stats.update(logprob_gap(batch, torch.cat([_pad(v[2], width) for v in views])))
    tokens = float(batch.attention_mask.sum())  # every real token went through forward and backward once
    return {**stats, **extra, **norms, "loss": loss_value, "train_tokens": tokens}


def clip_and_step(model, optimizer, grad_clip: float) -> dict[str, float]:
    """Clip the global gradient norm at ``grad_clip`` and step; the norm before and after clipping."""
    before = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
    after = min(before, grad_clip) if math.isfinite(before) else float("nan")
    optimizer.step()
    return {"grad_norm_before": before, "grad_norm_after": after}
