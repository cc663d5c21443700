"""Every statistic an estimator returns, against a value computed exactly on a small enumerable case.

Expectations are exact because of one device: a batch holding each token in proportion to its probability
under the sampling policy (old = [0.4, 0.3, 0.2, 0.1] -> 4, 3, 2 and 1 copies) has a token mean equal to
the expectation under that policy. The reference values are computed here in plain Python (``math``), not
with the estimator's own formula, so a wrong formula in the package cannot agree with them.
"""

import itertools
import math
from fractions import Fraction

import pytest
import torch

import agent_lab.estimators as E
from agent_lab.envs.number_search_dp import NumberSearchDP, sequential_policy, uniform_consistent_policy
from estimator_cases import DTYPE

OLD = [0.4, 0.3, 0.2, 0.1]  # behaviour policy mu
NEW = [0.3, 0.45, 0.1, 0.15]  # current policy pi: token ratios 0.75, 1.5, 0.5, 1.5
ADV = [1.0, 1.0, -1.0, -1.0]  # advantage of each token
COUNTS = [4, 3, 2, 1]  # COUNTS / 10 == OLD


def kl(p, q):
    """KL(p || q) in plain floats."""
    return math.fsum(a * math.log(a / b) for a, b in zip(p, q))


def proportional_batch(probs_old, probs_new, counts, advantages=None):
    """One row whose tokens appear `counts` times each: token means are expectations under the old policy."""
    tokens = torch.tensor([a for a, c in enumerate(counts) for _ in range(c)])
    old = torch.tensor(probs_old, dtype=DTYPE).log()[tokens][None]
    new = torch.tensor(probs_new, dtype=DTYPE).log()[tokens][None]
    adv = None if advantages is None else torch.tensor(advantages, dtype=DTYPE)[tokens][None]
    return tokens, new, old, adv, torch.ones_like(new, dtype=torch.bool)


# ----- KL: k1, k2, k3, both directions -----------------------------------------------------------

@pytest.mark.parametrize("p, q", [(OLD, NEW), (NEW, OLD), ([0.7, 0.2, 0.1], [0.3, 0.4, 0.3])])
def test_kl_estimate_expectations_under_the_first_argument_are_exact(p, q):
    lp, lq = torch.tensor(p, dtype=DTYPE).log(), torch.tensor(q, dtype=DTYPE).log()
    weights = torch.tensor(p, dtype=DTYPE)
    mean = {kind: float((weights * E.kl_estimate(lp, lq, kind)).sum()) for kind in E.KL_KINDS}
    assert mean["k1"] == pytest.approx(kl(p, q), abs=1e-14), "k1 = log p - log q is unbiased for KL(p || q)"
    assert mean["k3"] == pytest.approx(kl(p, q), abs=1e-14), "k3 = (r - 1) - log r is unbiased for KL(p || q)"
    half_square = math.fsum(a * 0.5 * math.log(b / a) ** 2 for a, b in zip(p, q))
    assert mean["k2"] == pytest.approx(half_square, abs=1e-14)
    assert abs(mean["k2"] - kl(p, q)) > 1e-3, "k2 is biased: its mean is not the KL"
    # The other direction needs the other sampling distribution: same estimator, swapped roles.
    reverse = float((torch.tensor(q, dtype=DTYPE) * E.kl_estimate(lq, lp, "k3")).sum())
    assert reverse == pytest.approx(kl(q, p), abs=1e-14)
    assert abs(reverse - mean["k3"]) > 1e-3, "KL is not symmetric here, so the direction is visible"


def test_k3_averaged_over_the_wrong_policy_is_not_a_kl():
    # k3 of KL(p || q) averaged over samples from q: E_q[(q/p - 1) - log(q/p)] = chi^2(q || p) - KL(q || p).
    p, q = [0.3, 0.4, 0.3], [0.7, 0.2, 0.1]
    lp, lq = torch.tensor(p, dtype=DTYPE).log(), torch.tensor(q, dtype=DTYPE).log()
    wrong = float((torch.tensor(q, dtype=DTYPE) * E.kl_estimate(lp, lq, "k3")).sum())
    chi2 = math.fsum(b * b / a for a, b in zip(p, q)) - 1
    assert wrong == pytest.approx(chi2 - kl(q, p), abs=1e-14)
    assert abs(wrong - kl(p, q)) > 0.05 and abs(wrong - kl(q, p)) > 0.05


