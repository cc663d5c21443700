"""Shared fixtures for the trainer tests: tiny models and configurations that run in seconds on 2 CPU cores."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # toy_env.py

from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    # the tests run beside other processes; one intra-op thread avoids OpenMP spin-waiting
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def tiny_policy(tok: WordTokenizer, seed: int = 0, **kw) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(ModelConfig(len(tok), **{"d_model": 32, "n_layers": 2, "n_heads": 4, **kw}))


def grouped_number_search_batch(policy_seed: int, groups: int, group_size: int, temperature: float = 1.0):
    """``(env, tokenizer, policy, batch)``: a tiny policy's masked rollouts of ``groups`` number-search tasks,
    ``group_size`` contiguous samples each."""
    from agent_lab.envs import make_env
    from agent_lab.rollout import SamplingConfig, collect_rollouts

    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=policy_seed)
    tasks = [t for t in env.sample_tasks(0, groups) for _ in range(group_size)]
    batch = collect_rollouts(model, tok, env, tasks, SamplingConfig(temperature=temperature, candidate_mask=True),
                             torch.Generator().manual_seed(0))
    return env, tok, model, batch


#: A fast TrainConfig for number search (a few steps of a tiny model).
FAST = dict(d_model=32, n_layers=1, n_heads=2, batch_size=32, group_size=4, sft_batch_size=16, eval_every=0,
            steps=2)


def _token_mean_pair(logprobs, action_mask, advantages, max_tokens):
    """A student loss normalised by the token count, returned as (numerator, denominator)."""
    m = action_mask.to(logprobs.dtype)
    return -(logprobs * m * advantages[:, None]).sum(), m.sum()


def _constant_scalar(logprobs, action_mask, advantages, max_tokens):
    """A student Dr.GRPO loss returned as one number: the normaliser B * max_tokens is fixed per sequence."""
    m = action_mask.to(logprobs.dtype)
    return -(logprobs * m * advantages[:, None]).sum() / (len(advantages) * max_tokens)


def _token_mean_scalar(logprobs, action_mask, advantages, max_tokens):
    """The token mean returned as one number: normalised per worker, so DDP's average is *not* global."""
    num, den = _token_mean_pair(logprobs, action_mask, advantages, max_tokens)
    return num / den


#: Student ``loss_fn`` forms checked under DDP (tests/trainer/test_distributed.py).
STUDENT_LOSSES = {"pair_token_mean": _token_mean_pair, "scalar_constant": _constant_scalar,
                  "scalar_token_mean": _token_mean_scalar}
