"""bench/bench_trl.py: without TRL (the runtime install) it says how to get it and runs nothing; with the ``trl``
extra, its multi-turn rollout hands TRL exactly what TRL must train on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_trl.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_trl", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="TRL is installed: the bench would run")
def test_without_trl_the_bench_says_how_to_install_it_and_writes_nothing(tmp_path, capsys):
    assert _bench().main(["--tiny", "--results", str(tmp_path / "t.json")]) == {}
    assert "pip install -e '.[trl]'" in capsys.readouterr().out
    assert not (tmp_path / "t.json").exists()


def test_the_trl_rollout_masks_the_environments_tokens_and_logs_the_samplers_logprobs():
    pytest.importorskip("transformers")
    from agent_lab.envs import make_env
    from agent_lab.policy import WordTokenizer

    b = _bench()
    tok = WordTokenizer.from_env(make_env("number-search"))
    model = b.gpt2(tok, seed=0)
    torch.manual_seed(0)
    eps = b.play(model, tok, list(range(1, 17)) * 2, greedy=False)
    for e in eps:
        ids = torch.tensor([e["prompt_ids"] + e["completion_ids"]])
        lp = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        lp = lp[len(e["prompt_ids"]) - 1:]  # the completion's tokens
        mask = torch.tensor(e["env_mask"], dtype=torch.bool)
        assert len(e["completion_ids"]) == len(e["env_mask"]) == len(e["logprobs"])
        # a sampled token's log-prob is the teacher-forced one of the whole transcript; the rest are 0
        torch.testing.assert_close(torch.tensor(e["logprobs"])[mask], lp[mask].detach(), atol=1e-5, rtol=1e-5)
        assert all(x == 0.0 for x, m in zip(e["logprobs"], e["env_mask"]) if not m)
        # the environment's answers are exactly its observations, unsampled
        unsampled = tok.decode([t for t, m in zip(e["completion_ids"], e["env_mask"]) if not m])
        assert [line for line in unsampled.split("\n") if line] == [o for o in e["observations"][:-1] if o], e
    # greedy play is deterministic and the tokenizer round-trips the environment's words
    assert b.play(model, tok, [5, 9], greedy=True)[0]["completion_ids"] == b.play(model, tok, [5, 9], True)[0][
        "completion_ids"]
    hf = b.hf_tokenizer(tok)
    assert hf("guess 8")["input_ids"] == tok.encode("guess 8")
