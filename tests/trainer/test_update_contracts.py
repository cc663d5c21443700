"""What the trainer's update promises, checked exactly on small fixed batches: which logits it trains on, the
defaults of one batch's loss, the sampler's view of its log-probs, the statistics outside the action mask and
at one token, the step denominator's device, and how a step drives micro-batches, plug-in terms, DDP's
gradient sync, the stopwatch and the optimizer. (The cases came from the mutants of agent_lab.update that
survived `make mutation`.)"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from exact_batches import MU, TOKENS, FixedLogits, one_token_batch

from agent_lab import timing
from agent_lab.algorithms import make_algorithm
from agent_lab.estimators import KL_OLD_NEW
from agent_lab.update import (batch_loss, gradient_step, kl_to_reference, policy_logits, step_denominator,
                              step_statistics)

F64 = torch.float64
PI = [0.2, 0.35, 0.45]


def entropy(p):
    return -sum(x * math.log(x) for x in p)


def k3(rho):
    return rho - 1 - math.log(rho)


def padded_batch(targets, old_probs, top_p=1.0):
    """Episodes of action tokens over a vocabulary of three, ``None`` a padded position; as in collect_rollouts,
    padding records log-prob 0 (``old_probs`` 1.0 there) and allows every token."""
    B, W = len(targets), len(targets[0])
    batch = one_token_batch([0] * B, [1.0] * B, top_p=top_p)
    real = torch.tensor([[t is not None for t in row] for row in targets])
    batch.input_ids = torch.tensor([[0] + [0 if t is None else t for t in row] for row in targets])
    batch.attention_mask = torch.cat([torch.ones(B, 1, dtype=torch.bool), real], 1)
    batch.action_mask = real
    batch.old_logprobs = torch.log(torch.tensor(old_probs, dtype=F64))
    batch.turn_ids = torch.where(real, 0, -1)
    batch.allowed_tokens = torch.ones(B, W, 3, dtype=torch.bool)
    return batch


class SharedLogits(torch.nn.Module):
    """A policy with the same next-token distribution ``probs`` at every position of every row, so that it can
    be run on any micro-batch (FixedLogits returns all of its rows whatever the input)."""

    def __init__(self, probs):
        super().__init__()
        self.z = torch.nn.Parameter(torch.log(torch.tensor(probs, dtype=F64)))

    def forward(self, input_ids, attention_mask=None, segment_ids=None):
        return self.z.expand(*input_ids.shape, -1)


def sgd_step(model, batch, algo, adv, **kw):
    return gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, adv, algo, grad_clip=1e9, **kw)


# ----------------------------------------------------------------------------- policy_logits and batch_loss
def test_logits_are_cut_to_the_batch_vocabulary_then_masked_and_tempered():
    # a model whose vocabulary is padded past the batch's (V = 3): the extra column must not reach the policy
    model = FixedLogits([[0.1, 0.2, 0.3, 0.4]] * 2)
    batch = one_token_batch([0, 1], [0.5, 0.5])
    batch.allowed_tokens[0, 0, 2] = False
    want = torch.tensor([[[math.log(0.1), math.log(0.2), -math.inf]],
                         [[math.log(0.1), math.log(0.2), math.log(0.3)]]], dtype=F64) / 2
    torch.testing.assert_close(policy_logits(model, batch, 2.0), want, rtol=1e-15, atol=0)


def test_bf16_logits_are_trained_in_float32_and_float64_logits_stay_float64():
    bf16 = FixedLogits([PI] * 2).to(torch.bfloat16)
    batch = one_token_batch([0, 1], [0.5, 0.5])
    torch.testing.assert_close(policy_logits(bf16, batch, 1.0), bf16.z.detach()[:, :1].float(), rtol=0, atol=0)
    f64 = FixedLogits([PI] * 2)
    torch.testing.assert_close(policy_logits(f64, batch, 1.0), f64.z.detach()[:, :1], rtol=0, atol=0)


def test_batch_loss_by_default_has_no_entropy_bonus_and_no_sampler_view():
    # PlannerGuidance calls batch_loss with its defaults: its SFT loss must be the bare surrogate
    adv = [1.0, -0.5, 2.0, 0.25]
    algo = make_algorithm("dr_grpo", group_size=2, max_tokens=2)
    f = batch_loss(FixedLogits([PI] * 4), one_token_batch(TOKENS, [MU[t] for t in TOKENS]),
                   torch.tensor(adv, dtype=F64), algo)
    want = -sum(a * math.log(PI[t]) for a, t in zip(adv, TOKENS)) / (4 * 2)
    assert float(f.loss.detach()) == pytest.approx(want, rel=1e-12)
    assert f.sampler_logprobs is None


def test_entropy_is_computed_with_autograd_only_when_it_enters_the_loss(monkeypatch):
    import agent_lab.update as update

    grad_modes, entropy_from_logits = [], update.entropy_from_logits

    def recorded(z):
        grad_modes.append(torch.is_grad_enabled())
        return entropy_from_logits(z)

    monkeypatch.setattr(update, "entropy_from_logits", recorded)
    model, batch = FixedLogits([PI] * 4), one_token_batch(TOKENS, [MU[t] for t in TOKENS])
    algo, adv = make_algorithm("dr_grpo", group_size=2, max_tokens=2), torch.ones(4, dtype=F64)
    batch_loss(model, batch, adv, algo)  # a graph for a statistic only would hold [B, L-1, V] for nothing
    batch_loss(model, batch, adv, algo, entropy_coef=0.1)
    with torch.no_grad():
        batch_loss(model, batch, adv, algo, entropy_coef=0.1)
    assert grad_modes == [False, True, False]


def test_with_top_p_one_the_sampler_view_is_the_trainers_own_logprobs_bit_for_bit():
    # large float32 logits: a separate log_softmax would round differently from the trainer's log-probs, and the
    # first update's gap must be exactly |log rho| of the ratio PPO uses
    model = FixedLogits([PI] * 4).float()
    with torch.no_grad():
        model.z.add_(1000.0)
    f = batch_loss(model, one_token_batch(TOKENS, [MU[t] for t in TOKENS]), torch.ones(4),
                   make_algorithm("dr_grpo", group_size=2, max_tokens=2), sampler_view=True)
    assert torch.equal(f.sampler_logprobs, f.logprobs.detach())


def test_the_sampler_view_under_top_p_has_one_logprob_per_target_token():
    pi = [0.6, 0.3, 0.1]  # top_p = 0.8 keeps tokens 0 and 1: the sampler drew from [2/3, 1/3, 0]
    batch = padded_batch([[0, 1], [1, 0]], [[2 / 3, 1 / 3], [1 / 3, 2 / 3]], top_p=0.8)
    f = batch_loss(FixedLogits([pi] * 2, length=3), batch, torch.zeros(2, dtype=F64),
                   make_algorithm("dr_grpo", group_size=2, max_tokens=2), sampler_view=True)
    want = torch.log(torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3]], dtype=F64))
    torch.testing.assert_close(f.sampler_logprobs, want, rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------- step_statistics, kl_to_reference
def test_statistics_leave_out_every_position_outside_the_action_mask():
    # row 1's second position is padding: recorded log-prob 0, the model's uniform 1/3 there, entropy log 3
    batch = padded_batch([[0, 2], [1, None]], [[MU[0], MU[2]], [MU[1], 1.0]])
    lp = torch.log(torch.tensor([[PI[0], PI[2]], [PI[1], 1 / 3]], dtype=F64))
    ent = torch.tensor([[0.9, 1.0], [1.1, math.log(3)]], dtype=F64)
    stats = step_statistics(make_algorithm("dr_grpo", group_size=2, max_tokens=2), batch,
                            torch.zeros(2, dtype=F64), lp, ent)
    rho = [PI[0] / MU[0], PI[2] / MU[2], PI[1] / MU[1]]
    w = [rho[0] * rho[1], rho[2]]  # episode weights: the product of the ratios of its policy tokens
    assert stats["entropy"] == pytest.approx(1.0, rel=1e-12)
    assert stats[KL_OLD_NEW] == pytest.approx(sum(map(k3, rho)) / 3, rel=1e-12)
    assert stats["ess_fraction"] == pytest.approx(sum(w) ** 2 / sum(x * x for x in w) / 2, rel=1e-12)


def test_statistics_over_a_single_policy_token_are_that_tokens_values():
    batch = padded_batch([[0], [None]], [[MU[0]], [1.0]])
    lp = torch.log(torch.tensor([[PI[0]], [1 / 3]], dtype=F64))
    stats = step_statistics(make_algorithm("dr_grpo", group_size=2, max_tokens=1), batch,
                            torch.zeros(2, dtype=F64), lp, torch.tensor([[0.7], [math.log(3)]], dtype=F64))
    assert stats["entropy"] == pytest.approx(0.7, rel=1e-12)  # divided by one token, not by a floor above it
    assert stats[KL_OLD_NEW] == pytest.approx(k3(PI[0] / MU[0]), rel=1e-12)


def test_demonstrations_and_batches_without_policy_tokens_log_the_entropy_alone():
    demos = one_token_batch(TOKENS, [1.0] * 4)  # a demonstrator has no log-probs: 0 recorded
    ent = torch.tensor([[0.5], [0.7], [0.9], [1.1]], dtype=F64)
    stats = step_statistics(make_algorithm("sft", group_size=1, max_tokens=1), demos, torch.ones(4, dtype=F64),
                            torch.log(torch.tensor([[PI[t]] for t in TOKENS], dtype=F64)), ent)
    assert stats == {"entropy": pytest.approx(0.8, rel=1e-12)}
    empty = padded_batch([[None], [None]], [[1.0], [1.0]])
    stats = step_statistics(make_algorithm("dr_grpo", group_size=2, max_tokens=1), empty,
                            torch.zeros(2, dtype=F64), torch.zeros(2, 1, dtype=F64), torch.ones(2, 1, dtype=F64))
    assert stats == {"entropy": 0.0}


def test_clip_fraction_over_a_single_signed_token_is_that_tokens_clip():
    # row 0: A > 0 and rho = 0.45 / 0.25 = 1.8 > 1.2, clipped; row 1 has A = 0 and counts in neither sign
    batch = one_token_batch([2, 0], [MU[2], MU[0]])
    stats = step_statistics(make_algorithm("ppo", group_size=2, max_tokens=1, clip_eps=0.2), batch,
                            torch.tensor([1.0, 0.0], dtype=F64), torch.log(torch.tensor([[PI[2]], [PI[0]]], dtype=F64)),
                            torch.zeros(2, 1, dtype=F64))
    assert (stats["clip_frac_pos"], stats["clip_frac_neg"], stats["clip_fraction"]) == (1.0, 0.0, 1.0)


def test_the_reference_kl_ignores_what_lies_outside_the_mask_even_non_finite_values():
    # a sampler may record -inf at a padded position; rho there must not become inf * 0 = NaN
    lp = torch.log(torch.tensor([[0.2, 0.3]], dtype=F64))
    old = torch.tensor([[math.log(0.5), -math.inf]], dtype=F64)
    ref = torch.log(torch.tensor([[0.6, 0.1]], dtype=F64))
    got = kl_to_reference(lp, old, ref, torch.tensor([[True, False]]))
    assert got == pytest.approx(0.2 / 0.5 * k3(0.6 / 0.2), rel=1e-12)


# ----------------------------------------------------------------------------- the optimizer step
def test_the_step_denominator_is_built_on_the_masks_device_not_the_default_one():
    # the default device set elsewhere (torch.set_default_device("cuda") with a CPU batch) must not matter
    batch = padded_batch([[0, 2], [1, None]], [[MU[0], MU[2]], [MU[1], 1.0]])
    algo = make_algorithm("dr_grpo", group_size=2, max_tokens=2, objective="token_mean")
    with torch.device("meta"):
        den = step_denominator(batch, torch.ones(2, dtype=F64), algo)
    assert den.device == torch.device("cpu") and float(den) == 3.0


def test_the_entropy_bonus_enters_the_steps_loss():
    stats = sgd_step(FixedLogits([PI] * 4), one_token_batch(TOKENS, [MU[t] for t in TOKENS]),
                     make_algorithm("dr_grpo", group_size=2, max_tokens=2), torch.zeros(4, dtype=F64),
                     entropy_coef=0.1)
    assert stats["loss"] == pytest.approx(-0.1 * 4 * entropy(PI) / (4 * 2), rel=1e-12)


def test_micro_batches_keep_the_kl_penalty_to_the_reference():
    # rho = 1 and the advantages sum to 0: the token-mean loss is kl_coef * the mean k3 to the reference
    ref = [0.6, 0.3, 0.1]
    algo = make_algorithm("ppo", group_size=2, max_tokens=2, kl_coef=0.5, objective="token_mean")
    stats = sgd_step(SharedLogits(MU), one_token_batch(TOKENS, [MU[t] for t in TOKENS]), algo,
                     torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=F64), micro_batch_size=2,
                     ref_logprobs=torch.log(torch.tensor([[ref[t]] for t in TOKENS], dtype=F64)))
    assert stats["loss"] == pytest.approx(0.5 * sum(k3(ref[t] / MU[t]) for t in TOKENS) / 4, rel=1e-12)


def test_plug_in_terms_learn_which_micro_batch_is_last_and_their_statistics_are_summed():
    tokens, adv = [0, 0, 1, 2, 1, 1], [1.0, -1.0, 0.5, -0.5, 2.0, -3.0]
    seen = []

    def term(micro, logprobs, whole, last):
        seen.append(last)
        return None, {"rows": float(len(micro))}  # no loss this time (PlannerGuidance before the last)

    stats = sgd_step(SharedLogits(PI), one_token_batch(tokens, [MU[t] for t in tokens]),
                     make_algorithm("dr_grpo", group_size=2, max_tokens=2), torch.tensor(adv, dtype=F64),
                     micro_batch_size=2, terms=[term])
    assert seen == [False, False, True]
    assert stats["rows"] == 6.0
    assert stats["loss"] == pytest.approx(-sum(a * math.log(PI[t]) for a, t in zip(adv, tokens)) / (6 * 2),
                                          rel=1e-12)


class FakeDDP(torch.nn.Module):
    """Stands in for DistributedDataParallel: forwards to the model and says whether ``no_sync`` is open."""

    def __init__(self, module):
        super().__init__()
        self.module, self.deferred = module, False

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self.deferred = True
        try:
            yield
        finally:
            self.deferred = False


def test_ddp_all_reduces_gradients_once_on_the_last_micro_batch():
    model = SharedLogits(PI)
    ddp, deferred = FakeDDP(model), []
    model.z.register_hook(lambda g: deferred.append(ddp.deferred))  # runs in each micro-batch's backward
    tokens = [0, 0, 1, 2, 1, 1]
    sgd_step(model, one_token_batch(tokens, [MU[t] for t in tokens]),
             make_algorithm("dr_grpo", group_size=2, max_tokens=2), torch.ones(6, dtype=F64),
             micro_batch_size=2, ddp=ddp)
    assert deferred == [True, True, False]


def test_the_step_times_its_loss_and_optimizer_phases_under_their_names():
    timing.take()  # start from an empty stopwatch
    sgd_step(SharedLogits(PI), one_token_batch(TOKENS, [MU[t] for t in TOKENS]),
             make_algorithm("dr_grpo", group_size=2, max_tokens=2), torch.ones(4, dtype=F64), micro_batch_size=2)
    assert set(timing.take()) == {"loss", "optimizer"}


class WithIdleHead(FixedLogits):
    """A policy with a parameter this step's loss does not use (a head that only some steps train)."""

    def __init__(self, probs):
        super().__init__(probs)
        self.head = torch.nn.Parameter(torch.ones(2, dtype=F64))


def test_a_parameter_outside_the_loss_is_left_alone_by_the_optimizer():
    model = WithIdleHead([PI] * 4)
    model.head.grad = torch.ones(2, dtype=F64)  # left by an earlier step that did use it
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, weight_decay=0.5)
    gradient_step(model, optimizer, one_token_batch(TOKENS, [MU[t] for t in TOKENS]), torch.ones(4, dtype=F64),
                  make_algorithm("dr_grpo", group_size=2, max_tokens=2), grad_clip=1e9)
    # a zeroed (not None) gradient would let weight decay shrink the head: 1 - 1.0 * 0.5 * 1
    assert model.head.grad is None
    assert torch.equal(model.head.detach(), torch.ones(2, dtype=F64))
