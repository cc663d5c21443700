"""Exact checks of agent_lab.algorithms that mutation testing found unchecked: the exact error messages, the
registry's contents, GiGPO's gamma and padded turns, PPO's KL switch and user-loss message, and the device the
advantages live on (checked on the ``meta`` device, so no accelerator is needed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from exact_batches import one_token_batch

from agent_lab import algorithms as A
from agent_lab.algorithms import AlgoState, anchor_keys, make_algorithm
from agent_lab.estimators.policy_gradient import ppo_clipped_surrogate


def _gigpo_batch(rewards, states, mask=None):
    """Episodes of a few turns each (one action token per episode is enough for the advantages), their
    per-turn rewards ``[B, T]`` and logs that name the state before each real turn."""
    r = torch.tensor(rewards, dtype=torch.float64)
    m = torch.ones_like(r, dtype=torch.bool) if mask is None else torch.tensor(mask)
    logs = [{"turns": [{"state": s, "text": f"a{t}"} for t, s in enumerate(row)]} for row in states]
    base = one_token_batch([0] * r.shape[0], [0.5] * r.shape[0])
    return dataclasses.replace(base, rewards=r, turn_mask=m, episode_return=(r * m).sum(1), episode_logs=logs)


# ----------------------------------------------------------------------------- registry
def test_the_registry_maps_each_name_to_its_class_and_make_algorithm_builds_that_class():
    want = {"reinforce": A.Reinforce, "rloo": A.RLOO, "grpo": A.GRPO, "dr_grpo": A.DrGRPO, "gigpo": A.GiGPO,
            "rest_em": A.RestEM, "ppo": A.PPO, "ppo_gae": A.PPOCritic, "vineppo": A.VinePPO, "sft": A.SFT}
    assert A.ALGORITHMS == tuple(want)  # the built-in algorithms, in registration order
    for name, cls in want.items():  # @register runs at import: the class itself, not a placeholder, is stored
        assert A._REGISTRY[name] is cls and A.DEFAULT_OBJECTIVE[name] == cls.default_objective
        assert type(make_algorithm(name, group_size=1, max_tokens=1)) is cls
    assert A.rl_algorithms() == tuple(n for n in want if n != "sft")  # SFT learns from demonstrations only


# ----------------------------------------------------------------------------- anchor_keys messages
def test_anchor_keys_without_logs_names_what_is_missing_exactly():
    b = dataclasses.replace(_gigpo_batch([[1.0], [0.0]], [["s"], ["s"]]), episode_logs=[])
    with pytest.raises(ValueError) as excinfo:
        anchor_keys(b, "state")
    assert str(excinfo.value) == ("anchor-state groups need the batch's episode logs (env.episode_logs()); "
                                  "this batch has 0 for 2 episodes")


def test_anchor_keys_on_logs_without_states_points_to_the_history_anchor_exactly():
    b = _gigpo_batch([[1.0], [0.0]], [[None], [None]])  # logs from before environments logged their states
    with pytest.raises(ValueError) as excinfo:
        anchor_keys(b, "state")
    assert str(excinfo.value) == ("these episode logs record no 'state' per turn (logs written before environments "
                                  "logged their states); use anchor='history'")
    assert anchor_keys(b, "history") == [[""], [""]]  # the documented way out works on the same logs


# ----------------------------------------------------------------------------- GiGPO
def test_gigpo_refuses_a_gamma_above_one_with_the_exact_message():
    with pytest.raises(ValueError) as excinfo:
        make_algorithm("gigpo", group_size=2, max_tokens=1, gamma=1.5)
    assert str(excinfo.value) == "gamma must be in (0, 1], got 1.5"
    assert make_algorithm("gigpo", group_size=2, max_tokens=1, gamma=1.0).gamma == 1.0  # the closed end is allowed


def test_gigpo_discounts_the_step_term_with_its_gamma_exactly():
    # one group of two episodes; both start in s0, then each reaches a state of its own (singletons: step 0)
    b = _gigpo_batch([[1.0, 2.0], [0.0, 6.0]], [["s0", "s1"], ["s0", "s2"]])
    # R = 3, 6: episode terms -1.5, +1.5. gamma = 0.5: G at s0 = 1 + 0.5 * 2 = 2 and 0 + 0.5 * 6 = 3, b = 2.5
    got = make_algorithm("gigpo", group_size=2, max_tokens=1, gamma=0.5).advantages(b, AlgoState())
    torch.testing.assert_close(got, torch.tensor([[-2.0, -1.5], [2.0, 1.5]], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    # gamma = 1 (the default) gives G = 3 and 6 at s0, a different step term: the setting must reach it
    undiscounted = make_algorithm("gigpo", group_size=2, max_tokens=1).advantages(b, AlgoState())
    torch.testing.assert_close(undiscounted, torch.tensor([[-3.0, -1.5], [3.0, 1.5]], dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_gigpo_handles_a_batch_whose_turn_axis_is_longer_than_every_logged_episode():
    # e.g. a minibatch selected from a batch whose longest episodes are elsewhere: T = 3 columns, 2 logged turns
    b = _gigpo_batch([[1.0, 2.0, 0.0], [0.0, 6.0, 0.0]], [["s0", "s1"], ["s0", "s2"]],
                     mask=[[True, True, False], [True, True, False]])
    got = make_algorithm("gigpo", group_size=2, max_tokens=1, gamma=0.5).advantages(b, AlgoState())
    torch.testing.assert_close(got, torch.tensor([[-2.0, -1.5, 0.0], [2.0, 1.5, 0.0]], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    stats = make_algorithm("gigpo", group_size=2, max_tokens=1).statistics(b)
    assert stats == {"anchor_shared_fraction": 0.5}  # the two s0 turns share, s1 and s2 do not


def test_gigpo_anchor_ids_live_on_the_batch_device():
    # the meta device stands in for an accelerator: ids built on the CPU must follow the batch's rewards
    b = _gigpo_batch([[1.0, 2.0], [0.0, 6.0]], [["s0", "s1"], ["s0", "s2"]])
    b = dataclasses.replace(b, rewards=torch.empty(2, 2, device="meta"))
    ids = make_algorithm("gigpo", group_size=2, max_tokens=1)._ids(b)
    assert ids.device.type == "meta" and ids.shape == (2, 2) and ids.dtype == torch.long


def test_gigpo_shared_fraction_of_a_batch_with_one_real_turn_is_zero():
    b = _gigpo_batch([[1.0, 0.0]], [["s0"]], mask=[[True, False]])
    assert make_algorithm("gigpo", group_size=1, max_tokens=1).statistics(b) == {"anchor_shared_fraction": 0.0}


# ----------------------------------------------------------------------------- PPO
def _ppo_inputs():
    b = one_token_batch([0, 1, 2, 0], [0.5, 0.25, 0.25, 0.5])
    logprobs = b.old_logprobs + torch.tensor([[0.1], [-0.2], [0.3], [0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    plain, _ = ppo_clipped_surrogate(logprobs, b.old_logprobs, adv, b.action_mask, clip_eps=0.2)
    return b, logprobs, adv, plain


def test_ppo_without_kl_coef_ignores_the_reference_even_where_it_gives_a_sampled_token_probability_zero():
    b, logprobs, adv, plain = _ppo_inputs()
    ref = torch.full_like(logprobs, float("-inf"))  # every estimator is infinite here: 0 * inf would be NaN
    for kind in ("k1", "k2", "k3"):
        algo = make_algorithm("ppo", group_size=1, max_tokens=1, kl_coef=0.0, kl_kind=kind)
        s, _ = algo.surrogate(logprobs, b, adv, ref)
        torch.testing.assert_close(s, plain, rtol=0, atol=0)  # exactly the clipped surrogate, no KL term


def test_ppo_with_kl_coef_but_no_reference_gives_the_plain_clipped_surrogate():
    # without reference log-probs there is nothing to penalise against: the surrogate is PPO's alone
    b, logprobs, adv, plain = _ppo_inputs()
    s, _ = make_algorithm("ppo", group_size=1, max_tokens=1, kl_coef=0.5).surrogate(logprobs, b, adv, None)
    torch.testing.assert_close(s, plain, rtol=0, atol=0)
    ref = b.old_logprobs - 0.3  # and with one, the penalty acts: kl_coef * k3 per action token
    s, _ = make_algorithm("ppo", group_size=1, max_tokens=1, kl_coef=0.5).surrogate(logprobs, b, adv, ref)
    log_r = ref - logprobs
    torch.testing.assert_close(s, plain - 0.5 * (torch.expm1(log_r) - log_r), rtol=1e-12, atol=1e-15)


def test_ppo_user_loss_names_the_type_a_bad_loss_fn_returned():
    b, logprobs, adv, _ = _ppo_inputs()
    algo = make_algorithm("ppo", group_size=1, max_tokens=1)
    with pytest.raises(ValueError) as excinfo:
        algo.user_loss(lambda *args: torch.zeros(()), logprobs, b.action_mask, b, adv, None)
    assert str(excinfo.value) == (f"PPO's {A.PPO.loss_fn_signature} must return a pair (loss, stats dict), "
                                  "got Tensor")


# ----------------------------------------------------------------------------- SFT
def test_sft_weights_every_demonstration_one_on_the_batch_device():
    b = one_token_batch([0, 1, 2], [0.5, 0.25, 0.25])
    adv = make_algorithm("sft", group_size=1, max_tokens=1).advantages(b, AlgoState())
    torch.testing.assert_close(adv, torch.ones(3), rtol=0, atol=0)
    # the meta device stands in for an accelerator: the weights must be made where the batch lives
    meta = dataclasses.replace(b, input_ids=torch.empty(3, 2, dtype=torch.long, device="meta"))
    assert make_algorithm("sft", group_size=1, max_tokens=1).advantages(meta, AlgoState()).device.type == "meta"
