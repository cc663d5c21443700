"""Splitting a step into micro-batches does not change its gradient, for every objective (the denominator is the
whole step's, not each micro-batch's: the bug class of verl #5625, SkyRL #1296, TRL #2995 and #6439)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_policy

from agent_lab.algorithms import AlgoState, make_algorithm
from agent_lab.envs import make_env
from agent_lab.estimators.aggregation import OBJECTIVES
from agent_lab.policy import WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts, demonstration_batch
from agent_lab.trainer import max_action_tokens
from agent_lab.update import gradient_step

B, G = 16, 4
#: micro-batch sizes: the whole batch, 2 and 3 micro-batches, and an uneven split (5, 5, 5, 1)
SIZES = (0, 8, 6, 5)
ALGOS = {"dr_grpo": {}, "ppo": {"clip_eps": 0.1}, "rest_em": {}, "reinforce": {"reward_to_go": True}, "sft": {}}


@pytest.fixture(scope="module")
def batches():
    torch.set_num_threads(1)
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=4).double()
    tasks = [t for t in env.sample_tasks(2, B // G) for _ in range(G)]
    rollouts = collect_rollouts(model, tok, env, tasks, SamplingConfig(candidate_mask=True),
                                torch.Generator().manual_seed(1))
    tokens = rollouts.action_mask.sum(1)
    assert len(set(tokens.tolist())) > 1 and 0 < float(rollouts.success.float().mean()) < 1
    demos = demonstration_batch(env, tok, env.sample_tasks(3, B))
    with torch.no_grad():  # move off-policy, so that PPO's ratios differ from 1 and some clip
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    return env, model, rollouts, demos


def gradient(model, batch, algo, size):
    adv = algo.advantages(batch, AlgoState()).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # step() changes nothing: the gradient stays readable
    stats = gradient_step(model, opt, batch, adv, algo, grad_clip=1e9, micro_batch_size=size)
    return [p.grad.clone() for p in model.parameters()], stats


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("name", list(ALGOS))
def test_micro_batches_give_the_whole_batch_gradient(batches, name, objective):
    env, model, rollouts, demos = batches
    algo = make_algorithm(name, group_size=G, max_tokens=max_action_tokens(env), objective=objective, **ALGOS[name])
    batch = demos if name == "sft" else rollouts
    whole, stats = gradient(model, batch, algo, 0)
    assert sum(float(g.abs().sum()) for g in whole) > 0
    for size in SIZES[1:]:
        split, split_stats = gradient(model, batch, algo, size)
        for a, b in zip(whole, split):
            torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=f"{size}-episode micro-batches change the gradient")
        assert split_stats["loss"] == pytest.approx(stats["loss"], abs=1e-9)
        for k in ("entropy", "ratio_mean", "ratio_max", "kl_old_new_k3_on_old", "ess_fraction", "clip_fraction"):
            if k in stats:
                assert split_stats[k] == pytest.approx(stats[k], abs=1e-9), k
    if name == "ppo":
        assert stats["clip_fraction"] > 0, "the test needs clipped tokens to cover the clipped branch"


def test_per_micro_batch_normalisation_would_change_the_token_mean_gradient(batches):
    """The test above can fail: normalising each micro-batch by its own token count changes the gradient."""
    env, model, rollouts, _ = batches
    algo = make_algorithm("dr_grpo", group_size=G, max_tokens=max_action_tokens(env), objective="token_mean")
    whole, _ = gradient(model, rollouts, algo, 0)
    adv = algo.advantages(rollouts, AlgoState()).double()
    model.zero_grad(set_to_none=True)
    from agent_lab.update import batch_loss, micro_batches, take

    parts = micro_batches(len(rollouts), 5)
    for rows in parts:  # the wrong way: each micro-batch's own token mean, averaged
        mb, a, _ = take(rollouts, adv, None, rows)
        (batch_loss(model, mb, a, algo).loss / len(parts)).backward()
    gap = max(float((p.grad - w).abs().max()) for p, w in zip(model.parameters(), whole))
    assert gap > 1e-4, gap


def test_a_loss_fn_refuses_micro_batches(batches):
    env, model, rollouts, _ = batches
    algo = make_algorithm("dr_grpo", group_size=G, max_tokens=max_action_tokens(env))
    adv = algo.advantages(rollouts, AlgoState())
    with pytest.raises(ValueError, match="micro_batch_size"):
        gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rollouts, adv, algo, grad_clip=1.0,
                      micro_batch_size=4, loss_fn=lambda lp, m, a, t: -(lp * m).sum())
