"""bench/crafting_curve.py: a cut-off curve resumes to the uninterrupted one exactly; target; stops."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import agent_lab.streams
import agent_lab.trainer as trainer_mod
from agent_lab.recipes import recipe

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = dict(d_model=16, n_layers=1, n_heads=2, sft_batch_size=4, batch_size=8, group_size=4, sft_steps=4,
            sft_slip_from=2, sft_lr_decay_steps=2, steps=3)


def _load():
    spec = importlib.util.spec_from_file_location("crafting_curve", BENCH / "crafting_curve.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


C = _load()


class Crash(Exception):
    """Raised in place of the process being killed."""


def options(folder: Path, **kw):
    settings = {"recipe": "crafting-quick", "seed": 0, "run_dir": folder, "threads": 1, "every_sft": 2,
                "every_rl": 2, "sample": 2, "confirm": 3, "overrides": TINY}
    return C.CurveOptions(**{**settings, **kw})


def cut_off(monkeypatch, folder: Path, step: int) -> None:
    """Run the curve in ``folder`` until the process dies as training step ``step`` begins."""
    real_sft, real_rl = trainer_mod.sft_step, trainer_mod.rl_step

    def die_at(real):
        def step_fn(run, s, *rest):
            if s == step:
                raise Crash
            return real(run, s, *rest)
        return step_fn

    with monkeypatch.context() as m:
        m.setattr(trainer_mod, "sft_step", die_at(real_sft))
        m.setattr(trainer_mod, "rl_step", die_at(real_rl))
        with pytest.raises(Crash):
            C.run_curve(options(folder))


def curve(path: Path) -> list[dict]:
    """The curve's lines without the fields that measure time."""
    def strip(x):
        return {k: strip(v) for k, v in x.items() if k not in C.WALL_CLOCK} if isinstance(x, dict) else x
    return [strip(json.loads(line)) for line in path.read_text().splitlines()]


def weights(folder: Path) -> dict:
    return torch.load(folder / "checkpoint.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whole")
    torch.set_num_threads(1)
    return C.run_curve(options(folder)), folder


@pytest.mark.parametrize("cut", [3, 5])  # inside SFT, and inside RL (after SFT's last checkpoint)
def test_a_cut_off_curve_resumes_to_the_uninterrupted_one_bit_for_bit(uninterrupted, tmp_path, monkeypatch,
                                                                        cut):
    whole_path, whole = uninterrupted
    cut_off(monkeypatch, tmp_path, cut)
    kept = curve(tmp_path / "curve.jsonl")
    assert [x["step"] for x in kept[1:]] == [s for s in (2, 4) if s < cut], "a line per evaluation before it"
    resumed = C.run_curve(options(tmp_path))
    lines = curve(resumed)
    assert lines == curve(whole_path)
    expected = [("sample", 2, "sft"), ("sample", 4, "sft"), ("sample", 6, "rl"), ("sample", 7, "rl"),
                ("confirm", 7, "rl")]
    assert [(x["kind"], x["step"], x["phase"]) for x in lines[1:]] == expected
    assert lines[-1]["demonstrations"] == 16 and lines[-1]["episodes"] == 24
    head = lines[0]
    described = (head["kind"], head["recipe"], head["decoding"], head["candidate_mask"])
    assert described == ("header", "crafting-quick", "greedy", True)
    assert {"cpu", "cpu_flags", "torch_threads", "command"} <= set(head) and head["torch_threads"] == 1
    assert all(x["loss"] is not None for x in lines[1:])
    for g in (g for x in lines[1:] for levels in x["splits"].values() for g in levels.values()):
        assert sum(g["mistakes"].values()) == g["n"] - g["successes"]  # each failed episode, by first mistake
    for x in lines[1:]:  # the loss by role, on the line's test worlds: every level, shares summing to one
        assert sorted(x["nll"]) == sorted(x["splits"]["test"])
        assert all(sum(r["share"] for r in g.values()) == pytest.approx(1.0) for g in x["nll"].values())
    mine, theirs = weights(tmp_path), weights(whole)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    sessions = [json.loads(x) for x in (tmp_path / "sessions.jsonl").read_text().splitlines()]
    assert [s["from_step"] for s in sessions] == [0, 2 if cut == 3 else 4]


def _forget_optimizer(monkeypatch):
    real = trainer_mod.restore

    def restore(run, path):
        real(run, path)
        run.optimizer.state.clear()  # Adam's moments lost
    monkeypatch.setattr(trainer_mod, "restore", restore)


def _stateful_tasks(monkeypatch):
    # a stream that depends on what ran before (one generator for the process): resuming cannot restore it
    shared = np.random.default_rng(0)
    monkeypatch.setattr(agent_lab.streams, "task_rng", lambda seed, step, round_=0: shared)
    monkeypatch.setattr(trainer_mod, "task_rng", lambda seed, step, round_=0: shared)


