"""agent_lab.results_figures: the figures behind the results page's sentences, exactly, on small made-up rows;
and every figure draws from the committed benchmark records at the book's width."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
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


def _lever(arm, piece, seconds, peak_gb=0.5, dtype="float32", round_=1):
    return {"arm": arm, "round": round_, "piece": piece, "s_per_step": seconds, "peak_gb": peak_gb,
            "peak_dtype": dtype}


def _levers(prefix_s=0.5, bf16_s=0.8):
    """A recipe at 1 s per SFT step and 4 s per RL step, two rounds of bf16, prefix SFT only."""
    return {"threads": 2, "arms": [
        _lever("recipe", "SFT", 1.0), _lever("recipe", "RL", 4.0, 0.7),
        _lever("bf16", "SFT", bf16_s, 1.5, "bfloat16"), _lever("bf16", "RL", 5.0, 1.6, "bfloat16"),
        _lever("bf16", "SFT", 10.0, 1.2, "bfloat16", 2), _lever("bf16", "RL", 5.0, 1.4, "bfloat16", 2),
        _lever("bf16", "SFT", bf16_s, 1.1, "bfloat16", 3), _lever("bf16", "RL", 5.0, 1.3, "bfloat16", 3),
        _lever("prefix", "SFT", prefix_s, 0.6)]}


def test_lever_facts_rank_arms_by_the_recipes_seconds_over_theirs():
    f = rf.lever_facts(_levers())
    # bf16's SFT: the median of its three rounds (0.8, 10, 0.8), so one slow round does not rank it
    assert f["speedup"] == {"recipe, SFT": 1.0, "bf16, SFT": 1.25, "prefix, SFT": 2.0,
                            "recipe, RL": 1.0, "bf16, RL": 0.8}
    assert f["ranked"] == {"SFT": ["prefix", "bf16", "recipe"], "RL": ["recipe", "bf16"]}
    # peaks: the highest round of each arm
    assert f["highest_peak"] == ("bf16, RL", 1.6) and f["peak_gb"]["bf16, SFT"] == 1.5
    assert f["peak_range"] == {"float32": (0.5, 0.7), "bfloat16": (1.1, 1.6)}
    assert f["threads"] == 2


def test_lever_facts_can_compare_median_steps_which_leave_out_a_first_compilation():
    row = _levers()
    for arm in row["arms"]:  # a compiled arm: slow on average (its first step compiles), faster at the median
        arm["median_step_s"] = arm["s_per_step"] / (2 if arm["arm"] == "prefix" else 1)
    row["arms"][-1]["s_per_step"] = 3.0
    assert rf.lever_facts(row)["speedup"]["prefix, SFT"] == pytest.approx(1 / 3)
    assert rf.lever_facts(row, step="median_step_s")["speedup"]["prefix, SFT"] == 4.0


def test_lever_facts_follow_the_seconds_when_two_arms_swap():
    f = rf.lever_facts(_levers(prefix_s=0.8, bf16_s=0.5))
    assert f["ranked"]["SFT"] == ["bf16", "prefix", "recipe"]
    assert f["speedup"]["bf16, SFT"] == 2.0 and f["speedup"]["prefix, SFT"] == 1.25
    slower = rf.lever_facts(_levers(prefix_s=2.0))
    assert slower["ranked"]["SFT"] == ["bf16", "recipe", "prefix"] and slower["speedup"]["prefix, SFT"] == 0.5


def test_lever_facts_leave_out_a_piece_the_recipe_did_not_run_and_need_the_recipe():
    row = _levers()
    row["arms"] = [a for a in row["arms"] if (a["arm"], a["piece"]) != ("recipe", "RL")]
    f = rf.lever_facts(row)
    assert "RL" not in f["ranked"] and "bf16, RL" not in f["speedup"]
    assert f["peak_gb"]["bf16, RL"] == 1.6  # its memory is still measured
    row["arms"] = [a for a in row["arms"] if a["arm"] != "recipe"]
    with pytest.raises(ValueError, match="no arm 'recipe'.*--arms recipe"):
        rf.lever_facts(row)


def _ahead_row():
    """Two rounds. The recipe: median steps 1.0 and 1.2 s, 8% + 2% of its seconds building demonstrations, 20%
    evaluating (so 12.5% of the rest); arm ahead: 0.9 and 1.0 s, waiting 1% of its seconds."""
    def arm(name, round_, step_s, env, demos, evaluation=0.2):
        return {**_lever(name, "SFT", step_s, round_=round_), "median_step_s": step_s,
                "shares": {"environment": env, "demonstrations": demos, "evaluation": evaluation, "loss": 0.5,
                           "other": 0.001 if name == "recipe" else 0.04 * round_}}
    return {"threads": 1, "arms": [arm("recipe", 1, 1.0, 0.02, 0.08), arm("ahead", 1, 0.9, 0.0, 0.008),
                                   arm("recipe", 2, 1.2, 0.02, 0.08), arm("ahead", 2, 1.0, 0.0, 0.008)]}


def test_ahead_facts_give_the_speed_up_each_round_and_the_bound_of_hiding_the_demonstrations():
    f = rf.ahead_facts(_ahead_row())
    assert f["per_round"] == pytest.approx([1.0 / 0.9, 1.2])
    assert f["speedup"] == pytest.approx(1.1 / 0.95)  # medians of rounds: (1.0 + 1.2) / 2 over (0.9 + 1.0) / 2
    assert f["hidden_share"] == pytest.approx(0.125) and f["bound"] == pytest.approx(1 / 0.875)
    assert f["waited_share"] == pytest.approx(0.01) and f["threads"] == 1
    assert f["other"] == pytest.approx({"recipe": 0.001, "ahead": 0.06})  # medians of rounds: 0.04 and 0.08
    rf.ahead_figure([_ahead_row(), {**_ahead_row(), "threads": 2}])
    row = _ahead_row()
    row["arms"] = [a for a in row["arms"] if a["arm"] != "ahead"]
    with pytest.raises(ValueError, match="--arms recipe ahead"):
        rf.ahead_facts(row)


def _profile_section(name):
    path = RESULTS / "bench_crafting_profile.json"
    sections = json.loads(path.read_text())["sections"] if path.exists() else {}
    if name not in sections:
        pytest.skip(f"bench_crafting_profile.json has no section {name!r}")
    (row,) = sections[name]["rows"]
    return row


def test_lever_facts_of_the_committed_levers_run():
    row = _profile_section("levers")
    step = {rf.arm_label(a): a["s_per_step"] for a in row["arms"]}
    f = rf.lever_facts(row)
    assert f["speedup"]["prefix, SFT"] == pytest.approx(step["recipe, SFT"] / step["prefix, SFT"])
    assert f["speedup"]["bf16, RL"] == pytest.approx(step["recipe, RL"] / step["bf16, RL"])
    assert f["ranked"]["SFT"] == sorted(f["ranked"]["SFT"], key=lambda a: step[f"{a}, SFT"])
    assert set(f["ranked"]["RL"]) == {"recipe", "bf16"}  # the prefix arms have no RL piece
    assert f["highest_peak"][1] == max(a["peak_gb"] for a in row["arms"])


@pytest.mark.parametrize("name", ["bf16", "levers"])
def test_the_lever_figure_draws_the_committed_run_at_the_books_width(name):
    fig = rf.lever_figure(_profile_section(name), 2.0)
    speed_ax, peak_ax = fig.axes
    assert fig.get_figwidth() == rf.WIDTH and speed_ax.has_data() and peak_ax.has_data()
    bars = len(rf.lever_facts(_profile_section(name))["speedup"])
    assert len(speed_ax.patches) == bars and 2.0 in peak_ax.lines[0].get_xdata()
    plt.close(fig)


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


def _level(success, low=0.0, high=1.0):
    return {"n": 20, "success": success, "ci_low": low, "ci_high": high}


def _curve_line(kind, step, phase, seconds, success, per_level=20, met=False, episodes=0, level3=None):
    levels = {f"level {lv}": _level(success) for lv in (1, 2)}
    levels["level 3"] = level3 or _level(success)
    return {"kind": kind, "step": step, "phase": phase, "train_s": seconds, "per_level": per_level,
            "demonstrations": min(step, 500) * 32, "episodes": episodes,
            "splits": {"test": levels, "held_out_goals": levels}, "target_met": met}


TARGET = {"level <= 2": 0.95, "level >= 3": 0.8}
HEADER = {"kind": "header", "recipe": "crafting-full", "seed": 0, "candidate_mask": True, "target": TARGET,
          "config": {"sft": {"steps": 500}, "algorithm": {"steps": 100}}}
#: SFT to step 500, then RL: 25 steps of 128 episodes, where a sample and its confirmation met the target
CURVE = [HEADER,
         _curve_line("sample", 250, "sft", 100.0, 0.5), _curve_line("sample", 500, "sft", 200.0, 0.7),
         _curve_line("sample", 525, "rl", 260.0, 0.97, met=True, episodes=3200),
         _curve_line("confirm", 525, "rl", 260.0, 0.96, per_level=200, met=True, episodes=3200)]


def test_a_crafting_curve_gives_its_points_its_switch_to_rl_and_when_it_met_the_target():
    body = CURVE[1:]
    assert rf.curve_points(body, "test", "level 1") == [(100.0, 0.5), (200.0, 0.7), (260.0, 0.97)]
    assert rf.curve_points(body, "test", "level 1", "confirm") == [(260.0, 0.96)]
    assert rf.curve_points(body, "test", "level 1", x="budget") == [(8000, 0.5), (16000, 0.7), (19200, 0.97)]
    assert rf.curve_points(body, "test", "level 9") == []
    assert rf.rl_start(body) == 200.0 and rf.rl_start(body, "budget") == 16000
    assert rf.rl_start(body[:2]) is None
    f = rf.crafting_curve_facts(CURVE)
    assert f == {"recipe": "crafting-full", "seed": 0, "mask": True, "met_s": 260.0, "met_step": 525,
                 "met_budget": 19200, "confirmed_on": 200, "sample_met_step": 525, "last_s": 260.0,
                 "last_step": 525, "last_budget": 19200, "rl_start_step": 500, "confirmed": True,
                 "finished": True}


def test_a_partial_crafting_curve_says_how_far_it_got_and_that_it_has_not_finished():
    partial = rf.crafting_curve_facts(CURVE[:3])
    assert partial["met_s"] is None and partial["sample_met_step"] is None
    assert (partial["last_step"], partial["last_s"], partial["last_budget"]) == (500, 200.0, 16000)
    assert not partial["confirmed"] and not partial["finished"] and partial["rl_start_step"] is None
    assert rf.crafting_curve_facts(CURVE[:1])["last_s"] is None
    # a line cut short in the copy (no evaluation) is left out, not fatal
    assert rf.crafting_curve_facts(CURVE[:3] + [{"kind": "sample", "step": 600}])["last_step"] == 500
    # a confirmation that missed the target mid-run does not finish the curve; one after the last step does
    missed = _curve_line("confirm", 250, "sft", 100.0, 0.5, per_level=200)
    assert not rf.crafting_curve_facts([HEADER, missed])["finished"]
    ended = _curve_line("confirm", 600, "rl", 400.0, 0.5, per_level=200, episodes=12800)
    f = rf.crafting_curve_facts(CURVE[:3] + [ended])
    assert f["finished"] and f["met_s"] is None and f["confirmed"]


def test_each_level_reads_its_target_from_the_curves_header():
    assert [rf.level_target(TARGET, f"level {n}") for n in (1, 2, 3, 4)] == [0.95, 0.95, 0.8, 0.8]
    assert rf.level_target({"of": "the planner"}, "level 1") is None


def _rl_curve(before, after):
    """SFT to step 500 then 50 RL steps; level 3 of every split at ``before`` and ``after``."""
    return [HEADER, _curve_line("sample", 500, "sft", 200.0, 1.0, level3=before),
            _curve_line("sample", 525, "rl", 260.0, 1.0, episodes=3200, level3=_level(0.0)),
            _curve_line("sample", 550, "rl", 330.0, 1.0, episodes=6400, level3=after)]


def test_what_rl_changed_compares_the_end_of_sft_with_the_last_rl_sample_by_their_intervals():
    up = rf.rl_change(_rl_curve(_level(0.3, 0.15, 0.5), _level(0.9, 0.7, 0.97)), "test", "level 3")
    assert (up["before"]["success"], up["after"]["success"]) == (0.3, 0.9)
    assert (up["steps"], up["seconds"], up["overlap"]) == (50, 130.0, False)
    down = rf.rl_change(_rl_curve(_level(0.9, 0.7, 0.97), _level(0.3, 0.15, 0.5)), "test", "level 3")
    assert not down["overlap"]
    same = rf.rl_change(_rl_curve(_level(0.5, 0.3, 0.7), _level(0.6, 0.4, 0.8)), "held_out_goals", "level 3")
    assert same["overlap"]
    assert rf.rl_change(CURVE[:3], "test", "level 1") is None  # no RL yet
    assert rf.rl_change(CURVE, "test", "level 9") is None  # a level the curve does not evaluate


def test_the_curve_sentences_say_where_each_curve_stands_and_what_rl_changed():
    assert rf.curve_sentence("a", CURVE) == (
        "`a` (crafting-full, seed 0, with the candidate mask) met the crafting target after 260 s of "
        "training (step 525, 19,200 demonstrations and RL episodes), confirmed on 200 worlds per level.")
    assert rf.curve_sentence("p", CURVE[:3]).endswith(
        "has not met the target by 200 s of training (step 500, 16,000 demonstrations and RL episodes); "
        "the curve is partial.")
    assert rf.curve_sentence("h", CURVE[:1]).endswith("has no evaluation yet.")
    assert rf.rl_sentence(CURVE[:3]) == "It has no RL evaluation yet."
    up = rf.rl_sentence(_rl_curve(_level(0.3, 0.15, 0.5), _level(0.9, 0.7, 0.97)))
    assert up.startswith("Its 50 RL steps (130 s of training) took level 3 success")
    assert "test 0.30 [0.15, 0.50] → 0.90 [0.70, 0.97]" in up
    assert up.endswith("the intervals do not overlap on test up, held out goals up.")
    same = rf.rl_sentence(_rl_curve(_level(0.5, 0.3, 0.7), _level(0.6, 0.4, 0.8)))
    assert same.endswith("the intervals overlap on every split: no change this sample can tell apart.")



def test_the_rl_diagnostics_sentence_reads_the_first_and_last_rl_windows():
    curve = _rl_curve(_level(0.5, 0.3, 0.7), _level(0.6, 0.4, 0.8))
    assert rf.rl_diagnostics_sentence(curve) == ""  # lines written before the harness recorded them
    curve[2]["rl"] = {"success": 0.7, "rejected_share": 0.25, "entropy": 0.15, "degenerate_fraction": 0.6}
    curve[3]["rl"] = {"success": 0.65, "rejected_share": 0.3, "entropy": 0.2125, "degenerate_fraction": 0.5}
    assert rf.rl_diagnostics_sentence(curve) == (
        "From its first RL window to its last, in the batches it sampled: sampled success 70% → 65%; "
        "refused actions 25% → 30%; groups whose episodes all scored the same 60% → 50%; the policy's "
        "entropy (nats per action token) 0.150 → 0.212.")
    del curve[3]["rl"]  # one window: it is both the first and the last
    assert "refused actions 25% → 25%" in rf.rl_diagnostics_sentence(curve)


def _branch(after, *, before=None):
    """A branch of CURVE's cold start: the cold start at step 500, then two RL samples; level 3 of every split
    goes from ``before`` to ``after``."""
    head = dict(HEADER, candidate_mask=False, parent=HEADER)
    return [head, _curve_line("sample", 500, "sft", 200.0, 1.0, level3=before or _level(0.5, 0.43, 0.57)),
            _curve_line("sample", 550, "rl", 300.0, 1.0, episodes=6400, level3=_level(0.55, 0.48, 0.62)),
            _curve_line("sample", 600, "rl", 400.0, 1.0, episodes=12800, level3=after)]


def test_branches_are_told_by_their_parent_and_compared_from_their_cold_start():
    flat, up = _branch(_level(0.52, 0.45, 0.59)), _branch(_level(0.7, 0.63, 0.76))
    assert rf.is_branch(up) and not rf.is_branch(CURVE) and not rf.is_branch([])
    points = rf.branch_points(up, "test", "level 3")
    assert [p for p, _ in points] == [0, 50, 100] and points[-1][1]["success"] == 0.7
    f = rf.branches_facts({"flat": flat, "up": up})
    assert f["up"] == [("up", "held_out_goals"), ("up", "test")] and f["down"] == []
    assert f["best"][0] == pytest.approx(0.2) and f["best"][1] == "up"
    assert f["changes"]["flat"]["test"]["overlap"]
    down = rf.branches_facts({"down": _branch(_level(0.3, 0.24, 0.37))})
    assert down["up"] == [] and down["down"] == [("down", "held_out_goals"), ("down", "test")]
    fig = rf.branches_figure({"flat": flat, "up": up})
    assert fig.get_size_inches()[0] == pytest.approx(rf.WIDTH) and len(fig.axes) == 2
    plt.close(fig)


def test_a_legend_of_long_names_keeps_what_tells_them_apart():
    names = ["full-rl-fresh-lr1e-4-levels012-seed0", "full-rl-fresh-lr1e-4-gigpo-seed0", "full-rl-lr1e-4-seed0"]
    short, shared = rf.distinct_names(names)
    assert list(short.values()) == ["fresh-lr1e-4-levels012", "fresh-lr1e-4-gigpo", "lr1e-4"]
    assert shared == "full-rl-…-seed0"
    # every name keeps a word, even one that is all shared words; one name, or none, is kept whole
    assert rf.distinct_names(["a-b", "a-b-c"]) == ({"a-b": "b", "a-b-c": "b-c"}, "a-…")
    assert rf.distinct_names(["x-seed0", "y-seed0"]) == ({"x-seed0": "x", "y-seed0": "y"}, "…-seed0")
    assert rf.distinct_names(["only-one"]) == ({"only-one": "only-one"}, "")
    assert rf.distinct_names(["p", "q"]) == ({"p": "p", "q": "q"}, "")
    fig = rf.branches_figure({n: _branch(_level(0.7, 0.63, 0.76)) for n in names})
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(short.values())
    assert fig.legends[0].get_title().get_text() == shared
    plt.close(fig)


def _sft_branch(levels3: list[tuple[float, dict]]) -> list[dict]:
    """SFT alone past CURVE's cold start (step 500, 200 s): an SFT sample of level 3 at each (seconds, level)."""
    head = dict(HEADER, candidate_mask=False, parent=HEADER,
                config={"sft": {"steps": 900}, "algorithm": {"steps": 0}})
    return [head, _curve_line("sample", 500, "sft", 200.0, 1.0, level3=_level(0.5, 0.43, 0.57)),
            *(_curve_line("sample", 500 + 100 * (k + 1), "sft", 200.0 + s, 1.0, level3=lv)
              for k, (s, lv) in enumerate(levels3))]


