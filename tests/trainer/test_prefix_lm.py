"""A prefix-LM policy (``ModelConfig.prompt_attention="bidirectional"``): the prompt's tokens attend to each
other both ways, every later token causally, and every path that runs the policy (teacher-forced, packed,
cached sampling, resumed continuations, SFT, checkpoints) gives each row that same mask. A causal policy keeps
its mask-free path and its outputs, whatever prompt lengths it is handed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_policy

from agent_lab.branching import ResumedEpisodes, branch_points
from agent_lab.checkpoints import load_checkpoint
from agent_lab.config import ModelConfig
from agent_lab.envs import make_env
from agent_lab.policy import WordTokenizer
from agent_lab.policy.model import prompt_arguments
from agent_lab.policy.packing import packed_logits
from agent_lab.recipes import recipe
from agent_lab.rollout import RolloutBatch, SamplingConfig, collect_rollouts, demonstration_batch
from agent_lab.trainer import train_sft

GREEDY = SamplingConfig(decoding="greedy", candidate_mask=True)
PROMPT, LENGTH = 7, 13  # a transcript of 13 tokens whose first 7 are the prompt


@pytest.fixture(scope="module")
def tok():
    return WordTokenizer.from_env(make_env("crafting"))


def _ids(tok, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, len(tok), (1, LENGTH), generator=torch.Generator().manual_seed(seed))


def _changed_at(ids: torch.Tensor, j: int, tok) -> torch.Tensor:
    out = ids.clone()
    out[0, j] = 4 + (int(ids[0, j]) - 3) % (len(tok) - 4)  # another ordinary word
    return out


@torch.no_grad()
def _gap(model, ids, other, where) -> float:
    lengths = torch.tensor([PROMPT])
    a, b = (model.hidden_states(x, prompt_lengths=lengths)[0, where] for x in (ids, other))
    return float((a - b).abs().max())


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_a_prompt_token_reads_later_prompt_tokens_and_a_later_token_reads_nothing_after_it(tok, positions):
    prefix = tiny_policy(tok, positions=positions, prompt_attention="bidirectional").eval()
    causal = tiny_policy(tok, positions=positions).eval()
    ids = _ids(tok)
    later_in_prompt = _changed_at(ids, PROMPT - 2, tok)
    assert _gap(prefix, ids, later_in_prompt, 1) > 1e-3, "prompt token 1 must see prompt token 5"
    assert _gap(causal, ids, later_in_prompt, 1) == 0.0, "a causal policy's token 1 never sees token 5"
    after_prompt = _changed_at(ids, PROMPT + 3, tok)
    earlier = slice(0, PROMPT + 3)
    assert _gap(prefix, ids, after_prompt, earlier) == 0.0, "no token reads a later non-prompt one"
    assert _gap(prefix, ids, after_prompt, PROMPT + 3) > 1e-3  # the changed token itself does change


def test_a_bidirectional_policy_refuses_to_run_without_its_prompt_lengths(tok):
    prefix = tiny_policy(tok, prompt_attention="bidirectional")
    ids = _ids(tok)
    with pytest.raises(ValueError, match="bidirectional.*pass prompt_lengths"):
        prefix(ids)
    with pytest.raises(ValueError, match="one entry per sequence"):
        prefix(ids, prompt_lengths=torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="longer than its row's real tokens"):
        prefix(ids, torch.arange(LENGTH)[None] < 5, prompt_lengths=torch.tensor([PROMPT]))
    with pytest.raises(ValueError, match="prompt_attention must be one of"):
        ModelConfig(vocab_size=10, prompt_attention="both")


def test_the_cached_steps_give_the_teacher_forced_logits(tok):
    # the prompt in one step, then one token per step: the keys cached from the prompt are the ones the
    # teacher-forced pass computes, so every later logit agrees with it
    model = tiny_policy(tok, positions="rope", prompt_attention="bidirectional").eval()
    ids = torch.cat([_ids(tok, 1), _ids(tok, 2)])
    lengths = torch.tensor([PROMPT, PROMPT - 3])
    want = model(ids, prompt_lengths=lengths)
    cache = model.new_cache(2, capacity=4)
    pad = torch.arange(PROMPT)[None] < lengths[:, None]  # row 1 feeds a shorter prompt, right-padded
    prompts = torch.where(pad, ids[:, :PROMPT], 0)
    first = model.step(prompts, pad, cache, torch.arange(PROMPT).expand(2, -1), lengths)
    torch.testing.assert_close(first[pad], want[:, :PROMPT][pad], rtol=0, atol=1e-5)
    for j in range(4):  # each row's next tokens, at its own positions
        nxt = torch.stack([ids[b, int(lengths[b]) + j] for b in range(2)])[:, None]
        got = model.step(nxt, torch.ones(2, 1, dtype=torch.bool), cache, (lengths + j)[:, None])
        torch.testing.assert_close(got[:, 0], want[torch.arange(2), lengths + j], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="first step only"):
        model.step(nxt, torch.ones(2, 1, dtype=torch.bool), cache, (lengths + 4)[:, None], lengths)


def test_packed_rows_give_the_padded_logits_of_a_prefix_lm():
    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    batch = demonstration_batch(env, tok, env.sample_tasks(0, 10))
    model = tiny_policy(tok, positions="rope", prompt_attention="bidirectional")
    am, lengths = batch.attention_mask, batch.prompt_lengths
    plain = model(batch.input_ids, am, prompt_lengths=lengths)
    packed = packed_logits(model, batch.input_ids, am, min_saving=0.0, prompt_lengths=lengths)
    torch.testing.assert_close(packed[am], plain[am], rtol=0, atol=1e-5)
    causal = model(batch.input_ids, am, prompt_lengths=torch.ones_like(lengths))  # as if <bos> were all
    assert float((causal[am] - plain[am]).detach().abs().max()) > 1e-2


def test_the_demonstrations_and_the_rollouts_record_the_same_prompt_lengths():
    env = make_env("crafting", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    tasks = env.sample_tasks(4, 6)
    demos = demonstration_batch(env, tok, tasks)
    played = collect_rollouts(tiny_policy(tok), tok, env, tasks, GREEDY, torch.Generator())
    prompts = [len(tok.encode(p)) + 2 for p in env.reset(tasks)]  # <bos>, the prompt's words, its newline
    assert demos.prompt_lengths.tolist() == played.prompt_lengths.tolist() == prompts
    both = RolloutBatch.concat([played.select([4, 1]), demos.select([0])])
    assert both.prompt_lengths.tolist() == [prompts[4], prompts[1], prompts[0]]
    with pytest.raises(ValueError, match="with and without prompt lengths"):
        RolloutBatch.concat([played, RolloutBatch(**{**played.__dict__, "prompt_lengths": None})])


def test_a_causal_policy_keeps_its_mask_free_path_and_its_outputs(tok, monkeypatch):
    model = tiny_policy(tok, positions="rope").eval()
    ids = torch.cat([_ids(tok, 1), _ids(tok, 2)])
    plain = model(ids)
    masks = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kw):
        masks.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    assert torch.equal(model(ids, prompt_lengths=torch.tensor([PROMPT, 3])), plain)
    assert masks and all(m is None for m in masks), "a causal policy builds no attention mask"


def test_only_a_prefix_lm_is_handed_prompt_lengths_also_inside_a_wrapper(tok):
    # a causal policy, or a plain model without a config, is called exactly as before; a DDP wrapper keeps its
    # policy in .module
    lengths = torch.tensor([PROMPT])
    prefix = tiny_policy(tok, prompt_attention="bidirectional")
    assert prompt_arguments(prefix, lengths) == prompt_arguments(SimpleNamespace(module=prefix), lengths)
    assert prompt_arguments(prefix, lengths)["prompt_lengths"] is lengths
    assert prompt_arguments(tiny_policy(tok), lengths) == {} == prompt_arguments(torch.nn.Identity(), lengths)


def test_greedy_continuations_of_a_prefix_lm_read_only_the_episodes_prompt_as_its_prompt():
    # A continuation reads the whole history as its rollout prompt, but the policy must attend as it did in
    # the episode (only the episode's prompt both ways): then a greedy continuation's first action has the
    # episode's own log-probs.
    env = make_env("crafting", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=3, positions="rope", prompt_attention="bidirectional")
    b = collect_rollouts(model, tok, env, env.eval_tasks("deeper", 4), GREEDY, torch.Generator())
    points = [(i, t) for i, t in branch_points(b.episode_logs) if t > 0][:6]
    resumed = ResumedEpisodes(b.episode_logs, points, 1)
    cont = collect_rollouts(model, tok, resumed, [None] * len(points), GREEDY, torch.Generator())
    for r, (i, t) in enumerate(points):
        got, want = cont.old_logprobs[r][cont.turn_ids[r] == 0], b.old_logprobs[i][b.turn_ids[i] == t]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_tiny_crafting_sft_run_of_a_prefix_lm_learns_and_its_checkpoint_round_trips(tmp_path):
    cfg = recipe("crafting-quick", d_model=32, n_layers=2, n_heads=4, sft_batch_size=16, sft_steps=30,
                 sft_slip_prob=0.0, sft_slip_from=0, sft_lr_decay_steps=0, cpu_threads=1,
                 prompt_attention="bidirectional", seed=0)
    cfg = cfg.replace(env_options={**cfg.env_options, "reread": False, "eval_size": 2})
    result = train_sft(cfg, run_dir=str(tmp_path), progress=False)
    losses = [h["loss"] for h in result.history]
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5]), f"the SFT loss must fall: {losses}"
    policy, _, _ = load_checkpoint(tmp_path / "checkpoint.pt", expect=result.policy.cfg)
    assert policy.cfg.prompt_attention == "bidirectional"
    env = make_env("crafting", reread=False)
    batch = demonstration_batch(env, result.tokenizer, env.sample_tasks(1, 3))
    args = (batch.input_ids, batch.attention_mask)
    saved = policy(*args, prompt_lengths=batch.prompt_lengths)
    assert torch.equal(saved, result.policy.eval()(*args, prompt_lengths=batch.prompt_lengths))