@pytest.mark.parametrize("break_it", [_forget_optimizer, _stateful_tasks])
def test_the_comparison_catches_a_resume_that_loses_state(tmp_path, monkeypatch, break_it):
    """The check above can fail: resuming without the optimizer's state, or with a random stream whose state
    lives in the process, gives another curve."""
    break_it(monkeypatch)
    whole = C.run_curve(options(tmp_path / "whole"))
    cut_off(monkeypatch, tmp_path / "cut", 3)
    resumed = C.run_curve(options(tmp_path / "cut"))
    assert curve(resumed) != curve(whole)


def test_a_curve_resumed_with_batches_prepared_ahead_is_the_same_curve(uninterrupted, tmp_path, monkeypatch):
    whole_path, whole = uninterrupted
    cut_off(monkeypatch, tmp_path, 3)
    resumed = C.run_curve(options(tmp_path, overrides={**TINY, "prepare_ahead": True}))
    assert curve(resumed) == curve(whole_path)
    with pytest.raises(ValueError, match="prepare_ahead=True .* dagger"):
        C.run_curve(options(tmp_path / "dagger", overrides={**TINY, "prepare_ahead": True, "sft_dagger_prob": 0.5}))


def test_a_folder_resumes_only_with_its_own_settings(uninterrupted, tmp_path, monkeypatch):
    cut_off(monkeypatch, tmp_path, 3)
    with pytest.raises(ValueError, match="other settings .*every_sft.*--run-dir"):
        C.run_curve(options(tmp_path, every_sft=1))
    trainer_mod.train(recipe("crafting-quick", **{**TINY, "steps": 1}), run_dir=str(tmp_path / "plain"),
                      progress=False)  # the trainer's own run, without a curve
    with pytest.raises(ValueError, match="holds a training run but no curve"):
        C.run_curve(options(tmp_path / "plain"))
    with pytest.raises(ValueError, match="needs a crafting recipe"):
        C.run_curve(options(tmp_path / "other", recipe="number-search", overrides={}))


def test_each_level_is_judged_on_its_own_against_its_share_of_the_planner():
    def splits(l1, l2, l3):
        by = {"level 1": {"share": l1}, "level 2": {"share": l2}, "level 3": {"share": l3}}
        return {"test": by, "held_out_goals": dict(by)}
    assert C.meets_target(splits(1.0, 0.95, 0.80))
    assert not C.meets_target(splits(1.0, 0.94, 1.0))  # level 2 alone short: the mean passes, not each level
    assert not C.meets_target(splits(0.95, 0.95, 0.79))
    held_short = {**splits(1.0, 1.0, 1.0), "held_out_goals": splits(1.0, 1.0, 0.5)["test"]}
    assert not C.meets_target(held_short)


def test_evaluations_fall_every_n_steps_of_each_phase_and_at_each_phase_end():
    stops, step = [], 0
    while step < 12:
        step = C.next_stop(step, sft_steps=7, total=12, every_sft=3, every_rl=2)
        stops.append(step)
    assert stops == [3, 6, 7, 9, 11, 12]