def test_sft_alone_is_set_beside_an_rl_branch_at_equal_seconds_since_the_cold_start():
    rl = _branch(_level(0.7, 0.63, 0.76))  # 100 s and 200 s after the cold start
    sft = _sft_branch([(90.0, _level(0.52, 0.45, 0.59)), (150.0, _level(0.55, 0.48, 0.62)),
                       (260.0, _level(0.9, 0.85, 0.94))])
    assert rf.is_sft_branch(sft) and not rf.is_sft_branch(rl) and not rf.is_sft_branch(CURVE)
    assert [s for s, _ in rf.branch_points(sft, "test", "level 3", "train_s")] == [0, 90, 150, 260]
    cmp = rf.equal_seconds(rl, sft, "test")
    # the horizon is RL's last evaluation (200 s); SFT is read at its last sample before it (150 s)
    assert (cmp["seconds"], cmp["rl_s"], cmp["sft_s"]) == (200.0, 200.0, 150.0)
    assert cmp["rl"]["success"] == 0.7 and cmp["sft"]["success"] == 0.55
    assert cmp["rl_above"] and not cmp["sft_above"]
    later = rf.equal_seconds(rl, _sft_branch([(190.0, _level(0.9, 0.85, 0.94))]), "test")
    assert later["sft_above"] and not later["rl_above"]
    assert rf.equal_seconds(rl, sft[:2], "test") is None  # SFT alone has not evaluated past the cold start
    fig = rf.branches_figure({"rl": rl, "sft alone": sft}, by="train_s")
    assert fig.axes[0].get_xlabel() == rf.BRANCH_AXES["train_s"]
    plt.close(fig)


