"""The training algorithms, each a few lines over the estimator library (book chapter "From REINFORCE to
Dr.GRPO in one trainer"; seed 000 §2-§6, seed 004 §6-§13).

An algorithm says three things, and nothing else:

* ``advantages(batch)``: the credit of each episode (``[B]``) or turn (``[B, T]``);
* ``surrogate(logprobs, batch, advantages)``: the per-token quantity to maximise (``[B, L-1]``);
* ``objective``: how tokens are summed and normalised (an :data:`agent_lab.estimators.aggregation.OBJECTIVES` name).

The trainer turns these into ``loss = -reduce_loss(aggregate(surrogate, action_mask, objective))`` and logs
the exact text of :meth:`Algorithm.describe` at the start of each run. What makes GRPO differ from Dr.GRPO
is visible below: a standardised versus a centred advantage, and a per-sequence versus a constant
normaliser. Every number comes from :mod:`agent_lab.estimators`; nothing here re-implements one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agent_lab.estimators.advantages import (
    group_centered_advantages,
    group_standardized_advantages,
    rloo_advantages,
)
from agent_lab.estimators.baselines import constant_baseline, running_mean_update
from agent_lab.estimators.filtering import rest_em_filter
from agent_lab.estimators.logprobs import kl_estimate
from agent_lab.estimators.policy_gradient import ppo_clipped_surrogate, reinforce_surrogate
from agent_lab.estimators.returns import reward_to_go

ALGORITHMS = ("reinforce", "rloo", "grpo", "dr_grpo", "rest_em", "ppo", "sft")
BASELINES = ("none", "constant", "running_mean")


@dataclass
class AlgoState:
    """What an algorithm carries across steps (saved in checkpoints): the running-mean baseline."""

    baseline_mean: float = 0.0
    baseline_count: int = 0

    def to_dict(self) -> dict:
        return {"baseline_mean": self.baseline_mean, "baseline_count": self.baseline_count}


@dataclass
class Algorithm:
    """Base: REINFORCE-style surrogate ``sg[A] * log pi`` over all action tokens, one epoch per batch."""

    name: str
    group_size: int = 1
    objective: str = "constant"
    max_tokens: int = 1
    epochs: int = 1
    uses_rollouts: bool = True
    options: dict = field(default_factory=dict)

    def advantages(self, batch, state: AlgoState) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def surrogate(self, logprobs: Tensor, batch, advantages: Tensor, ref_logprobs: Tensor | None = None):
        """Per-token surrogate to maximise ``[B, L-1]`` and a dict of statistics."""
        turn_ids = batch.turn_ids if advantages.dim() == 2 else None
        return reinforce_surrogate(logprobs, advantages, turn_ids=turn_ids), {}

    def loss_mask(self, batch, advantages: Tensor) -> Tensor:
        """Tokens that enter the loss and its normaliser ``[B, L-1]``: the action mask."""
        return batch.action_mask

    def describe(self) -> str:
        return f"{self.name}: see agent_lab.algorithms"

    def _normaliser(self) -> str:
        return {
            "constant": f"loss = -sum_ij m_ij s_ij / (B * max_tokens), max_tokens = {self.max_tokens} "
                        "(a constant: no length weighting)",
            "token_mean": "loss = -sum_ij m_ij s_ij / sum_ij m_ij (token mean over the batch)",
            "seq_mean_token_mean": "loss = -(1/B) sum_i [sum_j m_ij s_ij / sum_j m_ij] (sequence mean of token means)",
            "turn_then_trajectory": "loss = mean over tokens of each turn, then turns, then sequences",
        }[self.objective]

    _MASK = ("m_ij = action_mask: 1 on policy-sampled target tokens (action words and the newline ending each "
             "action), 0 on prompt, observations and padding; normalisers are global sums over all workers")


class Reinforce(Algorithm):
    """REINFORCE (Williams 1992) with an optional baseline; with ``reward_to_go`` each action is credited
    only with the rewards from its own turn on (``[B, T]`` credit placed on tokens by turn id)."""

    def advantages(self, batch, state: AlgoState) -> Tensor:
        o = self.options
        if o.get("reward_to_go"):
            ret = reward_to_go(batch.rewards, gamma=o.get("gamma", 1.0), mask=batch.turn_mask)  # [B, T]
        else:
            ret = batch.episode_return  # [B]
        kind = o.get("baseline", "none")
        if kind == "none":
            return ret
        if kind == "constant":
            return ret - constant_baseline(ret, o.get("baseline_value", 0.0))
        # running mean of episode returns seen *before* this batch (else it depends on the batch's own actions)
        b = state.baseline_mean if state.baseline_count > 0 else 0.0
        mean, count = running_mean_update(torch.tensor(state.baseline_mean), state.baseline_count,
                                          batch.episode_return.detach().cpu())
        state.baseline_mean, state.baseline_count = float(mean), int(count)
        adv = ret - b
        return adv * batch.turn_mask if adv.dim() == 2 else adv

    def describe(self) -> str:
        o = self.options
        credit = ("reward-to-go G_t = sum_{t'>=t} gamma^(t'-t) r_t' per turn, placed on that turn's tokens"
                  if o.get("reward_to_go") else "episode return R_i on every action token")
        base = {"none": "no baseline", "constant": f"constant baseline b = {o.get('baseline_value', 0.0)}",
                "running_mean": "running-mean baseline b = mean of all earlier episode returns"}[o.get("baseline", "none")]
        return (f"REINFORCE: A = {credit}, minus {base}; s_ij = sg[A] * log pi(x_ij | x_<ij); "
                f"{self._normaliser()}; {self._MASK}")


class RLOO(Algorithm):
    def advantages(self, batch, state):
        return rloo_advantages(batch.episode_return, self.group_size)

    def describe(self):
        return (f"RLOO: A_i = R_i - mean_{{k != i in group}} R_k (group_size G = {self.group_size}, contiguous rows "
                f"[gG, (g+1)G)); s_ij = sg[A_i] * log pi(x_ij); {self._normaliser()}; {self._MASK}")


class GRPO(Algorithm):
    EPS = 1e-6  # one constant for the computation and the printed loss, so the two cannot drift apart

    def advantages(self, batch, state):
        return group_standardized_advantages(batch.episode_return, self.group_size, eps=self.EPS)

    def describe(self):
        return (f"GRPO: A_i = (R_i - mean_group R) / (std_group R + {self.EPS:g}), population std (group_size G = "
                f"{self.group_size}, contiguous rows); s_ij = sg[A_i] * log pi(x_ij) (one epoch: ratio = 1, no "
                f"clipping needed); {self._normaliser()}; {self._MASK}")


class DrGRPO(Algorithm):
    def advantages(self, batch, state):
        return group_centered_advantages(batch.episode_return, self.group_size)

    def describe(self):
        return (f"Dr.GRPO: A_i = R_i - mean_group R (no std division; group_size G = {self.group_size}, contiguous "
                f"rows); s_ij = sg[A_i] * log pi(x_ij); {self._normaliser()}; {self._MASK}")


class RestEM(Algorithm):
    """ReST-EM: keep episodes with return >= threshold, maximise their log-likelihood for ``epochs`` passes."""

    def advantages(self, batch, state):
        sel = rest_em_filter(batch.episode_return, self.options.get("threshold", 1.0))
        return sel.weights  # 1 on kept episodes, 0 on the rest

    def loss_mask(self, batch, advantages):
        """Only the kept episodes' action tokens count, in the numerator and in the token-mean denominator."""
        return batch.action_mask & (advantages > 0)[:, None]

    def describe(self):
        return (f"ReST-EM: keep episodes with R >= {self.options.get('threshold', 1.0)} (weight 1, others 0), "
                f"s_ij = w_i * log pi(x_ij); {self._normaliser()} over kept episodes' tokens; {self.epochs} "
                f"epoch(s) per collected batch; {self._MASK}")