def test_a_branch_starts_rl_from_another_curves_cold_start_and_evaluates_it_as_it_decodes(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    sft_only = {**TINY, "steps": 0}
    C.run_curve(options(tmp_path / "sft", overrides=sft_only))
    src = [json.loads(x) for x in (tmp_path / "sft" / "curve.jsonl").read_text().splitlines()]
    unmasked = {**TINY, "candidate_mask": False}
    path = C.run_curve(options(tmp_path / "rl", overrides=unmasked, branch_from=tmp_path / "sft"))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    head, first = lines[0], lines[1]
    assert head["branch_from"] == str(tmp_path / "sft") and head["parent"]["overrides"] == sft_only
    assert head["candidate_mask"] is False and src[0]["candidate_mask"] is True
    # the branch's first line is the source's cold start, at the source's step and counts, decoded unmasked
    start = (first["step"], first["demonstrations"], first["episodes"])
    assert start == (TINY["sft_steps"], src[-1]["demonstrations"], 0)
    assert first["train_s"] == pytest.approx(src[-1]["train_s"])
    assert [x["phase"] for x in lines[2:]] == ["rl"] * (len(lines) - 2) and lines[-1]["episodes"] > 0
    # a source saved before a setting existed reads as if it held the setting's default
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "sft", old)
    saved = torch.load(old / "checkpoint.pt", weights_only=False)
    for section, key in (("model", "prompt_attention"), ("sft", "warmup_steps")):
        del saved["driver_state"]["header"]["config"][section][key]
    torch.save(saved, old / "checkpoint.pt")
    C.run_curve(options(tmp_path / "from-old", overrides=unmasked, branch_from=old))
    with pytest.raises(ValueError, match="another cold start"):
        C.run_curve(options(tmp_path / "other", overrides={**TINY, "sft_lr": 1e-2},
                            branch_from=tmp_path / "sft"))
    # RL may draw its training worlds in other proportions, or charge invalid actions; an option that changes
    # the worlds may not differ
    env_options = C.recipe("crafting-quick").env_options
    rl_only = {"level_weights": [0, 1, 2], "invalid_penalty": 0.1}
    weighted = {**unmasked, "env_options": {**env_options, **rl_only}}
    path = C.run_curve(options(tmp_path / "weighted", overrides=weighted, branch_from=tmp_path / "sft"))
    assert json.loads(path.read_text().splitlines()[0])["config"]["env_options"] == {**env_options, **rl_only}
    with pytest.raises(ValueError, match=r"another cold start \(env_options differ"):
        C.run_curve(options(tmp_path / "other-worlds", branch_from=tmp_path / "sft",
                            overrides={**unmasked, "env_options": {**env_options, "train_levels": [1, 2]}}))
    # SFT alone may go on from the cold start, on a schedule of its own; it may not start before its end
    more = {**unmasked, "sft_steps": 6, "sft_lr_decay_steps": 2, "sft_lr": 1e-2, "steps": 0}
    path = C.run_curve(options(tmp_path / "more-sft", overrides=more, branch_from=tmp_path / "sft"))
    more_lines = [json.loads(x) for x in path.read_text().splitlines()][1:]
    assert [(x["step"], x["phase"]) for x in more_lines] == [(4, "sft"), (6, "sft"), (6, "sft")]
    assert more_lines[-1]["demonstrations"] == src[-1]["demonstrations"] + 2 * TINY["sft_batch_size"]
    assert more_lines[-1]["episodes"] == 0 and more_lines[-1]["kind"] == "confirm"
    with pytest.raises(ValueError, match="not at the end of an SFT phase of at most 3 steps"):
        C.run_curve(options(tmp_path / "less-sft", branch_from=tmp_path / "sft",
                            overrides={**unmasked, "sft_steps": 3, "sft_lr_decay_steps": 1, "sft_slip_from": 2}))
    with pytest.raises(ValueError, match="no checkpoint.pt there"):
        C.run_curve(options(tmp_path / "none", overrides=unmasked, branch_from=tmp_path / "missing"))


def test_rl_lines_carry_the_sampled_batches_diagnostics_since_the_previous_line(uninterrupted):
    path, folder = uninterrupted
    lines = [json.loads(x) for x in path.read_text().splitlines()][1:]
    history = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [h for h in history if h.get("phase") not in (None, "sft")]
    assert rl_rows, "the tiny curve has RL steps"
    for i, line in enumerate(lines):  # a confirmation shares its sample's window
        since = max([x["step"] for x in lines[:i] if x["step"] < line["step"]], default=0)
        want = [h for h in rl_rows if since <= h["step"] < line["step"]]
        if not want:
            assert "rl" not in line, line["step"]
        else:
            for key in ("success", "rejected_share", "entropy", "degenerate_fraction"):
                assert line["rl"][key] == pytest.approx(sum(h[key] for h in want) / len(want)), key
    # a window is only its own steps
    rows = [{"step": 1, "phase": "sft", "success": 0.0}, {"step": 2, "phase": "dr_grpo", "success": 0.5},
            {"step": 3, "phase": "dr_grpo", "success": 1.0, "entropy": 2.0}]
    assert C.rl_diagnostics(rows, 0, 3) == {"success": 0.5}
    assert C.rl_diagnostics(rows, 2, 4) == {"success": 0.75, "entropy": 2.0}
    assert C.rl_diagnostics(rows, 0, 2) == {}


def _failures_script():
    spec = importlib.util.spec_from_file_location("crafting_failures", BENCH / "crafting_failures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_failures_merge_each_runs_failed_episodes_by_first_mistake_into_one_file(uninterrupted, tmp_path, capsys):
    _, folder = uninterrupted
    F, out = _failures_script(), tmp_path / "failures.json"
    out.write_text(json.dumps({"another-run": {"step": 1}}))
    F.main([f"tiny={folder}", "--per-level", "3", "--no-mask", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["another-run"] == {"step": 1}  # merged, not overwritten
    record = saved["tiny"]
    assert record["step"] == weights_step(folder) and record["candidate_mask"] is False
    assert record["by"] == "first mistake"
    assert sorted(record["splits"]) == ["held_out_goals", "test"]
    for levels in record["splits"].values():
        assert sorted(levels) == ["level 1", "level 2", "level 3"]
        for g in levels.values():
            assert g["n"] == 3 and sum(g["failures"].values()) == g["n"] - g["successes"]
            assert "missing ingredients" not in g["failures"]  # always named by what was short
    with pytest.raises(SystemExit):
        F.main([str(tmp_path / "missing"), "--no-mask", "--out", str(out)])
    assert "no checkpoint.pt there" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the decoding must be said
        F.main([str(folder), "--out", str(out)])


def weights_step(folder: Path) -> int:
    return torch.load(folder / "checkpoint.pt", weights_only=False)["step"]
