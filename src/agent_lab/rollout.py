"""Batched multi-turn rollouts with a KV cache (book/part2/09_tensor_contract.md; foundations chapter sections 9,
"Importance sampling and policy versions", and 18, "Tensor contract for an implementation").

``B`` episodes advance together, turn by turn:

1. *ingest*: every live row feeds its pending environment text (the prompt, or the newline that ended its
   last action followed by the new observation and a newline) in one cached forward call;
2. *act*: rows sample action tokens one incremental step at a time until each has produced its newline
   (or is forced to end at ``env.max_action_words`` words);
3. the environment steps all live rows at once and returns observations and rewards.

Behaviour log-probabilities are recorded at the moment a token is sampled, under the distribution it was
actually drawn from (structural masks, temperature, top-p); they are never recomputed from decoded text.
The set of tokens that were allowed at each action position is kept too (``allowed_tokens``), so the
trainer can evaluate the current policy under exactly the same masks and the importance ratio is exactly
one while the weights have not changed (foundations chapter section 19, "Invariants worth testing";
book/part2/10_invariants.md).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F

from agent_lab.config import SamplingConfig
from agent_lab.envs.base import OPEN_ENDED
from agent_lab.policy import TinyTransformer, WordTokenizer
from agent_lab.policy.model import prompt_arguments
from agent_lab.timing import span


# ----------------------------------------------------------------------------- the sampling transform
def masked_logprobs(logits: torch.Tensor, allowed: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """log softmax( where(allowed, logits, -inf) / temperature ) over the last axis; float32.

    ``logits [..., V]``, ``allowed [..., V]`` bool (None = everything allowed). This is the distribution the
    rollout samples from when ``top_p == 1``, and the one the trainer differentiates.
    """
    z = logits.float()
    if allowed is not None:
        z = z.masked_fill(~allowed, float("-inf"))
    return F.log_softmax(z / temperature, dim=-1)


def top_p_logprobs(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus truncation: keep the most likely tokens until their mass reaches ``top_p``, renormalise.

    The most likely token is always kept. ``top_p == 1`` returns the input unchanged.
    """
    if top_p >= 1.0:
        return logprobs
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)
    mass_before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()  # mass of strictly more likely tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return F.log_softmax(logprobs.masked_fill(drop, float("-inf")), dim=-1)


