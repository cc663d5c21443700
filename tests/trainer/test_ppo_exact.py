"""PPO away from theta_old, its KL penalty and the entropy bonus: exact losses and gradients on enumerable batches.

Every expected value is written out by hand from the definitions (foundations chapter sections 10, 11 and 15):
the clipped surrogate min(rho A, clip(rho, 1 - eps, 1 + eps) A) with rho = pi / mu, the k1/k2/k3 penalties
and the entropy H(pi). The policy's logits are one parameter per row (exact_batches.FixedLogits), so the
gradient of each row is its own closed form.
"""

from __future__ import annotations

import math

import pytest
import torch
from exact_batches import MU, TOKENS, FixedLogits, kl, one_token_batch

from agent_lab import distributed as D
from agent_lab.algorithms import KL_PENALTY, make_algorithm
from agent_lab.diagnostics import summarise_updates
from agent_lab.estimators import KL_OLD_NEW
from agent_lab.trainer import Run, TrainConfig, update
from agent_lab.update import KL_NEW_REF, loss_and_stats

PI = [0.2, 0.35, 0.45]


def onehot(x: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(x), 3).to(torch.float64)


def loss_and_row_grads(model, batch, adv, algo, **kw):
    """The loss, its statistics and d loss / d logits of each row's action position ``[B, V]``."""
    loss, stats = loss_and_stats(model, batch, torch.tensor(adv, dtype=torch.float64), algo, **kw)
    loss.backward()
    return float(loss.detach()), stats, model.z.grad[:, 0, :]


