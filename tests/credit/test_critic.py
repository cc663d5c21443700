"""The turn-level critic: its decision positions read the rollout's tensor contract, a tabular fit converges to
the per-state mean return, and its initialisation leaves torch's global random state alone."""

from __future__ import annotations

import pytest
import torch

from agent_lab.critic import TurnCritic, decision_positions, decision_states, fit_critic
from agent_lab.envs import make_env
from agent_lab.estimators import explained_variance
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts


def test_decision_positions_are_the_token_before_each_turns_first_action_token():
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(len(tok), d_model=32, n_layers=1, n_heads=2, max_len=64))
    batch = collect_rollouts(model, tok, env, env.sample_tasks(0, 8), SamplingConfig(candidate_mask=True),
                             generator=torch.Generator().manual_seed(0))
    turns = batch.rewards.shape[1]
    positions, present = decision_positions(batch.turn_ids, turns)
    assert torch.equal(present, batch.turn_mask)
    for b, t in present.nonzero().tolist():
        j = int(positions[b, t])
        assert batch.turn_ids[b, j] == t and bool((batch.turn_ids[b, :j] != t).all())
        assert batch.input_ids[b, j + 1] == tok.index["guess"]  # the first word of the action is the target at j
        assert batch.input_ids[b, j] == tok.nl_id  # which follows the newline closing the prompt or observation
    hidden = torch.randn(*batch.input_ids.shape, 5)
    states = decision_states(hidden, batch.turn_ids, turns)
    b, t = present.nonzero()[0].tolist()
    assert torch.equal(states[b, t], hidden[b, positions[b, t]])
    assert bool((states[~present] == 0).all())


def test_a_fitted_critic_on_one_hot_states_predicts_each_states_mean_return():
    torch.manual_seed(3)
    states = torch.randint(0, 4, (40, 3))
    targets = states.double() + torch.randn(40, 3, dtype=torch.float64)  # mean return of state s is about s
    mask = torch.ones(40, 3, dtype=torch.bool)
    mask[::5, 2] = False
    features = torch.nn.functional.one_hot(states, 4).double()
    critic = TurnCritic(4, hidden=8, layers=0, seed=0).double()
    losses = fit_critic(critic, features, targets, mask, steps=300, lr=0.1)
    assert losses[-1] < losses[0]
    with torch.no_grad():
        values = critic(features)
    for s in range(4):
        sel = mask & (states == s)
        assert float(values[sel].mean()) == pytest.approx(float(targets[sel].mean()), abs=1e-3)
    tabular = torch.zeros_like(targets)
    for s in range(4):
        tabular[states == s] = targets[mask & (states == s)].mean()
    ev = explained_variance(values, targets, mask)
    assert float(ev) == pytest.approx(float(explained_variance(tabular, targets, mask)), abs=1e-3)


def test_seeded_critics_are_identical_and_leave_the_global_random_stream_alone():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    a, b = TurnCritic(6, seed=5), TurnCritic(6, seed=5)
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert a(torch.zeros(2, 3, 6)).shape == (2, 3)


def test_bad_critic_inputs_name_the_argument():
    with pytest.raises(ValueError, match=r"features must be a tensor \[\.\.\., 6\], got \(2, 5\)"):
        TurnCritic(6)(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="layers must be a non-negative integer"):
        TurnCritic(6, layers=-1)
    with pytest.raises(ValueError, match=r"turn_ids must lie in \[-1, 2\) for turns=2"):
        decision_positions(torch.tensor([[0, 2]]), 2)
    with pytest.raises(ValueError, match=r"turn_ids must have shape \(1, 2\)"):
        decision_states(torch.zeros(1, 3, 4), torch.zeros(1, 3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        fit_critic(TurnCritic(2), torch.zeros(1, 1, 2), torch.zeros(1, 1), torch.ones(1, 1), steps=0)
