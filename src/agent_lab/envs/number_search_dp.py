r"""Exact analysis of number search by dynamic programming over candidate sets.

A hidden integer is uniform on ``1..N``; the agent has ``K`` guesses and hears ``higher``, ``lower``
or ``correct``. After a history ``h`` of ``t`` guesses the candidate set is always an interval
``C = [lo, hi]`` (each answer cuts the interval at the guess; an ``invalid`` turn leaves it alone), and
the future depends on ``h`` only through ``(C, t)``. With ``R(T)`` the reward for success on guess
``T`` (1, or ``1 - 0.05 T`` under the length-dependent reward of lecture notes section 2):

.. math::

    Q^*(h, a) = \frac{1}{|C|}\Big( [a \in C]\, R(t+1)
                 + |C_{<a}|\, V^*(C_{<a}, t+1) + |C_{>a}|\, V^*(C_{>a}, t+1) \Big),
    \qquad V^*(C, t) = \max_a Q^*(C, t, a),\quad V^*(C, K) = 0,

where ``C_{<a} = {n in C : n < a}`` (the targets that answer ``lower``) and ``C_{>a}`` likewise. The
values are success probabilities (expected returns under the length reward) conditioned on the
history, the target being uniform on ``C``.

What the lecture gets wrong (lecture notes section 0 says binary search "can therefore succeed within four
guesses" on 1..16): a guess must *hit* the number, so ``K`` guesses find at most ``2^K - 1`` targets
(the guess itself plus at most ``2^{K-1} - 1`` on each side, by induction), and the optimal success on
1..16 with 4 guesses is 15/16, not 1. The median reference policy attains that optimum; guessing
1, 2, 3, 4 in order succeeds with 4/16. Book: book/part1/00_demonstrations_vs_reward.md (the reference policies
and the 15/16 correction).

A policy is a function from a history (a tuple of ``(guess, feedback)`` pairs, ``guess`` an int or
``None`` for an invalid turn) to an action or to a distribution over actions (a mapping action ->
probability). An action is an int guess or an action text (parsed like the environment parses it, so
invalid texts follow the environment's invalid-action rule). :func:`evaluate_policy` gives its exact
success rate by enumerating targets and the policy's randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from agent_lab.envs.base import INVALID_RULES, check_choice, check_int, tokens_of

__all__ = [
    "NumberSearchDP",
    "PolicyEvaluation",
    "PolicyTable",
    "FEEDBACK",
    "candidates_after",
    "history_from_log",
    "parse_guess",
    "median_policy",
    "sequential_policy",
    "uniform_consistent_policy",
    "uniform_optimal_policy",
]

History = tuple[tuple[int | None, str], ...]
Policy = Callable[[History], Any]

#: Feedback words: ``higher`` means the hidden number is higher than the guess.
FEEDBACK = ("higher", "lower", "correct", "invalid")
REWARD_KINDS = ("binary", "length")


def parse_guess(words: list[str], n: int) -> tuple[int | None, str | None]:
    """``(guess, None)`` for ``["guess", "<k>"]`` with ``1 <= k <= n``, else ``(None, reason)``."""
    if len(words) != 2 or words[0] != "guess":
        return None, "expected 'guess <number>'"
    digits = words[1]
    if not (digits.isascii() and digits.isdigit()):
        return None, "not a number"
    if len(digits) > 6 or not 1 <= int(digits) <= n:
        return None, f"out of range 1..{n}"
    return int(digits), None


def candidates_after(history: History, n: int) -> tuple[int, int]:
    """The candidate interval ``(lo, hi)`` consistent with ``history`` on ``1..n``.

    ``higher`` after guess ``a`` keeps ``n > a``; ``lower`` keeps ``n < a``; ``invalid`` keeps all.
    Raises ``ValueError`` for a history that no target could produce or that continues after ``correct``.
    """
    lo, hi = 1, n
    for step, pair in enumerate(history):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"history[{step}] must be a (guess, feedback) pair, got {pair!r}")
        guess, feedback = pair
        check_choice(f"history[{step}] feedback", feedback, FEEDBACK)
        if feedback == "invalid":
            continue
        guess = check_int(f"history[{step}] guess", guess, 1, n)
        if feedback == "correct":
            raise ValueError(f"history[{step}] is 'correct': the episode is over, there is no later decision")
        if feedback == "higher":
            lo = max(lo, guess + 1)
        else:
            hi = min(hi, guess - 1)
        if lo > hi:
            raise ValueError(f"history {history!r} is inconsistent: no target in 1..{n} gives these answers")
    return lo, hi


def history_from_log(episode_log: Mapping) -> History:
    """The ``(guess, feedback)`` history of a number-search episode log (``env.episode_logs()[i]``)."""
    if episode_log.get("env") != "number-search":
        raise ValueError(f"episode_log must come from number-search, got env {episode_log.get('env')!r}")
    return tuple((turn["action"], turn["observation"]) for turn in episode_log["turns"])


@dataclass(frozen=True)
class PolicyEvaluation:
    """Exact performance of a policy, averaged over targets uniform on 1..N.

    success: probability of finding the target; expected_return: mean return under the analysis'
    reward; per_target_success / per_target_return: float ``[N]``, index ``k-1`` for target ``k``;
    expected_guesses: mean number of turns used.
    """

    success: float
    expected_return: float
    per_target_success: np.ndarray
    per_target_return: np.ndarray
    expected_guesses: float


@dataclass(frozen=True)
class PolicyTable:
    r"""Exact values of one policy at every decision history it reaches, the target uniform on 1..N.

    Row ``i`` is a history ``h`` with fewer than ``k`` turns that the policy reaches with positive
    probability (depth first, the empty history first); ``index`` maps a history to its row. Per row:

    * ``lo``, ``hi``, ``turn``: the candidate interval ``C(h)`` and ``t = |h|`` (int ``[H]``);
    * ``occupancy``: :math:`d(h) = P(\text{an episode passes through } h) = \frac{|C(h)|}{N}
      \prod_{s<t} \pi(a_s \mid h_s)` (float ``[H]``; the expected visits per episode);
    * ``probs``: :math:`\pi(a \mid h)` (float ``[H, N+1]``; column ``a`` is guess ``a``, column 0 an
      invalid action);
    * ``q``: :math:`Q^\pi(h, a)` where :math:`\pi(a \mid h) > 0`, NaN elsewhere (``[H, N+1]``);
    * ``values``: :math:`V^\pi(h) = \sum_a \pi(a \mid h) Q^\pi(h, a)` (``[H]``);
    * ``target_values[i]``: :math:`V^\pi(h, z)` for the hidden number ``z = lo..hi`` (float
      ``[hi - lo + 1]``): the value of the environment's state, which knows ``z``. The posterior of ``z``
      given ``h`` is uniform on ``C(h)`` (the policy never sees ``z``), so ``values[i]`` is their mean.

    Values are expected returns under the DP's reward (success probabilities for ``reward="binary"``).
    Book: part2/06_credit_assignment.
    """

    histories: list
    index: dict
    lo: np.ndarray
    hi: np.ndarray
    turn: np.ndarray
    occupancy: np.ndarray
    probs: np.ndarray
    q: np.ndarray
    values: np.ndarray
    target_values: list

    def __len__(self) -> int:
        return len(self.histories)

    def row(self, history: History) -> int:
        """The row of ``history``; ``ValueError`` if the policy never reaches it."""
        try:
            return self.index[tuple(history)]
        except KeyError:
            raise ValueError(f"history {tuple(history)!r} is not a decision history this policy reaches") from None

    @property
    def advantages(self) -> np.ndarray:
        r""":math:`A^\pi(h, a) = Q^\pi(h, a) - V^\pi(h)` (``[H, N+1]``, NaN where :math:`\pi(a \mid h) = 0`)."""
        return self.q - self.values[:, None]

    def gradient(self) -> np.ndarray:
        r"""The exact policy gradient with respect to the logits of :math:`\pi(\cdot \mid h)` at each row.

        .. math:: \frac{\partial J}{\partial \theta_{h,a}} = d(h)\, \pi(a \mid h)\, A^\pi(h, a)

        for a softmax :math:`\pi(\cdot \mid h) = \operatorname{softmax}(\theta_{h, \cdot})` with its own
        logits at every history (the tabular policy; any other parametrisation's gradient is this one
        multiplied by the Jacobian of the logits). ``[H, N+1]``, 0 off the support.
        """
        return self.occupancy[:, None] * self.probs * np.nan_to_num(self.advantages)


class NumberSearchDP:
    """Exact values, optimal policy and policy evaluation for number search on ``1..n`` with ``k`` guesses.

    ``reward="binary"`` (1 for success) or ``"length"`` (``1 - length_penalty * T`` for success on turn
    ``T``); ``invalid_action`` is the environment's rule (``"spend_turn"`` or ``"end_episode"``), used
    for the value of an invalid action. Values are memoised over ``(lo, hi, t)``: O(N^2 K) states, O(N)
    actions each.
    """

    def __init__(
        self,
        n: int = 16,
        k: int = 4,
        reward: str = "binary",
        length_penalty: float = 0.05,
        invalid_action: str = "spend_turn",
    ):
        self.n = check_int("n", n, 1, 10_000)
        self.k = check_int("k", k, 1, 64)
        self.reward = check_choice("reward", reward, REWARD_KINDS)
        self.length_penalty = float(length_penalty)
        if not 0.0 <= self.length_penalty < 1.0 / self.k:
            raise ValueError(
                f"length_penalty must lie in [0, 1/k) = [0, {1.0 / self.k:.4g}) so success always pays, "
                f"got {length_penalty!r}"
            )
        self.invalid_action = check_choice("invalid_action", invalid_action, INVALID_RULES)
        self._v = lru_cache(maxsize=None)(self._value_uncached)

    # ----- the Bellman recursion ----------------------------------------------------------------
    def success_reward(self, turns: int) -> float:
        """``R(T)``: the return of finding the target on guess number ``turns``."""
        return 1.0 if self.reward == "binary" else 1.0 - self.length_penalty * turns

    def _q(self, lo: int, hi: int, t: int, a: int) -> float:
        size = hi - lo + 1
        total = self.success_reward(t + 1) if lo <= a <= hi else 0.0
        below_hi, above_lo = min(hi, a - 1), max(lo, a + 1)
        if below_hi >= lo:  # targets that answer "lower"
            total += (below_hi - lo + 1) * self._v(lo, below_hi, t + 1)
        if above_lo <= hi:  # targets that answer "higher"
            total += (hi - above_lo + 1) * self._v(above_lo, hi, t + 1)
        return total / size

    def _value_uncached(self, lo: int, hi: int, t: int) -> float:
        if t >= self.k:
            return 0.0
        # Guesses outside [lo, hi] are dominated by the nearest end of the interval, so only C is searched.
        return max(self._q(lo, hi, t, a) for a in range(lo, hi + 1))

    # ----- history-level interface --------------------------------------------------------------
    def _state(self, history: History) -> tuple[int, int, int]:
        history = tuple(history)
        lo, hi = candidates_after(history, self.n)
        return lo, hi, len(history)

    def value(self, history: History = ()) -> float:
        """``V*(h)``: the optimal expected return from history ``h`` (0 once the guesses are spent)."""
        return self._v(*self._state(history))

    def q_values(self, history: History = ()) -> dict[int | None, float]:
        """``Q*(h, a)`` for every guess ``a`` in 1..N, and for ``None`` (an invalid action)."""
        lo, hi, t = self._state(history)
        if t >= self.k:
            raise ValueError(f"history has {t} turns: all {self.k} guesses are spent, no action is left")
        out: dict[int | None, float] = {a: self._q(lo, hi, t, a) for a in range(1, self.n + 1)}
        out[None] = self._v(lo, hi, t + 1) if self.invalid_action == "spend_turn" else 0.0
        return out

    def optimal_actions(self, history: History = ()) -> list[int]:
        """Every guess attaining ``max_a Q*(h, a)`` (within 1e-12), in increasing order."""
        q = self.q_values(history)
        best = max(q.values())
        return [a for a, v in q.items() if a is not None and v >= best - 1e-12]

    def optimal_action(self, history: History = ()) -> int:
        """The planner's guess: the optimal guess closest to the lower median of the candidates."""
        lo, hi, _ = self._state(history)
        median = (lo + hi) // 2
        return min(self.optimal_actions(history), key=lambda a: (abs(a - median), a))

    def optimal_policy(self) -> Policy:
        """The deterministic planner as a policy (history -> guess)."""
        return self.optimal_action

    def optimal_value(self) -> float:
        """``V*`` of the empty history: the best attainable expected return (15/16 for N=16, K=4)."""
        return self.value(())

    # ----- exact evaluation of any policy -------------------------------------------------------
    def evaluate_policy(self, policy: Policy) -> PolicyEvaluation:
        """Exact success rate and expected return of ``policy`` for a target uniform on 1..N.

        Enumerates the policy's randomness history by history, carrying the set of targets still
        consistent with each branch, so the cost is the number of distinct reachable histories (not
        N times that). ``policy(history)`` returns an action or a mapping action -> probability
        (probabilities must be non-negative and sum to 1 within 1e-9).
        """
        success = np.zeros(self.n)
        returns = np.zeros(self.n)
        turns = np.zeros(self.n)

        def recurse(history: History, lo: int, hi: int, weight: float) -> None:
            t = len(history)
            if t >= self.k:
                turns[lo - 1 : hi] += weight * t
                return
            for action, prob in _distribution(policy(history), t).items():
                if prob == 0.0:
                    continue
                guess = self._as_guess(action)
                w = weight * prob
                if guess is None:
                    if self.invalid_action == "end_episode":
                        turns[lo - 1 : hi] += w * (t + 1)
                    else:
                        recurse(history + ((None, "invalid"),), lo, hi, w)
                    continue
                if lo <= guess <= hi:
                    success[guess - 1] += w
                    returns[guess - 1] += w * self.success_reward(t + 1)
                    turns[guess - 1] += w * (t + 1)
                if min(hi, guess - 1) >= lo:
                    recurse(history + ((guess, "lower"),), lo, min(hi, guess - 1), w)
                if max(lo, guess + 1) <= hi:
                    recurse(history + ((guess, "higher"),), max(lo, guess + 1), hi, w)

        recurse((), 1, self.n, 1.0)
        return PolicyEvaluation(
            success=float(success.mean()),
            expected_return=float(returns.mean()),
            per_target_success=success,
            per_target_return=returns,
            expected_guesses=float(turns.mean()),
        )

    def policy_table(self, policy: Policy) -> PolicyTable:
        r"""Exact :math:`V^\pi`, :math:`Q^\pi`, occupancies and state values of ``policy`` (see :class:`PolicyTable`).

        One depth-first pass over the histories the policy reaches, each computing the vector of
        :math:`V^\pi(h, z)` over the targets ``z`` in ``C(h)``:

        .. math:: V^\pi(h, z) = \sum_a \pi(a \mid h) \big( [a = z] R(t+1) + [a \ne z] V^\pi(h\,(a, o_z(a)), z) \big)

        with :math:`o_z(a)` the answer ``lower``/``higher`` and :math:`V^\pi(h, z) = 0` once ``k`` guesses are
        spent; :math:`Q^\pi(h, a)` is the same bracket averaged over ``z``. ``policy`` as in
        :meth:`evaluate_policy` (int guesses, action texts or ``None``; invalid ones follow the invalid rule).
        """
        rows: list[tuple] = []

        def visit(history: History, lo: int, hi: int, reach: float) -> np.ndarray:
            t, size = len(history), hi - lo + 1
            if t >= self.k:
                return np.zeros(size)
            slot = len(rows)
            rows.append(())
            probs = np.zeros(self.n + 1)
            for action, prob in _distribution(policy(history), t).items():
                probs[self._as_guess(action) or 0] += prob
            q, value = np.full(self.n + 1, np.nan), np.zeros(size)
            for col in np.flatnonzero(probs):
                guess = int(col) or None
                q_z = self._action_values(history, lo, hi, guess, lambda h, a, b: visit(h, a, b, reach * probs[col]))
                q[col], value = q_z.mean(), value + probs[col] * q_z
            rows[slot] = (history, lo, hi, reach * size / self.n, probs, q, value)
            return value

        visit((), 1, self.n, 1.0)
        histories = [r[0] for r in rows]
        return PolicyTable(
            histories=histories,
            index={h: i for i, h in enumerate(histories)},
            lo=np.array([r[1] for r in rows]),
            hi=np.array([r[2] for r in rows]),
            turn=np.array([len(r[0]) for r in rows]),
            occupancy=np.array([r[3] for r in rows]),
            probs=np.stack([r[4] for r in rows]),
            q=np.stack([r[5] for r in rows]),
            values=np.array([r[6].mean() for r in rows]),
            target_values=[r[6] for r in rows],
        )

    def _action_values(self, history: History, lo: int, hi: int, guess: int | None, child) -> np.ndarray:
        """``Q(h, guess, z)`` for ``z = lo..hi``; ``child(history, lo, hi)`` gives ``V`` of a later history."""
        t = len(history)
        if guess is None:
            if self.invalid_action == "end_episode":
                return np.zeros(hi - lo + 1)
            return child(history + ((None, "invalid"),), lo, hi)
        out = np.zeros(hi - lo + 1)
        if lo <= guess <= hi:
            out[guess - lo] = self.success_reward(t + 1)
        if min(hi, guess - 1) >= lo:  # targets below the guess answer "lower"
            out[: min(hi, guess - 1) - lo + 1] = child(history + ((guess, "lower"),), lo, min(hi, guess - 1))
        if max(lo, guess + 1) <= hi:  # targets above it answer "higher"
            out[max(lo, guess + 1) - lo :] = child(history + ((guess, "higher"),), max(lo, guess + 1), hi)
        return out

    def _as_guess(self, action: Any) -> int | None:
        if isinstance(action, str):
            words = tokens_of(action)
            return None if words is None else parse_guess(words, self.n)[0]
        if action is None:
            return None
        return check_int("policy action", action, 1, self.n)


