"""A decoder-only transformer with a key/value cache (book/part2/00_nested_policies.md).

Read it top to bottom: the cache, rotary positions (optional), line offsets and heads (optional), attention (with an
optional same-word bias), MLP, block, model (its sizes, ``ModelConfig``, are declared with every other setting in
``agent_lab.config``). Shapes are in comments: ``B`` batch, ``k`` new tokens this call, ``S`` cache slots, ``H``
heads, ``D`` head size, ``V`` vocabulary.

The cache stores one key/value per *slot*. During a batched multi-turn rollout every row advances by the
same number of slots per call, but a row that has nothing to feed (its action already ended, its
observation is shorter) feeds a padding token whose slot is marked invalid and never attended to. Each
row's real tokens therefore keep consecutive positions 0, 1, 2, ..., exactly as in a teacher-forced
pass over the compacted transcript, which is what makes "KV-cache logits equal full recompute" hold.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from agent_lab.config import ModelConfig
from agent_lab.policy.tokenizer import NL, SPECIALS


class KVCache:
    """Per-layer keys and values ``[B, H, S, D]`` plus ``valid [B, S]`` (False for padding slots) and each slot's
    token ``ids [B, S]`` (what a same-word bias, ``ModelConfig.token_match``, compares a new token with).

    ``length`` is the number of slots written; capacity doubles when a call would overflow it. A rollout drops
    the rows of finished episodes (:meth:`keep_rows`), so ``B`` may shrink as it runs.
    """

    def __init__(self, n_layers: int, batch: int, n_heads: int, head_dim: int, capacity: int, device, dtype):
        shape = (batch, n_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.ids = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.line_start = torch.zeros(batch, dtype=torch.long, device=device)  # each row's last newline position
        self.line_head = torch.zeros(batch, dtype=torch.long, device=device)  # the first word of each row's line
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def reserve(self, k: int) -> None:
        """Make room for ``k`` more slots (amortised doubling)."""
        need = self.length + k
        if need <= self.capacity:
            return
        new_cap = max(need, 2 * self.capacity)
        pad = new_cap - self.capacity
        self.k = [F.pad(t, (0, 0, 0, pad)) for t in self.k]
        self.v = [F.pad(t, (0, 0, 0, pad)) for t in self.v]
        self.valid = F.pad(self.valid, (0, pad), value=False)
        self.ids = F.pad(self.ids, (0, pad))

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Keep the rows where ``keep [B]`` (bool) is True, in order; the others' keys and values are freed."""
        self.k = [t[keep] for t in self.k]
        self.v = [t[keep] for t in self.v]
        self.valid = self.valid[keep]
        self.ids = self.ids[keep]
        self.line_start = self.line_start[keep]
        self.line_head = self.line_head[keep]


