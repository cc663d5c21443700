"""The first command a user types: the defaults reach the optimum, recipes are named, progress reads in a log,
the summary says what to try next, and curves.png draws constant panels on a meaningful scale."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest

import agent_lab.trainer as trainer_mod
from agent_lab.cli import main as cli_main
from agent_lab.diagnostics import PANELS, Progress, curves_figure, next_steps
from agent_lab.recipes import RECIPES, recipe


@pytest.fixture
def captured(monkeypatch):
    """``agent-lab train`` with the training replaced by a recorder of its configuration."""
    seen = []

    def fake_train(cfg, progress=True, **kw):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(trainer_mod, "train", fake_train)
    return seen


@pytest.mark.parametrize(("argv", "name", "changes"), [
    ([], "number-search", {}),
    (["--env", "crafting"], "crafting-quick", {}),
    (["--recipe", "number-search/plain"], "number-search/plain", {}),
    (["--recipe", "number-search", "--lr", "0.01", "--no-stop-at-optimum", "--seed", "3"], "number-search",
     dict(lr=0.01, stop_at_optimum=False, seed=3)),
    (["--recipe", "crafting-quick", "--env-option", "reread=false"], "crafting-quick",
     dict(env_options={"plan": "fetch_full", "reread": False})),
])
def test_train_runs_the_recipe_and_each_flag_overrides_one_of_its_settings(captured, argv, name, changes):
    with pytest.raises(SystemExit):
        cli_main(["train", *argv])
    assert captured[-1] == recipe(name, **changes)


def test_the_default_recipe_is_a_cold_start_then_dr_grpo_stopping_at_the_optimum():
    cfg = recipe("number-search")
    assert cfg.sft.steps > 0 and cfg.algorithm.name == "dr_grpo" and cfg.evaluation.stop_at_optimum
    plain = recipe("number-search/plain")
    assert plain == trainer_mod.TrainConfig() and plain.sft.steps == 0 and not plain.sampling.candidate_mask


def test_the_recipes_command_lists_every_recipe_with_its_purpose(capsys):
    assert cli_main(["recipes"]) == 0
    out = capsys.readouterr().out
    for r in RECIPES.values():
        assert r.name in out and r.purpose[:40] in out.replace("\n    ", " ")


def test_the_assignment_recipe_is_the_notebooks_train_budget():
    import json
    from pathlib import Path

    nb = Path(__file__).resolve().parents[2] / "assignments" / "source" / "policy_gradients" / "policy_gradients.ipynb"
    source = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    start = source.index("TRAIN_BUDGET = dict(")
    budget = eval(source[start + len("TRAIN_BUDGET = "): source.index(")", start) + 1])  # a dict(...) literal
    assert RECIPES["assignment"].settings == budget


@pytest.mark.slow
def test_agent_lab_train_with_no_options_reaches_the_optimum(tmp_path, capsys):
    assert cli_main(["train", "--run-dir", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "0.938 [" in out and "planner" in out and "optimum reached" in out and "step " in out.split("optimum")[-1]
    for f in ("config.json", "loss.txt", "metrics.jsonl", "metrics.csv", "curves.png", "checkpoint.pt",
              "final_eval.json"):
        assert (tmp_path / f).exists(), f
    assert "below the planner's optimum" not in out
    assert re.search(r"^where the time went: SFT: \d+ steps, [\d.]+ s \(loss \d+%", out, re.M), out
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    header = next(line for line in out.splitlines() if line.startswith("recipe "))
    assert header.rstrip() in readme, "README's 'Where to start' shows what agent-lab train prints"


def _row(step, **kw):
    return {"step": step, "phase": "dr_grpo", "loss": 0.1, "success": 0.5, "elapsed_s": step * 0.1, **kw}


def test_progress_without_a_terminal_writes_a_line_every_tenth_and_no_carriage_return():
    out = io.StringIO()
    bar = Progress(40, desc="dr_grpo", stream=out)
    for k in range(40):
        bar.update(_row(k, **({"eval_success": 0.75} if k % 5 == 4 else {})))
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and len(text.splitlines()) == 10
    assert text.splitlines()[-1].startswith("dr_grpo: step 40/40 (100%) loss 0.100 greedy 0.75 sampled 0.50")


def test_progress_writes_the_step_a_phase_stopped_at():
    out = io.StringIO()
    bar = Progress(40, desc="sft", stream=out)
    for k in range(13):
        bar.update({**_row(k), "phase": "sft"})
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("sft: step 13/40") and "sampled" not in lines[-1]


def test_progress_on_a_terminal_updates_one_bar_in_place():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    bar = Progress(5, desc="dr_grpo", stream=out)
    for k in range(5):
        bar.update(_row(k))
    bar.close()
    assert "\r" in out.getvalue() and out.getvalue().count("\n") == 1  # one line, rewritten in place


def test_a_training_run_logs_progress_lines_to_a_file_without_carriage_returns(tmp_path, capsys):
    from conftest import FAST

    trainer_mod.train(trainer_mod.TrainConfig(**{**FAST, "steps": 20}), run_dir=str(tmp_path), progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "dr_grpo: step 20/20 (100%)" in err and "loss = " in err


def _result(rows, success=0.5, optimum=15 / 16, **cfg):
    return SimpleNamespace(final_eval=SimpleNamespace(success=success, optimum=optimum), history=rows,
                           config=trainer_mod.TrainConfig(**cfg), stopped=None)


def test_the_summary_names_the_likely_reason_a_run_ended_below_the_optimum():
    collapsed = [_row(k, degenerate_fraction=0.9, entropy=0.01, success=0.05) for k in range(12)]
    tips = "\n".join(next_steps(_result(collapsed), "number-search/plain"))
    assert "90% of the last steps' groups had all-equal rewards" in tips
    assert "entropy fell to 0.010" in tips and "--entropy-coef" in tips
    assert "--candidate-mask" in tips and "--recipe number-search" in tips
    healthy = [_row(k, degenerate_fraction=0.2, entropy=0.6, success=0.7) for k in range(12)]
    assert "train longer (--steps 80)" in "\n".join(next_steps(_result(healthy, candidate_mask=True), "x"))
    assert next_steps(_result(healthy, success=15 / 16)) == []
    formatted = [_row(k, degenerate_fraction=0.2, entropy=0.9, success=0.24, rejected_share=0.05 + k / 100)
                 for k in range(12)]
    tips = "\n".join(next_steps(_result(formatted), "x"))
    assert "at most 16% of the sampled actions were refused" in tips and "--sft-steps 200" in tips
    assert "at most" not in "\n".join(next_steps(_result(formatted, candidate_mask=True), "x"))
    still_refused = [dict(r, rejected_share=0.3) for r in formatted]
    assert "at most" not in "\n".join(next_steps(_result(still_refused), "x"))


def test_curves_draw_constant_panels_on_a_fixed_scale_with_labels_and_legends_off_the_curves():
    rows = [_row(k, ratio_mean=1.0, ratio_max=1.0 + 1e-7, ratio_min=1.0 - 1e-7, ess_fraction=1.0 - 1e-7,
                 kl_old_new_k3_on_old=1e-14, kl_new_ref_k3_on_old=0.0, logprob_gap_max=2e-7, logprob_gap_mean=3e-8, eval_success=0.5,
                 optimum=0.9375) for k in range(10)]
    fig = curves_figure(rows)
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    lo, hi = axes["importance ratio"].get_ylim()
    assert lo <= 0.8 and hi >= 1.2, "the ratio is drawn within at least the clip range around 1"
    assert axes["ESS / B"].get_ylim() == pytest.approx((0.0, 1.02))
    assert axes["KL"].get_ylim()[0] == 0.0 and axes["KL"].get_ylim()[1] >= 1e-2
    assert not axes["importance ratio"].yaxis.get_major_formatter().get_offset(), "no axis offset (1e-6+1)"
    kl_legend = [t.get_text() for t in axes["KL"].get_legend().get_texts()]
    assert kl_legend == ["KL(old||new), k3 on old", "KL(new||ref), rho-weighted k3 on old"], "direction and sampler"
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for title, ax in axes.items():
        assert ax.get_ylabel(), f"panel {title!r} has no y label"
        legend = ax.get_legend()
        if legend is not None:  # drawn above the axes, so it cannot cover a curve
            assert legend.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1 - 1, title
    assert {p.title for p in PANELS} >= set(axes)
