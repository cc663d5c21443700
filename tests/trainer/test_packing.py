"""Packing several transcripts into one row must not change a single logit or gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_policy

from agent_lab.envs import make_env
from agent_lab.policy import WordTokenizer
from agent_lab.policy.packing import pack_rows, packed_logits
from agent_lab.rollout import demonstration_batch


def test_pack_rows_places_every_sequence_once_within_capacity():
    lengths = [9, 3, 7, 2, 5, 5, 1, 8]
    rows = pack_rows(lengths, 10)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 10 for r in rows)
    assert len(rows) == 4  # 40 slots in all: first-fit decreasing fills 4 rows of 10 exactly; padding needs 8
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows([11], 10)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_packed_logits_and_gradients_equal_the_padded_pass_on_a_crafting_batch(positions):
    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    batch = demonstration_batch(env, tok, env.sample_tasks(np.random.default_rng(0), 12))
    lengths = batch.attention_mask.sum(1)
    assert len(pack_rows(lengths.tolist(), batch.input_ids.shape[1])) < 12  # mixed levels: packing saves rows
    model = tiny_policy(tok, positions=positions)
    am = batch.attention_mask
    plain = model(batch.input_ids, am)
    packed = packed_logits(model, batch.input_ids, am, min_saving=0.0)
    assert torch.allclose(packed[am], plain[am], atol=1e-5)
    assert not packed[~am].any()  # padding slots are zero
    # gradients of a loss over the real tokens agree too
    w = torch.randn_like(plain)
    g_plain = torch.autograd.grad((plain[am] * w[am]).sum(), list(model.parameters()))
    g_packed = torch.autograd.grad((packed_logits(model, batch.input_ids, am, min_saving=0.0)[am] * w[am]).sum(),
                                   list(model.parameters()))
    for a, b in zip(g_plain, g_packed):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_packed_logits_refuses_left_padding():
    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok)
    ids = torch.ones(2, 5, dtype=torch.long)
    am = torch.tensor([[True] * 5, [False, False, True, True, True]])
    with pytest.raises(ValueError, match="right-padded"):
        packed_logits(model, ids, am)


def test_packed_logits_falls_back_to_the_plain_pass_when_packing_saves_little():
    env = make_env("number-search")
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok)
    ids = torch.randint(0, len(tok), (6, 12))
    full = torch.ones(6, 12, dtype=torch.bool)  # rows of equal length: nothing to pack
    assert torch.equal(packed_logits(model, ids, full), model(ids, full))
    short = full.clone()
    short[:, 6:] = False  # every row half padding: two share a row, 3 rows instead of 6
    assert not torch.equal(packed_logits(model, ids, short, min_saving=0.0), model(ids, short))
    assert torch.allclose(packed_logits(model, ids, short)[short], model(ids, short)[short], atol=1e-5)


def test_rotary_positions_make_attention_depend_on_offsets_only():
    from agent_lab.policy.model import rotary, rotate

    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        return float((rotate(q, rotary(torch.tensor([[i]]), 8)) * rotate(k, rotary(torch.tensor([[j]]), 8))).sum())

    assert abs(score(7, 3) - score(104, 100)) < 1e-4 and abs(score(7, 3) - score(7, 4)) > 1e-3