def test_the_clip_holds_both_signs_flat_with_exact_loss_gradient_and_clip_fractions():
    # ratios pi / mu: rows 0-1 at 0.4, rows 2-3 at 1.4, rows 4-5 inside [0.75, 1.25] (mu = pi / 1.1), row 6 at 1.8
    tokens = [0, 0, 1, 1, 2, 0, 2]
    old = [MU[0], MU[0], MU[1], MU[1], PI[2] / 1.1, PI[0] / 1.1, MU[2]]
    adv = [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, -2.0]
    eps, mt, B = 0.25, 2, len(tokens)  # not the default 0.2: the setting must reach the clip
    algo = make_algorithm("ppo", group_size=1, max_tokens=mt, clip_eps=eps)
    loss, stats, grads = loss_and_row_grads(FixedLogits([PI] * B), one_token_batch(tokens, old), adv, algo)
    rho = [PI[t] / m for t, m in zip(tokens, old)]
    clipped = [(a > 0 and r > 1 + eps) or (a < 0 and r < 1 - eps) for r, a in zip(rho, adv)]
    assert clipped == [False, True, True, False, False, False, False], "the fixture must clip on both signs"
    want = -sum(min(r * a, min(max(r, 1 - eps), 1 + eps) * a) for r, a in zip(rho, adv)) / (B * mt)
    assert loss == pytest.approx(want, rel=1e-12)
    for i, (t, r, a, c) in enumerate(zip(tokens, rho, adv, clipped)):
        # d(rho A)/dz = A rho (onehot(x) - pi); a clipped token's surrogate is flat: no gradient
        row = 0.0 if c else -a * r * (onehot(t) - torch.tensor(PI, dtype=torch.float64)) / (B * mt)
        torch.testing.assert_close(grads[i], row * torch.ones(3, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert stats["clip_frac_pos"] == pytest.approx(1 / 3, rel=1e-12)  # A > 0 rows 0, 2, 4: row 2 clipped
    assert stats["clip_frac_neg"] == pytest.approx(1 / 4, rel=1e-12)  # A < 0 rows 1, 3, 5, 6: row 1 clipped
    assert stats["clip_fraction"] == pytest.approx(2 / 7, rel=1e-12)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_the_kl_penalty_has_the_value_and_expected_gradient_its_description_states(kind):
    # pi = mu (the first epoch) on a batch that enumerates pi, advantages 0: the loss is the penalty alone,
    # coef * mean_i k(x_i) / max_tokens, and the rows' gradients sum to coef / max_tokens * E_pi[grad k]
    ref = [0.6, 0.3, 0.1]
    coef, mt, B = 0.3, 2, len(TOKENS)
    ref_lp = torch.log(torch.tensor([ref[t] for t in TOKENS], dtype=torch.float64))[:, None]
    algo = make_algorithm("ppo", group_size=1, max_tokens=mt, kl_coef=coef, kl_kind=kind)
    loss, stats, grads = loss_and_row_grads(FixedLogits([MU] * B), one_token_batch(TOKENS, [MU[t] for t in TOKENS]),
                                            [0.0] * B, algo, ref_logprobs=ref_lp)
    mu, r = torch.tensor(MU, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64)
    kl_pi_ref, log_ratio = kl(MU, ref), (mu / r).log()
    value = {"k1": kl_pi_ref, "k3": kl_pi_ref, "k2": float((mu * log_ratio.square()).sum() / 2)}[kind]
    grad_forward = mu * (log_ratio - kl_pi_ref)  # d KL(pi || ref) / dz with pi = softmax(z)
    grad_reverse = mu - r  # d KL(ref || pi) / dz
    gradient = {"k1": torch.zeros(3, dtype=torch.float64), "k2": grad_forward, "k3": grad_reverse}[kind]
    assert loss == pytest.approx(coef * value / mt, rel=1e-12)
    assert stats[KL_NEW_REF] == pytest.approx(kl_pi_ref, rel=1e-12)  # the logged statistic, whatever the kind
    torch.testing.assert_close(grads.sum(0), coef / mt * gradient, rtol=1e-12, atol=1e-15)
    assert (grad_forward - grad_reverse).abs().max() > 0.05, "the two directions must be distinguishable here"
    stated = {"k1": "value KL(pi || pi_ref), expected gradient 0",
              "k2": "value biased, expected gradient grad KL(pi || pi_ref)",
              "k3": "value KL(pi || pi_ref), expected gradient grad KL(pi_ref || pi)"}[kind]
    assert stated in KL_PENALTY[kind] and KL_PENALTY[kind] in algo.describe()


@pytest.mark.parametrize("name", ["dr_grpo", "ppo"])
def test_the_entropy_bonus_adds_coef_times_the_entropy_with_its_exact_gradient(name):
    coef, mt, B = 0.05, 3, len(TOKENS)
    algo = make_algorithm(name, group_size=1, max_tokens=mt)
    loss, stats, grads = loss_and_row_grads(FixedLogits([PI] * B), one_token_batch(TOKENS, [PI[t] for t in TOKENS]),
                                            [0.0] * B, algo, entropy_coef=coef)
    p = torch.tensor(PI, dtype=torch.float64)
    h = float(-(p * p.log()).sum())
    assert loss == pytest.approx(-coef * h / mt, rel=1e-12)  # every row: -coef * H / (B * max_tokens)
    row = coef / (B * mt) * p * (p.log() + h)  # -coef/(B mt) * dH/dz, dH/dz = -pi (log pi + H)
    torch.testing.assert_close(grads, row.expand(B, 3), rtol=1e-12, atol=1e-15)
    assert stats["entropy"] == pytest.approx(h, rel=1e-12)


def _ppo_run(model, epochs: int, lr: float) -> Run:
    cfg = TrainConfig(env="number-search", algo="ppo", ppo_epochs=epochs, grad_clip=1e9)
    algo = make_algorithm("ppo", group_size=2, max_tokens=1, epochs=epochs)
    return Run(cfg, None, None, model, model, torch.optim.SGD(model.parameters(), lr=lr), torch.device("cpu"), None,
               D.DistInfo(), algo, algo, [], None)


def test_later_epochs_see_the_moved_policy_against_the_recorded_behaviour_log_probs():
    # Epoch 1 at pi = mu (rho = 1), one SGD step of size lr; epoch 2 must compare the moved policy with the
    # *recorded* mu: its ratios, KL, clip fractions and loss follow in closed form from the first gradient.
    adv, lr, eps, B = [1.0, -1.0, 1.0, -1.0], 4.0, 0.2, len(TOKENS)
    model = FixedLogits([MU] * B)
    batch = one_token_batch(TOKENS, [MU[t] for t in TOKENS])
    updates = update(_ppo_run(model, epochs=2, lr=lr), batch, torch.tensor(adv, dtype=torch.float64), None)
    assert len(updates) == 2
    mu = torch.tensor(MU, dtype=torch.float64)
    z1 = [mu.log() + lr * a * (onehot(t) - mu) / B for t, a in zip(TOKENS, adv)]  # z - lr * d loss / dz
    rho = [float(torch.softmax(z, 0)[t]) / MU[t] for z, t in zip(z1, TOKENS)]
    first, second = updates
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-12) and first[KL_OLD_NEW] == pytest.approx(0.0, abs=1e-15)
    assert second["ratio_mean"] == pytest.approx(sum(rho) / B, rel=1e-12)
    assert second["ratio_max"] == pytest.approx(max(rho), rel=1e-12)
    assert second[KL_OLD_NEW] == pytest.approx(sum(r - 1 - math.log(r) for r in rho) / B, rel=1e-12)
    pos = [r > 1 + eps for r, a in zip(rho, adv) if a > 0]
    neg = [r < 1 - eps for r, a in zip(rho, adv) if a < 0]
    assert sum(pos) + sum(neg) > 0, "the step must be large enough to reach the clip"
    assert (second["clip_frac_pos"], second["clip_frac_neg"]) == pytest.approx((sum(pos) / 2, sum(neg) / 2))
    want = -sum(min(r * a, min(max(r, 1 - eps), 1 + eps) * a) for r, a in zip(rho, adv)) / B
    assert second["loss"] == pytest.approx(want, rel=1e-12)
    row = summarise_updates(updates)
    assert row["ratio_first_epoch"] == first["ratio_mean"] and row["ratio_max"] == max(1.0, *rho)
    assert row[KL_OLD_NEW] == second[KL_OLD_NEW]