def test_ppo_kl_statistic_equals_kl_old_new_exactly_on_a_proportional_batch():
    _, new, old, adv, mask = proportional_batch(OLD, NEW, COUNTS, ADV)
    _, stats = E.ppo_clipped_surrogate(new, old, adv, mask, 0.2)
    assert float(stats[E.KL_OLD_NEW]) == pytest.approx(kl(OLD, NEW), abs=1e-14)
    assert float(stats["approx_kl"]) == float(stats[E.KL_OLD_NEW]), "the former name must carry the same value"
    # The trainer's kl_behaviour formula, kl_estimate(old, new, "k3"), is the same statistic.
    assert float(E.kl_estimate(old, new, "k3", mask).mean()) == pytest.approx(float(stats[E.KL_OLD_NEW]), abs=1e-15)
    _, sequence = E.ppo_clipped_surrogate(new, old, adv, mask, 0.2, ratio_level="sequence")
    assert float(sequence[E.KL_OLD_NEW]) == pytest.approx(kl(OLD, NEW), abs=1e-14), "the KL uses token ratios"


def test_ppo_kl_statistic_on_200000_old_policy_samples_matches_the_exact_kl():
    # Issue 25's reproduction: the former (1/rho - 1) + log rho averaged 0.4221 here, chi^2 - KL, not 0.3446.
    old_p, new_p = [0.7, 0.2, 0.1], [0.3, 0.4, 0.3]
    tokens = torch.multinomial(torch.tensor(old_p, dtype=DTYPE), 200_000, replacement=True,
                               generator=torch.Generator().manual_seed(0))
    old = torch.tensor(old_p, dtype=DTYPE).log()[tokens][None]
    new = torch.tensor(new_p, dtype=DTYPE).log()[tokens][None]
    _, stats = E.ppo_clipped_surrogate(new, old, torch.ones(1, dtype=DTYPE), torch.ones_like(new, dtype=torch.bool))
    exact = kl(old_p, new_p)
    assert exact == pytest.approx(0.3446, abs=5e-5)
    # Standard error of the k3 mean here is about 0.0015; the biased formula sits 0.077 away.
    got = float(stats[E.KL_OLD_NEW])
    assert abs(got - exact) < 0.005, f"expected KL(old || new) = {exact:.4f}, got {got:.4f}"


def test_kl_estimates_as_loss_terms_have_the_documented_expected_gradients():
    # Differentiated through log pi on pi's own samples (expectation by enumeration, weights detached):
    # k1 -> 0, k2 -> grad KL(pi || ref), k3 -> grad KL(ref || pi).
    logits = torch.tensor([0.3, -0.5, 1.0], dtype=DTYPE, requires_grad=True)
    ref = torch.tensor([0.2, 0.5, 0.3], dtype=DTYPE).log()
    lp = torch.log_softmax(logits, 0)
    weights = lp.exp().detach()

    def grad(value):
        return torch.autograd.grad(value, logits, retain_graph=True)[0]

    forward = grad((lp.exp() * (lp - ref)).sum())
    reverse = grad((ref.exp() * (ref - lp)).sum())
    assert torch.allclose(grad((weights * E.kl_estimate(lp, ref, "k1")).sum()), torch.zeros(3, dtype=DTYPE), atol=1e-15)
    assert torch.allclose(grad((weights * E.kl_estimate(lp, ref, "k2")).sum()), forward, atol=1e-15)
    assert torch.allclose(grad((weights * E.kl_estimate(lp, ref, "k3")).sum()), reverse, atol=1e-15)
    assert not torch.allclose(forward, reverse, atol=1e-3)