def _failures(successes: int, **by_kind: int) -> dict:
    kinds = {k.replace("_", " "): n for k, n in by_kind.items()}
    return {"n": 200, "successes": successes, "failures": kinds}


def test_failures_are_read_per_record_and_split_with_the_kind_that_leads_everywhere():
    records = {"cold": {"splits": {"test": {"level 3": _failures(114, missing_ingredients=76, unknown_item=10)},
                                   "held_out_goals": {"level 3": _failures(116, missing_ingredients=65,
                                                                           unknown_item=19)}}},
               "rl": {"splits": {"test": {"level 3": _failures(125, missing_ingredients=61, unknown_item=14)},
                                 "held_out_goals": {"level 3": _failures(130, missing_ingredients=53,
                                                                         unknown_item=17)}}}}
    f = rf.failures_facts(records)
    assert f["top"] == "missing ingredients" and f["by"] == "first refused action"  # records from before "by"
    assert f["records"]["rl"]["test"] == {"n": 200, "failed": 75,
                                          "by_kind": {"missing ingredients": 61, "unknown item": 14}}
    records["rl"]["splits"]["test"]["level 3"] = _failures(125, unknown_item=61, missing_ingredients=14)
    assert rf.failures_facts(records)["top"] is None  # another kind leads one record: no kind leads everywhere
    assert rf.failures_facts(records, "level 2") == {"records": {"cold": {}, "rl": {}}, "top": None,
                                                     "by": "first refused action"}
    records["cold"]["by"] = "first mistake"
    with pytest.raises(ValueError, match="count failed episodes in different ways"):
        rf.failures_facts(records)  # one figure cannot set two ways of counting side by side
    records["rl"]["by"] = "first mistake"
    assert rf.failures_facts(records)["by"] == "first mistake"
    fig = rf.failures_figure(records)
    assert fig.legends[0].get_title().get_text() == "first mistake"
    assert fig.get_figwidth() == rf.WIDTH and len(fig.axes) == 2
    bars = [p.get_width() for p in fig.axes[0].patches]  # test panel: per kind, a bar per record
    assert bars == pytest.approx([76 / 200, 14 / 200, 10 / 200, 61 / 200])
    plt.close(fig)


