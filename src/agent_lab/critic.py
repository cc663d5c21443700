"""A turn-level critic :math:`V_\\phi(h_t)`: a small value network over one feature vector per decision
(book/part2/06_credit_assignment.md; foundations chapter section 8, "Actor-critic and temporal-difference
residuals").

The critic is separate from the policy: it reads a per-turn feature ``[B, T, F]`` and returns one value per
turn ``[B, T]``. The feature can be anything computed from the history alone (never hidden environment
state, or the critic would be privileged: foundations chapter section 4): a hand-made description of the
decision (number search's candidate interval and turn), or the policy's own hidden state at the token
where it starts the turn's action, gathered by :func:`decision_states`. Its use, in order::

    features = decision_states(hidden, batch.turn_ids, T)           # [B, T, d], or any [B, T, F]
    values = critic(features)                                        # [B, T]
    adv, targets = estimators.gae_targets(batch.rewards, values.detach(), batch.turn_mask, gamma, lam,
                                          terminated, bootstrap_values)
    num, den = estimators.value_loss(values, targets, batch.turn_mask)   # the critic's loss
    tokens = estimators.turn_to_tokens(adv, batch.turn_ids)          # the policy's per-token credit

:func:`fit_critic` regresses a critic on fixed targets (full batch, Adam), for analyses such as the book's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from agent_lab.estimators import reduce_loss, value_loss
from agent_lab.estimators._validation import as_turn_ids, positive_int
from agent_lab.policy.model import prompt_arguments

__all__ = ["TurnCritic", "decision_positions", "decision_states", "fit_critic", "policy_features"]


class TurnCritic(nn.Module):
    """MLP value head: ``features [..., F] -> values [...]`` (LayerNorm, ``layers`` tanh layers of width
    ``hidden``, a linear output; ``layers=0`` is a linear critic).

    ``seed`` makes the initial weights reproducible without touching torch's global random state.
    """

    def __init__(self, in_features: int, hidden: int = 64, layers: int = 2, seed: int | None = None):
        super().__init__()
        in_features, hidden = positive_int("in_features", in_features), positive_int("hidden", hidden)
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
            raise ValueError(f"layers must be a non-negative integer (0: a linear critic), got {layers!r}")
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.default_generator.manual_seed(seed)  # the CPU generator only: fork_rng restores no other
            parts: list[nn.Module] = [nn.LayerNorm(in_features)]
            width = in_features
            for _ in range(layers):
                parts += [nn.Linear(width, hidden), nn.Tanh()]
                width = hidden
            parts.append(nn.Linear(width, 1))
            self.net = nn.Sequential(*parts)
        self.in_features = in_features

    def forward(self, features: Tensor) -> Tensor:
        """``features [..., F]`` -> ``[...]``."""
        if not isinstance(features, Tensor) or features.ndim < 1 or features.shape[-1] != self.in_features:
            got = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
            raise ValueError(f"features must be a tensor [..., {self.in_features}], got {got}")
        return self.net(features).squeeze(-1)


def decision_positions(turn_ids: Tensor, turns: int) -> tuple[Tensor, Tensor]:
    """Where each turn's decision is made: the first target index of turn t in each row.

    Target ``j`` is ``input_ids[:, j+1]``, predicted at input position ``j``, so position ``j`` of the first
    token of turn t has read exactly the history :math:`h_t` (prompt, earlier actions and observations).
    ``turn_ids`` ``[B, L-1]`` (-1 outside actions). Returns ``(positions [B, T] long, present [B, T] bool)``;
    a turn without any action token (not present) gets position 0.
    """
    turns = positive_int("turns", turns)
    if not isinstance(turn_ids, Tensor) or turn_ids.ndim != 2:
        got = tuple(turn_ids.shape) if isinstance(turn_ids, Tensor) else type(turn_ids).__name__
        raise ValueError(f"turn_ids must be an integer torch.Tensor of shape [B, L-1], got {got}")
    turn_ids = as_turn_ids(turn_ids, turn_ids.shape)
    if bool((turn_ids >= turns).any()):
        raise ValueError(f"turn_ids must lie in [-1, {turns}) for turns={turns}, got {int(turn_ids.max())}")
    width = turn_ids.shape[1]
    index = torch.arange(width, device=turn_ids.device).expand_as(turn_ids)
    hits = turn_ids[:, :, None] == torch.arange(turns, device=turn_ids.device)  # [B, L-1, T]
    first = torch.where(hits, index[:, :, None], torch.full_like(index[:, :, None], width)).min(dim=1).values
    present = first < width
    return torch.where(present, first, torch.zeros_like(first)), present


def decision_states(hidden: Tensor, turn_ids: Tensor, turns: int) -> Tensor:
    """The policy's hidden state at each turn's decision position: ``hidden [B, L, d] -> [B, T, d]``.

    Positions from :func:`decision_positions`; turns without action tokens get zeros. Pass ``hidden``
    detached to keep the critic's loss out of the policy's gradient (a separate critic), or attached for a
    value head that shares the policy's trunk.
    """
    if not isinstance(hidden, Tensor) or hidden.ndim != 3:
        got = tuple(hidden.shape) if isinstance(hidden, Tensor) else type(hidden).__name__
        raise ValueError(f"hidden must be a tensor [B, L, d] of hidden states, got {got}")
    if turn_ids.shape[0] != hidden.shape[0] or turn_ids.shape[1] != hidden.shape[1] - 1:
        raise ValueError(f"turn_ids must have shape ({hidden.shape[0]}, {hidden.shape[1] - 1}) for hidden of shape "
                         f"{tuple(hidden.shape)}, got {tuple(turn_ids.shape)}")
    positions, present = decision_positions(turn_ids, turns)
    picked = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
    return torch.where(present[:, :, None], picked, torch.zeros_like(picked))


def policy_features(policy, batch) -> tuple[Tensor, Tensor]:
    """What a turn-level critic reads from a rollout batch: the policy's hidden states at each turn's decision,
    ``[B, T, d]`` (:func:`decision_states`), and after the last turn, ``[B, d]``: the last real position, which
    has read the whole episode, where the next turn's decision would be made (the bootstrap of a cut row).
    Computed with the policy's gradient; call it under ``torch.no_grad()`` for a separate critic."""
    hidden = policy.hidden_states(batch.input_ids, batch.attention_mask,
                                  **prompt_arguments(policy, getattr(batch, "prompt_lengths", None)))
    last = batch.attention_mask.long().sum(-1) - 1
    after = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    return decision_states(hidden, batch.turn_ids, batch.rewards.shape[1]), after


def fit_critic(critic: nn.Module, features: Tensor, targets: Tensor, turn_mask: Tensor, *, steps: int = 200,
               lr: float = 1e-2) -> list[float]:
    """Regress ``critic(features)`` on fixed ``targets`` over the real turns: ``steps`` full-batch Adam steps on
    :func:`agent_lab.estimators.value_loss`. Returns the loss before each step."""
    steps = positive_int("steps", steps)
    if not float(lr) > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    optimizer = torch.optim.Adam(critic.parameters(), lr=float(lr))
    losses = []
    for _ in range(steps):
        loss = reduce_loss(*value_loss(critic(features), targets, turn_mask))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses
