"""Exact checks on ``PPOCritic`` (algo ``ppo_gae``) that the broader tests in test_ppo_gae.py leave open: its
option bounds and messages, the critic it builds (width, Adam lr, device), ``value_mean``, the checkpoint round
trip and its description. The batches are tiny hand-made ones (``advantages`` reads only ``turn_mask``,
``rewards`` and ``truncated``), so the file runs in well under a second."""

from __future__ import annotations

import copy
import math
import types

import pytest
import torch

from agent_lab.algorithms import AlgoState, PPOCritic, make_algorithm

B, T, F = 3, 2, 5


def _algo(**options):
    return make_algorithm("ppo_gae", group_size=2, max_tokens=8, **{"critic_steps": 3, **options})


def _batch(seed, mask=None):
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]) if mask is None else mask
    batch = types.SimpleNamespace(turn_mask=mask, rewards=torch.rand(B, T, generator=g) * mask,
                                  truncated=torch.tensor([False, False, True]))
    features = (torch.randn(B, T, F, generator=g), torch.randn(B, F, generator=g))
    return batch, features


# --- option validation: the bounds are exact and the messages name the option and the value --------------------

def _message(**options) -> str:
    with pytest.raises(ValueError) as excinfo:
        _algo(**options)
    return str(excinfo.value)


def test_gamma_zero_and_above_one_are_refused_with_the_exact_message_and_one_is_accepted():
    assert _message(gamma=0) == "gae_gamma must be in (0, 1], got 0"  # (0, 1]: 0 is excluded
    assert _message(gamma=1.5) == "gae_gamma must be in (0, 1], got 1.5"
    assert _algo(gamma=1.0).gamma == 1.0


def test_gae_lambda_accepts_both_ends_of_the_closed_interval_and_refuses_outside_it_exactly():
    assert _algo(gae_lambda=0.0).gae_lambda == 0.0  # one-step TD residual
    assert _algo(gae_lambda=1.0).gae_lambda == 1.0  # Monte-Carlo return minus V
    assert _message(gae_lambda=1.5) == "gae_lambda must be in [0, 1], got 1.5"
    assert _message(gae_lambda=-0.5) == "gae_lambda must be in [0, 1], got -0.5"


def test_critic_lr_steps_and_hidden_are_refused_with_messages_naming_the_option():
    assert _message(critic_lr=0.0) == "critic_lr must be > 0, got 0.0"
    assert _message(critic_steps=0) == "critic_steps must be a positive int, got 0"
    assert _message(critic_hidden=0) == "critic_hidden must be a positive int, got 0"
    assert _message(critic_hidden=2.0) == "critic_hidden must be a positive int, got 2.0"


# --- the critic it builds --------------------------------------------------------------------------------------

def test_the_built_critic_has_width_critic_hidden_and_its_adam_uses_critic_lr():
    algo = _algo(critic_hidden=7, critic_lr=0.0125)
    algo._build_critic(F, "cpu")
    shapes = [tuple(p.shape) for p in algo.critic.parameters()]
    # LayerNorm(F) weight and bias, Linear(F, 7), Linear(7, 7), Linear(7, 1)
    assert shapes == [(F,), (F,), (7, F), (7,), (7, 7), (7,), (1, 7), (1,)]
    assert isinstance(algo.critic_optimizer, torch.optim.Adam)
    assert algo.critic_optimizer.param_groups[0]["lr"] == 0.0125


def test_the_critic_is_built_on_the_device_it_is_given():
    algo = _algo()
    algo._build_critic(F, "meta")  # the meta device stands in for an accelerator on a CPU-only machine
    assert {p.device.type for p in algo.critic.parameters()} == {"meta"}


def test_advantages_build_the_critic_on_the_device_of_the_decision_states():
    algo, seen = _algo(), []
    build = algo._build_critic
    algo._build_critic = lambda in_features, device: (seen.append((in_features, device)), build(in_features, device))
    batch, features = _batch(0)
    algo.advantages(batch, AlgoState(), features)
    assert seen == [(F, torch.device("cpu"))]


# --- advantages and statistics ---------------------------------------------------------------------------------

def test_advantages_without_the_decision_states_raise_the_exact_message():
    batch, _ = _batch(0)
    with pytest.raises(ValueError) as excinfo:
        _algo().advantages(batch, AlgoState())
    assert str(excinfo.value) == "ppo_gae needs the policy's decision states: advantages(batch, state, features)"


def test_value_mean_is_the_mean_over_real_turns_of_the_critic_before_its_fit():
    batch, features = _batch(1)
    algo = _algo()
    algo._build_critic(F, "cpu")
    before = copy.deepcopy(algo.critic)
    algo.advantages(batch, AlgoState(), features)
    with torch.no_grad():
        want = float(before(features[0])[batch.turn_mask.bool()].mean())
    assert algo.statistics(batch)["value_mean"] == want


def test_value_mean_is_nan_on_a_batch_without_a_real_turn():
    batch, features = _batch(2, mask=torch.zeros(B, T))
    algo = _algo()
    assert torch.equal(algo.advantages(batch, AlgoState(), features), torch.zeros(B, T))
    assert math.isnan(algo.statistics(batch)["value_mean"])


def test_the_critic_fit_leaves_gradient_tensors_from_an_earlier_fit_untouched():
    # zero_grad(set_to_none=True): each step gets fresh gradient tensors, so a .grad a caller kept from the
    # previous batch is neither zeroed nor accumulated into (set_to_none=False would zero it in place)
    algo = _algo()
    batch, features = _batch(3)
    algo.advantages(batch, AlgoState(), features)
    kept = [p.grad for p in algo.critic.parameters()]
    snapshot = [g.clone() for g in kept]
    batch, features = _batch(4)
    algo.advantages(batch, AlgoState(), features)
    for p, g, s in zip(algo.critic.parameters(), kept, snapshot):
        assert torch.equal(g, s)
        assert p.grad is not g


# --- checkpoint round trip -------------------------------------------------------------------------------------

def test_a_fresh_ppo_gae_loaded_from_a_state_dict_continues_bit_identically():
    options = {"critic_hidden": 6, "critic_lr": 0.02}
    original = _algo(**options)
    batch, features = _batch(5)
    original.advantages(batch, AlgoState(), features)  # one fit: Adam's moments and step are non-trivial
    state = copy.deepcopy(original.state_dict())
    restored = _algo(**options)
    restored.load_state_dict(state)
    assert restored.critic.in_features == F
    for p, q in zip(original.critic.parameters(), restored.critic.parameters(), strict=True):
        assert torch.equal(p, q)
    saved, loaded = original.critic_optimizer.state_dict(), restored.critic_optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for k in saved["state"]:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(saved["state"][k][name], loaded["state"][k][name])
    batch, features = _batch(6)  # the next batch: same advantages, same statistics, same critic after the fit
    assert torch.equal(original.advantages(batch, AlgoState(), features),
                       restored.advantages(batch, AlgoState(), features))
    assert original.statistics(batch) == restored.statistics(batch)
    for p, q in zip(original.critic.parameters(), restored.critic.parameters(), strict=True):
        assert torch.equal(p, q)


def test_loading_a_state_keeps_the_device_its_tensors_are_on():
    source = _algo()
    batch, features = _batch(7)
    source.advantages(batch, AlgoState(), features)
    state = source.state_dict()
    on_meta = {**state, "critic": {k: v.to("meta") for k, v in state["critic"].items()}}
    restored = _algo()
    restored.load_state_dict(on_meta)  # a checkpoint from an accelerator is restored on that accelerator
    assert {p.device.type for p in restored.critic.parameters()} == {"meta"}


def test_an_empty_state_leaves_the_critic_to_be_built_at_the_first_batch():
    algo = _algo()
    algo.load_state_dict({})
    assert algo.critic is None and algo.critic_optimizer is None and algo.state_dict() == {}


# --- description -----------------------------------------------------------------------------------------------

def test_describe_gives_the_exact_description_with_the_options():
    algo = PPOCritic(group_size=2, max_tokens=8, gamma=0.9, gae_lambda=0.5, critic_lr=0.0125, critic_steps=3,
                     critic_hidden=7, clip_eps=0.25, epochs=2)
    assert algo.describe() == (
        "PPO with a turn-level critic: A_it = GAE(gamma = 0.9, lambda = 0.5) over turns, delta_it = r_it + gamma "
        "V(h_i,t+1) - V(h_it) (V = 0 after a terminal turn), V an MLP (width 7) on the policy's detached hidden "
        "state at turn t's first action token, fitted after the advantages for 3 Adam steps (lr 0.0125) on L_V = "
        "mean over turns of (V - (A + V_old))^2 / 2; A_it on turn t's tokens; rho_ij = exp(log pi(x_ij) - "
        "log mu(x_ij)) with mu the behaviour log-probs recorded at sampling; s_ij = min(rho A_it, clip(rho, "
        "1-0.25, 1+0.25) A_it) no KL penalty; 2 epochs x 1 minibatches per rollout batch; loss = -sum_ij m_ij "
        "s_ij / (B * max_tokens), max_tokens = 8 (a constant: no length weighting); m_ij = action_mask: 1 on "
        "policy-sampled target tokens (action words and the newline ending each action), 0 on prompt, "
        "observations and padding; normalisers are global sums over all workers and micro-batches")