def test_the_first_curve_to_the_target_by_seconds_and_by_demonstrations():
    slow_but_frugal = [HEADER, _curve_line("sample", 100, "sft", 900.0, 1.0, met=True),
                       _curve_line("confirm", 100, "sft", 900.0, 1.0, per_level=200, met=True)]
    curves = {"a": CURVE, "b": slow_but_frugal, "partial": CURVE[:3]}
    assert rf.first_to_target(curves) == ("a", 260.0)
    assert rf.first_to_target(curves, "budget") == ("b", 3200)
    assert rf.first_to_target({"partial": CURVE[:3]}) is None


def test_the_crafting_curve_figures_draw_every_curve_partial_or_with_rl_at_the_books_width():
    rl = _rl_curve(_level(0.3), _level(0.9))
    for lines, x in ((CURVE, "train_s"), (CURVE[:3], "budget"), (rl, "budget")):
        fig = rf.crafting_curve_figure(lines, x)
        assert fig.get_figwidth() == rf.WIDTH and len(fig.axes) == 2
        legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
        assert legend == ["level 1", "level 2", "level 3", "targets"]
        plt.close(fig)
    shaded = rf.crafting_curve_figure(CURVE)
    assert all(len(ax.patches) == 1 for ax in shaded.axes), "the RL phase is shaded in every panel"
    plt.close(shaded)
    fig = rf.crafting_curve_figure(CURVE[:1])  # a header alone: an empty figure, not an error
    plt.close(fig)
    fig = rf.compare_curves_figure({"a": CURVE, "partial": CURVE[:3], "rl": rl})
    assert fig.get_figwidth() == rf.WIDTH and len(fig.axes) == 2
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["a (mask)", "partial (mask)", "rl (mask)"]
    assert {"SFT", "RL", "target"} <= set(labels)
    unmasked = [dict(HEADER, candidate_mask=False), *CURVE[1:]]
    assert rf.curve_label("u", unmasked) == "u (no mask)" and rf.curve_label("h", [{}]) == "h"
    dashed = [line for line in fig.axes[0].get_lines()
              if line.get_linestyle() == "--" and len(line.get_xdata())]
    assert len(dashed) == 2 + 1, "each curve with RL draws its RL part dashed (and the target is dashed)"
    plt.close(fig)


