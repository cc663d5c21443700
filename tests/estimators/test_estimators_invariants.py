"""The foundations chapter's ten invariants (section 19), one named test each, at the level of the estimator layer.

Numbering follows the seed. Invariants 4, 9 and 10 are about rollout logging; here we test what the
estimators can guarantee (they read stored old log-probs as given, never modify inputs, and map turn
events onto tokens in order); the trainer and rollout tests must cover the logging itself.
"""

import time

import pytest
import torch
import torch.multiprocessing as mp

import agent_lab.estimators as E
from estimator_cases import DTYPE, expected_group_gradient, softmax_policy

OBJECTIVE_KW = {"max_tokens": 8}


def _token_batch(seed=0, batch=4, length=6, vocab=7):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=generator, dtype=DTYPE, requires_grad=True)
    targets = torch.randint(0, vocab, (batch, length), generator=generator)
    mask = torch.rand(batch, length, generator=generator) < 0.6
    mask[:, 0] = True
    turn_ids = torch.where(mask, torch.arange(length)[None, :] // 3, torch.tensor(-1)).expand(batch, length).clone()
    advantages = torch.randn(batch, generator=generator, dtype=DTYPE)
    return logits, targets, mask, turn_ids, advantages


# 1
def test_constant_reward_gives_zero_expected_centered_gradient():
    theta = softmax_policy([0.2, -1.0, 0.5])
    constant = torch.full((3,), 0.8, dtype=DTYPE)
    # Centred: every sample's advantage is exactly 0, so the gradient is exactly 0, not just in expectation.
    centred = expected_group_gradient(theta, constant, 3, lambda r: E.group_centered_advantages(r, 3))
    assert torch.equal(centred, torch.zeros_like(centred))
    # Uncentred REINFORCE: single samples are non-zero, the expectation cancels.
    assert torch.allclose(expected_group_gradient(theta, constant, 1, lambda r: r), torch.zeros(3, dtype=DTYPE), atol=1e-15)


# 2
def test_adding_a_constant_to_every_reward_leaves_normalized_advantages_unchanged():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.3, 0.7, 0.7, 0.1], dtype=DTYPE)
    for shift in (-3.0, 0.5, 100.0):
        for fn in (E.group_centered_advantages, E.group_standardized_advantages, E.rloo_advantages):
            before, after = fn(rewards, 4), fn(rewards + shift, 4)
            assert torch.allclose(before, after, atol=1e-12), f"{fn.__name__} moved under shift {shift}"


# 3
@pytest.mark.parametrize("objective", E.OBJECTIVES)
def test_masked_observation_tokens_give_exactly_zero_loss_and_gradient(objective):
    logits, targets, mask, turn_ids, advantages = _token_batch()
    old = E.token_logprobs(logits, targets).detach() + 0.1

    def loss(logits, old, advantages_tokens):
        logprobs = E.token_logprobs(logits, targets)
        surrogate, _ = E.ppo_clipped_surrogate(logprobs, old, advantages_tokens, mask, 0.2)
        numerator, denominator = E.aggregate(surrogate, mask, objective, turn_ids=turn_ids, **OBJECTIVE_KW)
        return E.reduce_loss(-numerator, denominator)

    adv_tokens = advantages[:, None].expand_as(mask).clone()
    value = loss(logits, old, adv_tokens)
    (grad,) = torch.autograd.grad(value, logits)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask])), "observation logits received gradient"
    # Garbage at observation positions (huge logits, NaN old log-probs, wild advantages) changes nothing.
    noisy_logits = torch.where(~mask[..., None], torch.full_like(logits, 1e4), logits.detach())
    noisy_old = torch.where(~mask, torch.full_like(old, float("nan")), old)
    noisy_adv = torch.where(~mask, torch.full_like(adv_tokens, 1e9), adv_tokens)
    assert torch.equal(loss(noisy_logits, noisy_old, noisy_adv), value.detach())