# ----- ratio statistics, clip fractions by sign, the surrogate and its gradient -------------------

def test_ppo_ratio_statistics_are_exact_expectations_under_the_old_policy():
    _, new, old, adv, mask = proportional_batch(OLD, NEW, COUNTS, ADV)
    _, stats = E.ppo_clipped_surrogate(new, old, adv, mask, 0.2)
    assert float(stats["ratio_mean"]) == pytest.approx(1.0, abs=1e-15), "E_old[pi/old] = sum(pi) = 1"
    assert float(stats["ratio_max"]) == pytest.approx(1.5, abs=1e-15)
    assert float(stats["ratio_min"]) == pytest.approx(0.5, abs=1e-15)
    assert [int(stats[k]) for k in ("n_pos", "n_neg", "n_tokens")] == [7, 3, 10]


def test_ppo_clip_fractions_by_sign_surrogate_and_gradient_are_exact():
    # eps = 0.2. A > 0: token 0 (ratio 0.75, free), token 1 (1.5 > 1.2, clipped): P(clip | A > 0) = 0.3/0.7.
    # A < 0: token 2 (0.5 < 0.8, clipped), token 3 (1.5, free for A < 0): P(clip | A < 0) = 0.2/0.3.
    tokens, _, old, adv, mask = proportional_batch(OLD, NEW, COUNTS, ADV)
    logits = torch.tensor(NEW, dtype=DTYPE).log().requires_grad_(True)
    new = E.token_logprobs(logits.expand(len(tokens), 4)[None], tokens[None])
    surrogate, stats = E.ppo_clipped_surrogate(new, old, adv, mask, 0.2)
    assert float(stats["clip_frac_pos"]) == pytest.approx(3 / 7, abs=1e-15)
    assert float(stats["clip_frac_neg"]) == pytest.approx(2 / 3, abs=1e-15)
    expected = 0.4 * 0.75 + 0.3 * 1.2 + 0.2 * -0.8 + 0.1 * -1.5  # min(rho A, clip(rho) A) per token
    assert float(surrogate.detach().mean()) == pytest.approx(expected, abs=1e-15)
    (grad,) = torch.autograd.grad(surrogate.mean(), logits)
    # Only unclipped tokens carry gradient: d(rho A)/dz = rho A (e_a - pi), weighted by old(a).
    want = [0.0] * 4
    for a, rho in ((0, 0.75), (3, 1.5)):
        for k in range(4):
            want[k] += OLD[a] * rho * ADV[a] * ((k == a) - NEW[k])
    assert grad.tolist() == pytest.approx(want, abs=1e-14)


# ----- entropy ----------------------------------------------------------------------------------

@pytest.mark.parametrize("theta", [-2.0, 0.0, 0.7])
def test_entropy_of_the_two_action_bandit_and_its_gradient_are_exact(theta):
    # logits [theta, 0]: p = sigmoid(theta), H = -p log p - (1-p) log(1-p), dH/dtheta = -theta p (1-p).
    t = torch.tensor(theta, dtype=DTYPE, requires_grad=True)
    h = E.entropy_from_logits(torch.stack([t, torch.zeros((), dtype=DTYPE)]))
    p = 1 / (1 + math.exp(-theta))
    assert h.item() == pytest.approx(-p * math.log(p) - (1 - p) * math.log(1 - p), abs=1e-15)
    (grad,) = torch.autograd.grad(h, t)
    assert grad.item() == pytest.approx(-theta * p * (1 - p), abs=1e-15)


def test_entropy_of_a_categorical_is_minus_sum_p_log_p():
    h = E.entropy_from_logits(torch.tensor(OLD, dtype=DTYPE).log())
    assert h.item() == pytest.approx(-math.fsum(p * math.log(p) for p in OLD), abs=1e-15)


# ----- effective sample size --------------------------------------------------------------------