def _committed_curves() -> tuple[dict[str, list[dict]], list[str]]:
    """The committed crafting curves and the files that could not be read (``bench/_results.py``)."""
    spec = importlib.util.spec_from_file_location("_results", RESULTS.parent / "_results.py")
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    return results.load_curves()


def test_the_committed_crafting_curves_draw():
    curves, problems = _committed_curves()
    if not curves:
        pytest.skip("no crafting curve is committed")
    assert not problems, problems
    for lines in curves.values():
        for x in rf.CURVE_X:
            fig = rf.crafting_curve_figure(lines, x)
            assert fig.get_figwidth() == rf.WIDTH and all(ax.has_data() for ax in fig.axes)
            plt.close(fig)
    fig = rf.compare_curves_figure(curves)
    assert all(ax.has_data() for ax in fig.axes)
    plt.close(fig)
    if rf.loss_vs_recipe_facts(curves)["rows"]:
        fig = rf.loss_vs_recipe_figure(curves)
        assert fig.get_figwidth() == rf.WIDTH and fig.axes[0].has_data()
        plt.close(fig)
    scored = {n: lines for n, lines in curves.items() if n in rf.role_loss_facts(curves)}
    if scored:  # curves that score the loss by role
        fig = rf.role_loss_figure(scored)
        assert fig.get_figwidth() == rf.WIDTH and all(ax.has_data() for ax in fig.axes)
        plt.close(fig)


def _written_by_scripts(root: Path) -> set[str]:
    """The results files the benchmark and report scripts write by default (``RESULTS / "name.json"``)."""
    pattern = re.compile(r'(?:RESULTS|"results")\s*/\s*"([\w.-]+\.json)"')
    return {name for script in [*root.glob("bench/*.py"), *root.glob("scripts/*.py")]
            for name in pattern.findall(script.read_text(encoding="utf-8"))}


def test_the_results_readme_names_every_committed_file_and_every_file_a_script_writes():
    readme = (RESULTS / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"^- `([^`]+)`:", readme, re.M))
    committed = {p.name + ("/" if p.is_dir() else "") for p in RESULTS.iterdir() if p.name != "README.md"}
    written = _written_by_scripts(RESULTS.parents[1])
    assert {"gpu_bench.json", "bench_envs.json", "mutation.json"} <= written  # the pattern still finds them
    assert not committed - named, f"bench/results/README.md does not list {sorted(committed - named)}"
    assert not written - named, f"bench/results/README.md does not list {sorted(written - named)}"


def _mistakes_line(step, successes, mistakes=None):
    g = {"n": 20, "successes": successes, "success": successes / 20}
    if mistakes is not None:
        g["mistakes"] = mistakes
    return {"kind": "sample", "step": step, "phase": "sft", "demonstrations": 32 * step, "episodes": 0,
            "train_s": float(step), "splits": {"test": {"level 3": g}, "held_out_goals": {"level 3": dict(g)}}}


def test_mistakes_along_a_curve_are_shares_of_the_sample_from_where_the_curve_counts_them():
    lines = [{"kind": "header", "candidate_mask": True}, _mistakes_line(100, 0),  # from before the counting
             _mistakes_line(200, 2, {"off the goal's tree": 15, "too few of a base item": 3}),
             _mistakes_line(300, 10, {"off the goal's tree": 4, "an intermediate not crafted yet": 6})]
    got = rf.mistake_points(lines)
    assert got == {"mistake": [(6400, 0.75), (9600, 0.2)], "other": [(6400, 0.15), (9600, 0.3)]}
    # results_figures is a leaf (it imports no agent_lab module): its default kind must stay crafting's name
    from agent_lab.envs.crafting import MISTAKES
    for fn in (rf.mistake_points, rf.mistakes_figure):
        assert inspect.signature(fn).parameters["kind"].default == MISTAKES["off_tree"]
    fig = rf.mistakes_figure({"lever": lines, "old": lines[:2]})  # a curve that never counted is left out
    assert len(fig.axes) == 2 and len(fig.axes[0].get_lines()) == 2 + 2  # the curve's two lines, two keys
    plt.close(fig)
    lines[2]["splits"]["test"]["level 3"]["mistakes"] = {"off the goal's tree": 1}
    with pytest.raises(ValueError, match="step 200: 1 failed episodes counted"):
        rf.mistake_points(lines)


def _roles_line(step, shares, nll=1.0):
    """A sample line whose test worlds' level 2 and level 3 losses split by role as ``shares`` (``nll`` each)."""
    def roles():
        return {r: {"tokens": 10, "nll": nll, "share": v} for r, v in shares.items()}
    return {**_mistakes_line(step, 10), "nll": {"level 2": roles(), "level 3": roles()}}