# 4
def test_log_ratios_come_from_stored_old_logprobs_token_by_token():
    # The estimators take the behaviour log-probs as stored tensors aligned with target tokens; they have
    # no text input, so nothing can be re-tokenised. A stored value moves exactly its own token's ratio.
    logits, targets, mask, _, advantages = _token_batch()
    logprobs = E.token_logprobs(logits, targets)
    stored = logprobs.detach().clone()
    stored[1, 0] -= 0.25
    ratios = E.token_log_ratios(logprobs, stored, mask)
    expected = torch.zeros_like(stored)
    expected[1, 0] = 0.25 if mask[1, 0] else 0.0
    assert torch.allclose(ratios, expected, atol=1e-12)


# 5
def test_ratios_are_one_when_theta_equals_theta_old():
    logits, targets, mask, _, advantages = _token_batch()
    logprobs = E.token_logprobs(logits, targets)
    old = E.token_logprobs(logits.detach(), targets)
    surrogate, stats = E.ppo_clipped_surrogate(logprobs, old, advantages, mask, 0.2)
    assert torch.equal(E.token_log_ratios(logprobs, old, mask), torch.zeros_like(old))
    assert torch.equal(E.sequence_log_ratios(logprobs, old, mask), torch.zeros(old.shape[0], dtype=DTYPE))
    assert stats["ratio_min"] == 1 and stats["ratio_max"] == 1 and stats[E.KL_OLD_NEW] == 0
    assert stats["clip_frac_pos"] == 0 and stats["clip_frac_neg"] == 0
    assert torch.equal(surrogate, torch.where(mask, advantages[:, None].expand_as(old), torch.zeros_like(old)))


# 6
@pytest.mark.parametrize("objective", E.OBJECTIVES)
def test_padding_or_repacking_leaves_globally_normalized_loss_unchanged(objective):
    logits, targets, mask, turn_ids, advantages = _token_batch()
    surrogate = E.reinforce_surrogate(E.token_logprobs(logits, targets), advantages)
    whole = E.reduce_loss(*E.aggregate(surrogate, mask, objective, turn_ids=turn_ids, **OBJECTIVE_KW))
    # Padding: three extra masked columns holding junk.
    pad = lambda x, value: torch.cat([x, torch.full_like(x[:, :3], value)], dim=1)  # noqa: E731
    padded = E.reduce_loss(*E.aggregate(pad(surrogate, 7.0), pad(mask, False), objective, turn_ids=pad(turn_ids, -1), **OBJECTIVE_KW))
    assert torch.allclose(padded, whole, atol=1e-12)
    # Repacking: rows shuffled and split into micro-batches of 1 and 3; numerators and denominators summed.
    order = torch.tensor([2, 0, 3, 1])
    parts = [E.aggregate(surrogate[order][s], mask[order][s], objective, turn_ids=turn_ids[order][s], **OBJECTIVE_KW)
             for s in (slice(0, 1), slice(1, 4))]
    repacked = E.reduce_loss(sum(p[0] for p in parts), sum(p[1] for p in parts))
    assert torch.allclose(repacked, whole, atol=1e-12)


# 7
def test_terminal_state_does_not_bootstrap_and_truncation_does():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=DTYPE)
    turn_mask = torch.ones(2, 2, dtype=torch.bool)
    terminated = torch.tensor([True, False])
    bootstrap = torch.tensor([5.0, 5.0], dtype=DTYPE)
    returns = E.discounted_returns(rewards, turn_mask, 0.5, terminated, bootstrap)
    assert returns.tolist() == [[0.5, 1.0], [0.5 + 0.25 * 5.0, 1.0 + 0.5 * 5.0]]
    values = torch.tensor([[0.2, 0.4], [0.2, 0.4]], dtype=DTYPE)
    delta = E.td_residuals(rewards, values, turn_mask, 0.5, terminated, bootstrap)
    assert delta[:, 1].tolist() == [1.0 - 0.4, 1.0 + 0.5 * 5.0 - 0.4]
    # Marking the truncated row done changes its targets: the two rules are not interchangeable.
    both_done = E.discounted_returns(rewards, turn_mask, 0.5, torch.tensor([True, True]), bootstrap)
    assert not torch.equal(both_done[1], returns[1])


