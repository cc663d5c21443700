"""Where a run's time went (agent_lab.diagnostics.time_profile, time_summary) and the benchmarks' profiling
helpers (bench/_profile.py) against hand-computed values, and the crafting profile benchmark at a tiny size."""

from __future__ import annotations

import json

import _profile as profile
import pytest
from conftest import tiny_policy
from test_benches import _load, as_saved

from agent_lab.device import cpu_fast_bf16
from agent_lab.diagnostics import format_shares, time_profile, time_summary
from agent_lab.policy import WordTokenizer

HISTORY = [
    {"step": 0, "phase": "sft", "time_demonstrations_s": 1.0, "time_loss_s": 3.0, "time_other_s": 0.0,
     "train_tokens": 600.0},
    {"step": 1, "phase": "dr_grpo", "time_sampling_s": 2.0, "time_environment_s": 1.0, "time_loss_s": 1.0,
     "time_other_s": 0.5, "train_tokens": 300.0, "rollout_tokens": 300.0},
    {"step": 2, "phase": "dr_grpo", "time_sampling_s": 2.0, "time_environment_s": 0.5, "time_loss_s": 1.0,
     "time_evaluation_s": 0.5, "time_other_s": 0.0, "train_tokens": 500.0, "rollout_tokens": 400.0},
]


def test_phases_sum_each_phase_over_the_chosen_rows_and_share_them():
    rl = time_profile(HISTORY, "rl")
    assert rl["steps"] == 2 and rl["seconds"] == 8.5
    assert rl["phase_seconds"] == {"sampling": 4.0, "environment": 1.5, "loss": 2.0, "other": 0.5,
                                   "evaluation": 0.5}
    assert rl["shares"]["sampling"] == 4.0 / 8.5 and sum(rl["shares"].values()) == pytest.approx(1.0)
    assert rl["train_tokens"] == 800.0 and rl["rollout_tokens"] == 700.0
    sft = time_profile(HISTORY, "sft")
    assert sft["steps"] == 1 and sft["phase_seconds"] == {"demonstrations": 1.0, "loss": 3.0, "other": 0.0}


def test_shares_are_listed_largest_first_and_cut_at_top():
    shares = {"loss": 0.25, "sampling": 0.6, "other": 0.15}
    assert format_shares(shares) == "sampling 60%, loss 25%, other 15%"
    assert format_shares(shares, 1) == "sampling 60%"


def test_the_time_summary_names_each_phases_largest_shares():
    assert time_summary(HISTORY, top=2) == ("where the time went: SFT: 1 steps, 4.0 s (loss 75%, demonstrations 25%); "
                                            "RL: 2 steps, 8.5 s (sampling 47%, loss 24%)")
    assert time_summary([{"step": 0, "phase": "sft", "loss": 1.0}]) == ""  # a history from before the phases


def test_throughput_divides_tokens_by_their_own_phases_seconds():
    rates = profile.throughput(time_profile(HISTORY, "rl"), flops_per_token=1e6, peak_gflops=2.0)
    assert rates["train_tokens_per_s"] == 400.0  # 800 tokens in 2 s of loss
    assert rates["rollout_tokens_per_s"] == 175.0  # 700 tokens in 4 s of sampling
    assert rates["train_gflops"] == pytest.approx(0.4) and rates["share_of_matmul_peak"] == pytest.approx(0.2)


def test_training_flops_count_each_multiplying_matrix_once_and_the_attention():
    tok = WordTokenizer(["a", "b", "c"])
    model = tiny_policy(tok, d_model=8, n_layers=2, n_heads=2)
    d, V = 8, len(tok)
    per_layer = d * 3 * d + d * d + d * 4 * d + 4 * d * d  # qkv, proj, fc, out
    n = 2 * per_layer + V * d  # the tied head counted once; no position table, biases or norms
    assert profile.train_flops_per_token(model, context=10.0) == 6 * n + 6 * 2 * 10.0 * d


def test_peak_memory_sees_an_allocation_inside_the_block():
    with profile.peak_memory() as mem:
        block = bytearray(b"x" * 200_000_000)
    assert mem["peak_gb"] >= 0.2 and block[:1] == b"x"


@pytest.mark.slow
def test_the_crafting_profile_bench_runs_every_arm_and_saves_them(tmp_path, capsys):
    bench = _load("bench_crafting_profile")
    # every setting an arm changes, in seven arms: bf16-sft-whole has those of bf16 and of sft-whole, prefix-bf16
    # those of prefix (whose RL piece runs here only because a tiny policy's starts from random weights)
    arms = ["recipe", "keep-rows", "whole-batch", "bf16-sft-whole", "prefix-bf16", "compile", "ahead"]
    assert {k for a in bench.ARMS for k in bench.ARMS[a]} == {k for a in arms for k in bench.ARMS[a]}
    got = bench.main(["--tiny", "--sft-steps", "4", "--rl-steps", "1", "--arms", *arms, "--threads", "1",
                      "--results", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert "recipe / whole-batch" in out and "recipe / keep-rows" in out and "matmul peak" in out
    saved = json.loads((tmp_path / "p.json").read_text())["sections"]["tiny"]["rows"][0]
    assert list(got) == ["tiny"] and as_saved(got["tiny"]) == [saved]
    assert saved["threads"] == 1 and "float32, 1 thread " in out  # --threads: every arm's, and the peak of their shares
    assert all(0 < r["median_step_s"] <= r["s_per_step"] * r["steps"] for r in saved["arms"])
    assert {(r["arm"], r["piece"], r["steps"]) for r in saved["arms"]} == {
        (arm, piece, steps) for arm in arms for piece, steps in (("SFT", 4), ("RL", 1))}
    # the bf16 arms autocast where this CPU has fast bf16 and say so; their shares are of that dtype's peak
    fast = cpu_fast_bf16() is not None
    for r in saved["arms"]:
        assert r["peak_dtype"] == ("bfloat16" if fast and "bf16" in r["arm"] else "float32"), r
        assert r["precision"].startswith("bfloat16" if r["peak_dtype"] == "bfloat16" else "float32"), r