def test_the_loss_by_role_is_read_at_a_curves_first_and_last_scored_sample():
    early = {"verb": 0.1, "get item": 0.2, "get count": 0.05, "craft item, first": 0.25, "craft item, later": 0.4}
    late = {"verb": 0.5, "get item": 0.1, "craft item, first": 0.1, "craft item, later": 0.2, "end": 0.1}
    lines = [{"kind": "header"}, _mistakes_line(100, 0), _roles_line(200, early), _roles_line(300, late, 0.5)]
    got = rf.role_loss_facts({"lever": lines, "old": lines[:2]})  # a curve that never scored is left out
    assert list(got) == ["lever"]
    first, last = got["lever"]["first"], got["lever"]["last"]
    assert (first["step"], first["x"], last["step"], last["x"]) == (200, 6400, 300, 9600)
    assert first["levels"]["level 3"]["items"] == pytest.approx(0.85)  # get item + first and later craft item
    assert first["levels"]["level 3"]["largest"] == "craft item, later"
    assert last["levels"]["level 2"]["items"] == pytest.approx(0.4) and last["levels"]["level 2"]["largest"] == "verb"
    assert rf.role_loss_points(lines, "level 3")["verb"] == [(6400, 1.0), (9600, 0.5)]
    assert rf.role_loss_points(lines, "level 3")["end"] == [(9600, 0.5)]
    fig = rf.role_loss_figure({"lever": lines, "again": lines, "old": lines[:2]}, least_share=0.1)
    assert fig.get_figwidth() == rf.WIDTH and len(fig.axes) == 3
    labels = [t.get_text() for t in fig.legends[0].get_texts()]  # get count never holds 0.1: not drawn
    assert labels == ["verb", "get item", "craft item, first", "craft item, later", "end", "lever", "again"]
    plt.close(fig)
    lines[3]["nll"]["level 3"]["verb"]["share"] = 0.9
    with pytest.raises(ValueError, match="step 300: the shares of level 3's loss do not sum to 1"):
        rf.role_loss_facts({"lever": lines})


def _rec(successes, low, high, n=20):
    return {"n": n, "successes": successes, "success": successes / n, "ci_low": low, "ci_high": high}


def _lever_line(demonstrations, levels, episodes=0, kind="sample"):
    """A curve line at ``demonstrations`` (+ ``episodes``) whose test split carries ``levels``."""
    return {"kind": kind, "step": demonstrations // 32, "phase": "sft", "train_s": 1.0,
            "demonstrations": demonstrations, "episodes": episodes, "splits": {"test": levels}}


SAME = {f"level {lv}": _rec(10, 0.3, 0.7) for lv in (1, 2, 3)}
#: the recipe's curve: samples every 3200 demonstrations to 9600, a confirmation at the end
LEVER_BASE = [HEADER, _lever_line(3200, SAME), _lever_line(6400, SAME), _lever_line(9600, SAME),
              _lever_line(9600, SAME, kind="confirm")]


def test_a_lever_meets_the_recipe_at_its_last_sample_the_recipe_also_evaluated():
    early = {**SAME, "level 1": _rec(1, 0.0, 0.2)}
    lever = [HEADER, _lever_line(3200, SAME), _lever_line(6400, early), _lever_line(8000, SAME),
             _lever_line(12800, SAME), _lever_line(12800, SAME, kind="confirm")]
    points = rf.lever_points(lever, LEVER_BASE)
    assert [p["level"] for p in points] == ["level 1", "level 2", "level 3"]
    assert {p["x"] for p in points} == {6400}, "8000 and 12800 are not on the recipe's curve"
    assert points[0]["lever"] == _rec(1, 0.0, 0.2) and points[0]["base"] == _rec(10, 0.3, 0.7)
    # the x counts RL episodes too; a confirmation is never a common point
    rl = [HEADER, _lever_line(6000, SAME, episodes=3600)]
    assert {p["x"] for p in rf.lever_points(rl, LEVER_BASE)} == {9600}
    assert rf.lever_points([HEADER, _lever_line(9600, SAME, kind="confirm")], LEVER_BASE) == []
    assert rf.lever_points([HEADER, _lever_line(1000, SAME)], LEVER_BASE) == []


def test_levers_are_ahead_behind_or_within_the_recipe_by_their_intervals():
    levels = {"level 1": _rec(18, 0.72, 0.97),   # wholly above 0.3-0.7: ahead
              "level 2": _rec(1, 0.01, 0.24),    # wholly below: behind
              "level 3": _rec(14, 0.48, 0.85)}   # overlaps: within
    touching = {**SAME, "level 1": _rec(15, 0.7, 0.9)}  # touches the recipe's top: not above it
    curves = {"crafting-full-seed0": LEVER_BASE,
              "lever-mixed-seed0": [HEADER, _lever_line(9600, levels)],
              "lever-touch-seed0": [HEADER, _lever_line(3200, touching)],
              "lever-apart-seed0": [HEADER, _lever_line(100, levels)],
              "other-seed0": [HEADER, _lever_line(9600, levels)]}
    f = rf.levers_vs_baseline_facts(curves)
    assert list(f["rows"]) == ["lever-mixed-seed0", "lever-touch-seed0"]
    assert f["left_out"] == ["lever-apart-seed0"], "no common point: left out; not a lever: not counted"
    assert f["rows"]["lever-mixed-seed0"]["verdict"] == {"level 1": "ahead", "level 2": "behind",
                                                         "level 3": "within"}
    assert f["rows"]["lever-touch-seed0"]["verdict"]["level 1"] == "within"
    assert f["rows"]["lever-touch-seed0"]["x"] == 3200
    assert f["counts"] == {"level 1": {"ahead": 1, "within": 1, "behind": 0},
                           "level 2": {"ahead": 0, "within": 1, "behind": 1},
                           "level 3": {"ahead": 0, "within": 2, "behind": 0}}
    assert f["ahead"]["level 1"] == ["lever-mixed-seed0"] and f["behind"]["level 2"] == ["lever-mixed-seed0"]
    # without the recipe's curve there is nothing to compare with
    alone = rf.levers_vs_baseline_facts({k: v for k, v in curves.items() if k != "crafting-full-seed0"})
    assert alone["rows"] == {} and len(alone["left_out"]) == 3


