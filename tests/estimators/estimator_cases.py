"""Small exactly solvable policies shared by the estimator tests (not a test module itself).

Every case is a softmax policy over a finite action set, so expectations can be computed by enumerating
all outcomes, and the true gradient is autograd of the exact expected reward.
"""

from __future__ import annotations

import itertools

import torch

from agent_lab.estimators import token_logprobs

DTYPE = torch.float64


def softmax_policy(logits: list[float]) -> torch.Tensor:
    """Trainable logits theta [K] in float64."""
    return torch.tensor(logits, dtype=DTYPE, requires_grad=True)


def enumerate_groups(theta: torch.Tensor, group_size: int):
    """All K^G ordered groups of i.i.d. actions from softmax(theta).

    Returns (actions [N*G] flattened group by group, group probability of each row [N*G] (detached),
    token log-prob of each row [N*G, 1] as the estimators see it: logits [N*G, 1, K], targets [N*G, 1]).
    """
    k = theta.shape[0]
    tuples = torch.tensor(list(itertools.product(range(k), repeat=group_size)), dtype=torch.long)
    probs = torch.softmax(theta.detach(), dim=0)
    group_prob = probs[tuples].prod(dim=1)  # [N]
    actions = tuples.reshape(-1)
    rows = actions.shape[0]
    logprobs = token_logprobs(theta.expand(rows, 1, k), actions[:, None])
    return actions, group_prob.repeat_interleave(group_size), logprobs


def expected_group_gradient(theta, rewards_of_action, group_size, advantage_fn):
    """Exact E[(1/G) sum_i A_i grad log pi(a_i)] over i.i.d. groups, for an advantage estimator."""
    from agent_lab.estimators import reinforce_surrogate

    actions, row_prob, logprobs = enumerate_groups(theta, group_size)
    rewards = rewards_of_action[actions]
    advantages = advantage_fn(rewards)
    surrogate = reinforce_surrogate(logprobs, advantages)  # [N*G, 1]
    expectation = (row_prob * surrogate[:, 0]).sum() / group_size
    (grad,) = torch.autograd.grad(expectation, theta)
    return grad


def true_gradient(theta, rewards_of_action):
    """Gradient of J(theta) = sum_a softmax(theta)_a r(a), by autograd."""
    objective = (torch.softmax(theta, dim=0) * rewards_of_action).sum()
    (grad,) = torch.autograd.grad(objective, theta)
    return grad


def two_turn_batch(theta0: torch.Tensor, theta1: torch.Tensor):
    """Every trajectory of a two-turn task as one row of the token contract.

    Turn 0 samples a0 from softmax(theta0) [K]; an observation token follows (masked out); turn 1 samples
    a1 from softmax(theta1[a0]) [K, K]. Rows: targets [a0, obs, a1], action_mask [1, 0, 1],
    turn_ids [0, -1, 1]. Returns (a0 [N], a1 [N], logprobs [N, 3], action_mask, turn_ids, prob [N]).
    """
    k = theta0.shape[0]
    pairs = torch.tensor(list(itertools.product(range(k), repeat=2)), dtype=torch.long)
    a0, a1 = pairs[:, 0], pairs[:, 1]
    n = pairs.shape[0]
    observation_logits = torch.zeros(n, k, dtype=DTYPE)  # the environment's token: any logits, masked out
    logits = torch.stack([theta0.expand(n, k), observation_logits, theta1[a0]], dim=1)  # [N, 3, K]
    targets = torch.stack([a0, torch.zeros_like(a0), a1], dim=1)
    logprobs = token_logprobs(logits, targets)
    mask = torch.tensor([[1, 0, 1]]).expand(n, 3).clone()
    turn_ids = torch.tensor([[0, -1, 1]]).expand(n, 3).clone()
    with torch.no_grad():
        prob = torch.softmax(theta0, 0)[a0] * torch.softmax(theta1, 1)[a0, a1]
    return a0, a1, logprobs, mask, turn_ids, prob
