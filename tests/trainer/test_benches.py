"""The benchmark scripts' code paths run (on the CPU, tiny sizes); their figures are printed, not asserted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from _results import _finite_or_null
from conftest import grouped_number_search_batch

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_bench_exits_cleanly_without_cuda(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _load("gpu_bench").main(["--results", str(tmp_path / "g.json")]) == {}
    assert "CUDA is not available" in capsys.readouterr().out
    assert not (tmp_path / "g.json").exists()


@pytest.mark.slow
def test_gpu_bench_tiny_cpu_path_runs_every_section(capsys, tmp_path):
    saved = _load("gpu_bench").main(["--tiny", "--results", str(tmp_path / "g.json")])
    res = _saved_rows(tmp_path / "g.json", "tiny", saved)[0]
    assert saved["tiny"][0]["device"] == "cpu"
    out = capsys.readouterr().out
    for section in ("1. rollouts", "2. training step", "3. number search", "4. crafting"):
        assert section in out
    assert res["rollout_tok_per_s"] > 0 and res["cache_speedup"] > 0
    assert res["crafting_steps"] == 3 and set(res["crafting_ratios"]) >= {"test level 1"}
    assert res["logprob_gap_max"] < 1e-5, "measured before any update, the sampler and the trainer agree"


def test_gpu_bench_number_search_run_stops_at_its_time_limit(capsys, tmp_path):
    full = _load("gpu_bench").main(["--tiny", "--time-limit", "1000", "--results", str(tmp_path / "g.json")])
    cut = _load("gpu_bench").main(["--tiny", "--time-limit", "1e-6", "--results", str(tmp_path / "g.json")])
    assert full["tiny"][0]["number_search_steps"] > 1 and cut["tiny"][0]["number_search_steps"] == 1
    assert _saved_rows(tmp_path / "g.json", "tiny", cut)[0]["number_search_steps"] == 1  # the last run's


def test_gpu_bench_finds_the_largest_micro_batch_that_fits(monkeypatch):
    # a stand-in device that holds steps of at most 40 episodes: doubling from 8 stops at 32
    bench = _load("gpu_bench")
    env, tok, model, batch = grouped_number_search_batch(0, 2, 4)
    sizes = []

    def step(model, big, env, amp, micro):
        sizes.append(len(big))
        if len(big) > 40:
            raise torch.cuda.OutOfMemoryError("stand-in")
        return 0.0

    monkeypatch.setattr(bench, "peak_step_memory", step)
    assert bench.largest_micro_batch(model, batch, env, None) == 32
    assert sizes == [8, 16, 32, 64]


def test_gpu_bench_knows_the_h200_bf16_peak():
    assert _load("gpu_bench").peak_flops("NVIDIA H200") == pytest.approx(989e12)


def test_rollout_bench_cache_and_recompute_draw_identical_samples(tmp_path, capsys):
    saved = _load("bench_rollout").main(["--batch", "4", "--repeats", "1", "--d-model", "16", "--n-layers", "1",
                                         "--results", str(tmp_path / "r.json")])
    (res,) = _saved_rows(tmp_path / "r.json", "crafting", saved)
    assert res["identical_samples"] is True
    assert res["mean_tokens"] > 100, "the benchmark's crafting episodes should be long"


def as_saved(x):
    """``x`` as bench/_results.py writes it: JSON, with a figure never reached (inf, nan) as null."""
    return json.loads(json.dumps(_finite_or_null(x)))


def _saved_rows(path: Path, section: str, returned: dict) -> list[dict]:
    """The rows ``main`` saved as ``section`` of ``path``, checked to be all it returned, with provenance."""
    saved = json.loads(path.read_text())["sections"][section]
    assert {"command", "date", "machine", "commit"} <= set(saved)
    assert list(returned) == [section] and as_saved(returned[section]) == saved["rows"]
    return saved["rows"]


def test_micro_batch_bench_measures_each_size_in_its_own_process_with_the_same_gradient(tmp_path, capsys):
    saved = _load("bench_micro_batches").main(["--batch", "6", "--d-model", "16", "--n-layers", "1", "--sizes",
                                               "0", "2", "--results", str(tmp_path / "m.json")])
    rows = _saved_rows(tmp_path / "m.json", "cpu", saved)
    assert [r["micro_batch_size"] for r in rows] == [0, 2]
    assert all(r["peak_step_mib"] >= 0 for r in rows) and rows[1]["max_grad_difference"] < 1e-5


def test_packing_bench_saves_rows_and_keeps_the_logits(tmp_path, capsys):
    saved = _load("bench_packing").main(["--batch", "8", "--batches", "2", "--d-model", "16", "--n-layers", "1",
                                         "--results", str(tmp_path / "p.json")])
    (res,) = _saved_rows(tmp_path / "p.json", "crafting-sft", saved)
    assert res["rows_packed"] < res["rows_padded"] and 0 < res["real_token_share"] < 1
    assert res["max_logit_gap"] < 1e-4
    assert "packed" in capsys.readouterr().out


TINY = dict(d_model=16, n_layers=1, n_heads=2, sft_batch_size=4, batch_size=8, group_size=4, sft_steps=2,
            sft_slip_from=1, sft_lr_decay_steps=1, steps=1)


@pytest.mark.slow
def test_trainer_bench_crafting_path_reports_every_split_level_policy_and_mask():
    rows, costs = _load("bench_trainer").crafting("crafting-quick", eval_size=3, **TINY)
    assert costs["SFT"]["steps"] == 2 and costs["RL"]["steps"] == 1 and costs["RL"]["phase_seconds"]["sampling"] > 0
    assert 0 < costs["SFT"]["peak_gb"] < 100 and 0 < costs["RL"]["peak_gb"] < 100
    keys = {(r["policy"], r["mask"], r["split"]) for r in rows}
    assert keys == {(p, m, s) for p in ("cold start", "after Dr.GRPO") for m in (False, True)
                    for s in ("test", "held_out_goals", "deeper")}
    assert {r["group"] for r in rows if r["split"] == "deeper"} == {"level 4"}
    assert all(r["planner"] == 1.0 and 0.0 <= r["greedy"] <= 1.0 for r in rows)


@pytest.mark.slow
def test_trainer_bench_crafting_run_dir_keeps_the_run_and_resumes_it(monkeypatch, tmp_path):
    bench = _load("bench_trainer")
    import agent_lab.envs

    made, make_env = [], agent_lab.envs.make_env
    monkeypatch.setattr(agent_lab.envs, "make_env", lambda *a, **kw: made.append(kw) or make_env(*a, **kw))
    first, _ = bench.crafting("crafting-quick", eval_size=3, run_dir=str(tmp_path), **TINY)  # re-reads by default
    saved = torch.load(tmp_path / "rl" / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 3 and saved["config"]["plugins"]["recovery_demonstrations"] == {"prob": 0.5, "from_step": 1}
    assert saved["config"]["env_options"]["reread"] is True
    assert made and all(kw.get("reread") is True for kw in made), "the evaluation must reread as training did"
    again, _ = bench.crafting("crafting-quick", eval_size=3, run_dir=str(tmp_path), **TINY)  # nothing left to train
    assert again == first


@pytest.mark.parametrize("argv, name, reread", [([], "crafting-quick", True), (["--full"], "crafting-full", True),
                                                (["--plain", "--crafting-budget", "long"], "crafting-long", False)])
def test_trainer_bench_crafting_flags_choose_the_recipe_and_prompt(monkeypatch, capsys, tmp_path, argv, name, reread):
    bench = _load("bench_trainer")
    calls = []
    monkeypatch.setattr(bench, "crafting", lambda n, **kw: calls.append((n, kw["reread"])) or ([], {}))
    bench.main(["--only", "crafting", "--results", str(tmp_path / "r.json"), *argv])
    assert calls == [(name, reread)]


def test_trainer_bench_runs_exactly_the_recipes_the_cli_lists_and_records_them(monkeypatch, capsys, tmp_path):
    from agent_lab.cli import main as cli_main
    from agent_lab.recipes import RECIPES

    bench = _load("bench_trainer")
    ran = []
    monkeypatch.setattr(bench, "train", lambda cfg, progress: ran.append(cfg) or _fake_result(cfg))
    results = tmp_path / "results.json"
    bench.main(["--only", "number-search", "--full", "--seeds", "1", "--results", str(results)])
    names = [r["recipe"] for r in __import__("json").loads(results.read_text())["sections"]["number-search"]["rows"]]
    assert names == [n for n, r in RECIPES.items() if r.bench == "number-search"]
    rows = __import__("json").loads(results.read_text())["sections"]["number-search"]["rows"]
    assert all(run["steps"] == 5 and run["reached_step"] == 5 for row in rows for run in row["runs"])
    assert [c.to_dict() for c in ran] == [RECIPES[n].config(seed=0, time_limit_s=900.0, cpu_threads=0).to_dict() for n in names]
    monkeypatch.setattr("agent_lab.recipes.results_file", lambda: results)
    capsys.readouterr()
    assert cli_main(["recipes"]) == 0
    listed = capsys.readouterr().out
    for n in names:
        assert f"\n{n}" in "\n" + listed and "measured by make bench" in listed
    assert "crafting-quick" in listed and "not measured on this machine yet" in listed


def _fake_result(cfg):
    from types import SimpleNamespace

    return SimpleNamespace(reached_optimum_at={"step": 5, "seconds": 1.5, "episodes": 1280}, seconds=2.0,
                           history=[{"step": k} for k in range(5)], final_eval=SimpleNamespace(success=15 / 16))


def test_credit_training_bench_runs_every_arm_from_one_cold_start(tmp_path, capsys):
    rows = _load("bench_credit_training").main(["--tiny", "--results", str(tmp_path / "c.json")])["tiny"]
    assert [r["arm"] for r in rows] == ["cold start", "Dr.GRPO", "GiGPO, state anchors", "GiGPO, history anchors",
                                        "PPO, turn critic (GAE)", "VinePPO, 2 branches per turn"]
    assert all(r["episodes"] == 16 for r in rows[1:-1]), "one step of 16 episodes per arm"
    assert rows[-1]["episodes"] > 16 * 2, "VinePPO's continuations (2 per turn) count as episodes"
    for r in rows:
        for v in r["eval"].values():
            assert v["ci_low"] <= v["success"] <= v["ci_high"]
            levels = v["by_level"].values()  # the split's tasks, partitioned by level
            assert sum(g["n"] for g in levels) == v["n"]
            assert sum(g["n"] * g["success"] for g in levels) == pytest.approx(v["n"] * v["success"])
    import json

    saved = json.loads((tmp_path / "c.json").read_text())["sections"]["tiny"]
    assert saved["rows"] == json.loads(json.dumps(rows))


def test_the_crafting_budgets_differ_only_in_their_step_counts():
    """The peak memory per step that bench_memory measures once for crafting-quick, -full and -long (and the
    profile's, bench_crafting_profile) holds for every crafting budget, because nothing else differs between them."""
    from agent_lab.recipes import recipe

    bench = _load("bench_memory")
    assert bench.groups() == [["crafting-quick", "crafting-full", "crafting-long"], ["crafting-assignment"]]
    assert bench.without_budget("crafting-long") == bench.without_budget("crafting-quick")
    assert bench.without_budget("crafting-long") != bench.without_budget("crafting-assignment")
    assert recipe("crafting-long").sft.steps > recipe("crafting-full").sft.steps  # the budgets do differ


@pytest.mark.slow
def test_memory_bench_measures_each_piece_at_the_recipe_settings(monkeypatch, tmp_path):
    bench = _load("bench_memory")
    tiny = {k: v for k, v in TINY.items() if k not in ("sft_steps", "sft_slip_from", "sft_lr_decay_steps", "steps")}
    made = []
    real_sft = bench.train_sft
    monkeypatch.setattr(bench, "train_sft", lambda cfg, **kw: made.append(cfg) or real_sft(cfg, **kw))
    rows = bench.pieces(["crafting-quick"], 2, 1, 2, **tiny)
    assert [r["piece"] for r in rows] == ["SFT", "RL, random weights", "evaluation"]
    assert all(0 < r["peak_gb"] < 100 and r["seconds"] > 0 for r in rows)
    assert made[0].plugins["recovery_demonstrations"] == {"prob": 0.5, "from_step": 0}  # slips from the first step
    monkeypatch.setattr(bench, "run_group", lambda names, args: [{"recipes": ", ".join(names), "piece": "SFT",
                                                                   "steps": 1, "seconds": 1.0, "peak_gb": 2.5}])
    saved = bench.main(["--results", str(tmp_path / "m.json")])
    assert [r["within_target"] for r in saved["crafting"]] == [False, False]
    section = json.loads((tmp_path / "m.json").read_text())["sections"]["crafting"]
    assert saved == {"crafting": section["rows"]}
    assert section["command"] == f"python bench/bench_memory.py --results {tmp_path}/m.json"


def test_trainer_bench_quick_number_search_budget_is_steps_not_seconds(monkeypatch, tmp_path):
    """Whether a seed reaches the optimum must not depend on how fast the machine is that day: the quick run caps
    the RL steps and sets no time limit; recipes with fewer steps keep theirs."""
    from agent_lab.recipes import RECIPES

    bench = _load("bench_trainer")
    ran = []
    monkeypatch.setattr(bench, "train", lambda cfg, progress: ran.append(cfg) or _fake_result(cfg))
    bench.main(["--only", "number-search", "--seeds", "1", "--results", str(tmp_path / "r.json")])
    names = [n for n, r in RECIPES.items() if r.bench == "number-search" and not r.full_only]
    want = [RECIPES[n].config(seed=0, cpu_threads=0) for n in names]
    want = [c.replace(steps=bench.QUICK_STEPS) if c.algorithm.steps > bench.QUICK_STEPS else c for c in want]
    assert [c.to_dict() for c in ran] == [c.to_dict() for c in want]
    assert all(c.run.time_limit_s is None for c in ran) and any(c.algorithm.steps == bench.QUICK_STEPS for c in ran)


def test_sft_batch_bench_curve_means_the_losses_of_each_window():
    bench = _load("bench_sft_batch")
    history = [{"step": k, "elapsed_s": s, "loss": loss}
               for k, (s, loss) in enumerate([(1.0, 4.0), (2.0, 2.0), (5.0, 1.0), (11.0, 0.5), (12.0, 0.25)])]
    assert bench.loss_curve(history, window_s=4.0) == [
        {"seconds": 4.0, "steps": 2, "loss": 3.0},  # steps 0-1 ended in the first window
        {"seconds": 8.0, "steps": 3, "loss": 1.0},  # the second window: step 2 only; the third had no step end
        {"seconds": 12.0, "steps": 5, "loss": 0.375}]


def test_sft_batch_bench_arms_differ_only_in_their_batch(monkeypatch, tmp_path):
    bench = _load("bench_sft_batch")
    made = []
    real_sft = bench.train_sft
    monkeypatch.setattr(bench, "train_sft", lambda cfg, **kw: made.append(cfg) or real_sft(cfg, **kw))
    tiny = dict(d_model=16, n_layers=1, n_heads=2)
    rows = [bench.arm(b, 1.0, 0, 3, str(tmp_path / str(b)), **tiny) for b in (4, 2)]
    assert [r["demonstrations"] for r in rows] == [4 * rows[0]["steps"], 2 * rows[1]["steps"]]
    assert all(r["seconds"] >= 1.0 and r["curve"][-1] == {"seconds": 1.0, "steps": r["steps"] - 1,
                                                          "loss": r["last_loss"]} for r in rows)
    assert [c.sft.batch_size for c in made] == [4, 2]
    a, b = (c.to_dict() for c in made)
    a["sft"].pop("batch_size"), b["sft"].pop("batch_size")
    assert a == b and made[0].run.time_limit_s == 1.0 and made[0].run.cpu_threads == 1
    assert made[0].plugins["recovery_demonstrations"]["from_step"] == bench.ENOUGH_STEPS - 1  # no slips
    assert made[0].sft.lr_decay_steps == 0 and made[0].sft.lr == bench.recipe(bench.RECIPE).sft.lr
    monkeypatch.setattr(bench, "run_arms", lambda args: rows)
    saved = bench.main(["--results", str(tmp_path / "s.json")])
    section = json.loads((tmp_path / "s.json").read_text())["sections"]["seed 0"]
    assert section["rows"] == rows and section["command"].startswith("python bench/bench_sft_batch.py")
    assert saved == {"seed 0": rows}