def test_a_lever_is_compared_with_the_recipe_on_its_own_seed():
    behind = {**SAME, "level 1": _rec(1, 0.01, 0.24)}
    strong = {f"level {lv}": _rec(20, 0.84, 1.0) for lv in (1, 2, 3)}  # seed 1's recipe, far above seed 0's
    curves = {"crafting-full-seed0": LEVER_BASE,
              "crafting-full-seed1": [HEADER, _lever_line(3200, strong)],
              "lever-x-seed0": [HEADER, _lever_line(3200, SAME)],
              "lever-x-seed1": [HEADER, _lever_line(3200, SAME)],
              "lever-x-seed2": [HEADER, _lever_line(3200, behind)]}
    assert rf.same_seed("lever-x-seed1", "crafting-full-seed0") == "crafting-full-seed1"
    assert rf.same_seed("lever-x", "crafting-full-seed0") == "crafting-full-seed0"
    f = rf.levers_vs_baseline_facts(curves)
    assert {n: r["base"] for n, r in f["rows"].items()} == {"lever-x-seed0": "crafting-full-seed0",
                                                           "lever-x-seed1": "crafting-full-seed1"}
    assert f["rows"]["lever-x-seed1"]["verdict"]["level 1"] == "behind", "against seed 1's curve, not seed 0's"
    assert f["rows"]["lever-x-seed0"]["verdict"]["level 1"] == "within"
    assert f["left_out"] == ["lever-x-seed2"], "no seed-2 recipe curve: nothing to compare with"
    assert f["bases"] == ["crafting-full-seed0", "crafting-full-seed1"]
    fig = rf.levers_vs_baseline_figure(curves)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[0] == "crafting-full on the lever's seed, same demonstrations + episodes"
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["x (3,200)", "x-seed1 (3,200)"]
    plt.close(fig)


def _loss_curve(losses, env=None, plugins=None, batch=32, every=100):
    """A curve whose SFT samples every ``every`` steps of ``batch`` demonstrations log ``losses`` in turn."""
    config = {"env_options": env or {"plan": "fetch_full", "reread": True}, "sft": {"batch_size": batch},
              "plugins": plugins if plugins is not None else {"recovery_demonstrations": {"from_step": 400}}}
    return [{"kind": "header", "config": config}] + [
        {"kind": "sample", "step": every * (i + 1), "phase": "sft", "train_s": 1.0, "loss": loss, "splits": {},
         "demonstrations": batch * every * (i + 1), "episodes": 0} for i, loss in enumerate(losses)]


def test_a_levers_sft_loss_is_set_beside_each_recipe_seeds_at_equal_demonstrations():
    curves = {"crafting-full-seed0": _loss_curve([2.0, 1.5, 1.0, 0.8, 0.1]),  # 0.1: after recovery from 12,800
              "crafting-full-seed1": _loss_curve([2.0, 1.6, 1.2, 0.9]),
              "lever-low": _loss_curve([1.9, 1.2, 0.95, 0.7, 0.6], env={"plan": "fetch_full", "reread": False}),
              "lever-high": _loss_curve([2.1, 1.9, 1.55], plugins={}),  # no recovery: the recipe's still bounds it
              "lever-mid": _loss_curve([2.0, 1.4, 1.1], batch=16, every=200,  # 3,200 demos per 200 steps
                                   plugins={"recovery_demonstrations": {"from_step": 800}}),
              "lever-plan": _loss_curve([1.0], env={"plan": "on_demand", "reread": True}),
              "lever-obs": _loss_curve([1.0], plugins={"observation_loss": {"weight": 1.0}}),
              "lever-late": _loss_curve([1.0], every=1000)}
    f = rf.loss_vs_recipe_facts(curves)
    assert f["seeds"] == ["crafting-full-seed0", "crafting-full-seed1"]
    low, high, mid = (f["rows"][n] for n in ("lever-low", "lever-high", "lever-mid"))
    # the last point before 400 steps x 32 = 12,800 demonstrations at which both seeds evaluated: 12,800
    assert (low["x"], low["loss"], low["recipe"]) == (12800, 0.7, {"crafting-full-seed0": 0.8,
                                                                   "crafting-full-seed1": 0.9})
    assert low["verdict"] == "below" and low["ratio"] == pytest.approx(0.7 / 0.85)
    # seed 0 first came down to 0.7 only after recovery began (left out); seed 1 never did
    assert low["reached"] == {"crafting-full-seed0": None, "crafting-full-seed1": None} and low["demo_share"] == {}
    assert (high["x"], high["verdict"]) == (9600, "above")
    assert high["reached"] == {"crafting-full-seed0": 6400, "crafting-full-seed1": 9600}
    assert high["demo_share"] == {"crafting-full-seed0": 1.5, "crafting-full-seed1": 1.0}
    assert (mid["x"], mid["loss"], mid["verdict"]) == (9600, 1.1, "within")
    assert mid["demo_share"] == {"crafting-full-seed0": 1.0, "crafting-full-seed1": 9600 / 12800}
    assert (mid["own_share"], high["own_share"], low["own_share"]) == (1.0, 1.5, None)  # against seed 0's
    curves["lever-mid-seed1"] = curves["lever-mid"]
    assert rf.loss_vs_recipe_facts(curves)["rows"]["lever-mid-seed1"]["own_share"] == 0.75
    assert f["counts"] == {"below": 1, "within": 1, "above": 1}
    del curves["lever-mid-seed1"]
    assert f["left_out"] == {
        "lever-plan": "other demonstrations (plan=on_demand, the recipe's fetch_full)",
        "lever-obs": "a plug-in the recipe does not run (observation_loss)",
        "lever-late": "no evaluation at demonstrations two recipe seeds also evaluated at"}
    fig = rf.loss_vs_recipe_figure(curves)
    assert fig.get_figwidth() == rf.WIDTH and len(fig.axes[0].get_yticklabels()) == 3
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["low (12,800)", "high (9,600)", "mid (9,600)"]
    plt.close(fig)


def test_the_levers_figure_draws_a_row_per_lever_named_with_its_demonstrations():
    curves = {"crafting-full-seed0": LEVER_BASE,
              "lever-a-seed0": [HEADER, _lever_line(9600, SAME)],
              "lever-b-seed0": [HEADER, _lever_line(3200, {**SAME, "level 2": _rec(1, 0.01, 0.24)})],
              "lever-none-seed0": [HEADER, _lever_line(5, SAME)]}
    fig = rf.levers_vs_baseline_figure(curves)
    assert fig.get_figwidth() == rf.WIDTH and len(fig.axes) == 3
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a (9,600)", "b (3,200)"]
    low, high = fig.axes[0].get_ylim()
    assert low > high, "the first lever is drawn at the top"
    assert [ax.get_title() for ax in fig.axes] == ["test, level 1", "test, level 2", "test, level 3"]
    assert "greedy success (20 worlds)" in [ax.get_xlabel() for ax in fig.axes]
    for ax in fig.axes:
        dots = [line for line in ax.get_lines() if line.get_marker() == "o" and len(line.get_xdata())]
        assert len(dots) == 2 * 2, "a lever's dot and the recipe's, in each of the two rows"
    red = [line for line in fig.axes[1].get_lines() if line.get_color() == rf.VERDICTS["behind"]
           and line.get_marker() == "o" and len(line.get_xdata())]
    assert len(red) == 1 and list(red[0].get_ydata()) == [1 - 0.17], "b is behind at level 2"
    plt.close(fig)