# 8
@pytest.mark.slow
def test_distributed_summed_reduction_matches_single_concatenated_batch(tmp_path):
    from _estimators_distributed import single_process_gradients, worker

    context = mp.start_processes(worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + 240
    try:
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                pytest.fail("the two gloo workers did not finish within 240 s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    reference = single_process_gradients()
    for objective in E.OBJECTIVES:
        for got0, got1, want in zip(ranks[0][(objective, "global")], ranks[1][(objective, "global")], reference[objective]):
            assert torch.allclose(got0, want, atol=1e-12), f"{objective}: DDP gradient differs from one process"
            assert torch.equal(got0, got1)
        local = ranks[0][(objective, "local")]
        gap = max((g - w).abs().max().item() for g, w in zip(local, reference[objective]))
        assert gap > 1e-3, f"{objective}: averaging local losses should differ here (gap {gap})"


# 9
def test_estimators_never_modify_their_inputs():
    logits, targets, mask, turn_ids, advantages = _token_batch()
    logprobs = E.token_logprobs(logits, targets)
    old = logprobs.detach() - 0.05
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=DTYPE)
    turn_rewards = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.5, 0.0], [0.0, 0.0]], dtype=DTYPE)
    turn_mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
    values = torch.full_like(turn_rewards, 0.3)
    done = torch.tensor([True, False, True, False])
    boot = torch.ones(4, dtype=DTYPE)
    inputs = [logits, targets, mask, turn_ids, advantages, old, rewards, turn_rewards, turn_mask, values, done, boot]
    snapshot = [x.detach().clone() for x in inputs]
    calls = [
        lambda: E.ppo_clipped_surrogate(logprobs, old, advantages, mask, 0.2),
        lambda: E.reinforce_surrogate(logprobs, advantages),
        lambda: E.kl_estimate(logprobs, old, "k3", mask),
        lambda: E.entropy_from_logits(logits),
        lambda: [E.aggregate(logprobs, mask, o, turn_ids=turn_ids, max_tokens=8) for o in E.OBJECTIVES],
        lambda: [f(rewards, 2) for f in (E.group_centered_advantages, E.group_standardized_advantages, E.rloo_advantages,
                                         E.group_mean_baseline, E.leave_one_out_baseline)],
        lambda: E.reward_to_go(turn_rewards, 0.9, turn_mask),
        lambda: E.discounted_returns(turn_rewards, turn_mask, 0.9, done, boot),
        lambda: E.gae(turn_rewards, values, turn_mask, 0.9, 0.8, done, boot),
        lambda: E.rest_em_filter(rewards, 1.0),
        lambda: E.potential_based_shaping(turn_rewards, torch.zeros(4, 3, dtype=DTYPE), 0.9, turn_mask, done),
    ]
    for call in calls:
        call()
    for before, after in zip(snapshot, inputs):
        assert torch.equal(before, after.detach())
    # ReST-EM keeps its own copy of the scores, so later edits to the rewards cannot rewrite the record.
    selection = E.rest_em_filter(rewards, 1.0)
    rewards[0] = -1.0
    assert selection.scores[0] == 1.0


# 10
def test_turn_events_map_onto_their_own_tokens_in_order():
    # Per-turn rewards reach exactly the tokens of their turn, in turn order, and aggregating by turn
    # recovers them, so turn events and tokens stay aligned through the estimators.
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1, 1, 1, -1, 2], [-1, 0, -1, 1, -1, -1, -1, -1, -1]])
    mask = turn_ids >= 0
    turn_rewards = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 0.0]], dtype=DTYPE)
    tokens = E.expand_to_tokens(turn_rewards, turn_ids.to(DTYPE), turn_ids)
    assert tokens.tolist() == [[0, 1, 1, 0, 2, 2, 2, 0, 3], [0, 10, 0, 20, 0, 0, 0, 0, 0]]
    numerator, denominator = E.aggregate(tokens, mask, "turn_then_trajectory", turn_ids=turn_ids)
    assert (numerator / denominator).item() == pytest.approx(((1 + 2 + 3) / 3 + (10 + 20) / 2) / 2)
