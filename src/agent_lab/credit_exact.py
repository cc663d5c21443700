"""Exact credit assignment on number search: the true :math:`A^\\pi` of every reachable (history, guess),
and the turn-level estimators compared with it (book/part2/06_credit_assignment.md, bench/bench_credit.py).

The pieces, in the order :func:`compare` runs them:

* a policy as a function of the history (the convention of :mod:`agent_lab.envs.number_search_dp`): the
  uniform guess among the candidates, an optimal policy, or a language model read through the candidate
  mask (:func:`lm_policy`);
* its exact table (:meth:`~agent_lab.envs.NumberSearchDP.policy_table`): :math:`V^\\pi(h)`,
  :math:`Q^\\pi(h, a)`, the state values :math:`V^\\pi(h, z)`, occupancies and the exact policy gradient;
* batches of episodes played in the real environment (:func:`sample_batch`) and, for branching,
  continuations from each turn's saved state, replayed exactly (:func:`branch_returns`);
* the estimators of :mod:`agent_lab.estimators` as per-turn advantages of a batch (:data:`ESTIMATORS`);
* :func:`compare`: independent replicate batches at one episode budget; per estimator, the bias and variance
  of the per-turn advantage against :math:`A^\\pi(h_t, a_t)` and of the policy-gradient estimate against the
  exact gradient.

The gradient is taken with respect to the logits of :math:`\\pi(\\cdot \\mid h)` at every reachable history
(a tabular softmax; see :meth:`~agent_lab.envs.PolicyTable.gradient`): one estimate from a batch of N
episodes is :math:`\\hat g = \\frac1N \\sum_i \\sum_t \\hat A_{it} (e_{a_{it}} - \\pi(\\cdot \\mid h_{it}))` at the
row of :math:`h_{it}`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agent_lab.critic import TurnCritic, fit_critic
from agent_lab.envs import (
    NumberSearchDP,
    PolicyTable,
    history_from_log,
    make_env,
    replay_prefix,
    uniform_consistent_policy,
    uniform_optimal_policy,
)
from agent_lab.envs.number_search_dp import History, candidates_after
from agent_lab.estimators import (
    anchor_state_advantages,
    anchor_state_ids,
    branching_advantages,
    branching_cost,
    explained_variance,
    gae,
    gae_targets,
    group_centered_advantages,
    reward_to_go,
)

__all__ = ["Batch", "Context", "Estimator", "ESTIMATORS", "Comparison", "consistent_histories", "lm_policy",
           "trained_lm_policy", "reference_policies", "play",
           "sample_batch", "enumerate_episodes", "branch_returns", "exact_values", "state_keys", "critic_features",
           "fitted_critic", "compare"]

DTYPE = torch.float64


# ----------------------------------------------------------------------------- a language model as a policy
def consistent_histories(n: int, k: int) -> list[History]:
    """Every decision history (fewer than ``k`` turns) whose guesses all lie in the candidate interval."""
    out: list[History] = []

    def visit(history: History, lo: int, hi: int) -> None:
        out.append(history)
        if len(history) + 1 >= k:
            return
        for a in range(lo, hi + 1):
            if a > lo:
                visit(history + ((a, "lower"),), lo, a - 1)
            if a < hi:
                visit(history + ((a, "higher"),), a + 1, hi)

    visit((), 1, n)
    return out


@torch.no_grad()
def lm_policy(model, tokenizer, n: int = 16, k: int = 4, temperature: float = 1.0,
              batch: int = 512) -> Callable[[History], dict[int, float]]:
    """A language-model policy as a history policy: its sampling distribution under the candidate mask.

    With the environment's candidate mask (``mask_actions=True``, the rollout's ``candidate_mask``) the rollout
    writes ``guess``, then a number among the consistent candidates, then a newline; only the number is a
    choice, so :math:`\\pi(a \\mid h) = \\operatorname{softmax}_{a \\in C(h)}(z_a / T)` with :math:`z` the logits
    after the transcript ``<bos> prompt <nl> guess a <nl> answer <nl> ... guess``. Computed once for every
    consistent history, in batches of ``batch`` transcripts.
    """
    env = make_env("number-search", n=n, guesses=k)
    prompt = env.reset([1])[0]
    histories = consistent_histories(n, k)
    tok, device = tokenizer, next(model.parameters()).device
    number_ids = torch.tensor([tok.index[str(a)] for a in range(1, n + 1)], device=device)
    table: dict[History, dict[int, float]] = {}
    was_training = model.training
    model.eval()
    for start in range(0, len(histories), batch):
        part = histories[start:start + batch]
        rows = [[tok.bos_id] + tok.encode(prompt) + [tok.nl_id]
                + sum((tok.encode(f"guess {a}") + [tok.nl_id] + tok.encode(o) + [tok.nl_id] for a, o in h), [])
                + tok.encode("guess") for h in part]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows], device=device)
        mask = ids != tok.pad_id
        prompt_lengths = torch.full((len(rows),), len(tok.encode(prompt)) + 2, device=device)  # <bos>, <nl>
        logits = model(ids, mask, prompt_lengths=prompt_lengths)[torch.arange(len(rows), device=device),
                                                                 mask.sum(1) - 1][:, number_ids]
        for h, z in zip(part, logits.double().cpu()):
            lo, hi = candidates_after(h, n)
            p = torch.softmax(z[lo - 1:hi] / temperature, dim=0).tolist()
            table[h] = {a: q for a, q in zip(range(lo, hi + 1), p)}
    model.train(was_training)

    def policy(history: History) -> dict[int, float]:
        try:
            return table[tuple(history)]
        except KeyError:
            raise ValueError(f"history {history!r} has a guess outside its candidates: the candidate-masked "
                             "policy never reaches it") from None

    return policy


def trained_lm_policy(sft_steps: int = 10, seed: int = 0) -> Callable[[History], dict[int, float]]:
    """A partly trained policy: the default number-search transformer after ``sft_steps`` supervised steps on
    the planner's demonstrations (trained here, from ``seed``; nothing is read from disk), read through the
    candidate mask by :func:`lm_policy`."""
    from agent_lab.trainer import train  # late import: only this policy needs the training loop

    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the trainer's own precision, whatever the caller's default
    try:
        result = train(sft_steps=sft_steps, steps=0, seed=seed, eval_every=0, progress=False)
    finally:
        torch.set_default_dtype(dtype)
    return lm_policy(result.policy, result.tokenizer)


def reference_policies(dp: NumberSearchDP, sft_steps: int = 10, seed: int = 0) -> dict[str, Callable]:
    """The three policies the comparison is run on: uniform among the candidates, partly trained, optimal."""
    return {"uniform": uniform_consistent_policy(dp.n), f"partly trained (SFT {sft_steps} steps)":
            trained_lm_policy(sft_steps, seed), "optimal": uniform_optimal_policy(dp)}


# ----------------------------------------------------------------------------- episodes in the environment
@dataclass
class Batch:
    """Episodes of number search in the tensor contract, with each turn's exact table row.

    ``rewards`` ``[B, T]`` (float64), ``turn_mask`` ``[B, T]``, ``terminated`` ``[B]``; ``rows`` ``[B, T]``
    the :class:`~agent_lab.envs.PolicyTable` row of the history before each turn and ``actions`` ``[B, T]``
    its guess (the table's column; -1 at padding); ``group_size`` contiguous episodes share a task.
    ``continuations`` ``[B, T, K]`` (branching only): returns of K continuations from each turn's saved state.
    """

    logs: list[dict]
    rewards: Tensor
    turn_mask: Tensor
    terminated: Tensor
    rows: np.ndarray
    actions: np.ndarray
    group_size: int
    continuations: Tensor | None = None
    continuation_turns: Tensor | None = None

    def __len__(self) -> int:
        return int(self.rewards.shape[0])


def _sample_action(table: PolicyTable, row: int, rng: np.random.Generator) -> str:
    cdf = np.cumsum(table.probs[row])
    col = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return f"guess {min(col, table.probs.shape[1] - 1)}"  # column 0 is "guess 0": an invalid action


def play(env, table: PolicyTable, rng: np.random.Generator, histories: Sequence[History] | None = None) -> list[dict]:
    """Step every live episode of ``env`` with the table's policy until all are over; return the episode logs.

    ``histories`` (default: empty) are the episodes' histories so far, for environments replayed to a prefix.
    """
    histories = list(histories) if histories is not None else [()] * env.batch_size
    while not bool(env.done.all()):
        live = ~env.done
        texts = [_sample_action(table, table.row(h), rng) if on else "" for h, on in zip(histories, live)]
        step = env.step(texts)
        for i in np.flatnonzero(live):
            if not step.done[i]:
                histories[i] = histories[i] + ((step.info[i]["action"], step.observations[i]),)
    return env.episode_logs()


def _as_batch(logs: list[dict], table: PolicyTable, group_size: int) -> Batch:
    turns = max(len(log["turns"]) for log in logs)
    rewards = torch.zeros(len(logs), turns, dtype=DTYPE)
    rows = np.full((len(logs), turns), -1)
    actions = np.full((len(logs), turns), -1)
    for i, log in enumerate(logs):
        history = history_from_log(log)
        for t, turn in enumerate(log["turns"]):
            rewards[i, t] = turn["reward"]
            rows[i, t] = table.row(history[:t])
            actions[i, t] = turn["action"] or 0
    mask = torch.from_numpy(rows >= 0)
    terminated = torch.tensor([not log["truncated"] for log in logs])
    return Batch(logs, rewards, mask, terminated, rows, actions, group_size)


def sample_batch(table: PolicyTable, dp: NumberSearchDP, episodes: int, group_size: int,
                 rng: np.random.Generator) -> Batch:
    """``episodes`` episodes in ``episodes / group_size`` groups, each group one hidden number uniform on 1..N."""
    if episodes % group_size:
        raise ValueError(f"group_size {group_size} must divide episodes {episodes}")
    env = make_env("number-search", n=dp.n, guesses=dp.k, reward=dp.reward, length_penalty=dp.length_penalty,
                   invalid_action=dp.invalid_action)
    targets = rng.integers(1, dp.n + 1, size=episodes // group_size)
    env.reset([int(z) for z in np.repeat(targets, group_size)])
    return _as_batch(play(env, table, rng), table, group_size)


def enumerate_episodes(table: PolicyTable, dp: NumberSearchDP, target: int) -> tuple[Batch, Tensor]:
    """Every episode the policy can play against hidden number ``target``, and its exact probability ``[B]``.

    The batch is one group (``group_size = B``) with no logs; the probabilities sum to 1.
    """
    episodes: list[tuple[list[int], list[int], list[float], float]] = []

    def visit(history: History, rows: list[int], acts: list[int], prob: float) -> None:
        row = table.row(history)
        for col in np.flatnonzero(table.probs[row]):
            guess, p = int(col) or None, prob * float(table.probs[row, col])
            found = guess == target
            rewards = [0.0] * len(rows) + [dp.success_reward(len(rows) + 1) if found else 0.0]
            answer = "invalid" if guess is None else "higher" if target > guess else "lower"
            if found or len(rows) + 1 >= dp.k or (guess is None and dp.invalid_action == "end_episode"):
                episodes.append((rows + [row], acts + [int(col)], rewards, p))
            else:
                visit(history + ((guess, answer),), rows + [row], acts + [int(col)], p)

    visit((), [], [], 1.0)
    turns = max(len(e[0]) for e in episodes)
    rows = np.array([e[0] + [-1] * (turns - len(e[0])) for e in episodes])
    acts = np.array([e[1] + [-1] * (turns - len(e[1])) for e in episodes])
    rewards = torch.tensor([e[2] + [0.0] * (turns - len(e[2])) for e in episodes], dtype=DTYPE)
    mask = torch.from_numpy(rows >= 0)
    batch = Batch([], rewards, mask, torch.ones(len(episodes), dtype=torch.bool), rows, acts, len(episodes))
    return batch, torch.tensor([e[3] for e in episodes], dtype=DTYPE)


def branch_returns(batch: Batch, table: PolicyTable, k: int, rng: np.random.Generator, gamma: float = 1.0) -> Batch:
    """The batch with ``k`` continuations from the saved state before each real turn (``continuations``).

    Each episode is replayed exactly to the state before turn t (:func:`agent_lab.envs.replay_prefix`: the
    same hidden number, the same answers so far) in ``k`` copies, which the policy then plays to the end; the
    return from turn t on (discounted by ``gamma``) and the turns played are recorded per copy.
    """
    shape = (*batch.rewards.shape, k)
    returns, steps = torch.full(shape, float("nan"), dtype=DTYPE), torch.zeros(shape, dtype=torch.long)
    for i, log in enumerate(batch.logs):
        history = history_from_log(log)
        for t in range(len(log["turns"])):
            env = replay_prefix(log, t, copies=k)
            for c, copy in enumerate(play(env, table, rng, [history[:t]] * k)):
                rest = [turn["reward"] for turn in copy["turns"][t:]]
                returns[i, t, c] = sum(gamma ** j * r for j, r in enumerate(rest))
                steps[i, t, c] = len(rest)
    batch.continuations, batch.continuation_turns = returns, steps
    return batch


# ----------------------------------------------------------------------------- the estimators, per batch
@dataclass
class Context:
    """What an estimator may read besides its batch: the exact table (only the oracle baselines do), the
    discount, the branching width, and a critic's values of a batch."""

    table: PolicyTable
    gamma: float = 1.0
    k: int = 2
    critic_values: Callable[[Batch], Tensor] | None = None


@dataclass(frozen=True)
class Estimator:
    """A per-turn advantage ``fn(batch, context) -> [B, T]`` and what its batch needs: ``branching`` (K
    continuations per turn, counted in the budget), ``critic`` (a critic fitted on an earlier batch) and
    ``oracle`` (it reads the exact values: a reference, not a practical estimator)."""

    fn: Callable[[Batch, Context], Tensor]
    branching: bool = False
    critic: bool = False
    oracle: bool = False


def exact_values(batch: Batch, table: PolicyTable) -> Tensor:
    """:math:`V^\\pi(h_t)` of every turn of the batch ``[B, T]`` (0 at padding), from the exact table."""
    values = torch.from_numpy(table.values[np.maximum(batch.rows, 0)])
    return torch.where(batch.turn_mask, values, torch.zeros_like(values))


def _episode(b: Batch, ctx: Context) -> Tensor:
    returns = (b.rewards * b.turn_mask).sum(1)
    return group_centered_advantages(returns, b.group_size)[:, None] * b.turn_mask


def _gae_exact(lam: float) -> Callable[[Batch, Context], Tensor]:
    def fn(b: Batch, ctx: Context) -> Tensor:
        return gae(b.rewards, exact_values(b, ctx.table), b.turn_mask, ctx.gamma, lam, b.terminated)
    return fn


def _gae_critic(lam: float) -> Callable[[Batch, Context], Tensor]:
    def fn(b: Batch, ctx: Context) -> Tensor:
        values = ctx.critic_values(b)
        return gae_targets(b.rewards, values, b.turn_mask, ctx.gamma, lam, b.terminated)[0]
    return fn


def _branching(b: Batch, ctx: Context) -> Tensor:
    return branching_advantages(b.rewards, b.continuations, b.turn_mask, ctx.gamma, b.terminated)


def state_keys(batch: Batch, table: PolicyTable, key: str) -> list[list]:
    """Per-turn anchor keys: ``"state"``, the environment's state ``(lo, hi, t)`` (the hidden number is the
    group's task, shared by the group); ``"history"``, the whole history, so that every history is a state."""
    out = []
    for row in batch.rows:
        real = row[row >= 0]
        if key == "history":
            out.append([table.histories[r] for r in real])
        else:
            out.append([(int(table.lo[r]), int(table.hi[r]), int(table.turn[r])) for r in real])
    return out


def _anchor(key: str, step_weight: float = 1.0) -> Callable[[Batch, Context], Tensor]:
    def fn(b: Batch, ctx: Context) -> Tensor:
        ids = anchor_state_ids(state_keys(b, ctx.table, key), b.rewards.shape[1])
        return anchor_state_advantages(b.rewards, ids, b.turn_mask, b.group_size, ctx.gamma, step_weight=step_weight)
    return fn


#: The estimators compared, by name (each a few lines over :mod:`agent_lab.estimators`).
ESTIMATORS: dict[str, Estimator] = {
    "episode (Dr.GRPO)": Estimator(_episode),
    "GiGPO, state anchors": Estimator(_anchor("state")),
    "GiGPO, history anchors": Estimator(_anchor("history")),
    "GAE lambda=1, learned critic": Estimator(_gae_critic(1.0), critic=True),
    "GAE lambda=0, learned critic": Estimator(_gae_critic(0.0), critic=True),
    "branching": Estimator(_branching, branching=True),
    "MC - exact V (oracle)": Estimator(_gae_exact(1.0), oracle=True),
    "TD, exact V (oracle)": Estimator(_gae_exact(0.0), oracle=True),
}


# ----------------------------------------------------------------------------- the critic
def critic_features(batch: Batch, table: PolicyTable, n: int, k: int) -> Tensor:
    """One-hot ``lo``, ``hi`` and ``t`` of each turn's candidate interval: ``[B, T, 2n + k]`` (float64).

    A function of the history alone (never the hidden number), sufficient for :math:`V^\\pi` when the policy
    itself depends on the history only through them (the uniform and optimal policies)."""
    r = np.maximum(batch.rows, 0)
    parts = [np.eye(n)[table.lo[r] - 1], np.eye(n)[table.hi[r] - 1], np.eye(k)[table.turn[r]]]
    feats = torch.from_numpy(np.concatenate(parts, axis=-1))
    return feats * batch.turn_mask[..., None]


def fitted_critic(batch: Batch, table: PolicyTable, dp: NumberSearchDP, seed: int, steps: int = 200,
                  gamma: float = 1.0) -> Callable[[Batch], Tensor]:
    """A :class:`~agent_lab.critic.TurnCritic` (one hidden layer of 32) fitted on ``batch``'s reward-to-go with
    :func:`~agent_lab.critic.fit_critic`; returns the function that gives its values ``[B, T]`` of a batch."""
    critic = TurnCritic(2 * dp.n + dp.k, hidden=32, layers=1, seed=seed).to(DTYPE)
    targets = reward_to_go(batch.rewards, gamma, batch.turn_mask)
    fit_critic(critic, critic_features(batch, table, dp.n, dp.k), targets, batch.turn_mask, steps=steps, lr=0.02)

    @torch.no_grad()
    def values(b: Batch) -> Tensor:
        return critic(critic_features(b, table, dp.n, dp.k)) * b.turn_mask

    return values


@contextlib.contextmanager
def _one_thread():
    """One torch thread while comparing: the tensors are tiny, and spin-waiting threads on a shared machine
    cost more than they save."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- the comparison
class _Tally:
    """Running sums of one estimator's errors per (history, guess) pair and of its gradient estimates.

    Visits of one pair within a batch share the batch (the hidden number of a group, a group's baseline), so
    they are not independent; the replicate batches are. The bias of a pair's mean error is therefore judged
    by its spread across replicates: per pair, the sums over replicates of S, N, S^2, SN and N^2, where S and N
    are one replicate's sum of errors and count of visits.
    """

    def __init__(self, table: PolicyTable):
        self.table, self.width = table, table.probs.shape[1]
        size = len(table) * self.width
        self.n, self.err, self.err2, self.adv, self.s2, self.sn, self.n2, self.reps = (np.zeros(size) for _ in range(8))
        self.g_sum, self.g_sq = np.zeros(table.probs.shape), np.zeros(table.probs.shape)
        self.cosines: list[float] = []
        self.gains: list[float] = []
        self.episodes: list[int] = []
        self.extra_turns: list[int] = []

    def add(self, batch: Batch, advantages: Tensor, g_star: np.ndarray, extra: dict) -> None:
        real = batch.turn_mask.numpy()
        rows, acts, a_hat = batch.rows[real], batch.actions[real], advantages.detach().numpy()[real]
        error = a_hat - self.table.advantages[rows, acts]
        key, size = rows * self.width + acts, self.n.size
        n, s = np.bincount(key, minlength=size), np.bincount(key, error, minlength=size)
        self.n += n
        self.err += s
        self.err2 += np.bincount(key, error * error, minlength=size)
        self.adv += np.bincount(key, a_hat, minlength=size)
        self.s2, self.sn, self.n2, self.reps = self.s2 + s * s, self.sn + s * n, self.n2 + n * n, self.reps + (n > 0)
        g = np.zeros(self.table.probs.shape)
        np.add.at(g, (rows, acts), a_hat)  # A (e_a - pi(.|h)) at the row of h
        np.add.at(g, rows, -a_hat[:, None] * self.table.probs[rows])
        g /= len(batch)
        self.g_sum += g
        self.g_sq += g * g
        dot, norm_sq = float((g * g_star).sum()), float((g_star ** 2).sum())
        norms = np.linalg.norm(g) * math.sqrt(norm_sq)
        self.cosines.append(dot / norms if norms > 0 else math.nan)
        self.gains.append(dot / norm_sq if norm_sq > 0 else math.nan)
        self.episodes.append(len(batch) + extra.get("extra_episodes", 0))
        self.extra_turns.append(extra.get("extra_turns", 0))

    def _turn_error(self, select: np.ndarray) -> dict[str, float]:
        """Visit-weighted MSE = squared bias + variance over the selected pairs met in at least two replicates.

        A pair's squared bias is its mean error m = S/N squared, less the variance of that mean estimated
        across the M replicates that met it, M sum_r (S_r - m N_r)^2 / ((M - 1) N^2) (the ratio estimator's;
        with one visit per replicate it is the sample variance over N)."""
        ok = select & (self.reps >= 2)
        n, met = self.n[ok], self.reps[ok]
        if not n.size:
            return {"mse": math.nan, "bias_sq": math.nan, "variance": math.nan}
        m = self.err[ok] / n
        var_m = (self.s2[ok] - 2 * m * self.sn[ok] + m * m * self.n2[ok]) * met / ((met - 1) * n * n)
        mse = self.err2[ok].sum() / n.sum()
        bias_sq = float((n * (m * m - var_m)).sum() / n.sum())
        return {"mse": float(mse), "bias_sq": bias_sq, "variance": float(mse - bias_sq)}

    def summary(self, g_star: np.ndarray) -> dict[str, Any]:
        """Per-turn error (``turn``, and ``turn_by_index`` per turn t) and, for the gradient estimate: the trace
        of its covariance (``grad_variance``, and over the squared norm of the exact gradient:
        ``grad_variance_rel``), its squared bias ``||E g - g*||^2`` with the noise of the mean removed
        (``grad_bias_sq``, ``grad_bias_rel``), its gain ``E[g] . g* / ||g*||^2`` along the exact gradient with a
        standard error (1 for an unbiased estimator; (G-1)/G for Dr.GRPO), the variance at unit gain (a scale
        bias is a learning rate) and the mean cosine to the exact gradient."""
        reps = len(self.episodes)
        turn_of = np.repeat(self.table.turn, self.width)
        mean_g = self.g_sum / reps
        trace = float((self.g_sq - self.g_sum ** 2 / reps).sum() / max(reps - 1, 1))
        bias_sq = float(((mean_g - g_star) ** 2).sum()) - trace / reps  # minus the noise of the mean
        norm_sq = float((g_star ** 2).sum())
        out = {
            "episodes_per_estimate": float(np.mean(self.episodes)),
            "extra_turns_per_estimate": float(np.mean(self.extra_turns)),
            "turn": self._turn_error(np.ones_like(self.n, dtype=bool)),
            "turn_by_index": [self._turn_error(turn_of == t) for t in range(int(self.table.turn.max()) + 1)],
            "visits_in_pairs_met_twice": float(self.n[self.reps >= 2].sum() / max(self.n.sum(), 1)),
            "grad_variance": trace,
            "grad_bias_sq": bias_sq,
        }
        if norm_sq > 0:
            out["grad_cosine"] = float(np.mean(self.cosines))
            gain = float(np.mean(self.gains))
            out.update(grad_variance_rel=trace / norm_sq, grad_bias_rel=math.sqrt(max(bias_sq, 0.0) / norm_sq),
                       grad_gain=gain, grad_gain_se=float(np.std(self.gains, ddof=1) / math.sqrt(reps)),
                       grad_variance_at_unit_gain=trace / (norm_sq * gain ** 2) if gain else math.inf)
        return out


@dataclass
class Comparison:
    """What :func:`compare` returns: ``results[name]`` (see the keys of ``summary``), the exact figures
    (``exact``: J, the gradient's squared norm, expected turns), the settings, and per estimator the
    per-pair visit counts, mean estimates and exact advantages (``pairs``, for plots)."""

    results: dict[str, dict]
    exact: dict[str, float]
    settings: dict[str, Any]
    pairs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def compare(table: PolicyTable, dp: NumberSearchDP, *, budget: int = 64, group_size: int = 8, k: int = 2,
            replicates: int = 100, seed: int = 0, critic_episodes: int = 2048, critic_steps: int = 200,
            gamma: float = 1.0, estimators: dict[str, Estimator] | None = None) -> Comparison:
    """Each estimator on ``replicates`` independent batches of ``budget`` episodes, against the exact values.

    All estimators without branching see the same batch of each replicate (``budget / group_size`` hidden
    numbers, ``group_size`` episodes each). The critic is fitted once, on ``critic_episodes`` earlier episodes
    of the same policy (the batches a training run has already used: not counted in the budget), then frozen.
    Branching plays fewer episodes so that they and their ``k`` continuations per turn cost ``budget``
    episodes on average: ``round(budget / (1 + k E[T]))`` episodes, :math:`E[T]` the policy's exact expected
    number of turns. Per-turn errors are :math:`\\hat A_{it} - A^\\pi(h_{it}, a_{it})`, split into squared bias
    and variance over the (history, guess) pairs met in at least two replicates; gradient bias and variance are against
    :meth:`PolicyTable.gradient`.
    """
    estimators = dict(ESTIMATORS if estimators is None else estimators)
    if budget % group_size:
        raise ValueError(f"group_size {group_size} must divide budget {budget}")
    with _one_thread():
        rng = np.random.default_rng(seed)
        g_star, expected_turns = table.gradient(), float(table.occupancy.sum())
        n_branch = max(1, round(budget / (1 + k * expected_turns)))
        ctx = Context(table, gamma, k)
        if any(e.critic for e in estimators.values()):
            earlier = sample_batch(table, dp, critic_episodes, group_size, rng)
            ctx.critic_values = fitted_critic(earlier, table, dp, seed, critic_steps, gamma)
        tallies = {name: _Tally(table) for name in estimators}
        fits: list[tuple[Tensor, ...]] = []
        for _ in range(replicates):
            main = sample_batch(table, dp, budget, group_size, rng)
            branched = None
            if any(e.branching for e in estimators.values()):
                branched = branch_returns(sample_batch(table, dp, n_branch, 1, rng), table, k, rng, gamma)
            for name, est in estimators.items():
                batch = branched if est.branching else main
                extra = branching_cost(batch.turn_mask, k, batch.continuation_turns) if est.branching else {}
                tallies[name].add(batch, est.fn(batch, ctx), g_star, extra)
            if ctx.critic_values is not None:
                real = main.turn_mask
                fits.append((ctx.critic_values(main)[real], exact_values(main, table)[real],
                             reward_to_go(main.rewards, gamma, real)[real]))
    results = {name: t.summary(g_star) for name, t in tallies.items()}
    pairs = {name: {"n": t.n, "mean": t.adv / np.maximum(t.n, 1), "exact": table.advantages.reshape(-1)}
             for name, t in tallies.items()}
    exact = {"J": float(table.values[0]), "grad_norm_sq": float((g_star ** 2).sum()), "expected_turns": expected_turns}
    if fits:
        pred, true_v, returns = (torch.cat(parts) for parts in zip(*fits))
        exact.update(critic_ev_vs_exact_values=float(explained_variance(pred, true_v)),
                     critic_ev_vs_returns=float(explained_variance(pred, returns)),
                     exact_values_ev_vs_returns=float(explained_variance(true_v, returns)))
    settings = {"budget": budget, "group_size": group_size, "k": k, "branch_episodes": n_branch,
                "replicates": replicates, "seed": seed, "critic_episodes": critic_episodes,
                "critic_steps": critic_steps, "gamma": gamma}
    return Comparison(results, exact, settings, pairs)
