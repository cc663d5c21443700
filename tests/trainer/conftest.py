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


#: A fast TrainConfig for number search (a few steps of a tiny model).
FAST = dict(d_model=32, n_layers=1, n_heads=2, batch_size=32, group_size=4, sft_batch_size=16, eval_every=0,
            steps=2)
