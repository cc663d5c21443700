"""bench/_action_nll.py: the imitation loss by the token's role, against exact values from stub policies."""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from agent_lab.envs import make_env
from agent_lab.envs.crafting_world import apply_action, shortest_next
from agent_lab.policy import WordTokenizer
from agent_lab.rollout import demonstration_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _action_nll import ITEM_ROLES, ROLES, action_nll, action_roles  # noqa: E402


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


def test_the_set_score_charges_only_the_items_that_keep_the_plan_shortest(setting):
    """A uniform policy puts ``k / n`` on a set of k of the n items its position allows; the oracle, which knows
    the planner's item, at least that item's probability. Ties arise, so the two uniform scores differ."""
    env, tok, tasks = setting
    V = len(tok.vocab)
    out, known = action_nll(Uniform(V), env, tok, tasks), action_nll(Oracle(V), env, tok, tasks)
    batch = demonstration_batch(env, tok, tasks)
    for level in (1, 2, 3):
        expected = defaultdict(list)
        for r in [r for r, t in enumerate(tasks) if t["level"] == level]:
            task, inv, crafted = tasks[r], {}, False
            turns = batch.turn_ids[r]
            for t, (_, action) in enumerate(env.demonstrations([task])[0]):
                verb, item = action.split()[:2]
                items = shortest_next(task, inv, env.max_get)[verb]
                at = int((turns == t).nonzero()[1, 0])  # the item's position: the action's second token
                assert item in items and tok.vocab[int(batch.input_ids[r, at + 1])] == item
                allowed = int(batch.allowed_tokens[r, at].sum())
                role = "get item" if verb == "get" else "craft item, later" if crafted else "craft item, first"
                expected[role].append(math.log(allowed / len(items)))
                inv, crafted = apply_action(task, inv, action), crafted or verb == "craft"
        got = out[f"level {level}"]
        assert set(got) & set(ITEM_ROLES) == set(expected)
        for role, scores in expected.items():
            assert got[role]["set_nll"] == pytest.approx(sum(scores) / len(scores), rel=1e-5), (level, role)
            assert got[role]["set_nll"] <= got[role]["nll"] + 1e-6
            assert 0 <= known[f"level {level}"][role]["set_nll"] < V * math.exp(-30.0)
    assert any(out[g][r]["set_nll"] < out[g][r]["nll"] - 1e-3 for g in out for r in ITEM_ROLES if r in out[g])
