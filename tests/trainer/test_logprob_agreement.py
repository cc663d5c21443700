"""The sampler's recorded log-probs agree with the trainer's recomputation before the first update (theta =
theta_old), whatever path either side takes: KV cache or full recompute while sampling; packed or padded rows
while training; with or without the candidate mask; temperature and top-p. A mismatch here would silently bias
every importance ratio (the multi-turn bug of verl #2996, prime-rl #1352, SkyRL #123).

BOUND: in float32 the two sides compute the same log-softmax along different operation orders (one cached step at
a time against one teacher-forced pass, packed rows against padded ones), so they differ by rounding only: a few
float32 ulps of logits of size ~10, far below 1e-5 nats per token. A real mismatch (a mask, a temperature or a
position missed on one side) is larger than 1e-2.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import tiny_policy

import agent_lab.update as update
from agent_lab.algorithms import make_algorithm
from agent_lab.envs import make_env
from agent_lab.policy import WordTokenizer
from agent_lab.policy.packing import packed_logits
from agent_lab.rollout import SamplingConfig, collect_rollouts

BOUND = 1e-5
CASES = list(itertools.product((True, False), ("packed", "padded"), (True, False), ((1.0, 1.0), (0.7, 0.9))))


@pytest.fixture(scope="module", params=[{}, {"token_match": 2.0}, {"line_heads": True, "line_positions": True}],
                ids=["plain attention", "same-word bias", "line heads and offsets"])
def crafting(request):
    """A causal policy on crafting prompts shown twice, plain, with the same-word attention bias
    (ModelConfig.token_match) and with each line's first word and offsets embedded (line_heads, line_positions)."""
    torch.set_num_threads(1)
    env = make_env("crafting", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    return env, tok, tiny_policy(tok, seed=5, positions="rope", **request.param), env.sample_tasks(3, 8)


@pytest.fixture(scope="module", params=[False, True], ids=["token positions", "line positions"])
def crafting_prefix_lm(request):
    """A prefix-LM policy (ModelConfig.prompt_attention) on crafting prompts shown once, with and without the
    embedding of each token's offset in its line (ModelConfig.line_positions)."""
    torch.set_num_threads(1)
    env = make_env("crafting", mask_actions=True, reread=False)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=5, positions="rope", prompt_attention="bidirectional",
                        line_positions=request.param)
    return env, tok, model, env.sample_tasks(3, 8)


def force_rows(monkeypatch, rows: str) -> None:
    """Make the trainer's pass always pack its rows, or never (by default it packs only when that saves a
    tenth of the rows)."""
    if rows == "packed":
        monkeypatch.setattr(update, "packed_logits",
                            lambda m, ids, am, **kw: packed_logits(m, ids, am, min_saving=0.0, **kw))
    else:
        monkeypatch.setattr(update, "packed_logits", lambda m, ids, am, **kw: m(ids, am, **kw))


@pytest.mark.parametrize(("use_cache", "rows", "mask", "transform"), CASES)
def test_recorded_and_recomputed_logprobs_agree_before_the_first_update(crafting, monkeypatch, use_cache, rows,
                                                                        mask, transform):
    env, tok, model, tasks = crafting
    temperature, top_p = transform
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, candidate_mask=mask)
    batch = collect_rollouts(model, tok, env, tasks, sampling, torch.Generator().manual_seed(2), use_cache=use_cache)
    lengths = batch.attention_mask.sum(1)
    assert int(lengths.max()) > 1.5 * int(lengths.min()), "mixed lengths, so packing changes the rows"
    force_rows(monkeypatch, rows)
    algo = make_algorithm("dr_grpo", group_size=8, max_tokens=int(env.max_policy_tokens))
    f = update.batch_loss(model, batch, torch.zeros(len(batch)), algo, sampler_view=True)
    gap = update.logprob_gap(batch, f.sampler_logprobs)
    assert gap["logprob_gap_max"] < BOUND, f"sampler and trainer disagree: {gap}"
    if top_p < 1:  # the trainer's own (untruncated) log-probs differ by the truncated mass, as they should
        plain = (batch.old_logprobs - f.logprobs.detach())[batch.action_mask]
        assert float(plain.max()) > 1e-3


def test_the_bound_is_broken_by_a_mask_the_trainer_forgets(crafting, monkeypatch):
    env, tok, model, tasks = crafting
    batch = collect_rollouts(model, tok, env, tasks, SamplingConfig(candidate_mask=True),
                             torch.Generator().manual_seed(2))
    unmasked = batch.select(torch.arange(len(batch)))
    unmasked.allowed_tokens = torch.ones_like(batch.allowed_tokens)  # as if the trainer ignored the mask
    algo = make_algorithm("dr_grpo", group_size=8, max_tokens=int(env.max_policy_tokens))
    f = update.batch_loss(model, unmasked, torch.zeros(len(batch)), algo, sampler_view=True)
    assert update.logprob_gap(unmasked, f.sampler_logprobs)["logprob_gap_max"] > 1e-2


@pytest.mark.parametrize(("use_cache", "rows"), list(itertools.product((True, False), ("packed", "padded"))))
def test_a_prefix_lm_records_the_log_probs_the_trainer_recomputes(crafting_prefix_lm, monkeypatch, use_cache,
                                                                  rows):
    env, tok, model, tasks = crafting_prefix_lm
    batch = collect_rollouts(model, tok, env, tasks, SamplingConfig(candidate_mask=True),
                             torch.Generator().manual_seed(2), use_cache=use_cache)
    force_rows(monkeypatch, rows)
    algo = make_algorithm("dr_grpo", group_size=8, max_tokens=int(env.max_policy_tokens))
    f = update.batch_loss(model, batch, torch.zeros(len(batch)), algo, sampler_view=True)
    assert update.logprob_gap(batch, f.sampler_logprobs)["logprob_gap_max"] < BOUND
    # the same batch read as if only <bos> were the prompt: the bound breaks a hundredfold (an untrained
    # policy's logits are small, so the miss is too), so it tests the prompt's mask
    causal = batch.select(torch.arange(len(batch)))
    causal.prompt_lengths = torch.ones_like(batch.prompt_lengths)
    f = update.batch_loss(model, causal, torch.zeros(len(batch)), algo, sampler_view=True)
    assert update.logprob_gap(causal, f.sampler_logprobs)["logprob_gap_max"] > 100 * BOUND
