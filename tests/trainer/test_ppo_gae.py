"""PPO with a turn-level critic (algo ``ppo_gae``): its advantages are the estimator library's GAE of the critic as
it was before the batch, the critic reads the policy's hidden state where each turn starts, a row cut by the
context bootstraps from the state after its last turn, and the critic is part of the checkpoint
(book/part2/06_credit_assignment.md)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import FAST, grouped_number_search_batch

from agent_lab.algorithms import AlgoState, make_algorithm
from agent_lab.critic import policy_features
from agent_lab.estimators import explained_variance, reduce_loss, value_loss
from agent_lab.estimators.credit import gae_targets
from agent_lab.estimators.policy_gradient import ppo_clipped_surrogate
from agent_lab.preflight import check_config
from agent_lab.trainer import TrainConfig, train

G = 4


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    _, _, model, b = grouped_number_search_batch(2, 8, G)
    assert 0 < float(b.success.float().mean()) < 1 and int(b.num_turns.max()) > 1
    with torch.no_grad():
        return model, b, policy_features(model, b)


def test_the_output_head_reads_the_hidden_states_a_critic_reads(setup):
    model, b, _ = setup
    with torch.no_grad():
        torch.testing.assert_close(model.head(model.hidden_states(b.input_ids, b.attention_mask)),
                                   model(b.input_ids, b.attention_mask))


def test_features_are_the_hidden_state_at_each_turns_first_action_token_and_after_the_last_turn(setup):
    model, b, (decisions, after) = setup
    with torch.no_grad():
        hidden = model.hidden_states(b.input_ids, b.attention_mask)
    for i in range(len(b)):
        for t in range(int(b.num_turns[i])):
            first = int((b.turn_ids[i] == t).nonzero()[0])  # target first+1 is predicted at position first
            torch.testing.assert_close(decisions[i, t], hidden[i, first])
        torch.testing.assert_close(after[i], hidden[i, int(b.attention_mask[i].sum()) - 1])


def _algo(**options):
    return make_algorithm("ppo_gae", group_size=G, max_tokens=8, **{"gamma": 0.9, "gae_lambda": 0.7, **options})


def test_advantages_are_gae_of_the_critic_before_it_fits_the_batch(setup):
    _, b, features = setup
    algo = _algo()
    algo.load_state_dict({})  # nothing saved: the critic is made at the first batch
    algo._build_critic(features[0].shape[-1], "cpu")
    before = copy.deepcopy(algo.critic)
    adv = algo.advantages(b, AlgoState(), features)
    with torch.no_grad():
        values = before(features[0])
    want, targets = gae_targets(b.rewards, values, b.turn_mask, 0.9, 0.7, ~b.truncated)
    torch.testing.assert_close(adv, want)
    stats = algo.statistics(b)
    assert stats["value_loss"] == pytest.approx(float(reduce_loss(*value_loss(values, targets, b.turn_mask))))
    assert stats["explained_variance"] == pytest.approx(float(explained_variance(values, targets, b.turn_mask)))
    assert stats["value_loss_after_fit"] < stats["value_loss"], "the critic's fit must lower its loss on the batch"
    assert not all(torch.equal(p, q) for p, q in zip(before.parameters(), algo.critic.parameters()))


def test_a_row_cut_by_the_context_bootstraps_from_the_state_after_its_last_turn(setup):
    _, b, features = setup
    cut = dataclasses.replace(b, truncated=torch.arange(len(b)) == 0)
    algo = _algo()
    algo._build_critic(features[0].shape[-1], "cpu")
    critic = copy.deepcopy(algo.critic)
    adv = algo.advantages(cut, AlgoState(), features)
    with torch.no_grad():
        values, bootstrap = critic(features[0]), critic(features[1])
    want, _ = gae_targets(b.rewards, values, b.turn_mask, 0.9, 0.7, ~cut.truncated,
                          torch.where(cut.truncated, bootstrap, torch.zeros_like(bootstrap)))
    torch.testing.assert_close(adv, want)
    terminal, _ = gae_targets(b.rewards, values, b.turn_mask, 0.9, 0.7, torch.ones(len(b), dtype=torch.bool))
    assert not torch.allclose(adv[0], terminal[0]) and torch.allclose(adv[1:], terminal[1:])


def test_the_surrogate_puts_each_turns_advantage_on_that_turns_tokens(setup):
    model, b, features = setup
    algo = _algo()
    adv = algo.advantages(b, AlgoState(), features)
    lp = b.old_logprobs.clone().requires_grad_(False)
    got, _ = algo.surrogate(lp, b, adv)
    want, _ = ppo_clipped_surrogate(lp, b.old_logprobs, adv, b.action_mask, clip_eps=0.2, turn_ids=b.turn_ids)
    torch.testing.assert_close(got, want)


def test_ppo_gae_needs_the_features_and_checks_its_options(setup):
    _, b, _ = setup
    with pytest.raises(ValueError, match="decision states"):
        _algo().advantages(b, AlgoState())
    for options, match in (({"gae_lambda": 1.5}, "gae_lambda"), ({"critic_steps": 0}, "critic_steps"),
                           ({"critic_lr": 0.0}, "critic_lr")):
        with pytest.raises(ValueError, match=match):
            _algo(**options)


def test_ppo_gae_trains_from_flat_settings_logs_its_critic_and_saves_it(tmp_path):
    cfg = TrainConfig(**{**FAST, "algo": "ppo_gae", "gae_lambda": 0.5, "ppo_epochs": 2, "critic_steps": 5,
                         "run_dir": str(tmp_path)})
    assert cfg.algorithm.options == {"gae_lambda": 0.5, "epochs": 2, "critic_steps": 5}
    r = train(cfg, progress=False)
    last = r.history[-1]
    assert {"value_loss", "value_loss_after_fit", "explained_variance", "value_mean"} <= set(last)
    assert "GAE(gamma = 1, lambda = 0.5)" in (tmp_path / "loss.txt").read_text()
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert set(saved["algorithm"]) == {"in_features", "critic", "critic_optimizer"}
    with pytest.raises(ValueError, match="gae_lambda=0.5 is an option of algo 'ppo_gae', not of 'dr_grpo'"):
        TrainConfig(**{**FAST, "algo": "dr_grpo", "gae_lambda": 0.5})
    with pytest.raises(ValueError, match="without torchrun"):
        check_config(TrainConfig(**{**FAST, "algo": "ppo_gae"}), world_size=2)


def test_the_critic_takes_features_of_any_float_type(setup):
    _, b, features = setup
    for made, given in ((torch.float32, torch.float64), (torch.float64, torch.float32)):
        old = torch.get_default_dtype()
        torch.set_default_dtype(made)  # the book's chapters compute in float64
        try:
            algo = _algo()
            adv = algo.advantages(b, AlgoState(), tuple(f.to(given) for f in features))
        finally:
            torch.set_default_dtype(old)
        assert next(algo.critic.parameters()).dtype == made and torch.isfinite(adv).all()
