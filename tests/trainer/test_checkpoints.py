"""Reading a checkpoint is a trust boundary: weights only, size-capped, structure and architecture checked."""
from __future__ import annotations

import dataclasses
import os
import pickle
import zipfile

import pytest
import torch

from agent_lab.checkpoints import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer


def _policy(**cfg):
    tok = WordTokenizer([str(i) for i in range(20)])
    return TinyTransformer(ModelConfig(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2, max_len=32,
                                       **cfg)), tok


class _RunsCode:
    """What a hostile checkpoint carries: unpickling it calls os.system (here: creates a marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_the_trainers_checkpoint_round_trips_with_a_weights_only_load(tmp_path):
    m, tok = _policy()
    save_checkpoint(tmp_path / "c.pt", m, tok, step=3, history=[{"loss": 0.5}], config={"env": "number-search"})
    back, tok2, state = load_checkpoint(tmp_path / "c.pt", expect=m.cfg)
    ids = torch.randint(4, len(tok), (2, 7))
    assert torch.equal(back(ids), m.eval()(ids)) and tok2.vocab == tok.vocab and state["step"] == 3


def test_a_checkpoint_with_a_pickle_payload_is_refused_and_runs_nothing(tmp_path):
    m, tok = _policy()
    marker = tmp_path / "ran"
    state = {"model_config": m.cfg.to_dict(), "model": m.state_dict(), "tokenizer": tok.state_dict(),
             "extra": _RunsCode(marker)}
    torch.save(state, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="refused: it holds Python objects.*never runs code"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()
    # the same file under the unsafe load would have run it: the test can fail
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.exists()


def test_a_plain_pickle_file_is_refused(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "p.pt").write_bytes(pickle.dumps(_RunsCode(marker)))
    with pytest.raises(CheckpointError, match="not a torch checkpoint archive"):
        read_checkpoint(tmp_path / "p.pt")
    assert not marker.exists()


def test_a_different_architecture_is_refused_before_anything_is_built(tmp_path):
    m, tok = _policy()
    save_checkpoint(tmp_path / "c.pt", m, tok)
    expect = dataclasses.replace(m.cfg, d_model=32)
    with pytest.raises(CheckpointError, match=r"not the required architecture: d_model=16 \(expected 32\)"):
        load_checkpoint(tmp_path / "c.pt", expect=expect)


def test_weights_that_do_not_fit_their_config_are_refused(tmp_path):
    m, tok = _policy()
    state = {"model_config": dataclasses.replace(m.cfg, n_layers=2).to_dict(), "model": m.state_dict(),
             "tokenizer": tok.state_dict()}
    torch.save(state, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="weights do not fit its model_config"):
        load_checkpoint(tmp_path / "c.pt")


def test_oversized_files_are_refused_before_they_are_read(tmp_path):
    m, tok = _policy()
    path = save_checkpoint(tmp_path / "c.pt", m, tok)
    with pytest.raises(CheckpointError, match="over the limit of 1000 bytes"):
        read_checkpoint(path, max_bytes=1000)


def test_an_archive_that_unpacks_past_the_limit_is_refused(tmp_path):
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\0" * 5_000_000)
    assert path.stat().st_size < 100_000
    with pytest.raises(CheckpointError, match="unpacks to 5000000 bytes"):
        read_checkpoint(path, max_bytes=1_000_000)


@pytest.mark.parametrize("state, message", [
    ([1, 2], "holds a list, not a checkpoint dict"),
    ({"model": {}, "tokenizer": {"vocab": []}}, "no 'model_config' entry"),
    ({"model_config": {}, "model": {"w": 1}, "tokenizer": {"vocab": []}}, "'model' must map parameter names"),
    ({"model_config": {}, "model": {}, "tokenizer": {"vocab": [1]}}, "must hold a list of words"),
    ({"model_config": {"d_model": 16, "colour": 1}, "model": {}, "tokenizer": {"vocab": []}},
     "unknown field 'colour'"),
    ({"model_config": {"d_model": 15, "n_heads": 2}, "model": {}, "tokenizer": {"vocab": []}},
     "d_model must be divisible"),
])
def test_malformed_checkpoints_name_the_problem(tmp_path, state, message):
    torch.save(state, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "c.pt")


def test_damaged_and_missing_files(tmp_path):
    m, tok = _policy()
    path = save_checkpoint(tmp_path / "c.pt", m, tok)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a (readable )?torch checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")


def test_agent_lab_eval_refuses_a_hostile_checkpoint_in_one_line(tmp_path, capsys):
    from agent_lab.cli import main

    m, tok = _policy()
    marker = tmp_path / "ran"
    torch.save({"model_config": m.cfg.to_dict(), "model": m.state_dict(), "tokenizer": tok.state_dict(),
                "config": _RunsCode(marker)}, tmp_path / "evil.pt")
    assert main(["eval", str(tmp_path / "evil.pt"), "--env", "number-search"]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "Traceback" not in err and not marker.exists()
