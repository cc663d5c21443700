"""SFT batches built a step ahead on a second thread (agent_lab.ahead, ``prepare_ahead``): the same batches,
the same run, bit for bit; the worker's seconds kept out of the step being timed; DAgger refused."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import FAST

from agent_lab import timing
from agent_lab.ahead import Ahead
from agent_lab.config import TrainConfig
from agent_lab.preflight import check_config
from agent_lab.trainer import train

BASE = {**FAST, "env": "crafting", "max_len": 320, "algo": "sft", "sft_steps": 5, "steps": 0, "sft_batch_size": 8,
        "sft_slip_prob": 0.5, "sft_lr_decay_steps": 2, "checkpoint_every": 1}


def test_ahead_returns_each_step_made_on_the_worker_after_the_first():
    threads = {}

    def make(k):
        threads[k] = threading.current_thread().name
        return k * k

    ahead = Ahead(make, end=4)
    assert [ahead.take(k)[0] for k in range(4)] == [0, 1, 4, 9]
    ahead.close()
    assert threads[0] == threading.current_thread().name, "nothing was prepared for the first step"
    assert all(threads[k].startswith("agent-lab-ahead") for k in (1, 2, 3))
    assert set(threads) == {0, 1, 2, 3}, "no step at or past end is made"


def test_ahead_makes_a_step_it_did_not_prepare_on_the_calling_thread():
    made = []
    ahead = Ahead(lambda k: made.append(k) or k, end=10)
    assert ahead.take(0) == (0, 0.0)
    assert ahead.take(5)[0] == 5  # step 1 was prepared, not 5: 5 is made here
    assert ahead.take(6)[0] == 6
    ahead.close()
    assert 5 in made and 6 in made


def test_an_error_in_the_worker_is_raised_by_the_take_of_its_step():
    def make(k):
        if k == 1:
            raise RuntimeError("step 1 failed")
        return k

    ahead = Ahead(make, end=3)
    ahead.take(0)
    with pytest.raises(RuntimeError, match="step 1 failed"):
        ahead.take(1)
    ahead.close()


def test_spans_on_another_thread_stay_out_of_this_threads_stopwatch():
    timing.take()

    def work():
        with timing.span("environment"):
            pass

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    with timing.span("loss"):
        pass
    assert set(timing.take()) == {"loss"}


def _losses(result) -> list[float]:
    return [h["loss"] for h in result.history]


def test_a_run_with_batches_prepared_ahead_is_the_same_run(tmp_path):
    plain = train(TrainConfig(**BASE), run_dir=str(tmp_path / "plain"), progress=False)
    ahead = train(TrainConfig(**BASE, prepare_ahead=True), run_dir=str(tmp_path / "ahead"), progress=False)
    assert _losses(ahead) == _losses(plain)
    for k, v in plain.policy.state_dict().items():
        assert torch.equal(v, ahead.policy.state_dict()[k]), f"parameter {k} differs"
    assert "ahead_s" not in plain.history[0]
    assert ahead.history[0]["ahead_s"] == 0.0, "the first step has nothing prepared"
    assert all(h["ahead_s"] > 0 for h in ahead.history[1:]), "later steps are built on the worker"


def test_a_resumed_run_with_batches_prepared_ahead_is_the_same_run(tmp_path, monkeypatch):
    from test_training_loop import interrupted

    cfg = TrainConfig(**BASE, prepare_ahead=True)
    whole = train(cfg, run_dir=str(tmp_path / "whole"), progress=False)
    interrupted(monkeypatch, cfg, tmp_path / "b", 3)
    resumed = train(cfg, run_dir=str(tmp_path / "b"), resume=True, progress=False)
    assert _losses(resumed) == _losses(whole)


def test_prepare_ahead_refuses_demonstrations_that_play_the_policy():
    with pytest.raises(ValueError, match="prepare_ahead=True .* dagger plays the current policy"):
        check_config(TrainConfig(**BASE, prepare_ahead=True, sft_dagger_prob=0.5))
    check_config(TrainConfig(**BASE, sft_dagger_prob=0.5))


def test_prepare_ahead_must_be_a_bool():
    with pytest.raises(ValueError, match="prepare_ahead must be True or False"):
        TrainConfig(prepare_ahead="yes")
