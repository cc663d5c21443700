"""The loop's contracts with what it calls: it branches with the discount the algorithm declares, the user's
functions travel on the run (RL steps only), and a phase runs the step of the phase the run is in."""

from __future__ import annotations

import pytest
from conftest import FAST

import agent_lab.trainer as T
from agent_lab.trainer import TrainConfig


class Captured(Exception):
    pass


def _run(tmp_path, **overrides) -> T.Run:
    cfg = TrainConfig(**{**FAST, "sft_steps": 0, "steps": 1, "run_dir": str(tmp_path), **overrides})
    return T.start_run(cfg, phases=("rl",))


def test_the_trainer_branches_with_the_discount_the_algorithm_declares(tmp_path, monkeypatch):
    """The loop reads gamma from ``continuations()``, not from an attribute the base class never declares."""
    run = _run(tmp_path, algo="vineppo")
    monkeypatch.setattr(run.algo, "continuations", lambda: (1, 0.5))  # its own gamma stays 1

    def record(*args, gamma, **kwargs):
        raise Captured(gamma)

    monkeypatch.setattr(T, "continuation_returns", record)
    with pytest.raises(Captured) as got:
        T.collect(run, 0)
    assert got.value.args == (0.5,) and run.algo.gamma == 1.0


def test_the_users_functions_travel_on_the_run_and_replace_rl_only(tmp_path):
    calls = []

    def advantage_fn(rewards, group_size):
        calls.append("advantage_fn")
        return rewards - rewards.mean()

    def loss_fn(logprobs, action_mask, advantages, max_tokens):
        calls.append("loss_fn")
        return -(logprobs * action_mask * advantages[:, None]).sum() / (len(advantages) * max_tokens)

    cfg = TrainConfig(**{**FAST, "sft_steps": 1, "steps": 1, "run_dir": str(tmp_path)})
    run = T.start_run(cfg, phases=("sft", "rl"), advantage_fn=advantage_fn, loss_fn=loss_fn)
    assert run.advantage_fn is advantage_fn and run.loss_fn is loss_fn
    assert "advantage: replaced by the user's advantage_fn(rewards, group_size)" in run.description
    assert f"loss: replaced by the user's {run.algo.loss_fn_signature}" in run.description
    T.sft_step(run, 0)
    assert calls == []  # the cold start trains on demonstrations with SFT's own loss
    T.rl_step(run, 1)
    assert calls == ["advantage_fn", "loss_fn"]
    plain = T.start_run(cfg.replace(run_dir=str(tmp_path / "plain")), phases=("sft", "rl"))
    assert "replaced by the user's" not in plain.description


def test_a_phase_runs_the_step_of_the_phase_the_run_is_in(tmp_path, monkeypatch):
    run = T.start_run(TrainConfig(**{**FAST, "sft_steps": 2, "steps": 2, "run_dir": str(tmp_path)}),
                      phases=("sft", "rl"))
    seen = []
    monkeypatch.setattr(T, "sft_step", lambda r, step: seen.append(("sft", step)) or {"step": step})
    monkeypatch.setattr(T, "rl_step", lambda r, step: seen.append(("rl", step)) or {"step": step})
    monkeypatch.setattr(T, "finish_step", lambda r, row, t, last: setattr(r, "step", row["step"] + 1))
    T.run_phase(run, 2, progress=False)
    T.run_phase(run, 4, progress=False)
    assert seen == [("sft", 0), ("sft", 1), ("rl", 2), ("rl", 3)]