def test_the_committed_levers_are_compared_with_the_recipe():
    curves, _ = _committed_curves()
    if "crafting-full-seed0" not in curves or not any(n.startswith("lever-") for n in curves):
        pytest.skip("no lever curve or no crafting-full-seed0 curve is committed")
    f = rf.levers_vs_baseline_facts(curves)
    assert len(f["rows"]) + len(f["left_out"]) == sum(n.startswith("lever-") for n in curves)
    for counts in f["counts"].values():
        assert sum(counts.values()) == len(f["rows"])
    fig = rf.levers_vs_baseline_figure(curves)
    assert fig.get_figwidth() == rf.WIDTH and all(ax.has_data() for ax in fig.axes)
    plt.close(fig)


def _membership_rows(balanced):
    """Scores every 50 steps (32 worlds a step) with these balanced accuracies."""
    return [{"step": 50 * i, "worlds_seen": 1600 * i, "train_s": 10.0 * i, "needed_called_needed": 1.0,
             "others_called_not": 2 * b - 1.0, "balanced": b} for i, b in enumerate(balanced)]


MEMBERSHIP = {
    "command": "python bench/crafting_membership.py --steps 150 --arm base --arm l8:n_layers=8 "
               "--arm short:d_model=64 --arm lines:line_positions=true",
    "commit": "abc1234", "machine": {"cores": 2}, "seed": 0, "steps": 150, "worlds_per_level": 20,
    "arms": {"base": {"fields": {}, "rows": _membership_rows([0.5, 0.7, 0.79, 0.78])},  # never 0.8
             "l8": {"fields": {"n_layers": 8}, "rows": _membership_rows([0.5, 0.75, 0.8, 0.9])},  # 0.8 at 3,200
             "short": {"fields": {"d_model": 64}, "rows": _membership_rows([0.5, 0.81])},  # partial, at 1,600
             "lines": {"fields": {"line_positions": True}, "rows": []}},  # not scored yet
}


def test_membership_facts_say_when_each_arm_reaches_the_threshold_and_which_arms_are_partial():
    f = rf.membership_facts(MEMBERSHIP)
    assert f["threshold"] == 0.8 and f["steps"] == 150
    assert f["arms"]["base"] == {"fields": {}, "label": "base", "scores": 4, "last_step": 150,
                                 "last_worlds": 4800, "last_balanced": 0.78, "reached_at": None}
    assert f["arms"]["l8"] == {"fields": {"n_layers": 8}, "label": "l8 (n_layers=8)", "scores": 4,
                               "last_step": 150, "last_worlds": 4800, "last_balanced": 0.9, "reached_at": 3200}
    assert f["arms"]["short"]["reached_at"] == 1600 and f["arms"]["short"]["last_worlds"] == 1600
    assert f["arms"]["lines"] == {"fields": {"line_positions": True}, "label": "lines (line_positions=true)",
                                  "scores": 0, "last_step": None, "last_worlds": None, "last_balanced": None,
                                  "reached_at": None}
    assert f["first"] == ["short"] and f["first_worlds"] == 1600
    assert f["partial"] == ["short", "lines"]
    # a lower threshold: base reaches it too, and ties with l8 where both first reach it
    low = rf.membership_facts(MEMBERSHIP, threshold=0.7)
    assert low["arms"]["base"]["reached_at"] == 1600 and low["first"] == ["base", "l8", "short"]
    # no arm reaches it: no first
    high = rf.membership_facts(MEMBERSHIP, threshold=0.95)
    assert high["first"] == [] and high["first_worlds"] is None


def test_a_membership_run_is_partial_against_its_recorded_steps_or_else_its_longest_arm():
    one = {"steps": 1200, "arms": {"base": {"fields": {}, "rows": _membership_rows([0.5, 0.6, 0.7])}}}
    assert rf.membership_facts(one)["steps"] == 1200 and rf.membership_facts(one)["partial"] == ["base"]
    unnamed = {k: v for k, v in MEMBERSHIP.items() if k != "steps"}
    f = rf.membership_facts(unnamed)
    assert f["steps"] == 150 and f["partial"] == ["short", "lines"]
    shorter = dict(MEMBERSHIP, steps=7)  # an arm that ran longer than the record says sets the steps
    assert rf.membership_facts(shorter)["steps"] == 150


def test_the_membership_figure_draws_a_line_per_scored_arm_at_the_books_width():
    fig = rf.membership_figure(MEMBERSHIP)
    assert fig.get_figwidth() == rf.WIDTH and len(fig.axes) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["base", "l8 (n_layers=8)", "short (d_model=64), partial", "calls every item needed",
                      "0.8 balanced accuracy"]
    lines = [line for line in fig.axes[0].get_lines() if line.get_label() in labels[:3]]
    assert [list(line.get_xdata()) for line in lines] == [[0, 1600, 3200, 4800]] * 2 + [[0, 1600]]
    assert [line.get_linestyle() for line in fig.axes[0].get_lines()[3:]] == [":", "--"]
    assert list(fig.axes[0].get_lines()[3].get_ydata()) == [0.5, 0.5]
    plt.close(fig)
    fig = rf.membership_figure(dict(MEMBERSHIP, arms={"lines": MEMBERSHIP["arms"]["lines"]}))  # nothing scored
    assert len(fig.axes[0].get_lines()) == 2
    plt.close(fig)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("crafting_membership*.json")), ids=lambda p: p.name)
def test_every_committed_membership_run_draws(path):
    record = json.loads(path.read_text())
    f = rf.membership_facts(record)
    assert list(f["arms"]) == list(record["arms"])
    fig = rf.membership_figure(record)
    assert fig.get_figwidth() == rf.WIDTH
    plt.close(fig)
