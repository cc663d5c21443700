"""Where a step's time goes (agent_lab.timing, the trainer's ``time_<phase>_s`` columns), the tokens it trained
on, and the memory a run hands back after each step (agent_lab.device.release_freed_memory)."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import FAST, grouped_number_search_batch

from agent_lab import device, timing
from agent_lab import trainer as trainer_module
from agent_lab.algorithms import make_algorithm
from agent_lab.diagnostics import phase_times
from agent_lab.trainer import train
from agent_lab.update import gradient_step


class FakeClock:
    """``time.perf_counter`` that advances only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_nested_span_counts_its_seconds_once_in_the_innermost_phase(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    watch = timing.Stopwatch()
    with watch.span("sampling"):
        clock.now += 2.0
        with watch.span("environment"):
            clock.now += 0.5
        clock.now += 1.0
        with watch.span("environment"):
            clock.now += 0.25
    with watch.span("loss"):
        clock.now += 4.0
    assert watch.take() == {"sampling": 3.0, "environment": 0.75, "loss": 4.0}
    assert watch.take() == {}  # take starts again from nothing


def test_a_span_that_raises_still_counts_and_closes(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    watch = timing.Stopwatch()
    with pytest.raises(RuntimeError), watch.span("loss"):
        clock.now += 1.5
        raise RuntimeError("boom")
    with watch.span("optimizer"):  # not nested in the failed span
        clock.now += 1.0
    assert watch.take() == {"loss": 1.5, "optimizer": 1.0}


def test_phase_times_name_each_phase_and_leave_the_rest_to_other():
    row = phase_times({"loss": 0.5, "sampling": 1.25, "environment": 0.25}, seconds=2.5)
    assert row == {"time_environment_s": 0.25, "time_sampling_s": 1.25, "time_loss_s": 0.5, "time_other_s": 0.5}
    assert list(row)[:3] == ["time_environment_s", "time_sampling_s", "time_loss_s"]  # timing.PHASES order


@pytest.mark.parametrize("micro_batch_size", [0, 3])
def test_an_update_counts_every_real_token_of_its_batch_once(micro_batch_size):
    env, tok, model, batch = grouped_number_search_batch(policy_seed=0, groups=2, group_size=4)
    assert not bool(batch.attention_mask.all())  # episodes of different lengths: padding is no token
    algo = make_algorithm("dr_grpo", group_size=4, max_tokens=int(env.max_policy_tokens))
    out = gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, algo.advantages(batch, None),
                        algo, grad_clip=1e9, micro_batch_size=micro_batch_size)
    assert out["train_tokens"] == float(sum(int(row.sum()) for row in batch.attention_mask))


def test_every_step_logs_its_phases_and_they_add_up_to_its_seconds(tmp_path):
    result = train(env="number-search", sft_steps=2, **FAST, run_dir=str(tmp_path), progress=False)
    sft, rl = result.history[:2], result.history[2:]
    for row in sft:
        assert row["time_demonstrations_s"] > 0 and row["time_loss_s"] > 0 and row["time_optimizer_s"] > 0
        assert "time_sampling_s" not in row and row["train_tokens"] > 0
    for row in rl:
        for phase in ("environment", "sampling", "advantages", "loss", "optimizer"):
            assert row[f"time_{phase}_s"] > 0, phase
        assert row["rollout_tokens"] >= row["train_tokens"] > 0  # the update trains on every sampled token once
    last = result.history[-1]
    assert last["time_evaluation_s"] > 0  # the last step evaluates
    for row in result.history:
        spent = sum(v for k, v in row.items() if k.startswith("time_"))
        if "time_evaluation_s" not in row:  # step_s is the step before its evaluation
            assert spent == pytest.approx(row["step_s"], abs=5e-3)
        assert spent >= row["step_s"] - 5e-3


def test_the_trainer_offers_its_freed_memory_back_after_every_step_and_rollout_and_returns_it_at_the_end(
        monkeypatch, tmp_path):
    calls, released = [], []
    monkeypatch.setattr(device.HeapTrimmer, "__call__", lambda self, step_s: calls.append(step_s) or False)
    monkeypatch.setattr(trainer_module, "release_freed_memory", lambda: released.append(len(calls)))
    result = train(env="number-search", sft_steps=1, **FAST, run_dir=str(tmp_path), progress=False)
    sft, *rl = result.history
    assert len(rl) == 2
    # the SFT step; then each RL step's rollouts (offered with their own seconds) and the step (with its
    # evaluation and checkpoint, which step_s leaves out)
    assert len(calls) == 5 and [calls[1], calls[3]] == [rl[0]["rollout_s"], rl[1]["rollout_s"]]
    assert all(c >= row["step_s"] for c, row in zip(calls[::2], result.history))
    assert released == [5]  # once, when the run has finished


def test_a_short_step_is_trimmed_only_when_held_memory_grows_by_the_slack_over_its_level(monkeypatch):
    resident, trims = [1000], []
    monkeypatch.setattr(device, "resident_bytes", lambda: resident[0])
    monkeypatch.setattr(device, "release_freed_memory", lambda: trims.append(resident[0]))
    trim = device.HeapTrimmer(slack=500, long_step_s=1.0)
    assert not trim(0.5) and trim.level == 1000  # the first step sets the level
    resident[0] = 1499
    assert not trim(0.5) and trims == [] and trim.level == 1000  # grown by 499 < 500
    resident[0] = 1500
    assert trim(0.5) and trims == [1500] and trim.level is None  # grown by the slack: trimmed
    resident[0] = 1200
    assert not trim(0.99) and trim.level == 1200  # the step after a trim sets the new level
    resident[0] = 1700
    assert trim(0.5) and trims == [1500, 1700]
    monkeypatch.setattr(device, "resident_bytes", lambda: None)
    assert not trim(5.0)  # memory that cannot be read is never trimmed


def test_a_long_step_is_trimmed_every_time(monkeypatch):
    trims = []
    monkeypatch.setattr(device, "resident_bytes", lambda: 1000)
    monkeypatch.setattr(device, "release_freed_memory", lambda: trims.append(1))
    trim = device.HeapTrimmer(slack=500, long_step_s=1.0)
    assert trim(1.0) and trim(3.0) and not trim(0.5) and trim(2.0)
    assert trims == [1, 1, 1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_released_memory_leaves_the_process():
    # Blocks under glibc's mmap threshold come from the heap; a block kept at the top stops free() from
    # shrinking it, so without the trim the freed 40 MB below it stay resident.
    blocks = [b"x" * 100_000 for _ in range(400)]
    keep = b"y" * 100_000
    del blocks
    held = device.resident_bytes()
    device.release_freed_memory()
    after = device.resident_bytes()
    assert held - after > 20e6, (held, after)
    assert keep[:1] == b"y"


_LARGE_BLOCK = """
import sys
from agent_lab import device
if sys.argv[1] == "train":  # a run fixes the allocator's threshold for large blocks (map_large_blocks)
    from agent_lab.trainer import train
    train(env="number-search", steps=1, batch_size=8, group_size=4, eval_every=0, progress=False)
big = b"x" * (16 << 20)
del big  # a mapped block freed: glibc's own threshold would now rise past 16 MiB
block = b"x" * (8 << 20)
held = device.resident_bytes()
del block
print(held - device.resident_bytes())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_after_a_run_starts_a_freed_large_block_leaves_the_process_at_once():
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}

    def released(mode):
        out = subprocess.run([sys.executable, "-c", _LARGE_BLOCK, mode], env=env, capture_output=True, text=True,
                             check=True)
        return int(out.stdout.split()[-1])

    # Left to itself, glibc serves the 8 MiB block from the heap after the 16 MiB one was freed, and keeps it.
    assert released("plain") < 2e6
    assert released("train") > 6e6  # the run's fixed threshold: mapped on its own, unmapped when freed
