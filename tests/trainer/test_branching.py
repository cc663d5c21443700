"""Branching from saved states (``agent_lab.branching``, algo ``vineppo``): a continuation reads the episode's own
history token for token, starts from the episode's exact state, and stops where the episode would; the trainer
counts every continuation as an episode (book/part2/06_credit_assignment.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import FAST, grouped_number_search_batch, tiny_policy

from agent_lab.algorithms import AlgoState, make_algorithm
from agent_lab.branching import ResumedEpisodes, branch_points, continuation_returns, history_text
from agent_lab.envs import make_env
from agent_lab.estimators import reward_to_go
from agent_lab.policy import WordTokenizer
from agent_lab.rollout import RolloutBatch, SamplingConfig, collect_rollouts
from agent_lab.trainer import TrainConfig, train

GREEDY = SamplingConfig(decoding="greedy", candidate_mask=True)


def _crafting_batch(max_len: int = 160):
    """Greedy episodes of an untrained policy on level-4 worlds, with distance shaping (so the rewards differ from
    turn to turn); at ``max_len`` 160 some fill the context."""
    env = make_env("crafting", mask_actions=True, shaping="distance")
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=3, max_len=max_len)
    b = collect_rollouts(model, tok, env, env.eval_tasks("deeper", 6), GREEDY, torch.Generator().manual_seed(0))
    return tok, model, b


def _number_search_batch():
    _, tok, model, _ = grouped_number_search_batch(0, 1, 1)
    env = make_env("number-search", mask_actions=True)
    b = collect_rollouts(model, tok, env, env.sample_tasks(1, 12), SamplingConfig(temperature=3.0, candidate_mask=True),
                         torch.Generator().manual_seed(0))
    return tok, model, b


def test_the_history_a_continuation_reads_is_the_episodes_own_tokens_before_that_turn():
    tok, _, b = _crafting_batch()
    for i, t in branch_points(b.episode_logs):
        first = int((b.turn_ids[i] == t).nonzero()[0])  # the target first+1 is turn t's first action token
        episode = b.input_ids[i, 1:first + 1].tolist()  # after <bos>, up to the newline that precedes the action
        assert tok.encode(history_text(b.episode_logs[i], t)) + [tok.nl_id] == episode, (i, t)


@pytest.mark.parametrize("make", [_crafting_batch, _number_search_batch], ids=["crafting", "number-search"])
def test_greedy_continuations_replay_the_rest_of_a_greedy_episode_exactly(make):
    # A greedy policy's continuation from the state before turn t must earn exactly the episode's reward-to-go
    # from t: a wrong history, a wrong state or a wrong limit would change what it does or where it stops.
    tok, model, b = make()
    if make is _number_search_batch:  # sampled episodes: replay them greedily first, then branch from those
        env = make_env("number-search", mask_actions=True)
        b = collect_rollouts(model, tok, env, b.tasks, GREEDY, torch.Generator().manual_seed(0))
    returns, cost = continuation_returns(model, tok, b, 1, GREEDY, torch.Generator().manual_seed(5), rows_per_chunk=7)
    want = reward_to_go(b.rewards, gamma=1.0, mask=b.turn_mask)
    real = b.turn_mask.bool()
    assert len(set(want[real].tolist())) > 1, "the reward-to-go must differ between branch points"
    torch.testing.assert_close(returns[..., 0][real], want[real])
    assert torch.isnan(returns[~real]).all()
    assert cost["branch_points"] == cost["branch_episodes"] == int(real.sum())
    # the continuations play exactly the turns the episodes had left
    assert cost["branch_turns"] == sum(n * (n + 1) // 2 for n in b.num_turns.tolist())


def test_a_context_cut_episode_is_cut_at_the_same_point_in_its_continuations():
    tok, model, b = _crafting_batch()
    cut = [i for i, log in enumerate(b.episode_logs) if log.get("context_full")]
    assert cut, "an untrained policy wanders: some episodes must fill a 160-token window"
    points = [(i, t) for i, t in branch_points(b.episode_logs) if i in cut]
    env = ResumedEpisodes(b.episode_logs, points, 1)
    cont = collect_rollouts(model, tok, env, [None] * len(points), GREEDY, torch.Generator())
    assert bool(cont.truncated.all())
    want = [int(b.num_turns[i]) - t for i, t in points]
    assert cont.num_turns.tolist() == want


def test_the_discount_weights_each_continuation_turn_from_its_branch_point():
    tok, model, b = _crafting_batch(max_len=512)
    returns, _ = continuation_returns(model, tok, b, 1, GREEDY, torch.Generator(), gamma=0.5)
    want = reward_to_go(b.rewards, gamma=0.5, mask=b.turn_mask)
    real = b.turn_mask.bool()
    assert bool((b.rewards[:, 1:] != 0).any()), "rewards after the first turn: the discount must matter"
    torch.testing.assert_close(returns[..., 0][real], want[real])


def test_k_sampled_continuations_per_point_fill_k_columns_at_real_turns_only():
    tok, model, b = _number_search_batch()
    sampling = SamplingConfig(temperature=3.0, candidate_mask=True)
    one, _ = continuation_returns(model, tok, b, 4, sampling, torch.Generator().manual_seed(2))
    two, _ = continuation_returns(model, tok, b, 4, sampling, torch.Generator().manual_seed(2), rows_per_chunk=8)
    assert one.shape == (*b.rewards.shape, 4)
    spread = one[b.turn_mask.bool()].std(-1)
    assert bool((spread > 0).any()), "a hot policy's continuations from one state must differ"
    assert torch.equal(torch.isnan(one), torch.isnan(two))


def test_resuming_refuses_a_log_whose_episode_ends_before_its_branch_point():
    _, _, b = _number_search_batch()
    log = next(log for log in b.episode_logs if log["success"])
    bad = {**log, "turns": log["turns"] + [dict(log["turns"][-1])]}  # a turn after the episode was won
    with pytest.raises(ValueError, match="no state to branch from"):
        ResumedEpisodes([bad], [(0, len(log["turns"]))], 1)


def test_vineppo_refuses_a_batch_without_its_continuations():
    _, _, b = _number_search_batch()
    algo = make_algorithm("vineppo", group_size=1, max_tokens=8, branches=3)
    with pytest.raises(ValueError, match="vineppo needs 3 continuation returns per turn"):
        algo.advantages(b, AlgoState())
    two = dataclasses.replace(b, continuation_returns=torch.zeros(*b.rewards.shape, 2))
    with pytest.raises(ValueError, match="this batch has 2 per turn"):
        algo.advantages(two, AlgoState())
    with pytest.raises(ValueError, match="branches must be a positive int"):
        make_algorithm("vineppo", group_size=1, max_tokens=8, branches=0)
    with pytest.raises(ValueError, match="this batch has none"):
        algo.advantages(b, AlgoState())
    for gamma in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"vine_gamma must be in \(0, 1\], got"):
            make_algorithm("vineppo", group_size=1, max_tokens=8, gamma=gamma)
    assert make_algorithm("vineppo", group_size=1, max_tokens=8, gamma=1.0).gamma == 1.0


def test_vineppo_logs_the_mean_branching_value_over_real_turns_and_nan_without_any():
    _, _, b = _number_search_batch()
    cont = torch.arange(float(b.rewards.numel() * 2)).view(*b.rewards.shape, 2)
    real = b.turn_mask.bool()
    want = sum(float(cont[i, t].mean()) for i, t in real.nonzero().tolist()) / int(real.sum())
    algo = make_algorithm("vineppo", group_size=1, max_tokens=8)
    got = algo.statistics(dataclasses.replace(b, continuation_returns=cont))
    assert got == {"branch_value_mean": pytest.approx(want, rel=1e-6)}
    empty = dataclasses.replace(b, turn_mask=torch.zeros_like(b.turn_mask), continuation_returns=cont)
    assert torch.isnan(torch.tensor(algo.statistics(empty)["branch_value_mean"]))
    # the description states the clipped surrogate on the branching advantage
    assert "s_ij = min(rho A_it, clip(rho, 1-0.2, 1+0.2) A_it)" in algo.describe()


def test_selecting_and_concatenating_rows_keeps_their_continuation_returns():
    _, _, b = _number_search_batch()
    cont = torch.arange(float(b.rewards.numel() * 2)).view(*b.rewards.shape, 2)
    c = dataclasses.replace(b, continuation_returns=cont)
    torch.testing.assert_close(c.select([3, 1]).continuation_returns, cont[[3, 1]])
    both = RolloutBatch.concat([c.select([0]), c.select([5])])
    torch.testing.assert_close(both.continuation_returns, cont[[0, 5]])
    with pytest.raises(ValueError, match="with and without continuation returns"):
        RolloutBatch.concat([c, b])


def test_the_trainer_counts_every_continuation_as_an_episode():
    r = train(TrainConfig(**{**FAST, "algo": "vineppo", "branches": 3, "candidate_mask": True}), progress=False)
    batch = FAST["batch_size"]
    for row in r.history:
        points = row["episode_turns"] * batch
        assert row["branch_points"] == pytest.approx(points)
        assert row["branch_episodes"] == 3 * row["branch_points"]
        assert row["branch_turns"] >= row["branch_episodes"]
    assert r.episodes == sum(batch + row["branch_episodes"] for row in r.history)
    text = make_algorithm("vineppo", group_size=1, max_tokens=8, branches=3).describe()
    assert "VinePPO" in text and "mean return of 3 continuations" in text


def _branch_means_against_exact_values(sample_temperature: float, table_temperature: float, k: int = 256):
    """Per branch point of a sampled number-search batch: the mean of ``k`` trainer continuations, the exact
    :math:`V^\\pi(h_t, z)` of the transformer's own candidate-masked policy at ``table_temperature``, and the
    standard error of a Bernoulli mean at that value (binary reward: a return is 1 or 0)."""
    from agent_lab.credit_exact import lm_policy
    from agent_lab.envs import NumberSearchDP, history_from_log

    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=4)
    with torch.no_grad():  # an untrained model is nearly uniform: scale its logits so it has preferences
        model.ln_f.weight.mul_(30.0)
    b = collect_rollouts(model, tok, env, env.sample_tasks(3, 8), SamplingConfig(temperature=sample_temperature,
                         candidate_mask=True), torch.Generator().manual_seed(0))
    returns, _ = continuation_returns(model, tok, b, k, SamplingConfig(temperature=sample_temperature,
                                      candidate_mask=True), torch.Generator().manual_seed(1))
    table = NumberSearchDP(env.n, env.max_turns).policy_table(lm_policy(model, tok, temperature=table_temperature))
    means, exact = [], []
    for i, t in branch_points(b.episode_logs):
        row = table.row(history_from_log(b.episode_logs[i])[:t])
        means.append(float(returns[i, t].mean()))
        exact.append(float(table.target_values[row][b.tasks[i] - table.lo[row]]))
    means, exact = torch.tensor(means, dtype=torch.float64), torch.tensor(exact, dtype=torch.float64)
    return means, exact, (exact * (1 - exact) / k).sqrt()


def test_sampled_continuations_estimate_the_exact_value_of_the_transformers_own_policy():
    # The transformer read through the candidate mask is a history policy whose V^pi(h, z) the DP computes
    # exactly (agent_lab.credit_exact.lm_policy). The trainer's continuations from the state before turn t are
    # draws of that return, so their mean lies within a few standard errors of it at every branch point, and the
    # pooled deviation is small. A policy sampled at another temperature than the table's fails the same check.
    means, exact, se = _branch_means_against_exact_values(1.0, 1.0)
    assert len(means) >= 16 and len(set(exact.tolist())) > 4, "branch points at several different values"
    z = (means - exact) / se.clamp_min(1e-9)
    assert bool((z.abs() < 4.5).all()), z
    assert abs(float(z.sum())) / len(z) ** 0.5 < 4.0
    wrong, exact_wrong, se_wrong = _branch_means_against_exact_values(2.0, 1.0)
    z_wrong = (wrong - exact_wrong) / se_wrong.clamp_min(1e-9)
    assert float(z_wrong.abs().max()) > 6.0, "a sampler at another temperature must be detected"