def _distribution(choice: Any, t: int) -> dict[Any, float]:
    """A policy's output as ``{action: probability}``."""
    if not isinstance(choice, Mapping):
        return {choice: 1.0}
    probs = {a: float(p) for a, p in choice.items()}
    if any(p < 0 or not np.isfinite(p) for p in probs.values()) or abs(sum(probs.values()) - 1.0) > 1e-9:
        raise ValueError(f"policy at turn {t} returned probabilities {probs!r}; they must be >= 0 and sum to 1")
    return probs


# ----- reference policies -----------------------------------------------------------------------
def median_policy(n: int = 16, upper: bool = False) -> Policy:
    """Binary search: guess a median of the candidate interval (the lower one unless ``upper``)."""

    def policy(history: History) -> int:
        lo, hi = candidates_after(history, n)
        return (lo + hi + (1 if upper else 0)) // 2

    return policy


def sequential_policy(n: int = 16) -> Policy:
    """Guess 1, 2, 3, ... in order, ignoring the feedback."""

    def policy(history: History) -> int:
        return min(len(history) + 1, n)

    return policy


def uniform_consistent_policy(n: int = 16) -> Policy:
    """Guess uniformly at random among the candidates consistent with the history."""

    def policy(history: History) -> dict[int, float]:
        lo, hi = candidates_after(history, n)
        return {a: 1.0 / (hi - lo + 1) for a in range(lo, hi + 1)}

    return policy


def uniform_optimal_policy(dp: NumberSearchDP) -> Policy:
    """An optimal policy that is not deterministic: uniform over ``dp.optimal_actions(history)``.

    Every guess it makes is optimal, so :math:`A^\\pi(h, a) = 0` for each of them and its policy gradient is
    exactly zero, yet its episodes still succeed or fail with the hidden number: what an advantage
    estimator reports for it is pure noise.
    """

    def policy(history: History) -> dict[int, float]:
        best = dp.optimal_actions(history)
        return {a: 1.0 / len(best) for a in best}

    return policy
