"""The benchmark scripts' code paths run (on the CPU, tiny sizes); their figures are printed, not asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_bench_exits_cleanly_without_cuda(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _load("gpu_bench").main([]) == {}
    assert "CUDA is not available" in capsys.readouterr().out


@pytest.mark.slow
def test_gpu_bench_tiny_cpu_path_runs_every_section(capsys):
    res = _load("gpu_bench").main(["--tiny"])
    out = capsys.readouterr().out
    for section in ("1. rollouts", "2. training step", "3. number search"):
        assert section in out
    assert res["rollout_tok_per_s"] > 0 and res["cache_speedup"] > 0


def test_gpu_bench_number_search_run_stops_at_its_time_limit(capsys):
    full = _load("gpu_bench").main(["--tiny", "--time-limit", "1000"])
    cut = _load("gpu_bench").main(["--tiny", "--time-limit", "1e-6"])
    assert full["number_search_steps"] > 1 and cut["number_search_steps"] == 1


def test_gpu_bench_knows_the_h200_bf16_peak():
    assert _load("gpu_bench").peak_flops("NVIDIA H200") == pytest.approx(989e12)


def test_rollout_bench_cache_and_recompute_draw_identical_samples(capsys):
    res = _load("bench_rollout").main(["--batch", "4", "--repeats", "1", "--d-model", "16", "--n-layers", "1"])
    assert res["identical_samples"] is True
    assert res["mean_tokens"] > 100, "the benchmark's crafting episodes should be long"


def test_packing_bench_saves_rows_and_keeps_the_logits(capsys):
    res = _load("bench_packing").main(["--batch", "8", "--batches", "2", "--d-model", "16", "--n-layers", "1"])
    assert res["rows_packed"] < res["rows_padded"] and 0 < res["real_token_share"] < 1
    assert res["max_logit_gap"] < 1e-4
    assert "packed" in capsys.readouterr().out


@pytest.mark.slow
def test_trainer_bench_crafting_path_reports_every_split_level_policy_and_mask(monkeypatch):
    bench = _load("bench_trainer")
    monkeypatch.setattr(bench, "CRAFTING_BUDGET", {"quick": (2, 1, 1)})
    monkeypatch.setattr(bench, "CRAFTING", {**bench.CRAFTING, "d_model": 16, "n_layers": 1, "n_heads": 2,
                                            "sft_batch_size": 4, "batch_size": 8, "group_size": 4})
    rows = bench.crafting("quick", eval_size=3)
    keys = {(r["policy"], r["mask"], r["split"]) for r in rows}
    assert keys == {(p, m, s) for p in ("cold start", "after Dr.GRPO") for m in (False, True)
                    for s in ("test", "held_out_goals", "deeper")}
    assert {r["group"] for r in rows if r["split"] == "deeper"} == {"level 4"}
    assert all(r["planner"] == 1.0 and 0.0 <= r["greedy"] <= 1.0 for r in rows)


@pytest.mark.slow
def test_trainer_bench_crafting_run_dir_keeps_the_run_and_resumes_it(monkeypatch, tmp_path):
    bench = _load("bench_trainer")
    monkeypatch.setattr(bench, "CRAFTING_BUDGET", {"quick": (2, 1, 1)})
    monkeypatch.setattr(bench, "CRAFTING", {**bench.CRAFTING, "d_model": 16, "n_layers": 1, "n_heads": 2,
                                            "sft_batch_size": 4, "batch_size": 8, "group_size": 4})
    import agent_lab.envs

    made, make_env = [], agent_lab.envs.make_env
    monkeypatch.setattr(agent_lab.envs, "make_env", lambda *a, **kw: made.append(kw) or make_env(*a, **kw))
    first = bench.crafting("quick", eval_size=3, probe_weight=1.0, probe_scope="prefix", probe_layer=1,
                           run_dir=str(tmp_path))  # the benchmark re-reads unless told not to
    saved = torch.load(tmp_path / "rl" / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 3 and saved["config"]["sft_probe_weight"] == 1.0
    assert saved["config"]["sft_probe_scope"] == "prefix" and saved["config"]["sft_probe_layer"] == 1
    assert saved["config"]["env_options"]["reread"] is True
    assert made and all(kw.get("reread") is True for kw in made), "the evaluation must reread as training did"
    again = bench.crafting("quick", eval_size=3, probe_weight=1.0, probe_scope="prefix", probe_layer=1,
                           run_dir=str(tmp_path))  # nothing left to train
    assert again == first


@pytest.mark.parametrize("argv, budget, reread", [([], "quick", True), (["--full"], "full", True),
                                                  (["--plain", "--crafting-budget", "long"], "long", False)])
def test_trainer_bench_crafting_flags_choose_budget_and_prompt(monkeypatch, capsys, argv, budget, reread):
    bench = _load("bench_trainer")
    calls = []
    monkeypatch.setattr(bench, "crafting", lambda mode, **kw: calls.append((mode, kw["reread"])) or [])
    bench.main(["--only", "crafting", *argv])
    assert calls == [(budget, reread)]
    assert bench.CRAFTING["env_options"]["reread"] is True and budget in bench.CRAFTING_BUDGET