class PPO(Algorithm):
    """PPO's clipped surrogate on group-centred advantages (no critic), several epochs per batch, optional
    KL penalty to a frozen reference policy (the initial weights)."""

    def advantages(self, batch, state):
        return group_centered_advantages(batch.episode_return, self.group_size)

    def surrogate(self, logprobs, batch, advantages, ref_logprobs=None):
        o = self.options
        s, stats = ppo_clipped_surrogate(logprobs, batch.old_logprobs, advantages, batch.action_mask,
                                         clip_eps=o.get("clip_eps", 0.2))
        if o.get("kl_coef", 0.0) > 0 and ref_logprobs is not None:
            kl = kl_estimate(logprobs, ref_logprobs, kind=o.get("kl_kind", "k3"), action_mask=batch.action_mask)
            s = s - o["kl_coef"] * kl
            stats["kl_reference"] = (kl * batch.action_mask).sum().detach() / batch.action_mask.sum().clamp(min=1)
        return s, stats

    def describe(self):
        o = self.options
        kl = (f"minus {o.get('kl_coef')} * KL_{o.get('kl_kind', 'k3')}(pi || pi_ref) per token, pi_ref = frozen "
              "initial policy" if o.get("kl_coef", 0.0) > 0 else "no KL penalty")
        return (f"PPO: A_i = R_i - mean_group R (group_size G = {self.group_size}, contiguous rows; no critic); "
                f"rho_ij = exp(log pi(x_ij) - log mu(x_ij)) with mu the behaviour log-probs recorded at sampling; "
                f"s_ij = min(rho A_i, clip(rho, 1-{o.get('clip_eps', 0.2)}, 1+{o.get('clip_eps', 0.2)}) A_i) {kl}; "
                f"{self.epochs} epochs x {o.get('minibatches', 1)} minibatches per rollout batch; "
                f"{self._normaliser()}; {self._MASK}")


class SFT(Algorithm):
    """Supervised fine-tuning on the planner's demonstrations (the cold start): maximise log pi of each
    demonstrated action token."""

    def advantages(self, batch, state):
        return torch.ones(len(batch), device=batch.input_ids.device)

    def describe(self):
        return (f"SFT: s_ij = log pi(x_ij) on the planner's demonstrated action tokens (weight 1); "
                f"{self._normaliser()}; {self._MASK}")


_CLASSES = {"reinforce": Reinforce, "rloo": RLOO, "grpo": GRPO, "dr_grpo": DrGRPO, "rest_em": RestEM,
            "ppo": PPO, "sft": SFT}
#: Each algorithm's normalisation (the lecture's and the papers' choices).
DEFAULT_OBJECTIVE = {"reinforce": "constant", "rloo": "constant", "grpo": "seq_mean_token_mean",
                     "dr_grpo": "constant", "rest_em": "token_mean", "ppo": "constant", "sft": "token_mean"}


def make_algorithm(name: str, *, group_size: int, max_tokens: int, objective: str | None = None,
                   epochs: int = 1, **options: Any) -> Algorithm:
    """Build the algorithm called ``name`` (one of :data:`ALGORITHMS`)."""
    if name not in _CLASSES:
        raise ValueError(f"algo must be one of {ALGORITHMS}, got {name!r}")
    return _CLASSES[name](name=name, group_size=group_size, objective=objective or DEFAULT_OBJECTIVE[name],
                          max_tokens=max_tokens, epochs=epochs, uses_rollouts=name != "sft", options=options)