def test_effective_sample_size_is_the_squared_sum_over_the_sum_of_squares():
    assert E.effective_sample_size(torch.tensor([1.0, 2.0, 3.0], dtype=DTYPE)).item() == pytest.approx(36 / 14, abs=1e-15)
    assert E.effective_sample_size(torch.tensor([0.5, 0.5, 2.0], dtype=DTYPE)).item() == pytest.approx(9 / 4.5, abs=1e-15)
    logs = torch.tensor([1.0, 2.0, 3.0], dtype=DTYPE).log()
    assert E.effective_sample_size(logs, log_weights=True).item() == pytest.approx(36 / 14, abs=1e-14)


def test_ess_fraction_of_importance_weights_is_one_over_one_plus_chi_square():
    # Weights pi/mu on samples from mu: ESS / N = (E w)^2 / E[w^2] = 1 / (1 + chi^2(pi || mu)), exactly.
    _, new, old, _, _ = proportional_batch(OLD, NEW, COUNTS)
    w = (new - old).exp()[0]
    chi2 = math.fsum(b * b / a for a, b in zip(OLD, NEW)) - 1
    assert E.effective_sample_size(w).item() / len(w) == pytest.approx(1 / (1 + chi2), abs=1e-14)


# ----- degenerate groups and P(>= 1 success), on number search's exact success rates -------------

UNIFORM_CONSISTENT = Fraction(9752459, 16816800)  # exact success of guessing uniformly among the candidates


def _uniform_consistent_success(n: int, k: int) -> Fraction:
    """In rationals: n candidates, k guesses, target and guess uniform on the candidates."""
    if n == 0 or k == 0:
        return Fraction(0)
    return sum(Fraction(1, n) * (Fraction(1, n) + Fraction(a - 1, n) * _uniform_consistent_success(a - 1, k - 1)
                                 + Fraction(n - a, n) * _uniform_consistent_success(n - a, k - 1))
               for a in range(1, n + 1))


def test_number_search_success_rates_used_below_are_exact():
    assert _uniform_consistent_success(16, 4) == UNIFORM_CONSISTENT
    dp = NumberSearchDP(16, 4)
    assert dp.evaluate_policy(uniform_consistent_policy(16)).success == pytest.approx(float(UNIFORM_CONSISTENT), abs=1e-13)
    assert dp.evaluate_policy(sequential_policy(16)).success == 4 / 16


def _outcomes(p, n):
    """Every binary outcome of n independent episodes with success p, with its probability."""
    for bits in itertools.product([0.0, 1.0], repeat=n):
        yield torch.tensor(bits, dtype=DTYPE), math.prod(p if b else 1 - p for b in bits)


@pytest.mark.parametrize("p", [float(UNIFORM_CONSISTENT), 4 / 16, 0.01])
@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_expected_degenerate_fraction_is_the_degenerate_probability(p, group_size):
    # Two groups per batch: E[observed all-equal share] = p^G + (1-p)^G, by enumerating all 2^(2G) outcomes.
    expectation = math.fsum(w * E.degenerate_group_fraction(r, group_size).item() for r, w in _outcomes(p, 2 * group_size))
    assert expectation == pytest.approx(p**group_size + (1 - p) ** group_size, abs=1e-14)
    assert E.degenerate_group_probability(p, group_size).item() == pytest.approx(expectation, abs=1e-14)


@pytest.mark.parametrize("p", [float(UNIFORM_CONSISTENT), 4 / 16, 1e-3])
@pytest.mark.parametrize("n", [1, 4, 8])
def test_prob_at_least_one_success_equals_enumeration(p, n):
    expectation = math.fsum(w for r, w in _outcomes(p, n) if r.max() == 1.0)
    assert E.prob_at_least_one_success(p, n).item() == pytest.approx(expectation, abs=1e-14)
    # and ReST-EM's success rate is an unbiased estimate of p
    rate = math.fsum(w * E.rest_em_filter(r).success_rate.item() for r, w in _outcomes(p, n))
    assert rate == pytest.approx(p, abs=1e-14)