def sample_tokens(
    logits: torch.Tensor, allowed: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from the declared sampling policy; return ``(tokens [B], logprob [B])``.

    The log-prob is that of the drawn token under the distribution it was drawn from (after masks,
    temperature and top-p). For greedy decoding it is the log-prob of the argmax under the same masked,
    tempered distribution (a point mass would give 0 for every token and carry no information).
    """
    lp = top_p_logprobs(masked_logprobs(logits, allowed, cfg.temperature), cfg.top_p)
    if cfg.decoding == "greedy":
        tok = lp.argmax(-1)
    else:
        tok = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(-1)
    return tok, lp.gather(-1, tok[:, None]).squeeze(-1)


# ----------------------------------------------------------------------------- the batch
@dataclass
class RolloutBatch:
    """One batch of finished episodes in the tensor contract (book/part2/09_tensor_contract.md). ``L`` tokens,
    ``T`` turns, ``V`` vocab.

    ``action_mask[b, j]`` is True when target ``input_ids[b, j+1]`` was sampled by the policy (action words
    and the newline ending each action); ``old_logprobs``/``turn_ids``/``allowed_tokens`` align with the same
    targets. ``allowed_tokens[b, j]`` is the boolean set the token was drawn from (all True outside actions).
    """

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] bool
    action_mask: torch.Tensor  # [B, L-1] bool
    old_logprobs: torch.Tensor  # [B, L-1] float, 0 outside actions
    turn_ids: torch.Tensor  # [B, L-1] long, -1 outside actions (an action left out of action_mask keeps its id)
    allowed_tokens: torch.Tensor  # [B, L-1, V] bool
    rewards: torch.Tensor  # [B, T] float
    turn_mask: torch.Tensor  # [B, T] bool
    success: torch.Tensor  # [B] bool
    episode_return: torch.Tensor  # [B] float
    num_turns: torch.Tensor  # [B] long
    truncated: torch.Tensor  # [B] bool: stopped by the turn limit, not by a terminal state
    policy_version: torch.Tensor  # [B] long
    tasks: list = field(default_factory=list)
    episode_logs: list = field(default_factory=list)
    texts: list = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    #: [B, T, K] float: returns of K continuations from the saved state before each turn, NaN at padded turns;
    #: only for an algorithm whose advantages branch (``Algorithm.continuations``; ``agent_lab.branching``)
    continuation_returns: torch.Tensor | None = None
    #: [B] long: tokens of each transcript's prompt (``<bos>``, the first observation, its newline), which a
    #: "bidirectional" policy reads as a prefix-LM (ModelConfig.prompt_attention); None where not recorded
    prompt_lengths: torch.Tensor | None = None

    _TENSORS = (
        "input_ids", "attention_mask", "action_mask", "old_logprobs", "turn_ids", "allowed_tokens",
        "rewards", "turn_mask", "success", "episode_return", "num_turns", "truncated", "policy_version",
    )
    _OPTIONAL = ("continuation_returns", "prompt_lengths")  # per-row tensors that a batch may lack

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_action_tokens(self) -> torch.Tensor:
        """Policy tokens per episode ``[B]``."""
        return self.action_mask.sum(-1)

    def to(self, device) -> RolloutBatch:
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for n in self._TENSORS:
            kw[n] = kw[n].to(device)
        for n in self._OPTIONAL:
            if kw[n] is not None:
                kw[n] = kw[n].to(device)
        return RolloutBatch(**kw)

    def select(self, index) -> RolloutBatch:
        """Rows ``index`` (a bool mask or a list/tensor of ints), trimmed to their longest transcript."""
        idx = torch.as_tensor(index)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().squeeze(-1)
        idx = idx.to(self.input_ids.device).long()
        kw: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        for n in self._TENSORS:
            kw[n] = kw[n][idx]
        for n in self._OPTIONAL:
            if kw[n] is not None:
                kw[n] = kw[n][idx.to(kw[n].device)]
        il = idx.tolist()
        for n in ("tasks", "episode_logs", "texts"):
            kw[n] = [kw[n][i] for i in il] if kw[n] else []
        L = max(int(kw["attention_mask"].sum(-1).max()) if len(il) else 1, 2)
        for n in ("input_ids", "attention_mask"):
            kw[n] = kw[n][:, :L]
        for n in ("action_mask", "old_logprobs", "turn_ids", "allowed_tokens"):
            kw[n] = kw[n][:, : L - 1]
        return RolloutBatch(**kw)

    @staticmethod
    def concat(batches: list[RolloutBatch], pad_id: int = 0) -> RolloutBatch:
        """Stack batches row-wise, right-padding tokens to the longest ``L`` and turns to the longest ``T``."""
        L = max(b.input_ids.shape[1] for b in batches)
        T = max(b.rewards.shape[1] for b in batches)

        def pad(t, n, value, dim=1):
            p = [0, 0] * (t.dim() - dim - 1) + [0, n - t.shape[dim]]
            return F.pad(t, p, value=value)

        out: dict[str, Any] = {}
        out["input_ids"] = torch.cat([pad(b.input_ids, L, pad_id) for b in batches])
        out["attention_mask"] = torch.cat([pad(b.attention_mask, L, False) for b in batches])
        out["action_mask"] = torch.cat([pad(b.action_mask, L - 1, False) for b in batches])
        out["old_logprobs"] = torch.cat([pad(b.old_logprobs, L - 1, 0.0) for b in batches])
        out["turn_ids"] = torch.cat([pad(b.turn_ids, L - 1, -1) for b in batches])
        out["allowed_tokens"] = torch.cat([pad(b.allowed_tokens, L - 1, True) for b in batches])
        out["rewards"] = torch.cat([pad(b.rewards, T, 0.0) for b in batches])
        out["turn_mask"] = torch.cat([pad(b.turn_mask, T, False) for b in batches])
        for n in ("success", "episode_return", "num_turns", "truncated", "policy_version"):
            out[n] = torch.cat([getattr(b, n) for b in batches])
        for n in ("tasks", "episode_logs", "texts"):
            out[n] = [x for b in batches for x in getattr(b, n)]
        out["temperature"], out["top_p"] = batches[0].temperature, batches[0].top_p
        if any(b.continuation_returns is not None for b in batches):
            if any(b.continuation_returns is None for b in batches):
                raise ValueError("cannot concatenate batches with and without continuation returns")
            out["continuation_returns"] = torch.cat([pad(b.continuation_returns, T, float("nan"))
                                                     for b in batches])
        if any(b.prompt_lengths is not None for b in batches):
            if any(b.prompt_lengths is None for b in batches):
                raise ValueError("cannot concatenate batches with and without prompt lengths")
            out["prompt_lengths"] = torch.cat([b.prompt_lengths for b in batches])
        return RolloutBatch(**out)


# ----------------------------------------------------------------------------- action constraints
class _ActionConstraint:
    """Which tokens row ``b`` may sample next: never pad/bos/unk; only ``<nl>`` after ``max_words`` words;
    with a candidate list, only continuations of an allowed action (prefix tree over token sequences)."""

    def __init__(self, tok: WordTokenizer, max_words: int, device):
        self.tok, self.max_words, self.device = tok, max_words, device
        base = torch.ones(len(tok), dtype=torch.bool)
        base[list(tok.special_ids)] = False
        self.base = base.to(device)
        self.only_nl = torch.zeros(len(tok), dtype=torch.bool, device=device)
        self.only_nl[tok.nl_id] = True

    def masks(self, n_words: torch.Tensor, prefixes: list[list[int]], candidates: list[list[list[int]]] | None):
        """``[B, V]`` allowed-token masks for this action step (``n_words [B]`` words sampled so far)."""
        B = n_words.shape[0]
        m = self.base.expand(B, -1).clone()
        m[n_words >= self.max_words] = self.only_nl
        if candidates is not None:
            rows, toks, has = [], [], torch.zeros(B, dtype=torch.bool)
            for b in range(B):
                cands = candidates[b]
                if not cands:
                    continue
                p, j = prefixes[b], len(prefixes[b])
                # an open-ended candidate (last id _OPEN) allows any words once its prefix is written
                if any(c[-1] == _OPEN and len(c) - 1 <= j and p[: len(c) - 1] == c[:-1] for c in cands):
                    continue
                nxt = {c[j] for c in cands if len(c) > j and c[:j] == p and c[j] != _OPEN}
                if nxt:
                    has[b] = True
                    rows += [b] * len(nxt)
                    toks += list(nxt)
            if rows:
                cand = torch.zeros(B, len(self.tok), dtype=torch.bool)
                cand[rows, toks] = True
                cand, has = cand.to(self.device), has.to(self.device)
                both = cand & m
                # the candidates win; the structural mask is kept where it leaves at least one of them
                m = torch.where(has[:, None], torch.where(both.any(-1, keepdim=True), both, cand), m)
        return m


# ----------------------------------------------------------------------------- the rollout loop
_OPEN = -1  # marks an encoded open-ended candidate: its prefix, then any words (never a token id)


def _encode_action(tok: WordTokenizer, text: str) -> list[int]:
    """Token ids of an allowed action plus its newline, or of an open-ended one's prefix plus ``_OPEN``
    (see ``envs.base.OPEN_ENDED``); memoised on the tokenizer (candidates repeat)."""
    memo = tok.__dict__.setdefault("_action_memo", {})
    ids = memo.get(text)
    if ids is None:
        if text.endswith(OPEN_ENDED):
            ids = memo[text] = tok.encode(text[: -len(OPEN_ENDED)]) + [_OPEN]
        else:
            ids = memo[text] = tok.encode(text) + [tok.nl_id]
    return ids


def _env_allowed_actions(env, tok: WordTokenizer, live: list[bool]) -> list[list[list[int]]] | None:
    fn = getattr(env, "allowed_actions", None)
    if fn is None:
        return None
    acts = fn()
    if acts is None:  # the environment's masking is switched off
        return None
    out = []
    for b, a in enumerate(acts):
        out.append([_encode_action(tok, x) for x in sorted(a)] if (live[b] and a) else [])
    return out


@torch.no_grad()
def collect_rollouts(
    policy: TinyTransformer,
    tokenizer: WordTokenizer,
    env,
    tasks: list,
    sampling: SamplingConfig | None = None,
    generator: torch.Generator | None = None,
    policy_version: int = 0,
    use_cache: bool = True,
    autocast_dtype: torch.dtype | None = None,
) -> RolloutBatch:
    """Play ``len(tasks)`` episodes of ``env`` with ``policy`` and return them as a :class:`RolloutBatch`.

    Each episode's transcript is ``<bos> prompt <nl> action <nl> observation <nl> action <nl> ...``; only the
    action words and the newline closing each action are policy tokens. ``use_cache=False`` recomputes the
    whole prefix at every step (the slow reference the benchmark compares against; same samples and
    log-probs). ``autocast_dtype`` (e.g. ``torch.bfloat16`` on CUDA) runs the forward passes under autocast.
    """
    sampling = sampling or SamplingConfig()
    if len(tasks) == 0:
        raise ValueError("tasks must be a non-empty list, got 0 tasks")
    was_training = policy.training
    policy.eval()
    try:
        rollout = _Rollout(policy, tokenizer, env, tasks, sampling, generator, use_cache, autocast_dtype)
        for t in range(rollout.max_turns):
            logits = rollout.ingest()  # 1. the pending environment text of every live row
            actions = rollout.act(t, logits)  # 2. sample each live row's action
            rollout.observe(t, actions)  # 3. the environment steps every live row
            if not bool(rollout.live.any()):
                break
        rollout.ingest(run_model=False)  # the newline closing each final action
        return rollout.batch(tasks, policy_version)
    finally:
        if was_training:
            policy.train()


class _Rollout:
    """The state of one batched rollout, advanced by :func:`collect_rollouts` in its three phases.

    Everything fed to the model is kept slot-major in one record buffer (ids, valid, action?, log-prob, turn,
    allowed tokens per chunk of slots); :func:`_compact` turns it into the tensor contract at the end. Each
    row's ``pending`` tokens (the newline ending its last action, then its next observation) wait there, with
    their metadata, until the next ingest.
    """

    def __init__(self, policy, tok, env, tasks, sampling, generator, use_cache, autocast_dtype):
        self.policy, self.tok, self.env, self.sampling, self.generator = policy, tok, env, sampling, generator
        self.use_cache, self.device = use_cache, policy.tok_emb.weight.device
        self.B, self.V = len(tasks), len(tok)
        self.max_turns, self.max_words = int(env.max_turns), int(env.max_action_words)
        self.max_len = int(policy.cfg.max_len)
        self.constraint = _ActionConstraint(tok, self.max_words, self.device)
        self.amp = (torch.autocast(self.device.type, dtype=autocast_dtype) if autocast_dtype is not None
                    else contextlib.nullcontext())
        with span("environment"):
            prompts = env.reset(tasks)
        self.pending: list[list[int]] = [[tok.bos_id] + tok.encode(p) + [tok.nl_id] for p in prompts]
        # A resumed episode's prompt is its whole history, but the policy read only the episode's own prompt
        # as one (agent_lab.branching): attend as it did then.
        firsts = env.episode_prompts() if hasattr(env, "episode_prompts") else prompts
        self.prompt_lengths = torch.tensor([len(tok.encode(p)) + 2 for p in firsts], device=self.device)
        # The context window: a turn needs room for its observation, max_words action words and their newline.
        longest = max(len(p) for p in self.pending)
        if longest + self.max_words + 1 > self.max_len:
            raise ValueError(f"a prompt of {longest} tokens leaves no room for an action within the policy's "
                             f"max_len={self.max_len}; train a policy with a larger max_len (model.max_len)")
        # per pending token: (log-prob, turn, allowed mask) if the policy sampled it (an action's newline), else None
        self.pending_meta: list[list[tuple | None]] = [[None] * len(x) for x in self.pending]
        self.live = torch.ones(self.B, dtype=torch.bool)
        self.rewards = torch.zeros(self.B, self.max_turns)
        self.turn_mask = torch.zeros(self.B, self.max_turns, dtype=torch.bool)
        self.success = torch.zeros(self.B, dtype=torch.bool)
        self.truncated = torch.zeros(self.B, dtype=torch.bool)
        self.records: list[tuple[torch.Tensor, ...]] = []  # per chunk: ids, valid, action, logprob, turn, allowed
        self.all_true = torch.ones(self.V, dtype=torch.bool, device=self.device)
        self.cache = policy.new_cache(self.B, capacity=64) if use_cache else None
        self.rows = torch.arange(self.B, device=self.device)  # the rows the cache holds: episodes still running
        self.n_pos = torch.zeros(self.B, dtype=torch.long, device=self.device)  # real tokens fed so far per row

    def _feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Feed ``ids [B, k]`` (``valid [B, k]``); return float32 logits ``[B, k, V]`` for the new slots (zero in
        the rows of finished episodes, which sample nothing more)."""
        pos = self.n_pos[:, None] + valid.long().cumsum(1) - 1
        with self.amp:
            if self.use_cache:
                logits = self._step_running(ids, valid, pos)
            else:  # reference path: rebuild the compacted prefix and run the full model
                logits = _recompute_logits(self.policy, self.records, valid, self.prompt_lengths)
        self.n_pos = self.n_pos + valid.long().sum(1)
        return logits.float()

    def _step_running(self, ids: torch.Tensor, valid: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The cached pass over the rows whose episodes still run. A finished episode's keys are never read
        again, so once a quarter of the cache's rows have finished they are dropped: their memory is freed and
        later steps stop computing them (each drop copies the cache, hence the quarter)."""
        running = self.live.to(self.device)[self.rows]
        if int((~running).sum()) * 4 >= len(self.rows) > 0:
            self.rows = self.rows[running]
            self.cache.keep_rows(running)
        rows = self.rows
        out = torch.zeros(*ids.shape, self.V, device=self.device)
        if len(rows):
            first = self.cache.length == 0  # the first chunk holds the prompts
            kw = prompt_arguments(self.policy, self.prompt_lengths[rows]) if first else {}
            out[rows] = self.policy.step(ids[rows], valid[rows], self.cache, pos[rows], **kw).to(out.dtype)
        return out

    def ingest(self, run_model: bool = True) -> torch.Tensor | None:
        """Phase 1: feed each row's pending tokens as one right-padded chunk; logits ``[B, V]`` at each row's end."""
        B, V, tok, device = self.B, self.V, self.tok, self.device
        k = max((len(p) for p in self.pending), default=0)
        if k == 0:
            return None
        lens = [len(p) for p in self.pending]
        ids = torch.tensor([p + [tok.pad_id] * (k - len(p)) for p in self.pending], dtype=torch.long)
        valid = torch.arange(k)[None] < torch.tensor(lens)[:, None]
        act = torch.zeros(B, k, dtype=torch.bool)
        lp = torch.zeros(B, k)
        turn = torch.full((B, k), -1, dtype=torch.long)
        allowed = self.all_true.expand(B, k, V).clone()
        # policy tokens among the pending ones (the newline closing each action), written with index lists
        pol = [(b, j, m) for b, metas in enumerate(self.pending_meta) for j, m in enumerate(metas) if m is not None]
        if pol:
            bs = torch.tensor([x[0] for x in pol])
            js = torch.tensor([x[1] for x in pol])
            act[bs, js] = True
            lp[bs, js] = torch.tensor([x[2][0] for x in pol])
            turn[bs, js] = torch.tensor([x[2][1] for x in pol])
            allowed[bs.to(device), js.to(device)] = torch.stack([x[2][2] for x in pol])
        ids, valid = ids.to(device), valid.to(device)
        self.records.append((ids, valid, act.to(device), lp.to(device), turn.to(device), allowed))
        self.pending = [[] for _ in range(B)]
        self.pending_meta = [[] for _ in range(B)]
        if not run_model:
            return None
        logits = self._feed(ids, valid)
        last = (torch.tensor(lens, device=device) - 1).clamp(min=0)
        return logits[torch.arange(B, device=device), last]  # (B, V)

    def act(self, t: int, last_logits: torch.Tensor) -> list[str]:
        """Phase 2: every live row samples action tokens, one incremental step at a time, until its newline."""
        B, tok, device = self.B, self.tok, self.device
        live_list = self.live.tolist()
        with span("environment"):
            cands = _env_allowed_actions(self.env, tok, live_list) if self.sampling.candidate_mask else None
        acting = self.live.clone().to(device)
        n_words = torch.zeros(B, dtype=torch.long, device=device)
        prefixes: list[list[int]] = [[] for _ in range(B)]
        while bool(acting.any()):
            allowed = self.constraint.masks(n_words, prefixes, cands)
            new_tok, new_lp = sample_tokens(last_logits, allowed, self.sampling, self.generator)
            is_nl = new_tok == tok.nl_id
            nl_l, lp_l, tok_l = is_nl.tolist(), new_lp.tolist(), new_tok.tolist()
            for b in acting.nonzero().squeeze(-1).tolist():
                if nl_l[b]:  # the newline is fed with the next observation chunk
                    self.pending[b].append(tok.nl_id)
                    self.pending_meta[b].append((lp_l[b], t, allowed[b]))
                else:
                    prefixes[b].append(tok_l[b])
            words = acting & ~is_nl
            acting = words
            if not bool(words.any()):
                break
            ids = torch.where(words, new_tok, torch.full_like(new_tok, tok.pad_id))[:, None]
            self.records.append((ids, words[:, None], words[:, None], torch.where(words, new_lp, 0.0)[:, None],
                                 torch.where(words, t, -1)[:, None],
                                 torch.where(words[:, None], allowed, self.all_true)[:, None]))
            last_logits = self._feed(ids, words[:, None])[:, 0]
            n_words = n_words + words.long()
        return [tok.decode(p) if live_list[b] else "" for b, p in enumerate(prefixes)]

    def observe(self, t: int, actions: list[str]) -> None:
        """Phase 3: the environment steps every live row; record rewards, end episodes, queue observations."""
        with span("environment"):
            step = self.env.step(actions)
        for b in self.live.nonzero().squeeze(-1).tolist():
            self.rewards[b, t], self.turn_mask[b, t] = float(step.rewards[b]), True
            done, cut = bool(step.done[b]), bool(step.truncated[b])
            self.success[b] = bool(step.success[b])
            obs_ids = self.tok.encode(step.observations[b]) + [self.tok.nl_id]
            # tokens so far (fed, plus the pending newline), this observation, then the longest next action
            full = int(self.n_pos[b]) + len(self.pending[b]) + len(obs_ids) + self.max_words + 1 > self.max_len
            if done or cut or t == self.max_turns - 1 or full:
                self.live[b] = False
                self.truncated[b] = cut or not done
                if full and not done and hasattr(self.env, "truncate"):  # the context window is full
                    self.env.truncate([b])  # optional in the environment contract
            else:
                self.pending[b].extend(obs_ids)
                self.pending_meta[b].extend([None] * len(obs_ids))

    def batch(self, tasks: list, policy_version: int) -> RolloutBatch:
        """The finished episodes in the tensor contract."""
        cols = [torch.cat([r[i] for r in self.records], 1) for i in range(6)]
        out = _compact(*cols, self.tok.pad_id)
        input_ids, am, device, B = out["input_ids"], out["attention_mask"], self.device, self.B
        with span("environment"):
            logs = self.env.episode_logs() if hasattr(self.env, "episode_logs") else []
        return RolloutBatch(
            input_ids=input_ids, attention_mask=am, action_mask=out["action_mask"],
            old_logprobs=out["old_logprobs"], turn_ids=out["turn_ids"], allowed_tokens=out["allowed_tokens"],
            rewards=self.rewards.to(device), turn_mask=self.turn_mask.to(device), success=self.success.to(device),
            episode_return=(self.rewards * self.turn_mask).sum(-1).to(device),
            num_turns=self.turn_mask.sum(-1).to(device), truncated=self.truncated.to(device),
            policy_version=torch.full((B,), int(policy_version), device=device), tasks=list(tasks),
            episode_logs=logs, texts=[self.tok.decode(row[m].tolist()) for row, m in zip(input_ids.cpu(), am.cpu())],
            temperature=self.sampling.temperature, top_p=self.sampling.top_p,
            prompt_lengths=self.prompt_lengths,
        )


def _compact(ids, valid, act, lp, turn, allowed, pad_id) -> dict:
    """Remove padding slots: each row's valid slots move left, in order. Per-token records that describe
    token ``i`` (sampled or not) become per-target records at index ``i-1`` (targets are ``input_ids[:, 1:]``)."""
    B, S = ids.shape
    n = valid.sum(1)
    L = int(n.max())
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :L]  # valid slots first, in order
    gather = lambda x: x.gather(1, order)  # noqa: E731
    am = torch.arange(L, device=ids.device)[None] < n[:, None]
    out = {
        "input_ids": torch.where(am, gather(ids), pad_id),
        "attention_mask": am,
        "action_mask": (gather(act) & am)[:, 1:],
        "old_logprobs": torch.where(am, gather(lp), 0.0)[:, 1:],
        "turn_ids": torch.where(am, gather(turn), -1)[:, 1:],
        "allowed_tokens": allowed.gather(1, order[:, :, None].expand(-1, -1, allowed.shape[-1]))[:, 1:],
    }
    out["allowed_tokens"] = out["allowed_tokens"] | ~out["action_mask"][:, :, None]
    return out


def _recompute_logits(policy, records: list[tuple[torch.Tensor, ...]], valid: torch.Tensor,
                      prompt_lengths: torch.Tensor) -> torch.Tensor:
    """No-cache reference: run the full model over each row's compacted transcript so far (the records
    already end with the new chunk, whose validity is ``valid [B, k]``) and return the chunk's logits
    ``[B, k, V]`` (padding slots get the logits of the row's preceding token; they are unused)."""
    all_ids = torch.cat([r[0] for r in records], 1)
    all_valid = torch.cat([r[1] for r in records], 1)
    n = all_valid.sum(1)
    L = int(n.max())
    order = torch.argsort((~all_valid).to(torch.int8), dim=1, stable=True)[:, :L]
    am = torch.arange(L, device=all_ids.device)[None] < n[:, None]
    logits = policy(all_ids.gather(1, order), am, **prompt_arguments(policy, prompt_lengths))  # (B, L, V)
    # position of each new slot in the compacted row: real tokens before it
    n_before = n - valid.sum(1)
    pos = (n_before[:, None] + valid.long().cumsum(1) - 1).clamp(min=0)
    return logits.gather(1, pos[:, :, None].expand(-1, -1, logits.shape[-1]))


def demonstration_batch(env, tokenizer: WordTokenizer, tasks: list, device=None, *,
                        demos: list | None = None, trained: list | None = None) -> RolloutBatch:
    """The planner's demonstrations for ``tasks`` as a :class:`RolloutBatch` (for SFT and ReST-style losses).

    Transcripts have exactly the rollout layout (``<bos> obs <nl> action <nl> obs <nl> ...``); the
    demonstrated actions are replayed through ``env`` so rewards, success and logs are the environment's
    own. ``allowed_tokens`` holds the same structural masks a rollout uses (no special tokens, newline
    forced after ``max_action_words`` words), so SFT fits the distribution the rollout samples from.
    ``old_logprobs`` is 0: the demonstrator is not a policy with known token probabilities.
    ``demos`` (default ``env.demonstrations(tasks)``): per task ``[(observation, action), ...]``, for example
    from a demonstration source of :mod:`agent_lab.plugins`; ``trained`` flags per action whether it is
    imitated (default all): an action flagged False stays in the transcript but out of ``action_mask``; its
    tokens keep their turn id, so ``turn_ids == -1`` marks exactly the environment's text (prompt, observations).
    """
    tok = tokenizer
    device = device or torch.device("cpu")
    if demos is None:
        demos = env.demonstrations(tasks)
    if trained is None:
        trained = [[True] * len(d) for d in demos]
    if not len(demos) == len(trained) == len(tasks):
        raise ValueError(f"demos and trained must hold one entry per task: {len(demos)} and {len(trained)} for "
                         f"{len(tasks)} tasks")
    constraint = _ActionConstraint(tok, int(env.max_action_words), torch.device("cpu"))
    rewards, turn_mask, success = _replay_demonstrations(env, tasks, demos)
    rows = _demonstration_rows(tok, demos, trained, constraint.max_words)
    L, B = max(len(r[0]) for r in rows), len(tasks)

    def padded(k, value, dtype):
        return torch.tensor([r[k] + [value] * (L - len(r[k])) for r in rows], dtype=dtype)

    input_ids = padded(0, tok.pad_id, torch.long)
    am = torch.tensor([[j < len(r[0]) for j in range(L)] for r in rows], dtype=torch.bool)
    act_t, turn_t, forced_t = padded(1, False, torch.bool), padded(2, -1, torch.long), padded(3, False, torch.bool)
    # the same structural masks as a rollout: no special tokens in actions, only <nl> after max_words words
    allowed_t = torch.where(act_t[:, :, None], constraint.base, True)
    allowed_t[forced_t] = constraint.only_nl
    batch = RolloutBatch(
        input_ids=input_ids, attention_mask=am, action_mask=act_t[:, 1:], old_logprobs=torch.zeros(B, L - 1),
        turn_ids=turn_t[:, 1:], allowed_tokens=allowed_t[:, 1:], rewards=rewards, turn_mask=turn_mask,
        success=success, episode_return=(rewards * turn_mask).sum(-1), num_turns=turn_mask.sum(-1),
        truncated=torch.zeros(B, dtype=torch.bool), policy_version=torch.full((B,), -1, dtype=torch.long),
        tasks=list(tasks), episode_logs=env.episode_logs() if hasattr(env, "episode_logs") else [],
        texts=[tok.decode(r[m].tolist()) for r, m in zip(input_ids, am)],
        prompt_lengths=torch.tensor([r[4] for r in rows], dtype=torch.long),
    )
    return batch.to(device)


def _replay_demonstrations(env, tasks: list, demos: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step ``env`` through the demonstrated actions: rewards ``[B, T]``, turn mask ``[B, T]``, success ``[B]``."""
    env.reset(tasks)
    T = max(len(d) for d in demos)
    rewards = torch.zeros(len(tasks), max(T, 1))
    turn_mask = torch.zeros(len(tasks), max(T, 1), dtype=torch.bool)
    success = torch.zeros(len(tasks), dtype=torch.bool)
    for t in range(T):
        step = env.step([d[t][1] if t < len(d) else "" for d in demos])
        for b, d in enumerate(demos):
            if t < len(d):
                rewards[b, t], turn_mask[b, t] = float(step.rewards[b]), True
                success[b] = bool(step.success[b])
    return rewards, turn_mask, success


def _demonstration_rows(tok: WordTokenizer, demos: list, trained: list, max_words: int) -> list[tuple[list, ...]]:
    """Per transcript: token ids, imitated?, turn id and forced-newline? of every token (unpadded lists), and
    its prompt's length (``<bos>``, the first observation and its newline)."""
    rows = []
    for d, keep in zip(demos, trained):
        ids, act, turn, forced = [tok.bos_id], [False], [-1], [False]
        for t, (obs, action) in enumerate(d):
            o = tok.encode(obs) + [tok.nl_id]  # the prompt, then the observation after each action
            a = tok.encode(action) + [tok.nl_id]
            ids += o + a
            act += [False] * len(o) + [keep[t]] * len(a)
            turn += [-1] * len(o) + [t] * len(a)  # the policy's text, imitated or not; the env's is -1
            forced += [False] * len(o) + [j >= max_words for j in range(len(a))]
        rows.append((ids, act, turn, forced, len(tok.encode(d[0][0])) + 2 if d else 1))
    return rows
