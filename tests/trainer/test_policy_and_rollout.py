"""The policy, its KV cache and the rollout tensor contract (foundations chapter sections 9, 18 and 19)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_policy
from toy_env import ToySearch

from agent_lab.envs import make_env
from agent_lab.envs.base import replay
from agent_lab.estimators.logprobs import token_logprobs
from agent_lab.policy import KVCache, ModelConfig, WordTokenizer
from agent_lab.policy.model import CausalSelfAttention, line_heads, line_offsets, same_word
from agent_lab.policy.tokenizer import NL, SPECIALS
from agent_lab.rollout import (
    RolloutBatch,
    SamplingConfig,
    collect_rollouts,
    demonstration_batch,
    masked_logprobs,
    top_p_logprobs,
)
from agent_lab.update import policy_logits


def test_tokenizer_round_trips_protocol_text_and_maps_newlines_to_nl():
    tok = WordTokenizer(["guess", "8", "higher"])
    ids = tok.encode("guess 8\nhigher")
    assert ids == [tok.index["guess"], tok.index["8"], tok.nl_id, tok.index["higher"]]
    assert tok.decode(ids) == "guess 8\nhigher"
    assert tok.encode("banana") == [tok.unk_id]
    assert WordTokenizer.from_state_dict(tok.state_dict()).vocab == tok.vocab
    with pytest.raises(ValueError, match="words"):
        WordTokenizer(["two words"])


@pytest.mark.parametrize(("positions", "line_positions", "token_match", "line_heads"),
                         [("learned", False, 0.0, False), ("rope", False, 0.0, False), ("rope", True, 0.0, False),
                          ("rope", False, 2.0, False), ("rope", False, 0.0, True), ("rope", True, 0.0, True)])
def test_kv_cache_chunked_steps_with_padding_slots_equal_full_recompute(positions, line_positions, token_match,
                                                                       line_heads):
    tok = WordTokenizer([str(i) for i in range(20)])
    m = tiny_policy(tok, positions=positions, line_positions=line_positions, token_match=token_match,
                    line_heads=line_heads).eval()
    g = torch.Generator().manual_seed(0)
    B, L = 3, 12
    ids = torch.randint(tok.nl_id, len(tok), (B, L), generator=g)  # newlines among the words: lines of any length
    ids[:, [2, 7]] = tok.nl_id  # a line that begins in one chunk and goes on in the next
    full = m(ids)  # [B, L, V]
    # feed the same rows in chunks of different sizes, with invalid padding slots interleaved per row
    cache = m.new_cache(B, capacity=4)  # forces the cache to grow
    fed = torch.zeros(B, dtype=torch.long)
    got = torch.zeros_like(full)
    chunks = [3, 1, 4, 2, 2]
    rng = torch.Generator().manual_seed(1)
    while bool((fed < L).any()):
        k = chunks[0]
        chunks = chunks[1:] + chunks[:1]
        take = torch.clamp(torch.randint(0, k + 1, (B,), generator=rng), max=(L - fed))
        valid = torch.arange(k)[None] < take[:, None]
        step_ids = torch.zeros(B, k, dtype=torch.long)
        for b in range(B):
            step_ids[b, : take[b]] = ids[b, fed[b] : fed[b] + take[b]]
        pos = fed[:, None] + valid.long().cumsum(1) - 1
        out = m.step(step_ids, valid, cache, pos)
        for b in range(B):
            got[b, fed[b] : fed[b] + take[b]] = out[b, : take[b]]
        fed = fed + take
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_each_token_carries_the_first_word_of_its_line_and_a_newline_none():
    nl = SPECIALS.index(NL)
    ids = torch.tensor([[1, 7, 8, 9, nl, 5, 6, nl, nl, 4]])  # <bos> 7 8 9 | 5 6 | (empty line) | 4
    offsets, _ = line_offsets(ids, torch.arange(10)[None])
    heads, last = line_heads(ids, offsets)
    assert heads.tolist() == [[0, 7, 7, 7, 0, 5, 5, 0, 0, 4]] and last.tolist() == [4]
    # fed in two calls, the second without a newline: the line begun in the first keeps its head
    first, start = line_offsets(ids[:, :6], torch.arange(6)[None])
    h1, carry = line_heads(ids[:, :6], first)
    rest = torch.tensor([[6, 6, 6]])
    more, _ = line_offsets(rest, torch.arange(6, 9)[None], start)
    h2, _ = line_heads(rest, more, carried=carry)
    assert h1.tolist() == [[0, 7, 7, 7, 0, 5]] and h2.tolist() == [[5, 5, 5]]
    # a padding slot is never a line's first word
    valid = torch.tensor([[True, True, False, True]])
    pad = torch.tensor([[1, nl, 3, 8]])
    offs, _ = line_offsets(pad, torch.tensor([[0, 1, 0, 2]]), valid=valid)
    assert line_heads(pad, offs, valid)[0].tolist()[0][3] == 8
    tok = WordTokenizer([str(i) for i in range(20)])
    assert tiny_policy(tok, line_heads=True).head_emb.num_embeddings == len(tok)
    assert tiny_policy(tok).head_emb is None
    with pytest.raises(ValueError, match="line_heads must be True or False, got 1"):
        ModelConfig(vocab_size=10, line_heads=1)


def test_the_same_word_bias_adds_each_heads_gain_to_the_scores_of_keys_holding_the_query_token():
    """With zero query and key weights a head's scores are its bias alone, so its weights over the keys it may
    see are exactly softmax(g_h * [same word]), and it returns that average of the values."""
    cfg = ModelConfig(vocab_size=10, d_model=8, n_heads=2, token_match=1.5)
    attn = CausalSelfAttention(cfg)
    assert attn.match_gain.tolist() == [1.5, 1.5]  # every head starts at the configured gain
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.qkv.bias.zero_()
        attn.qkv.weight[16:] = torch.eye(8)  # values = inputs
        attn.proj.weight.copy_(torch.eye(8))
        attn.proj.bias.zero_()
        attn.match_gain.copy_(torch.tensor([1.5, -1.0]))
    ids = torch.tensor([[3, 5, 3, 7, 5, 3]])
    x = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(0))
    got = attn(x, None, None, 0, None, same_word(ids, ids))
    for i in range(6):
        for h, gain in enumerate((1.5, -1.0)):
            w = torch.softmax(gain * (ids[0, : i + 1] == ids[0, i]).float(), dim=0)  # causal: keys 0..i
            torch.testing.assert_close(got[0, i, 4 * h : 4 * h + 4], w @ x[0, : i + 1, 4 * h : 4 * h + 4])


def test_the_same_word_gain_is_a_parameter_only_when_asked_for_and_a_bad_gain_is_refused():
    tok = WordTokenizer([str(i) for i in range(20)])
    assert not any("match_gain" in n for n, _ in tiny_policy(tok).named_parameters())  # old checkpoints load
    biased = tiny_policy(tok, token_match=2.0)
    ids = torch.randint(0, len(tok), (2, 9), generator=torch.Generator().manual_seed(0))
    biased(ids).sum().backward()
    gains = [p for n, p in biased.named_parameters() if n.endswith("match_gain")]
    assert len(gains) == 2 and all(float(p.grad.abs().sum()) > 0 for p in gains)  # learnt, one per layer
    for bad in (True, float("nan"), "2"):
        with pytest.raises(ValueError, match="token_match must be a finite number"):
            ModelConfig(vocab_size=10, token_match=bad)
    one = tiny_policy(tok, token_match=5.0, token_match_heads=1)  # one head per block looks up, three are free
    assert all(b.attn.match_gain.tolist() == [5.0, 0.0, 0.0, 0.0] for b in one.blocks)
    for bad in (0, 5, 1.0, True):
        with pytest.raises(ValueError, match="token_match_heads must be None"):
            ModelConfig(vocab_size=10, n_heads=4, token_match=1.0, token_match_heads=bad)


@pytest.fixture(scope="module")
def toy_batch():
    torch.set_num_threads(1)
    env = ToySearch()
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    tasks = env.sample_tasks(0, 12)
    sampling = SamplingConfig(temperature=0.7, top_p=0.9)
    b = collect_rollouts(m, tok, env, tasks, sampling, torch.Generator().manual_seed(3), policy_version=5)
    return env, tok, m, tasks, sampling, b


def test_rollout_with_cache_samples_exactly_what_full_recompute_samples(toy_batch):
    env, tok, m, tasks, sampling, b = toy_batch
    slow = collect_rollouts(m, tok, env, tasks, sampling, torch.Generator().manual_seed(3), use_cache=False)
    assert torch.equal(b.input_ids, slow.input_ids)
    torch.testing.assert_close(b.old_logprobs, slow.old_logprobs, atol=1e-5, rtol=0)


def test_finished_episodes_leave_the_cache_and_the_rest_sample_what_full_recompute_samples(monkeypatch):
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    tasks = env.sample_tasks(1, 16)
    sampling = SamplingConfig(temperature=1.0, candidate_mask=True)  # valid guesses: episodes end when they hit
    kept, keep_rows = [], KVCache.keep_rows
    monkeypatch.setattr(KVCache, "keep_rows", lambda self, keep: kept.append(int(keep.sum())) or keep_rows(self, keep))
    fast = collect_rollouts(m, tok, env, tasks, sampling, torch.Generator().manual_seed(0))
    slow = collect_rollouts(m, tok, env, tasks, sampling, torch.Generator().manual_seed(0), use_cache=False)
    turns = fast.num_turns.tolist()
    assert min(turns) < max(turns)  # episodes end at different turns
    # rows are dropped once a quarter of those held have finished; the longest episode's row is never dropped
    assert kept and kept == sorted(kept, reverse=True) and kept[0] <= 12 and kept[-1] >= turns.count(max(turns))
    assert torch.equal(fast.input_ids, slow.input_ids) and torch.equal(fast.action_mask, slow.action_mask)
    torch.testing.assert_close(fast.old_logprobs, slow.old_logprobs, atol=1e-5, rtol=0)


def test_behaviour_logprobs_equal_teacher_forced_recompute_under_the_same_transform(toy_batch):
    env, tok, m, tasks, sampling, b = toy_batch
    logits = m(b.input_ids, b.attention_mask)[:, :-1]
    lp = top_p_logprobs(masked_logprobs(logits, b.allowed_tokens, sampling.temperature), sampling.top_p)
    tf = lp.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
    am = b.action_mask
    assert int(am.sum()) > 0
    torch.testing.assert_close(tf[am], b.old_logprobs[am], atol=1e-5, rtol=0)
    # and the untempered log-probs differ: the transform really is part of what was recorded
    raw = torch.log_softmax(logits.float(), -1).gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
    assert (raw[am] - b.old_logprobs[am]).abs().max() > 1e-3


def test_masks_and_turn_ids_align_with_targets_and_reconstruct_the_actions(toy_batch):
    env, tok, m, tasks, sampling, b = toy_batch
    B, L = b.input_ids.shape
    assert b.action_mask.shape == b.old_logprobs.shape == b.turn_ids.shape == (B, L - 1)
    assert torch.equal(b.old_logprobs[~b.action_mask], torch.zeros(int((~b.action_mask).sum())))
    assert bool((b.turn_ids[~b.action_mask] == -1).all()) and bool((b.turn_ids[b.action_mask] >= 0).all())
    assert bool((b.old_logprobs[b.action_mask] <= 0).all())
    assert torch.equal(b.policy_version, torch.full((B,), 5))
    targets = b.input_ids[:, 1:]
    for i in range(B):
        turns = b.episode_logs[i]["turns"] if isinstance(b.episode_logs[i], dict) else b.episode_logs[i]
        assert int(b.num_turns[i]) == len(turns) == int(b.turn_mask[i].sum())
        for t, turn in enumerate(turns):
            toks = targets[i][(b.turn_ids[i] == t) & b.action_mask[i]].tolist()
            assert toks[-1] == tok.nl_id, "every action ends with its (policy) newline"
            sampled = turn.get("text", turn.get("sampled"))
            assert tok.decode(toks[:-1]) == sampled
    # observation tokens are never policy tokens: the word after each action newline is the env's reply
    assert not bool(b.action_mask[:, 0].any()), "the first target (prompt) is not a policy token"


def test_rollout_never_retokenizes_sampled_action_text(monkeypatch):
    env = ToySearch()
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    seen: list[str] = []
    real = WordTokenizer.encode
    monkeypatch.setattr(WordTokenizer, "encode", lambda self, text: seen.append(text) or real(self, text))
    b = collect_rollouts(m, tok, env, env.sample_tasks(1, 8), SamplingConfig(), torch.Generator().manual_seed(0))
    env_texts = {"find a number from 1 8", "higher", "lower", "correct", "invalid"}
    assert set(seen) <= env_texts, f"encode saw non-environment text: {set(seen) - env_texts}"
    assert len(b) == 8


def test_candidate_mask_only_samples_allowed_actions():
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    b = collect_rollouts(m, tok, env, env.sample_tasks(0, 64), SamplingConfig(candidate_mask=True),
                         torch.Generator().manual_seed(0))
    errors = [t["error"] for log in b.episode_logs for t in log["turns"]]
    assert errors and all(e is None for e in errors)
    # the untrained policy with the mask is the uniform-consistent guesser: it succeeds far above 4/16
    assert float(b.success.float().mean()) > 0.4


def test_a_full_context_window_truncates_the_episode_and_replays():
    env = make_env("crafting", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    tasks = env.eval_tasks("deeper", 8)  # level 4: long prompts and long episodes
    run = lambda max_len: collect_rollouts(tiny_policy(tok, max_len=max_len), tok, env, tasks,  # noqa: E731
                                           SamplingConfig(candidate_mask=True), torch.Generator().manual_seed(0))
    b = run(160)
    assert b.input_ids.shape[1] <= 160, "no transcript may outgrow the policy's window"
    cut = [i for i, log in enumerate(b.episode_logs) if log.get("context_full")]
    assert cut, "an untrained policy wanders: some episodes must reach a 160-token window"
    for i in cut:
        log = b.episode_logs[i]
        assert bool(b.truncated[i]) and not bool(b.success[i]) and log["done"] and log["truncated"]
        assert replay(log)["context_full"]
    roomy = run(2048)
    assert not any(log.get("context_full") for log in roomy.episode_logs)
    assert roomy.input_ids.shape[1] > 160
    with pytest.raises(ValueError, match="leaves no room for an action within the policy's max_len=40"):
        run(40)


def test_demonstration_batch_has_rollout_layout_and_planner_success():
    env = make_env("number-search")
    tok = WordTokenizer.from_env(env)
    d = demonstration_batch(env, tok, env.eval_tasks())
    assert float(d.success.float().mean()) == pytest.approx(15 / 16)
    assert d.texts[7].startswith("find the number from 1 to 16 in 4 guesses\nguess 8\n")
    assert d.action_mask.shape == (16, d.input_ids.shape[1] - 1)


def test_select_and_concat_preserve_rows():
    env = ToySearch()
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    b = collect_rollouts(m, tok, env, env.sample_tasks(0, 6), SamplingConfig(), torch.Generator().manual_seed(0))
    parts = [b.select([0, 1, 2]), b.select(torch.tensor([3, 4, 5]))]
    c = RolloutBatch.concat(parts)
    L = c.input_ids.shape[1]
    assert torch.equal(c.input_ids, b.input_ids[:, :L]) and torch.equal(c.old_logprobs, b.old_logprobs[:, : L - 1])
    assert c.texts == b.texts


def test_bf16_autocast_rollout_records_float32_logprobs_within_bf16_rounding_of_the_float32_policy():
    # The CUDA run samples under torch.autocast(bfloat16); on the CPU the same code path runs. Whatever tokens it
    # drew, their recorded log-probs must be the float32 policy's log-probs of those tokens up to the rounding of
    # bf16 matmuls (relative 2^-9 on this untrained model's logits, which are of order 1). The log-softmax itself
    # must stay in float32: taken in bf16, log-probs of magnitude 2-4 move in steps of 2^-6 = 0.016, past 5e-3.
    env = ToySearch()
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    b = collect_rollouts(m, tok, env, env.sample_tasks(0, 6), SamplingConfig(), torch.Generator().manual_seed(0),
                         autocast_dtype=torch.bfloat16)
    assert b.old_logprobs.dtype == torch.float32 and int(b.action_mask.sum()) > 0
    with torch.no_grad():
        full = token_logprobs(policy_logits(m, b, b.temperature), b.input_ids[:, 1:])
    am = b.action_mask
    torch.testing.assert_close(b.old_logprobs[am], full[am], atol=5e-3, rtol=0)
    assert bool((b.old_logprobs[~am] == 0).all())


def test_a_rotary_policy_survives_a_checkpoint_round_trip(tmp_path):
    from agent_lab.evaluation import load_checkpoint, save_checkpoint

    tok = WordTokenizer([str(i) for i in range(20)])
    m = tiny_policy(tok, positions="rope").eval()
    assert m.pos_emb is None
    save_checkpoint(tmp_path / "c.pt", m, tok)
    back, _, _ = load_checkpoint(tmp_path / "c.pt")
    ids = torch.randint(4, len(tok), (2, 9))
    assert back.cfg.positions == "rope" and torch.equal(back(ids), m(ids))


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_only_rotary_logits_are_invariant_to_shifting_every_position(positions):
    tok = WordTokenizer([str(i) for i in range(20)])
    m = tiny_policy(tok, positions=positions).eval()
    if m.pos_emb is not None:  # make the learned table matter at this tiny scale
        torch.nn.init.normal_(m.pos_emb.weight, 0.0, 0.5)
    ids = torch.randint(4, len(tok), (2, 9), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(2, 9, dtype=torch.bool)
    a, b = (m.step(ids, valid, m.new_cache(2), torch.arange(9).expand(2, 9) + s) for s in (0, 50))
    assert torch.allclose(a, b, atol=1e-5) == (positions == "rope")  # attention sees offsets, not absolute positions


def test_a_right_padded_batch_gives_each_real_position_what_the_row_alone_gives_and_left_padding_is_refused():
    env = make_env("number-search")
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    torch.manual_seed(0)
    ids = torch.randint(0, len(tok), (3, 12))
    lengths = [12, 7, 1]
    am = torch.arange(12)[None] < torch.tensor(lengths)[:, None]
    padded = ids.masked_fill(~am, tok.pad_id)
    out = m(padded, am)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :n], m(ids[b : b + 1, :n])[0], atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="right padding"):
        m(padded, am.flip(1))


def test_line_offsets_count_from_the_last_newline_across_cached_calls():
    from agent_lab.policy.model import line_offsets

    nl = WordTokenizer([]).nl_id
    ids = torch.tensor([[1, 5, 6, nl, 7, 8, 9, nl, 5]])
    pos = torch.arange(9)[None]
    offsets, last = line_offsets(ids, pos)
    assert offsets.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1]] and last.tolist() == [7]
    # the same row fed in two calls, the second with a padding slot: the cache's line start carries over
    first, start = line_offsets(ids[:, :5], pos[:, :5])
    ids2, pos2 = torch.tensor([[8, 0, 9, nl, 5]]), torch.tensor([[5, 0, 6, 7, 8]])
    second, _ = line_offsets(ids2, pos2, start, torch.tensor([[True, False, True, True, True]]))
    assert first.tolist() == [[0, 1, 2, 0, 1]] and second[0, [0, 2, 3, 4]].tolist() == [2, 3, 0, 1]
