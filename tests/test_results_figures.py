"""agent_lab.results_figures: the figures behind the results page's sentences, exactly, on small made-up rows;
and every figure draws from the committed benchmark records at the book's width."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from agent_lab import results_figures as rf  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def test_a_curve_holds_each_evaluation_until_the_next():
    curve = [(0, 0.0), (10, 0.5), (20, 1.0)]
    assert [rf.held(curve, x) for x in (0, 5, 10, 19, 25)] == [0.0, 0.0, 0.5, 0.5, 1.0]


def test_the_median_curve_starts_where_every_seed_has_started_and_holds_ended_seeds():
    a = [(0, 0.0), (10, 0.5), (20, 1.0)]
    b = [(5, 0.25), (15, 0.75)]
    c = [(0, 0.0), (30, 1.0)]
    # from 5 (b's first point); at 10: a 0.5, b 0.25, c 0.0; after 15 b holds 0.75, after 20 a holds 1.0
    assert rf.median_curve([a, b, c]) == [(5, 0.0), (10, 0.25), (15, 0.5), (20, 0.75), (30, 1.0)]
    # without holding, the median ends with b, the shortest seed
    assert rf.median_curve([a, b, c], hold=False) == [(5, 0.0), (10, 0.25), (15, 0.5)]
    assert rf.median_curve([]) == [] and rf.median_curve([[], a]) == a


def _number_search_row(name, episodes):
    runs = [{"reached_episodes": e, "reached_s": None if e is None else e / 100} for e in episodes]
    got = sorted(e for e in episodes if e is not None)
    return {"recipe": name, "runs": runs, "reached": f"{len(got)}/{len(episodes)}",
            "median_episodes": got[len(got) // 2] if len(got) == len(episodes) else None}


def test_number_search_facts_rank_recipes_and_split_supervised_from_rl():
    rows = [_number_search_row("rl-a", [300, 100, 200]), _number_search_row("sup", [50, 60, 70]),
            _number_search_row("rl-b", [90, 80, 95]), _number_search_row("never", [None, 10, 10])]
    f = rf.number_search_facts(rows, {"sup"})
    assert f["ranked"] == ["sup", "rl-b", "rl-a"]  # "never" has no median
    assert f["reached_everywhere"] == 3 and f["recipes"] == 4
    assert f["fastest_supervised"] == (60, "sup") and f["fastest_rl"] == (90, "rl-b")
    assert f["slowest_rl"] == (200, "rl-a")
    assert not rf.has_curves(rows)
    rows = [dict(r, runs=[dict(run, curve=[{"episodes": 1, "seconds": 1, "greedy": 0}]) for run in r["runs"]])
            for r in rows]
    assert rf.has_curves(rows)


def _trl(seed, side, steps, seconds, final, at_these=None, best=0.0):
    row = {"seed": seed, "side": side, "steps": steps, "seconds": seconds, "final_greedy": final,
           "curve": [[100, 0.0], [200, best]]}
    if at_these is not None:
        row["agent_lab_greedy_at_these_episodes"] = at_these
    return row


def test_trl_facts_give_each_seeds_update_rate_ratio_and_the_gap_at_equal_episodes():
    rows = [_trl(0, "agent-lab x", 300, 100.0, 0.25, best=0.25), _trl(0, "TRL y", 150, 100.0, 0.0625, 0.125),
            _trl(1, "agent-lab x", 200, 100.0, 0.0), _trl(1, "TRL y", 160, 100.0, 0.0, 0.0, best=0.125)]
    f = rf.trl_facts(rows)
    assert f["seeds"][0]["ratio"] == pytest.approx(2.0) and f["seeds"][1]["ratio"] == pytest.approx(1.25)
    assert (f["ratio_min"], f["ratio_max"]) == (pytest.approx(1.25), pytest.approx(2.0))
    assert f["greedy_gap_max"] == pytest.approx(0.0625)
    assert f["best_greedy"] == {"agent-lab": 0.25, "TRL": 0.125}


def test_no_mask_facts_count_the_seeds_that_reached_the_optimum():
    runs = [{"recipe": "a", "reached_s": None, "final_greedy": 0.0625, "sampled_success": 0.25},
            {"recipe": "a", "reached_s": None, "final_greedy": 0.125, "sampled_success": 0.2},
            {"recipe": "b", "reached_s": 3.0, "final_greedy": 0.9375, "sampled_success": 0.7},
            {"recipe": "b", "reached_s": 5.0, "final_greedy": 0.9375, "sampled_success": 0.8}]
    f = rf.no_mask_facts(runs)
    assert f["a"] == {"seeds": 2, "reached": 0, "median_s": None, "greedy": 0.09375, "sampled": 0.225}
    assert f["b"]["reached"] == 2 and f["b"]["median_s"] == 4.0


def test_crafting_change_reads_the_cold_start_and_the_rl_policy_of_one_cell():
    rows = [{"policy": p, "mask": m, "split": "test", "group": "level 3", "greedy": g}
            for p, m, g in (("cold start", False, 0.82), ("after Dr.GRPO", False, 0.74),
                            ("cold start", True, 0.94), ("after Dr.GRPO", True, 0.96))]
    assert rf.crafting_change(rows, "test", "level 3", mask=False) == (0.82, 0.74)
    assert rf.crafting_change(rows, "test", "level 3", mask=True) == (0.94, 0.96)


def test_profile_facts_take_the_peak_at_the_runs_thread_count():
    row = {"threads": 1, "matmul_peak_gflops": {"float32, 1 thread": 100.0, "float32, 2 threads": 190.0},
           "arms": [{"arm": "recipe", "piece": "SFT", "shares": {"loss": 0.7, "sampling": 0.3},
                     "train_gflops": 25.0, "share_of_matmul_peak": 0.25}]}
    assert rf.profile_peak(row) == ("float32, 1 thread", 100.0)
    arm = rf.profile_facts(row)["arms"]["recipe, SFT"]
    assert arm["largest"] == "loss" and arm["of_peak"] == 0.25 == arm["recorded_of_peak"]


def test_grading_facts_set_the_spread_within_a_grader_against_the_gap_between_graders():
    rows = [{"grader": g, "workers": 1, "s_per_submission": s} for g, s in
            (("old", 14.0), ("new", 25.0), ("new", 24.0), ("old", 24.0))]
    f = rf.grading_facts(rows)[1]
    assert f["means"] == {"old": 19.0, "new": 24.5}
    assert f["spread"] == 10.0 and f["between"] == 5.5


def _arm(seed, arm, success, low, high):
    return {"seed": seed, "arm": arm, "eval": {"t": {"success": success, "ci_low": low, "ci_high": high}}}


def test_arms_facts_find_intervals_above_the_baseline_and_whether_the_arms_overlap():
    rows = [_arm(0, "cold start", 0.5, 0.4, 0.6), _arm(0, "a", 0.8, 0.7, 0.9), _arm(0, "b", 0.6, 0.45, 0.75),
            _arm(1, "cold start", 0.5, 0.4, 0.6), _arm(1, "a", 0.9, 0.85, 0.95), _arm(1, "b", 0.5, 0.4, 0.6)]
    f = rf.arms_facts(rows, "t")
    assert f[0] == {"above": ["a"], "arms": 2, "overlap": True}  # a from 0.7, b up to 0.75
    assert f[1] == {"above": ["a"], "arms": 2, "overlap": False}  # a from 0.85, b up to 0.6


def test_estimator_errors_and_the_two_lowest():
    rows = [{"policy": "u", "budget": 64, "estimators": {n: {"turn": {"mse": m}} for n, m in
                                                          (("x", 0.3), ("y", 0.1), ("z", 0.2))}}]
    errors = rf.estimator_errors(rows)
    assert errors == {("u", 64): {"x": 0.3, "y": 0.1, "z": 0.2}}
    assert rf.two_lowest(errors[("u", 64)]) == {"y", "z"}


def _rows(name, section):
    path = RESULTS / name
    if not path.exists():
        pytest.skip(f"{name} is not committed")
    return json.loads(path.read_text())["sections"][section]["rows"]


def _figures():
    """Each figure of the results page, drawn from the committed records."""
    ns = _rows("bench_trainer.json", "number-search")
    yield rf.number_search_dots(ns)
    curves = [dict(r, runs=[dict(run, curve=[{"episodes": 10, "seconds": 1.0, "greedy": 0.5},
                                             {"episodes": 20, "seconds": 2.0, "greedy": 0.9375}])
                            for run in r["runs"]]) for r in ns]
    yield rf.number_search_curves(curves, 15 / 16)
    yield rf.trl_figure(_rows("bench_trl.json", "main"), 15 / 16)
    yield rf.no_mask_figure(_rows("bench_no_mask.json", "main")[0]["runs"], {}, 15 / 16)
    yield rf.crafting_figure(_rows("bench_trainer.json", "crafting")[0]["rows"])
    yield rf.profile_figure(_rows("bench_crafting_profile.json", "profile")[0])
    yield rf.memory_figure(_rows("bench_memory.json", "crafting"), 2.0)
    yield rf.sft_batch_figure({"seed 0": _rows("bench_sft_batch.json", "seed 0")})
    yield rf.assignment_figure({"reference": _rows("crafting_assignment.json", "reference")},
                               {"seen goals": 0.55, "held-out goals": 0.4})
    yield rf.grading_figure(_rows("bench_grading.json", "abba-without-training"))
    yield rf.estimators_figure(_rows("bench_credit.json", "full"))
    yield rf.arms_figure(_rows("bench_credit_training.json", "full"), ["test greedy"])
    yield rf.micro_batch_figure(_rows("bench_micro_batches.json", "cpu"))
    yield rf.mutation_figure(_rows("mutation.json", "score"))


def test_every_figure_draws_from_the_committed_records_at_the_books_width():
    for fig in _figures():
        assert fig.get_figwidth() == rf.WIDTH, "a wider figure is shrunk by the page, its type too"
        assert fig.axes and all(ax.has_data() for ax in fig.axes)
        plt.close(fig)


def test_the_trainer_bench_keeps_every_evaluation_as_the_seeds_curve():
    spec = importlib.util.spec_from_file_location("bench_trainer", RESULTS.parent / "bench_trainer.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    history = [{"step": 0, "elapsed_s": 1.0, "episodes": 64},
               {"step": 1, "elapsed_s": 2.0, "episodes": 128, "eval_success": 0.5},
               {"step": 2, "elapsed_s": 3.0, "episodes": 192},
               {"step": 3, "elapsed_s": 4.5, "episodes": 256, "eval_success": 0.9375}]
    assert bench.greedy_curve(history) == [{"step": 2, "seconds": 2.0, "episodes": 128, "greedy": 0.5},
                                           {"step": 4, "seconds": 4.5, "episodes": 256, "greedy": 0.9375}]


def _curve_line(kind, step, phase, seconds, success, per_level=20, met=False):
    levels = {f"level {lv}": {"success": success, "ci_low": 0.0, "ci_high": 1.0} for lv in (1, 2)}
    return {"kind": kind, "step": step, "phase": phase, "train_s": seconds, "per_level": per_level,
            "splits": {"test": levels, "held_out_goals": levels}, "target_met": met}


CURVE = [{"kind": "header", "recipe": "crafting-full", "seed": 0, "candidate_mask": True},
         _curve_line("sample", 250, "sft", 100.0, 0.5), _curve_line("sample", 500, "sft", 200.0, 0.7),
         _curve_line("sample", 525, "rl", 260.0, 0.97, met=True),
         _curve_line("confirm", 525, "rl", 260.0, 0.96, per_level=200, met=True)]


def test_a_crafting_curve_gives_its_points_its_switch_to_rl_and_when_it_met_the_target():
    body = CURVE[1:]
    assert rf.curve_points(body, "test", "level 1") == [(100.0, 0.5), (200.0, 0.7), (260.0, 0.97)]
    assert rf.curve_points(body, "test", "level 1", "confirm") == [(260.0, 0.96)]
    assert rf.curve_points(body, "test", "level 9") == []
    assert rf.rl_start(body) == 200.0 and rf.rl_start(body[:2]) is None
    f = rf.crafting_curve_facts(CURVE)
    assert f == {"recipe": "crafting-full", "seed": 0, "mask": True, "met_s": 260.0, "met_step": 525,
                 "confirmed_on": 200, "last_s": 260.0, "last_step": 525, "confirmed": True}
    partial = rf.crafting_curve_facts(CURVE[:3])
    assert partial["met_s"] is None and partial["last_step"] == 500 and not partial["confirmed"]
    assert rf.crafting_curve_facts(CURVE[:1])["last_s"] is None


def test_the_crafting_curve_figure_draws_every_run_at_the_books_width():
    fig = rf.crafting_curve_figure({"a": CURVE, "b": CURVE[:3]})
    assert fig.get_figwidth() == rf.WIDTH and len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()] == ["level 1", "level 2"]
    plt.close(fig)
