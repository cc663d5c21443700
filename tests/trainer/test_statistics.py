"""Every statistic the trainer logs, recomputed exactly on small fixed batches (the table in agent_lab/update.py).

The batches are built by hand: one action token per episode over a vocabulary of three, a "policy" whose logits
are a parameter, and behaviour log-probs chosen so that the episodes enumerate the behaviour distribution mu
exactly (token x appears in a share mu(x) of the rows). Then a sample mean over the batch *is* the expectation
under mu, and the KL statistics must equal the exact KL, not merely a value near it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from exact_batches import MU, TOKENS, FixedLogits, kl, one_token_batch, step

from agent_lab.algorithms import make_algorithm
from agent_lab.diagnostics import rejected_share, rollout_diagnostics, summarise_updates
from agent_lab.estimators import KL_OLD_NEW
from agent_lab.update import KL_NEW_REF

def test_kl_to_the_behaviour_policy_is_the_exact_forward_kl_under_enumeration():
    pi = [0.2, 0.35, 0.45]
    algo = make_algorithm("dr_grpo", group_size=2, max_tokens=2)
    stats = step(FixedLogits([pi] * 4), one_token_batch(TOKENS, [MU[t] for t in TOKENS]), algo,
                 torch.tensor([0.5, -0.5, 0.5, -0.5], dtype=torch.float64))
    # E_mu[(rho - 1) - log rho] = KL(mu || pi), since E_mu[rho] = 1; the key says so: KL(old || new), k3, on old
    assert stats[KL_OLD_NEW] == pytest.approx(kl(MU, pi), rel=1e-12)
    chi2_minus_kl = sum(m * m / p for m, p in zip(MU, pi)) - 1 - kl(MU, pi)  # the biased (1/rho - 1) + log rho
    assert abs(chi2_minus_kl - kl(MU, pi)) > 0.05, "the wrong estimator must be distinguishable here"
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-12)  # E_mu[pi/mu] = 1 exactly
    assert stats["ratio_max"] == pytest.approx(max(p / m for p, m in zip(pi, MU)), rel=1e-12)
    assert stats["ratio_min"] == pytest.approx(min(p / m for p, m in zip(pi, MU)), rel=1e-12)
    assert stats["entropy"] == pytest.approx(-sum(p * math.log(p) for p in pi), rel=1e-12)
    w = [pi[t] / MU[t] for t in TOKENS]  # one token per episode: the episode weight is its token ratio
    assert stats["ess_fraction"] == pytest.approx(sum(w) ** 2 / sum(x * x for x in w) / 4, rel=1e-12)


def test_kl_to_the_reference_is_the_exact_kl_of_the_current_policy_on_and_off_policy():
    ref = [0.6, 0.3, 0.1]
    ref_lp = torch.log(torch.tensor([ref[t] for t in TOKENS], dtype=torch.float64))[:, None]
    algo = make_algorithm("ppo", group_size=2, max_tokens=2, kl_coef=0.1)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    on = step(FixedLogits([MU] * 4), one_token_batch(TOKENS, [MU[t] for t in TOKENS]), algo, adv, ref=ref_lp)
    assert on[KL_NEW_REF] == pytest.approx(kl(MU, ref), rel=1e-12)  # pi = mu: KL(pi || ref)
    # A later epoch: pi has moved away from mu, the tokens are still mu's. Weighted by rho = pi / mu, the k3
    # average is KL(pi || ref) exactly; unweighted (what the trainer logged before) it is not.
    pi = [0.2, 0.35, 0.45]
    off = step(FixedLogits([pi] * 4), one_token_batch(TOKENS, [MU[t] for t in TOKENS]), algo, adv, ref=ref_lp)
    assert off[KL_NEW_REF] == pytest.approx(kl(pi, ref), rel=1e-12)
    unweighted = sum(m * ((r / p - 1) - math.log(r / p)) for m, p, r in zip(MU, pi, ref))
    assert abs(unweighted - kl(pi, ref)) > 0.1, "the biased statistic must be distinguishable here"


def test_clip_fractions_count_each_sign_of_the_advantage_separately():
    pi = [0.2, 0.35, 0.45]
    tokens = [0, 0, 1, 2, 1, 1]  # ratios 0.4, 0.4, 1.4, 1.8, 1.4, 1.4 (clip range [0.8, 1.2])
    adv = [1.0, -1.0, 1.0, -1.0, -1.0, 1.0]
    algo = make_algorithm("ppo", group_size=2, max_tokens=2, clip_eps=0.2)
    stats = step(FixedLogits([pi] * 6), one_token_batch(tokens, [MU[t] for t in tokens]), algo,
                 torch.tensor(adv, dtype=torch.float64))
    rho = [pi[t] / MU[t] for t in tokens]
    pos = [r > 1.2 for r, a in zip(rho, adv) if a > 0]  # A > 0: clipped above 1 + eps
    neg = [r < 0.8 for r, a in zip(rho, adv) if a < 0]  # A < 0: clipped below 1 - eps
    assert (stats["clip_frac_pos"], stats["clip_frac_neg"]) == pytest.approx((sum(pos) / 3, sum(neg) / 3))
    assert (sum(pos), sum(neg)) == (2, 1), "the fixture must tell the two signs apart"
    assert stats["clip_fraction"] == pytest.approx((sum(pos) + sum(neg)) / 6)


def test_gradient_norms_before_and_after_clipping_match_the_closed_form():
    pi = [0.2, 0.35, 0.45]
    adv = [0.5, -0.5, 1.5, -1.5]
    algo = make_algorithm("dr_grpo", group_size=2, max_tokens=3)
    # loss = -sum_i A_i log pi(x_i) / (B * max_tokens); d loss / d z_i = -A_i (onehot(x_i) - pi) / (B * max_tokens)
    sq = sum(a * a * sum(((1.0 if k == t else 0.0) - p) ** 2 for k, p in enumerate(pi)) for a, t in zip(adv, TOKENS))
    norm = math.sqrt(sq) / (4 * 3)
    batch = one_token_batch(TOKENS, [pi[t] for t in TOKENS])
    stats = step(FixedLogits([pi] * 4), batch, algo, torch.tensor(adv, dtype=torch.float64), grad_clip=norm / 2)
    assert stats["grad_norm_before"] == pytest.approx(norm, rel=1e-12)
    assert stats["grad_norm_after"] == pytest.approx(norm / 2, rel=1e-12)
    loose = step(FixedLogits([pi] * 4), batch, algo, torch.tensor(adv, dtype=torch.float64), grad_clip=1.0)
    assert loose["grad_norm_after"] == pytest.approx(norm, rel=1e-12)


def test_the_sampler_trainer_gap_is_the_largest_and_mean_log_prob_difference():
    pi = [0.2, 0.35, 0.45]
    delta = [1e-3, -2e-3, 0.0, 5e-4]
    old = [pi[t] * math.exp(d) for t, d in zip(TOKENS, delta)]  # recorded log mu = log pi + delta
    stats = step(FixedLogits([pi] * 4), one_token_batch(TOKENS, old), make_algorithm("dr_grpo", group_size=2,
                 max_tokens=2), torch.zeros(4, dtype=torch.float64))
    assert stats["logprob_gap_max"] == pytest.approx(2e-3, rel=1e-9)
    assert stats["logprob_gap_mean"] == pytest.approx(sum(map(abs, delta)) / 4, rel=1e-9)


def test_the_gap_is_measured_under_the_samplers_own_top_p_while_the_ratio_is_not():
    pi = [0.6, 0.3, 0.1]  # top_p = 0.8 keeps tokens 0 and 1: the sampler drew from [2/3, 1/3, 0]
    tokens = [0, 0, 1]
    stats = step(FixedLogits([pi] * 3), one_token_batch(tokens, [[2 / 3, 1 / 3][t] for t in tokens], top_p=0.8),
                 make_algorithm("dr_grpo", group_size=3, max_tokens=2), torch.zeros(3, dtype=torch.float64))
    assert stats["logprob_gap_max"] < 1e-12
    assert stats["ratio_mean"] == pytest.approx(0.9, rel=1e-12)  # pi / mu = kept mass: PPO's ratio corrects it


def test_degenerate_fraction_counts_groups_whose_rewards_are_all_equal():
    rewards = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1]  # groups of 4: equal, mixed, equal, mixed
    batch = one_token_batch([0] * 16, [0.5] * 16, rewards=[float(r) for r in rewards])
    run = SimpleNamespace(cfg=SimpleNamespace(algorithm=SimpleNamespace(group_size=4)),
                          algo=make_algorithm("dr_grpo", group_size=4, max_tokens=1))
    row = rollout_diagnostics(run, batch, batch, torch.zeros(16))
    assert row["degenerate_fraction"] == 0.5 and row["success"] == 8 / 16 and row["reward_mean"] == 8 / 16


def test_a_steps_row_takes_the_first_updates_norms_and_gap_and_the_largest_ratio():
    first = {"ratio_mean": 1.0, "ratio_max": 1.0, "grad_norm_before": 3.0, "grad_norm_after": 1.0,
             "logprob_gap_max": 1e-7, "logprob_gap_mean": 1e-8, KL_OLD_NEW: 0.0, "train_tokens": 40.0}
    later = {"ratio_mean": 1.1, "ratio_max": 1.6, "grad_norm_before": 0.5, "grad_norm_after": 0.5,
             KL_OLD_NEW: 0.02, "train_tokens": 30.0}
    last = {"ratio_mean": 1.2, "ratio_max": 1.4, "grad_norm_before": 0.2, "grad_norm_after": 0.2,
            KL_OLD_NEW: 0.03, "train_tokens": 40.0}
    row = summarise_updates([first, later, last])
    assert row["ratio_first_epoch"] == 1.0 and row["ratio_max"] == 1.6 and row["ratio_mean"] == 1.2
    assert row["grad_norm_before"] == 3.0 and row["logprob_gap_max"] == 1e-7 and row[KL_OLD_NEW] == 0.03
    assert row["train_tokens"] == 110.0  # every update's forward and backward passes, summed


def test_ess_weights_each_episode_by_the_product_of_its_token_ratios():
    pi = [0.2, 0.35, 0.45]
    pairs = [(0, 1), (2, 2), (1, 0)]  # two action tokens per episode
    B = len(pairs)
    batch = one_token_batch([0] * B, [0.5] * B)
    batch.input_ids = torch.tensor([[0, a, b] for a, b in pairs])
    batch.attention_mask = torch.ones(B, 3, dtype=torch.bool)
    batch.action_mask = torch.ones(B, 2, dtype=torch.bool)
    batch.turn_ids = torch.zeros(B, 2, dtype=torch.long)
    batch.allowed_tokens = torch.ones(B, 2, 3, dtype=torch.bool)
    batch.old_logprobs = torch.log(torch.tensor([[MU[a], MU[b]] for a, b in pairs], dtype=torch.float64))
    stats = step(FixedLogits([pi] * B, length=3), batch, make_algorithm("dr_grpo", group_size=B, max_tokens=2),
                 torch.zeros(B, dtype=torch.float64))
    w = [pi[a] / MU[a] * pi[b] / MU[b] for a, b in pairs]
    assert stats["ess_fraction"] == pytest.approx(sum(w) ** 2 / sum(x * x for x in w) / B, rel=1e-12)


def _three_number_search_episodes():
    """Targets 8, 5, 3: 'guess 8' wins at once; 'hello' is refused, then 'guess 5' wins; 'guess 20' is refused
    (out of 1..16), then 'guess 1' is executed. Pooled over turns: 2 refused of 5 (0.4); the mean of the
    episodes' own shares would be (0 + 1/2 + 1/2) / 3."""
    from agent_lab.envs import make_env

    env = make_env("number-search")
    env.reset([8, 5, 3])
    env.step(["guess 8", "hello", "guess 20"])
    env.step(["", "guess 5", "guess 1"])
    return env.episode_logs()


def test_rejected_share_pools_the_refused_turns_of_every_episode():

    logs = _three_number_search_episodes()
    assert [len(log["turns"]) for log in logs] == [1, 2, 2]
    assert rejected_share(logs) == 2 / 5
    assert rejected_share([]) is None


def test_rollout_diagnostics_logs_the_refused_share_only_when_the_batch_has_logs():
    batch = one_token_batch([0] * 3, [0.5] * 3, rewards=[1.0, 1.0, 0.0])
    run = SimpleNamespace(cfg=SimpleNamespace(algorithm=SimpleNamespace(group_size=3)),
                          algo=make_algorithm("dr_grpo", group_size=3, max_tokens=1))
    assert "rejected_share" not in rollout_diagnostics(run, batch, batch, torch.zeros(3))
    batch.episode_logs = _three_number_search_episodes()
    assert rollout_diagnostics(run, batch, batch, torch.zeros(3))["rejected_share"] == 2 / 5