def rotary(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[B, 1, k, D/2]`` of the rotary angles ``p * 10000^(-2i/D)`` (Su et al. 2021, RoFormer)."""
    half = head_dim // 2
    inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32, device=positions.device) / half)
    angles = positions[:, None, :, None].float() * inv_freq  # (B, 1, k, D/2)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, rot: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+D/2}) of ``x [B, H, k, D]`` by the angles of ``rot``: q.k then depends on offsets only."""
    cos, sin = (t.to(x.dtype) for t in rot)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


#: Offsets in a line past this share one embedding (crafting's longest line is shorter).
LINE_SPAN = 32
NL_ID = SPECIALS.index(NL)


def line_offsets(ids: torch.Tensor, positions: torch.Tensor, line_start: torch.Tensor | None = None,
                 valid: torch.Tensor | None = None, index: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's offset from the last newline at or before it (a sequence's first token, position 0, counts as
    one): ``[B, k]``, and each row's last such ``index`` ``[B]``. ``index`` (default: ``positions``) orders a
    row's slots: packed rows pass their column index, since positions restart in each packed sequence.
    ``line_start [B]`` carries that index over from earlier calls (an incremental forward); ``valid [B, k]``
    leaves padding slots out of it."""
    index = positions if index is None else index
    marker = (ids == NL_ID) | (positions == 0)
    if valid is not None:
        marker = marker & valid
    start = torch.where(marker, index, torch.full_like(index, -1)).cummax(dim=1).values
    if line_start is not None:
        start = torch.maximum(start, line_start[:, None])
    return (index - start).clamp(0, LINE_SPAN - 1), start[:, -1]


def line_heads(ids: torch.Tensor, offsets: torch.Tensor, valid: torch.Tensor | None = None,
               carried: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's line head ``[B, k]``: the token at offset 1 of its line (:func:`line_offsets`), the first
    word after the newline, or 0 (the padding id: no head yet) on a token at offset 0; and each row's last head
    ``[B]`` to carry into the next call. ``carried [B]`` is the head of a line begun in an earlier call;
    ``valid [B, k]`` leaves padding slots out."""
    B, k = ids.shape
    first = offsets == 1
    if valid is not None:
        first = first & valid
    columns = torch.arange(k, device=ids.device).expand(B, k)
    last = torch.where(first, columns, torch.full_like(columns, -1)).cummax(dim=1).values
    before = carried[:, None].expand(B, k) if carried is not None else torch.zeros_like(ids)
    heads = torch.where(last >= 0, ids.gather(1, last.clamp(min=0)), before)
    return heads.masked_fill(offsets == 0, 0), heads[:, -1]


def same_word(query_ids: torch.Tensor, key_ids: torch.Tensor) -> torch.Tensor:
    """``[B, 1, k, keys]`` bool: True where query ``i``'s token (``query_ids [B, k]``) is key ``j``'s
    (``key_ids [B, keys]``)."""
    return (query_ids[:, :, None] == key_ids[:, None, :])[:, None]


class CausalSelfAttention(nn.Module):
    """Multi-head attention. With ``ModelConfig.token_match = g`` each head ``h`` adds a learned gain ``g_h`` to
    its score wherever the query's token is the key's: ``softmax(q.k / sqrt(D) + g_h * [same word])``, with
    ``g_h`` starting at ``g`` in the first ``token_match_heads`` heads and at 0 in the others. Finding a word's
    other mentions by content otherwise needs query and key weights that map a word onto itself, which a model
    trained from random weights has to learn first; the bias gives that look-up from the first step, and each
    head learns how much of it to keep."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.match_gain = None
        if cfg.token_match:
            gain = torch.zeros(cfg.n_heads)
            gain[: cfg.token_match_heads or cfg.n_heads] = float(cfg.token_match)
            self.match_gain = nn.Parameter(gain)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None, layer: int, rot=None,
                same: torch.Tensor | None = None) -> torch.Tensor:
        B, k, C = x.shape
        q, kk, v = self.qkv(x).split(C, dim=2)
        # (B, k, C) -> (B, H, k, D)
        q, kk, v = (t.view(B, k, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, kk, v))
        if rot is not None:  # rotary positions: keys are cached already rotated by their own position
            q, kk = rotate(q, rot), rotate(kk, rot)
        if cache is not None:
            s = cache.length
            cache.k[layer][:, :, s : s + k] = kk.to(cache.k[layer].dtype)
            cache.v[layer][:, :, s : s + k] = v.to(cache.v[layer].dtype)
            kk = cache.k[layer][:, :, : s + k].to(q.dtype)  # (B, H, s+k, D)
            v = cache.v[layer][:, :, : s + k].to(q.dtype)
        # mask: (B, 1, k, keys) bool, True = may attend; None = causal over k == keys (no mask to build or save)
        if self.match_gain is not None:  # same (B, 1, k, keys): the scores' additive bias, -inf where not allowed
            allowed = mask if mask is not None else torch.ones(k, k, dtype=torch.bool, device=x.device).tril()
            mask = (self.match_gain.view(1, -1, 1, 1).to(q.dtype) * same).masked_fill(~allowed, float("-inf"))
        y = F.scaled_dot_product_attention(q, kk, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, k, C)  # (B, k, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.fc = nn.Linear(cfg.d_model, d_ff)
        self.out = nn.Linear(d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.out(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x, mask, cache, layer, rot=None, same=None):
        x = x + self.attn(self.ln1(x), mask, cache, layer, rot, same)
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """Decoder-only language model pi_theta(x_j | x_<j) over the environment's words.

    ``forward(input_ids, attention_mask)`` is the teacher-forced pass: logits ``[B, L, V]`` where
    ``logits[:, j]`` predicts ``input_ids[:, j+1]``. ``step(ids, valid, cache)`` is the incremental pass
    used by rollouts: it appends ``k`` slots to the cache and returns logits for them only.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size is None: set it to the tokenizer's size, "
                             "dataclasses.replace(cfg, vocab_size=len(tokenizer))")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positions == "learned" else None
        self.line_emb = nn.Embedding(LINE_SPAN, cfg.d_model) if cfg.line_positions else None
        self.head_emb = nn.Embedding(cfg.vocab_size, cfg.d_model) if cfg.line_heads else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        self.apply(self._init)
        for name, p in self.named_parameters():  # scaled init of residual projections (GPT-2)
            if name.endswith("proj.weight") or name.endswith("out.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor, offsets: torch.Tensor | None = None,
               heads: torch.Tensor | None = None) -> torch.Tensor:
        if int(positions.max()) >= self.cfg.max_len:
            raise ValueError(f"sequence position {int(positions.max())} exceeds max_len={self.cfg.max_len}; raise ModelConfig.max_len")
        x = self.tok_emb(ids)
        if self.line_emb is not None:
            x = x + self.line_emb(offsets)
        if self.head_emb is not None:
            x = x + self.head_emb(heads)
        return x + self.pos_emb(positions) if self.pos_emb is not None else x

    def _rotary(self, positions: torch.Tensor):
        return rotary(positions, self.cfg.d_model // self.cfg.n_heads) if self.cfg.positions == "rope" else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None,
                prompt_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced logits ``[B, L, V]``: the output head on :meth:`hidden_states`."""
        return self.head(self.hidden_states(input_ids, attention_mask, segment_ids, prompt_lengths))

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      segment_ids: torch.Tensor | None = None,
                      prompt_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The last layer's normalised states ``[B, L, d_model]`` for right-padded ``input_ids [B, L]`` (what the
        output head reads; a critic can read them too, :func:`agent_lab.critic.decision_states`).

        Right padding keeps each row's real tokens at positions 0..n-1, so the causal mask alone gives every
        real position exactly what it would get alone: padding keys come after it. ``attention_mask`` is
        therefore not needed (padding positions' outputs, which see earlier tokens, are never read), and no
        ``[B, 1, L, L]`` mask is built, which the attention kernels would otherwise read and save for the
        backward pass in every layer. ``segment_ids [B, L]`` packs several sequences into one row: a token
        attends only to earlier tokens of its own segment, positions restart at 0 in each, ``-1`` marks
        padding (see :mod:`agent_lab.policy.packing`).

        ``prompt_lengths [N]`` (long) gives each sequence's prompt length: row ``b``'s without
        ``segment_ids``, segment ``s``'s (``prompt_lengths[s]``) with them. A policy whose
        ``prompt_attention`` is "bidirectional" needs it and lets the prompt's tokens attend to each other in
        both directions; a causal policy ignores it and keeps the mask-free path.
        """
        B, L = input_ids.shape
        if segment_ids is not None:
            pos = segment_positions(segment_ids)
        else:
            pos = torch.arange(L, device=input_ids.device).expand(B, L)
            if attention_mask is not None and bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
                raise ValueError("attention_mask must be right padding (each row's real tokens first, then "
                                 "padding); pack sequences with segment_ids instead")
        in_prompt = self._prompt_tokens(pos, segment_ids, prompt_lengths, attention_mask)
        mask = None  # causal: no mask to build or save
        if segment_ids is not None or in_prompt is not None:
            mask = attention_rule(segment_ids, in_prompt, L)
        offsets = heads = None
        if self.line_emb is not None or self.head_emb is not None:
            columns = torch.arange(L, device=input_ids.device).expand(B, L)
            offsets = line_offsets(input_ids, pos, index=columns)[0]
            heads = line_heads(input_ids, offsets)[0] if self.head_emb is not None else None
        x, rot = self._embed(input_ids, pos, offsets, heads), self._rotary(pos)
        same = same_word(input_ids, input_ids) if self.cfg.token_match else None
        for i, blk in enumerate(self.blocks):
            x = blk(x, mask, None, i, rot, same)
        return self.ln_f(x)

    def _prompt_tokens(self, pos: torch.Tensor, segment_ids: torch.Tensor | None,
                       prompt_lengths: torch.Tensor | None,
                       attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """``[B, L]`` bool, True at each sequence's prompt tokens; None for a causal policy."""
        if self.cfg.prompt_attention == "causal":
            return None
        n = pos.shape[0] if segment_ids is None else None
        lengths = check_prompt_lengths(prompt_lengths, n, pos.device)
        if segment_ids is None:
            in_prompt = pos < lengths[:, None]
            if attention_mask is not None and bool((in_prompt & ~attention_mask.bool()).any()):
                raise ValueError("a prompt is longer than its row's real tokens (prompt_lengths > "
                                 "attention_mask.sum(1))")
            return in_prompt
        if int(segment_ids.max()) >= len(lengths):
            raise ValueError(f"segment id {int(segment_ids.max())} has no entry in prompt_lengths "
                             f"({len(lengths)} entries): segment ids index prompt_lengths")
        return (pos < lengths[segment_ids.clamp(min=0)]) & (segment_ids >= 0)

    def new_cache(self, batch: int, capacity: int = 64, dtype: torch.dtype | None = None) -> KVCache:
        p = self.tok_emb.weight
        hd = self.cfg.d_model // self.cfg.n_heads
        return KVCache(self.cfg.n_layers, batch, self.cfg.n_heads, hd, capacity, p.device, dtype or p.dtype)

    def step(self, ids: torch.Tensor, valid: torch.Tensor, cache: KVCache, positions: torch.Tensor,
             prompt_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Incremental forward: ``ids [B, k]`` at ``positions [B, k]``; ``valid [B, k]`` False for padding.

        Returns logits ``[B, k, V]``. New slot ``s+i`` may attend to slot ``j <= s+i`` if ``j`` is valid. The
        first call of a "bidirectional" policy feeds the prompts, right-padded, with their ``prompt_lengths
        [B]``: slots ``i, j < prompt_lengths[b]`` of row ``b`` also see each other both ways, as in
        :meth:`hidden_states`; the keys cached then are the ones the teacher-forced pass computes.
        """
        B, k = ids.shape
        cache.reserve(k)
        s = cache.length
        cache.valid[:, s : s + k] = valid
        cache.ids[:, s : s + k] = ids
        keys_valid = cache.valid[:, : s + k]  # (B, s+k)
        causal = torch.ones(k, s + k, dtype=torch.bool, device=ids.device).tril(diagonal=s)  # (k, s+k)
        mask = causal[None, None] & keys_valid[:, None, None, :]
        if self.cfg.prompt_attention == "bidirectional" and (s == 0 or prompt_lengths is not None):
            if s:
                raise ValueError("prompt_lengths goes with the first step only (the prompt); this cache "
                                 f"already holds {s} slots")
            lengths = check_prompt_lengths(prompt_lengths, B, ids.device)
            if bool((lengths > valid.sum(1)).any()):
                raise ValueError("a prompt is longer than the tokens its row feeds: prompt_lengths "
                                 f"{lengths.tolist()}, valid tokens {valid.sum(1).tolist()}")
            in_prompt = torch.arange(k, device=ids.device) < lengths[:, None]  # (B, k)
            mask = mask | (in_prompt[:, None, :, None] & in_prompt[:, None, None, :])
        # a padding query with no visible key would give NaN; let it see its own slot (its output is unused)
        own = torch.zeros(k, s + k, dtype=torch.bool, device=ids.device)
        own[torch.arange(k), s + torch.arange(k)] = True
        mask = mask | own[None, None]
        pos = torch.where(valid, positions, torch.zeros_like(positions))
        offsets = heads = None
        if self.line_emb is not None or self.head_emb is not None:
            # a line may have begun in an earlier call: the cache remembers where, and its first word
            offsets, cache.line_start = line_offsets(ids, pos, cache.line_start, valid)
            if self.head_emb is not None:
                heads, cache.line_head = line_heads(ids, offsets, valid, cache.line_head)
        x, rot = self._embed(ids, pos, offsets, heads), self._rotary(pos)
        same = same_word(ids, cache.ids[:, : s + k]) if self.cfg.token_match else None
        for i, blk in enumerate(self.blocks):
            x = blk(x, mask, cache, i, rot, same)
        cache.length = s + k
        return self.head(self.ln_f(x))


def prompt_arguments(model, prompt_lengths: torch.Tensor | None) -> dict:
    """The keywords that give ``model`` (a :class:`TinyTransformer`, possibly wrapped in
    DistributedDataParallel) the prompt lengths: ``{"prompt_lengths": ...}`` when its ``prompt_attention`` is
    "bidirectional", else none, so that a causal policy, or any model with the plain ``forward(input_ids,
    attention_mask, segment_ids)``, is called exactly as it always was."""
    cfg = getattr(getattr(model, "module", model), "cfg", None)
    causal = getattr(cfg, "prompt_attention", "causal") == "causal"
    return {} if causal else {"prompt_lengths": prompt_lengths}


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Each token's index within its segment ``[B, L]``: a segment starts wherever the id changes."""
    idx = torch.arange(segment_ids.shape[1], device=segment_ids.device)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return idx - torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values


def attention_rule(segment_ids: torch.Tensor | None, in_prompt: torch.Tensor | None, L: int) -> torch.Tensor:
    """Which keys each query may read, ``[B, 1, L, L]`` bool: earlier ones (causal), every token of its own
    prompt when it is a prompt token (``in_prompt [B, L]``), and with ``segment_ids`` only its own segment's;
    a padding query (segment ``-1``) still sees itself, so that its softmax has a key."""
    device = (segment_ids if segment_ids is not None else in_prompt).device
    allowed = torch.ones(L, L, dtype=torch.bool, device=device).tril()  # (L, L)
    if in_prompt is not None:
        allowed = allowed | (in_prompt[:, :, None] & in_prompt[:, None, :])  # (B, L, L)
    if segment_ids is not None:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        eye = torch.eye(L, dtype=torch.bool, device=device)
        allowed = (allowed & same & (segment_ids >= 0)[:, None, :]) | eye
    return allowed[:, None]  # (B, 1, L, L)


def check_prompt_lengths(prompt_lengths: torch.Tensor | None, n: int | None, device) -> torch.Tensor:
    """``prompt_lengths`` as a long tensor on ``device``, checked: 1-D, ``n`` entries (when given), none
    negative. A "bidirectional" policy cannot run without it: it would not know where the prompt ends."""
    if prompt_lengths is None:
        raise ValueError("this policy's prompt_attention is 'bidirectional': pass prompt_lengths (each "
                         "sequence's prompt length in tokens, e.g. RolloutBatch.prompt_lengths) to every "
                         "forward pass")
    lengths = torch.as_tensor(prompt_lengths, device=device)
    if lengths.dim() != 1 or (n is not None and len(lengths) != n) or lengths.is_floating_point():
        raise ValueError(f"prompt_lengths must be a 1-D integer tensor with one entry per sequence ({n}), "
                         f"got shape {tuple(lengths.shape)} of {lengths.dtype}")
    if bool((lengths < 0).any()):
        raise ValueError(f"prompt_lengths must be >= 0, got {lengths.tolist()}")
    return lengths.long()
