"""The training algorithms, each a small class over the estimator library (book/part1/06_group_relative_advantages.md,
book/part1/07_off_policy_ppo_kl_rewards.md; lecture notes sections 2-7).

An algorithm says everything the trainer needs to know about it, so the trainer never asks for its name:

* ``advantages(batch, state, features)``: the credit of each episode (``[B]``) or turn (``[B, T]``), one call
  for every algorithm (``features``: the policy's decision states where ``needs_decision_states``, else None);
* ``continuations()``: ``(K, gamma)``, K continuations from each turn's saved state and their discount;
* ``surrogate(logprobs, batch, advantages, ref_logprobs)``: the per-token quantity to maximise (``[B, L-1]``);
* ``loss_mask(batch, advantages)``: which tokens enter the loss (ReST-EM keeps only the kept episodes');
* ``objective``: how tokens are summed and normalised (an ``estimators.aggregation.OBJECTIVES`` name);
* what its update needs: ``needs_groups`` (contiguous groups of one task), ``needs_reference()`` (a frozen copy
  of the policy when RL starts), ``epochs`` and ``minibatches`` per rollout batch;
* ``describe()``: the exact loss, printed and saved at the start of each run.

Its own settings are its dataclass fields declared with ``agent_lab.config.setting`` (PPO's ``clip_eps``,
REINFORCE's ``baseline``): a default, a help text and, where the field's name would be ambiguous among all
algorithms, its flat keyword (``ppo_epochs``). They are passed by name to :func:`make_algorithm`, and the flat
keywords and the command line's flags are generated from them. What makes GRPO differ from Dr.GRPO is visible
below: a standardised versus a centred advantage, and a per-sequence versus a constant normaliser. A new
algorithm is one class with ``@register``, in this file or a file of its own.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from agent_lab.config import declared, make_declared, setting
from agent_lab.estimators.advantages import (
    group_centered_advantages,
    group_standardized_advantages,
    rloo_advantages,
)
from agent_lab.estimators.baselines import constant_baseline, running_mean_update
from agent_lab.estimators.aggregation import reduce_loss
from agent_lab.estimators.credit import (
    anchor_state_advantages,
    anchor_state_baselines,
    anchor_state_ids,
    branching_advantages,
    gae_targets,
    value_loss,
)
from agent_lab.estimators.filtering import rest_em_filter
from agent_lab.estimators.logprobs import KL_KINDS, kl_estimate
from agent_lab.estimators.policy_gradient import ppo_clipped_surrogate, reinforce_surrogate
from agent_lab.estimators.returns import reward_to_go
from agent_lab.estimators.statistics import explained_variance

BASELINES = ("none", "constant", "running_mean")
#: What each KL estimator does as PPO's penalty on the policy's own samples (pi = mu, the first epoch):
#: the value it averages to and the gradient it gives in expectation (estimators.kl_estimate).
KL_PENALTY = {
    "k1": "log pi - log pi_ref: value KL(pi || pi_ref), expected gradient 0",
    "k2": "(log pi - log pi_ref)^2 / 2: value biased, expected gradient grad KL(pi || pi_ref)",
    "k3": "r - 1 - log r, r = pi_ref / pi: value KL(pi || pi_ref), expected gradient grad KL(pi_ref || pi)",
}
_MASK = ("m_ij = action_mask: 1 on policy-sampled target tokens (action words and the newline ending each "
         "action), 0 on prompt, observations and padding; normalisers are global sums over all workers and "
         "micro-batches")


@dataclass
class AlgoState:
    """What an algorithm carries across steps (saved in checkpoints): the running-mean baseline."""

    baseline_mean: float = 0.0
    baseline_count: int = 0

    def to_dict(self) -> dict:
        return {"baseline_mean": self.baseline_mean, "baseline_count": self.baseline_count}


@dataclass
class Algorithm:
    """Base: REINFORCE-style surrogate ``sg[A] * log pi`` over all action tokens, one update per batch."""

    group_size: int = 1
    max_tokens: int = 1  # the most policy tokens an episode holds: the "constant" objective's normaliser
    objective: str | None = None  # None: default_objective

    name: ClassVar[str] = ""
    default_objective: ClassVar[str] = "constant"
    needs_groups: ClassVar[bool] = False  # its advantages compare the samples of one task
    uses_rollouts: ClassVar[bool] = True  # False: it trains on demonstrations (SFT)
    #: What a user's ``loss_fn`` receives here: the call :meth:`user_loss` makes.
    loss_fn_signature: ClassVar[str] = "loss_fn(logprobs, action_mask, advantages, max_tokens)"
    #: Its advantages read the policy's hidden state at each turn's decision (a critic): the trainer computes
    #: ``features`` for :meth:`advantages` only then (else it passes None).
    needs_decision_states: ClassVar[bool] = False
    epochs = 1  # passes over each rollout batch (a field where an algorithm makes it an option)
    minibatches = 1  # optimizer steps per pass

    def __post_init__(self):
        if self.objective is None:
            self.objective = self.default_objective

    def needs_reference(self) -> bool:
        """Whether the surrogate needs the log-probs of a frozen reference policy."""
        return False

    def continuations(self) -> tuple[int, float]:
        """``(K, gamma)``: K continuations its advantages need from the saved state before each turn (0: none)
        and the discount of their returns. The trainer samples them after collecting (``agent_lab.branching``)
        into ``batch.continuation_returns``."""
        return 0, 1.0

    def advantages(self, batch, state: AlgoState,
                   features: tuple[Tensor, Tensor] | None = None) -> Tensor:  # pragma: no cover - overridden
        """The credit of each episode ``[B]`` or turn ``[B, T]`` of ``batch``; ``state`` carries what the algorithm
        keeps across steps (a running mean), ``features`` the policy's detached hidden states ``(at each turn's
        decision [B, T, d], after the last turn [B, d])`` when :attr:`needs_decision_states`, else None."""
        raise NotImplementedError

    def surrogate(self, logprobs: Tensor, batch, advantages: Tensor, ref_logprobs: Tensor | None = None):
        """Per-token surrogate to maximise ``[B, L-1]`` and a dict of statistics."""
        turn_ids = batch.turn_ids if advantages.dim() == 2 else None
        return reinforce_surrogate(logprobs, advantages, turn_ids=turn_ids), {}

    def statistics(self, batch) -> dict[str, float]:
        """What this algorithm logs about a rollout batch beyond the trainer's own statistics (none by default)."""
        return {}

    def state_dict(self) -> dict:
        """What the algorithm has learned beyond the policy (a critic), saved in the checkpoint; none by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` from a checkpoint."""

    def loss_mask(self, batch, advantages: Tensor) -> Tensor:
        """Tokens that enter the loss and its normaliser ``[B, L-1]``: the action mask."""
        return batch.action_mask

    def user_loss(self, loss_fn, logprobs: Tensor, mask: Tensor, batch, advantages: Tensor,
                  ref_logprobs: Tensor | None) -> tuple[Any, dict]:
        """Call a user's ``loss_fn`` in place of the surrogate and its normalisation: ``(its result, stats)``.
        A REINFORCE-style algorithm hands it the token log-probs, the loss mask, the advantages and the
        constant normaliser's ``max_tokens``."""
        return loss_fn(logprobs, mask, advantages, self.max_tokens), {}

    def describe(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def _normaliser(self) -> str:
        return {
            "constant": f"loss = -sum_ij m_ij s_ij / (B * max_tokens), max_tokens = {self.max_tokens} "
                        "(a constant: no length weighting)",
            "token_mean": "loss = -sum_ij m_ij s_ij / sum_ij m_ij (token mean over the batch)",
            "seq_mean_token_mean": "loss = -(1/B) sum_i [sum_j m_ij s_ij / sum_j m_ij] (sequence mean of token means)",
            "turn_then_trajectory": "loss = mean over tokens of each turn, then turns, then sequences",
        }[self.objective]


#: name -> class; the registry lives in agent_lab.config, which reads each class's declared options from it.
_REGISTRY: dict[str, type[Algorithm]] = declared("algorithm")


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` available to :func:`make_algorithm` under ``cls.name``."""
    # the trainer passes features to every algorithm, plug-ins and direct callers may leave them out: refuse, at
    # import, a class that either call would fail on
    signature = inspect.signature(cls.advantages)
    try:
        signature.bind(cls, "batch", "state", "features")
        signature.bind(cls, "batch", "state")
    except TypeError:
        raise TypeError(f"{cls.__name__}.advantages must accept (batch, state, features=None), as "
                        "Algorithm.advantages does; features is None unless needs_decision_states") from None
    _REGISTRY[cls.name] = cls
    return cls


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@register
@dataclass
class Reinforce(Algorithm):
    """REINFORCE (Williams 1992) with an optional baseline; with ``reward_to_go`` each action is credited
    only with the rewards from its own turn on (``[B, T]`` credit placed on tokens by turn id)."""

    baseline: str = setting("none", "none | constant | running_mean")
    baseline_value: float = setting(0.0, "the constant baseline's value")
    reward_to_go: bool = setting(False, "credit each action with the rewards from its own turn on")
    gamma: float = setting(1.0, "discount of the reward-to-go")

    name: ClassVar[str] = "reinforce"

    def __post_init__(self):
        super().__post_init__()
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")

    def advantages(self, batch, state: AlgoState, features=None) -> Tensor:
        if self.reward_to_go:
            ret = reward_to_go(batch.rewards, gamma=self.gamma, mask=batch.turn_mask)  # [B, T]
        else:
            ret = batch.episode_return  # [B]
        if self.baseline == "none":
            return ret
        if self.baseline == "constant":
            return ret - constant_baseline(ret, self.baseline_value)
        # running mean of episode returns seen *before* this batch (else it depends on the batch's own actions)
        b = state.baseline_mean if state.baseline_count > 0 else 0.0
        mean, count = running_mean_update(torch.tensor(state.baseline_mean), state.baseline_count,
                                          batch.episode_return.detach().cpu())
        state.baseline_mean, state.baseline_count = float(mean), int(count)
        adv = ret - b
        return adv * batch.turn_mask if adv.dim() == 2 else adv

    def describe(self) -> str:
        credit = ("reward-to-go G_t = sum_{t'>=t} gamma^(t'-t) r_t' per turn, placed on that turn's tokens"
                  if self.reward_to_go else "episode return R_i on every action token")
        base = {"none": "no baseline", "constant": f"constant baseline b = {self.baseline_value}",
                "running_mean": "running-mean baseline b = mean of all earlier episode returns"}[self.baseline]
        return (f"REINFORCE: A = {credit}, minus {base}; s_ij = sg[A] * log pi(x_ij | x_<ij); "
                f"{self._normaliser()}; {_MASK}")


@register
@dataclass
class RLOO(Algorithm):
    name: ClassVar[str] = "rloo"
    needs_groups: ClassVar[bool] = True

    def advantages(self, batch, state, features=None):
        return rloo_advantages(batch.episode_return, self.group_size)

    def describe(self):
        return (f"RLOO: A_i = R_i - mean_{{k != i in group}} R_k (group_size G = {self.group_size}, contiguous rows "
                f"[gG, (g+1)G)); s_ij = sg[A_i] * log pi(x_ij); {self._normaliser()}; {_MASK}")


@register
@dataclass
class GRPO(Algorithm):
    name: ClassVar[str] = "grpo"
    default_objective: ClassVar[str] = "seq_mean_token_mean"
    needs_groups: ClassVar[bool] = True
    EPS: ClassVar[float] = 1e-6  # one constant for the computation and the printed loss

    def advantages(self, batch, state, features=None):
        return group_standardized_advantages(batch.episode_return, self.group_size, eps=self.EPS)

    def describe(self):
        return (f"GRPO: A_i = (R_i - mean_group R) / (std_group R + {self.EPS:g}), population std (group_size G = "
                f"{self.group_size}, contiguous rows); s_ij = sg[A_i] * log pi(x_ij) (one epoch: ratio = 1, no "
                f"clipping needed); {self._normaliser()}; {_MASK}")


@register
@dataclass
class DrGRPO(Algorithm):
    name: ClassVar[str] = "dr_grpo"
    needs_groups: ClassVar[bool] = True

    def advantages(self, batch, state, features=None):
        return group_centered_advantages(batch.episode_return, self.group_size)

    def describe(self):
        return (f"Dr.GRPO: A_i = R_i - mean_group R (no std division; group_size G = {self.group_size}, contiguous "
                f"rows); s_ij = sg[A_i] * log pi(x_ij); {self._normaliser()}; {_MASK}")


ANCHORS = ("state", "history")


def anchor_keys(batch, anchor: str) -> list[list[str]]:
    """Per-turn anchor keys of a batch's episodes, from their logs: the environment's ``state`` before each turn,
    or the ``history`` (every text sampled before it, which names the state of any deterministic task)."""
    if len(batch.episode_logs) != len(batch):
        raise ValueError("anchor-state groups need the batch's episode logs (env.episode_logs()); this batch has "
                         f"{len(batch.episode_logs)} for {len(batch)} episodes")
    if anchor == "history":
        return [["\n".join(str(t["text"]) for t in log["turns"][:i]) for i in range(len(log["turns"]))]
                for log in batch.episode_logs]
    keys = [[t.get("state") for t in log["turns"]] for log in batch.episode_logs]
    if any(k is None for row in keys for k in row):
        raise ValueError("these episode logs record no 'state' per turn (logs written before environments logged "
                         "their states); use anchor='history'")
    return keys


@register
@dataclass
class GiGPO(Algorithm):
    """GiGPO (Feng et al. 2025): Dr.GRPO's episode advantage plus a step advantage from anchor states, the turns
    of a group's episodes that act in the same environment state (``estimators.anchor_state_advantages``)."""

    step_weight: float = setting(1.0, "weight omega of the anchor-state step advantage (0: Dr.GRPO)")
    gamma: float = setting(1.0, "discount of the reward-to-go inside the step term", flat="gigpo_gamma")
    anchor: str = setting("state", "turns share a baseline when they act in the same state | history "
                                   "(see anchor_keys)")

    name: ClassVar[str] = "gigpo"
    needs_groups: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if self.anchor not in ANCHORS:
            raise ValueError(f"anchor must be one of {ANCHORS}, got {self.anchor!r}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if not (math.isfinite(self.step_weight) and self.step_weight >= 0):
            raise ValueError(f"step_weight must be a finite number >= 0, got {self.step_weight!r}")

    def _ids(self, batch) -> Tensor:
        return anchor_state_ids(anchor_keys(batch, self.anchor), batch.rewards.shape[1]).to(batch.rewards.device)

    def advantages(self, batch, state, features=None):
        return anchor_state_advantages(batch.rewards, self._ids(batch), batch.turn_mask, self.group_size, self.gamma,
                                       step_weight=self.step_weight)

    def statistics(self, batch):
        """``anchor_shared_fraction``: the share of real turns whose anchor set holds another turn of their group.
        The others are singletons, whose step term is 0; at 0 GiGPO is Dr.GRPO."""
        real = batch.turn_mask
        _, counts = anchor_state_baselines(batch.rewards, self._ids(batch), real, self.group_size)
        return {"anchor_shared_fraction": int(((counts >= 2) & real).sum()) / max(int(real.sum()), 1)}

    def describe(self):
        return (f"GiGPO: A_it = (R_i - mean_group R) + {self.step_weight:g} * (G_it - b_it), G_it the reward-to-go "
                f"(gamma = {self.gamma:g}) from turn t, b_it the mean G over the group's turns taken in the same "
                f"{self.anchor} (a turn alone in its {self.anchor} has step term 0; group_size G = "
                f"{self.group_size}, contiguous rows); s_ij = sg[A_it] * log pi(x_ij) on turn t's tokens; "
                f"{self._normaliser()}; {_MASK}")


@register
@dataclass
class RestEM(Algorithm):
    """ReST-EM: keep episodes with return >= threshold, maximise their log-likelihood for ``epochs`` passes."""

    epochs: int = setting(2, "passes over the kept episodes of each batch", flat="rest_em_epochs")
    threshold: float = setting(1.0, "keep episodes whose return reaches this", flat="rest_em_threshold")

    name: ClassVar[str] = "rest_em"
    default_objective: ClassVar[str] = "token_mean"

    def __post_init__(self):
        super().__post_init__()
        _positive("rest_em_epochs", self.epochs)
        if not math.isfinite(self.threshold):
            raise ValueError(f"rest_em_threshold must be a finite number, got {self.threshold!r}")

    def advantages(self, batch, state, features=None):
        return rest_em_filter(batch.episode_return, self.threshold).weights  # 1 on kept episodes, 0 on the rest

    def loss_mask(self, batch, advantages):
        """Only the kept episodes' action tokens count, in the numerator and in the token-mean denominator."""
        return batch.action_mask & (advantages > 0)[:, None]

    def describe(self):
        return (f"ReST-EM: keep episodes with R >= {self.threshold} (weight 1, others 0), s_ij = w_i * log pi(x_ij); "
                f"{self._normaliser()} over kept episodes' tokens; {self.epochs} epoch(s) per collected batch; {_MASK}")


@register
@dataclass
class PPO(Algorithm):
    """PPO's clipped surrogate on group-centred advantages (no critic), several epochs per batch, optional
    KL penalty to a frozen reference policy (the policy when RL starts).

    The penalty subtracts ``kl_coef * kl_estimate(log pi, log pi_ref, kl_kind)`` per token of the behaviour
    policy's samples. Which KL it pulls on depends on the kind (:data:`KL_PENALTY`, from
    ``estimators.kl_estimate``): with the default k3 its *value* estimates KL(pi || pi_ref) while pi = mu, but
    its expected *gradient* there is grad KL(pi_ref || pi), the reverse direction; k2 gives grad KL(pi ||
    pi_ref). After the first epoch the samples are mu's, not pi's, and neither statement holds exactly; the
    logged ``kl_new_ref_k3_on_old`` reweights by rho and stays unbiased."""

    epochs: int = setting(4, "passes over each rollout batch", flat="ppo_epochs")
    minibatches: int = setting(1, "optimizer steps per pass")
    clip_eps: float = setting(0.2, "the ratio is clipped to [1 - clip_eps, 1 + clip_eps]")
    kl_coef: float = setting(0.0, "weight of the KL penalty to the frozen reference (0: none)")
    kl_kind: str = setting("k3", "the KL estimator of the penalty, k1 | k2 | k3")

    name: ClassVar[str] = "ppo"
    needs_groups: ClassVar[bool] = True
    loss_fn_signature: ClassVar[str] = ("loss_fn(logprobs, old_logprobs, advantages, action_mask, clip_eps, "
                                        "ref_logprobs, kl_coef) -> (loss, stats)")

    def __post_init__(self):
        super().__post_init__()
        _positive("ppo_epochs", self.epochs)
        _positive("minibatches", self.minibatches)
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_kind not in KL_KINDS:
            raise ValueError(f"kl_kind must be one of {KL_KINDS}, got {self.kl_kind!r}")

    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, batch, state, features=None):
        return group_centered_advantages(batch.episode_return, self.group_size)

    def surrogate(self, logprobs, batch, advantages, ref_logprobs=None):
        turn_ids = batch.turn_ids if advantages.dim() == 2 else None  # [B, T] turn credit goes to its turn's tokens
        s, stats = ppo_clipped_surrogate(logprobs, batch.old_logprobs, advantages, batch.action_mask,
                                         clip_eps=self.clip_eps, turn_ids=turn_ids)
        if self.kl_coef > 0 and ref_logprobs is not None:
            kl = kl_estimate(logprobs, ref_logprobs, kind=self.kl_kind, action_mask=batch.action_mask)
            s = s - self.kl_coef * kl
        return s, stats

    def user_loss(self, loss_fn, logprobs, mask, batch, advantages, ref_logprobs):
        """A user's whole PPO loss: the behaviour log-probs recorded at sampling, this algorithm's ``clip_eps``
        and ``kl_coef``, the frozen reference's log-probs (the behaviour's when there is no KL penalty, so the
        penalty is zero); it returns the loss and a dict of float statistics, logged with a ``user_`` prefix."""
        ref = ref_logprobs if ref_logprobs is not None else batch.old_logprobs
        out = loss_fn(logprobs, batch.old_logprobs, advantages, mask, self.clip_eps, ref, self.kl_coef)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise ValueError(f"PPO's {self.loss_fn_signature} must return a pair (loss, stats dict), got "
                             f"{type(out).__name__}")
        stats = {f"user_{k}": float(v) for k, v in out[1].items() if isinstance(v, (int, float, Tensor))}
        return out[0], stats

    def describe(self):
        return (f"PPO: A_i = R_i - mean_group R (group_size G = {self.group_size}, contiguous rows; no critic); "
                + self._clipped("A_i"))

    def _clipped(self, a: str) -> str:
        """The clipped surrogate, its KL penalty, epochs and normaliser, for advantage ``a``."""
        kl = (f"minus {self.kl_coef} * {self.kl_kind}(pi, pi_ref) per token of mu's samples, pi_ref = frozen policy "
              f"when RL starts ({KL_PENALTY[self.kl_kind]})" if self.kl_coef > 0 else "no KL penalty")
        return (f"rho_ij = exp(log pi(x_ij) - log mu(x_ij)) with mu the behaviour log-probs recorded at sampling; "
                f"s_ij = min(rho {a}, clip(rho, 1-{self.clip_eps}, 1+{self.clip_eps}) {a}) {kl}; "
                f"{self.epochs} epochs x {self.minibatches} minibatches per rollout batch; "
                f"{self._normaliser()}; {_MASK}")


@register
@dataclass
class PPOCritic(PPO):
    """PPO with a turn-level critic and GAE (Schulman et al. 2016), the classic actor-critic PPO.

    The critic :math:`V_\\phi(h_t)` (:class:`agent_lab.critic.TurnCritic`, created at the first batch) reads the
    policy's hidden state where turn t's action starts, detached, so its loss never trains the policy. Each batch:
    the advantages are ``estimators.gae_targets`` of the critic's values *before* it sees the batch (a row cut
    by the context bootstraps from the state after its last turn), then the critic regresses on the batch's
    lambda-returns for ``critic_steps`` Adam steps. The clipped surrogate and its options are PPO's; the critic
    and its optimizer are saved in the checkpoint (:meth:`state_dict`)."""

    gamma: float = setting(1.0, "discount over turns", flat="gae_gamma")
    gae_lambda: float = setting(0.95, "GAE's lambda over turns (0: TD residual of the critic, most bias; "
                                      "1: return minus the critic, most variance)")
    critic_lr: float = setting(3e-3, "the critic's Adam learning rate")
    critic_steps: int = setting(50, "full-batch Adam steps on the value loss per rollout batch")
    critic_hidden: int = setting(64, "width of the critic's two tanh layers")

    name: ClassVar[str] = "ppo_gae"
    needs_groups: ClassVar[bool] = False
    needs_decision_states: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gae_gamma must be in (0, 1], got {self.gamma}")
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if not self.critic_lr > 0:
            raise ValueError(f"critic_lr must be > 0, got {self.critic_lr}")
        _positive("critic_steps", self.critic_steps)
        _positive("critic_hidden", self.critic_hidden)
        self.critic, self.critic_optimizer, self._stats = None, None, {}

    def _build_critic(self, in_features: int, device) -> None:
        from agent_lab.critic import TurnCritic

        self.critic = TurnCritic(in_features, hidden=self.critic_hidden).to(device)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=self.critic_lr)

    def advantages(self, batch, state, features=None):
        if features is None:
            raise ValueError("ppo_gae needs the policy's decision states: advantages(batch, state, features)")
        decisions, after_last = features
        if self.critic is None:
            self._build_critic(decisions.shape[-1], decisions.device)
        dtype = next(self.critic.parameters()).dtype  # bf16 states under autocast, float64 ones in the book
        decisions, after_last = decisions.to(dtype), after_last.to(dtype)
        mask = batch.turn_mask
        with torch.no_grad():
            values, bootstrap = self.critic(decisions), self.critic(after_last)
        adv, targets = gae_targets(batch.rewards, values, mask, self.gamma, self.gae_lambda, ~batch.truncated,
                                   torch.where(batch.truncated, bootstrap, torch.zeros_like(bootstrap)))
        before = reduce_loss(*value_loss(values, targets, mask))
        with torch.enable_grad():  # the critic's own fit, whatever the caller's grad mode
            for _ in range(self.critic_steps):
                loss = reduce_loss(*value_loss(self.critic(decisions), targets, mask))
                self.critic_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.critic_optimizer.step()
        with torch.no_grad():
            after = reduce_loss(*value_loss(self.critic(decisions), targets, mask))
        real = mask.bool()
        self._stats = {"value_loss": float(before), "value_loss_after_fit": float(after),
                       "explained_variance": float(explained_variance(values, targets, real)),
                       "value_mean": float(values[real].mean()) if real.any() else float("nan")}
        return adv

    def statistics(self, batch):
        """The critic on this batch, before its fit: ``value_loss`` (1/2 squared error to the lambda-returns),
        ``explained_variance`` of the lambda-returns by its values, ``value_mean``; and ``value_loss_after_fit``."""
        return dict(self._stats)

    def state_dict(self):
        if self.critic is None:
            return {}
        return {"in_features": self.critic.in_features, "critic": self.critic.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state):
        if not state:
            return
        device = next(iter(state["critic"].values())).device
        self._build_critic(int(state["in_features"]), device)
        self.critic.load_state_dict(state["critic"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])

    def describe(self):
        return (f"PPO with a turn-level critic: A_it = GAE(gamma = {self.gamma:g}, lambda = {self.gae_lambda:g}) over "
                f"turns, delta_it = r_it + gamma V(h_i,t+1) - V(h_it) (V = 0 after a terminal turn), V an MLP "
                f"(width {self.critic_hidden}) on the policy's detached hidden state at turn t's first action "
                f"token, fitted after the advantages for {self.critic_steps} Adam steps (lr {self.critic_lr:g}) on "
                f"L_V = mean over turns of (V - (A + V_old))^2 / 2; A_it on turn t's tokens; " + self._clipped("A_it"))


@register
@dataclass
class VinePPO(PPO):
    """PPO with Monte Carlo values from branching (VinePPO, Kazemnejad et al. 2024): no critic and no groups; the
    value of the state before each turn is the mean return of ``branches`` continuations sampled from it by the
    current policy, and a turn's advantage is its TD residual on those values
    (``estimators.branching_advantages``), unbiased for A(h_t, a_t) on every turn. Every turn of every episode
    costs ``branches`` extra episodes, counted in the run's episodes. The clipped surrogate is PPO's."""

    branches: int = setting(2, "K continuations sampled from the state before each turn (each counts "
                               "as an episode)")
    gamma: float = setting(1.0, "discount over turns", flat="vine_gamma")

    name: ClassVar[str] = "vineppo"
    needs_groups: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        _positive("branches", self.branches)
        if not 0 < self.gamma <= 1:
            raise ValueError(f"vine_gamma must be in (0, 1], got {self.gamma}")

    def continuations(self) -> tuple[int, float]:
        return self.branches, self.gamma

    def advantages(self, batch, state, features=None):
        cont = batch.continuation_returns
        if cont is None or cont.shape[-1] != self.branches:
            got = "none" if cont is None else f"{cont.shape[-1]} per turn"
            raise ValueError(f"vineppo needs {self.branches} continuation returns per turn "
                             f"(agent_lab.branching.continuation_returns), this batch has {got}")
        # continuations end where the episode would (same limits, same context): every row ends with value 0
        ended = torch.ones_like(batch.truncated, dtype=torch.bool)
        return branching_advantages(batch.rewards, cont, batch.turn_mask, self.gamma, ended)

    def statistics(self, batch):
        """``branch_value_mean``: the mean branching value over real turns."""
        real = batch.turn_mask.bool()
        values = batch.continuation_returns.mean(-1)
        return {"branch_value_mean": float(values[real].mean()) if real.any() else float("nan")}

    def describe(self):
        return (f"VinePPO: A_it = r_it + gamma V(h_i,t+1) - V(h_it) (gamma = {self.gamma:g}; V = 0 after the last "
                f"turn), V(h_it) = mean return of {self.branches} continuations sampled by the current policy from "
                f"the saved state before turn t (replayed exactly); A_it on turn t's tokens; " + self._clipped("A_it"))


@register
@dataclass
class SFT(Algorithm):
    """Supervised fine-tuning on the planner's demonstrations (the cold start): maximise log pi of each
    demonstrated action token."""

    name: ClassVar[str] = "sft"
    default_objective: ClassVar[str] = "token_mean"
    uses_rollouts: ClassVar[bool] = False

    def advantages(self, batch, state, features=None):
        return torch.ones(len(batch), device=batch.input_ids.device)

    def describe(self):
        return (f"SFT: s_ij = log pi(x_ij) on the planner's demonstrated action tokens (weight 1); "
                f"{self._normaliser()}; {_MASK}")


def rl_algorithms() -> tuple[str, ...]:
    """The registered algorithms that learn from rollouts (all but SFT), any registered since import too."""
    return tuple(n for n, c in _REGISTRY.items() if c.uses_rollouts)


#: The built-in algorithms (registered above), and those of them that learn from rollouts.
ALGORITHMS = tuple(_REGISTRY)
RL_ALGORITHMS = rl_algorithms()
#: Each algorithm's normalisation (the lecture's and the papers' choices).
DEFAULT_OBJECTIVE = {n: c.default_objective for n, c in _REGISTRY.items()}


def make_algorithm(name: str, *, group_size: int, max_tokens: int, objective: str | None = None,
                   **options: Any) -> Algorithm:
    """Build the algorithm called ``name`` (one of :data:`ALGORITHMS`) with its own ``options``."""
    return make_declared("algorithm", name, options, group_size=group_size, max_tokens=max_tokens,
                         objective=objective)
