"""bench/_action_nll.py: the imitation loss by the token's role, against exact values from stub policies."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from agent_lab.envs import make_env
from agent_lab.policy import WordTokenizer
from agent_lab.rollout import demonstration_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _action_nll import ROLES, action_nll, action_roles  # noqa: E402


class Uniform(torch.nn.Module):
    """Equal logits everywhere: each token's probability is one over the tokens its position allows."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, attention_mask=None, segment_ids=None, **_):
        return torch.zeros(*input_ids.shape, self.vocab)


class Oracle(Uniform):
    """A logit of 30 on the next token of the same row, 0 elsewhere: nearly all the mass on it."""

    def forward(self, input_ids, attention_mask=None, segment_ids=None, **_):
        z = torch.zeros(*input_ids.shape, self.vocab)
        z[:, :-1].scatter_(-1, input_ids[:, 1:, None], 30.0)
        return z


@pytest.fixture(scope="module")
def setting():
    env = make_env("crafting", plan="fetch_full")
    tasks = env.eval_tasks("test", 9)  # levels 1, 2, 3 in turn
    tok = WordTokenizer.from_env(env)
    return env, tok, tasks


def test_roles_of_each_kind_of_action():
    assert action_roles(["get", "log", "8", "<nl>"], False) == ["verb", "get item", "get count", "end"]
    assert action_roles(["craft", "axe", "<nl>"], False) == ["verb", "craft item, first", "end"]
    assert action_roles(["craft", "axe", "<nl>"], True) == ["verb", "craft item, later", "end"]
    assert action_roles(["think", "a", ";", "<nl>"], False) == ["verb", "thought", "thought", "end"]
    assert action_roles(["craft", "axe", "axe", "<nl>"], True) == ["verb", "craft item, later", "other", "end"]
    assert action_roles(["<nl>"], False) == ["end"]
    assert action_roles(["get", "a", "1", "x", "<nl>"], False)[3] == "other" and "other" in ROLES


def test_a_uniform_policy_scores_each_token_the_log_of_the_tokens_its_position_allows(setting):
    env, tok, tasks = setting
    out = action_nll(Uniform(len(tok.vocab)), env, tok, tasks)
    batch = demonstration_batch(env, tok, tasks)
    for level in (1, 2, 3):  # by hand: every action token of the level's worlds, counted by kind of word
        rows = [r for r, t in enumerate(tasks) if t["level"] == level]
        mask = batch.turn_ids[rows] >= 0
        allowed = batch.allowed_tokens[rows].sum(-1).double()
        total = float(allowed.log()[mask].sum())
        got = out[f"level {level}"]
        assert sum(v["tokens"] for v in got.values()) == int(mask.sum())
        assert sum(v["nll"] * v["tokens"] for v in got.values()) == pytest.approx(total, rel=1e-6)  # float32 logits
        assert sum(v["share"] for v in got.values()) == pytest.approx(1.0)
        # a verb may be any word but the special tokens: the most any position allows
        assert got["verb"]["nll"] == pytest.approx(math.log(float(allowed[mask].max())), rel=1e-6)
        assert got["get count"]["tokens"] == got["get item"]["tokens"] == sum(
            a.startswith("get") for d in env.demonstrations([tasks[r] for r in rows]) for _, a in d)


def test_a_policy_that_knows_each_next_token_scores_nearly_nothing_and_keeps_its_training_mode(setting):
    env, tok, tasks = setting
    model = Oracle(len(tok.vocab)).train()
    out = action_nll(model, env, tok, tasks)
    assert model.training
    bound = len(tok.vocab) * math.exp(-30.0)  # -log(1 / (1 + (V-1) e^-30)) < V e^-30
    assert all(0 <= v["nll"] < bound for g in out.values() for v in g.values())
    crafts = sum(a.startswith("craft") for d in env.demonstrations(tasks) for _, a in d)
    assert sum(g.get(k, {}).get("tokens", 0) for g in out.values()
               for k in ("craft item, first", "craft item, later")) == crafts
    assert sum(g["craft item, first"]["tokens"] for g in out.values()) == len(tasks)
