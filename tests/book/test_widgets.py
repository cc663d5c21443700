"""The book's widgets: build them, drive their controls from code, check the numbers they display.

Every expected number is derived independently here (closed forms of the two-action example, the
degenerate-group formula, the 2^K - 1 counting bound of number search) rather than copied from the
widget's own output.
"""

from __future__ import annotations

import pytest

from agent_lab import widgets as W


@pytest.fixture(autouse=True)
def _no_static_env(monkeypatch):
    monkeypatch.delenv(W.STATIC_ENV_VAR, raising=False)


# ----- the show mechanism ---------------------------------------------------------------------------
def test_auto_mode_is_live_without_the_env_var_and_static_with_it(monkeypatch):
    assert W.resolve_mode("auto") == "live"
    monkeypatch.setenv(W.STATIC_ENV_VAR, "1")
    assert W.resolve_mode("auto") == "static"
    assert W.resolve_mode("live") == "live"  # an explicit mode wins


def test_unknown_mode_raises_value_error_naming_mode():
    with pytest.raises(ValueError, match="mode"):
        W.resolve_mode("interactive")


def test_static_view_displays_png_then_markdown_hint_and_no_widget(monkeypatch):
    monkeypatch.setenv(W.STATIC_ENV_VAR, "1")
    view = W.baseline_explorer(0.25, 0.0)
    assert isinstance(view, W.StaticView)
    assert view.png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "jupyter lab book/part1/04_baselines.md" in view.hint
    shown = []
    import IPython.display as d

    monkeypatch.setattr(d, "display", lambda obj, **kw: shown.append(obj))
    view._ipython_display_()
    assert [type(o).__name__ for o in shown] == ["Image", "Markdown"]
    assert "jupyter lab" in shown[1].data


def test_static_view_rejects_a_chapter_that_is_not_an_md_path():
    with pytest.raises(ValueError, match="chapter"):
        W.degenerate_group_explorer(mode="static", chapter="chapter six")


# ----- baseline explorer ------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.8])
@pytest.mark.parametrize("b", [-0.5, 0.0, 0.5, 1.0])
def test_two_action_estimate_is_unbiased_with_closed_form_variance(p, b):
    d = W.two_action_estimate_distribution(p, b)
    # A: (1-b)(1-p) with prob p; B: (0-b)(-p) = b p with prob 1-p.
    assert d["values"] == pytest.approx(((1 - b) * (1 - p), b * p))
    assert d["mean"] == pytest.approx(p * (1 - p))  # the baseline never moves the mean
    assert d["variance"] == pytest.approx(p * (1 - p) * (1 - p - b) ** 2)
    assert d["optimal_baseline"] == pytest.approx(1 - p)  # E[R Z^2]/E[Z^2] = p(1-p)^2 / (p(1-p))


@pytest.mark.parametrize("p", [0.1, 0.2497, 0.5, 0.9])
def test_two_action_scores_come_from_autograd_and_equal_one_minus_p_and_minus_p(p):
    assert W.two_action_scores(p) == pytest.approx((1 - p, -p), abs=1e-15)
    assert W.two_action_estimate_distribution(p, 0.0)["scores"] == W.two_action_scores(p)


def test_lecture_numbers_half_and_quarter():
    half = W.two_action_estimate_distribution(0.5, 0.5)
    assert half["values"] == (0.25, 0.25) and half["variance"] == 0.0
    quarter = W.two_action_estimate_distribution(0.25, 0.0)
    assert quarter["mean"] == pytest.approx(0.1875)  # the transcript's ".18"
    assert quarter["values"] == pytest.approx((0.75, 0.0))


def test_baseline_explorer_sliders_update_the_displayed_numbers():
    e = W.baseline_explorer(0.25, 0.0, mode="live")
    assert isinstance(e, W.BaselineExplorer)
    assert "0.1875" in e.readout.value and "0.1055" in e.readout.value  # var = 3/16 * 9/16
    e.baseline.value = 0.75
    assert e.summary["variance"] == pytest.approx(0.0)
    assert "0.0000" in e.readout.value
    e.p.value = 0.5
    assert e.summary["mean"] == pytest.approx(0.25)
    assert e.summary["variance"] == pytest.approx(0.25 * 0.0625)


@pytest.mark.parametrize("p", [0.0, 1.0, float("nan"), "x"])
def test_two_action_rejects_p_outside_open_unit_interval(p):
    with pytest.raises(ValueError, match="p"):
        W.two_action_estimate_distribution(p, 0.0)


# ----- degenerate groups ------------------------------------------------------------------------------
def test_degenerate_summary_matches_lecture_number_and_formula():
    s = W.degenerate_group_summary(0.01, 8)
    assert s["all_failure"] == pytest.approx(0.99**8)
    assert round(s["all_failure"], 3) == 0.923  # the notes' 0.99^8 ~ 0.923
    assert s["degenerate"] == pytest.approx(0.99**8 + 0.01**8)
    assert s["useful_groups"] == pytest.approx(100 * (1 - s["degenerate"]))


def test_degenerate_explorer_controls_update_the_summary():
    e = W.degenerate_group_explorer(0.5, 2, mode="live")
    assert e.summary["degenerate"] == pytest.approx(0.5)
    e.group_size.value = 4
    assert e.summary["degenerate"] == pytest.approx(2 * 0.5**4)
    e.p.value = 0.0
    assert e.summary["degenerate"] == 1.0 and "1.0000" in e.readout.value


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_degenerate_summary_rejects_bad_group_size(bad):
    with pytest.raises(ValueError, match="group_size"):
        W.degenerate_group_summary(0.5, bad)


# ----- number search ----------------------------------------------------------------------------------
def test_number_search_table_initial_value_is_15_over_16_and_optimal_first_guesses_split_evenly():
    t = W.number_search_table()
    assert t["value"] == pytest.approx((2**4 - 1) / 16)
    # 8 leaves 7 below and 8 above, 9 leaves 8 below and 7 above: both find 1 + 7 + 7 of 16.
    assert t["optimal"] == [8, 9]
    # Guessing 1 first: hit 1 of 16, then 3 guesses find at most 7 of the other 15.
    assert t["q"][1] == pytest.approx(8 / 16)


def test_playground_plays_the_transcript_game_and_shows_q_after_each_answer():
    game = W.number_search_playground(11, mode="live")
    game.draw = False
    assert game.guess(8) == "higher"
    assert game.summary["candidates"] == (9, 16)
    assert game.summary["value"] == pytest.approx(7 / 8)  # 2^3 - 1 = 7 of 8 candidates with 3 guesses
    assert game.guess(12) == "lower"
    assert game.summary["candidates"] == (9, 11)
    assert game.summary["q"][10] == pytest.approx(1.0)
    assert game.summary["q"][11] == pytest.approx(2 / 3)  # hit 1/3, then 1 guess for {9, 10}: 1/3
    assert game.guess(10) == "higher"
    assert game.guess(11) == "correct"
    assert game.summary["over"] and game.summary["return"] == 1.0
    with pytest.raises(ValueError, match="new_game"):
        game.guess(3)
    game.new_game()
    assert game.summary["history"] == [] and game.summary["value"] == pytest.approx(15 / 16)


def test_playground_buttons_drive_the_game_and_timeout_gives_zero_return():
    game = W.NumberSearchPlayground(hidden=16, draw=False)
    for a in (1, 2, 3, 4):  # the transcript's failing sequential policy
        game.buttons[a - 1].click()
    assert game.summary["over"] and game.summary["return"] == 0.0
    assert "out of guesses" in game.readout.value


def test_static_playground_summary_follows_the_scripted_game():
    view = W.number_search_playground(11, guesses=(8, 12, 10, 11), mode="static")
    turns = view.summary["turns"]
    assert [(t["guess"], t["feedback"]) for t in turns] == [(8, "higher"), (12, "lower"), (10, "higher"),
                                                            (11, "correct")]
    assert [t["value"] for t in turns] == pytest.approx([15 / 16, 7 / 8, 1.0, 1.0])
    assert view.summary["return"] == 1.0


def test_length_reward_playground_value_is_exact():
    t = W.number_search_table(reward="length")
    # Binary search finds 1, 2, 4 and 8 of the 16 targets on guesses 1-4, each worth R = 1 - 0.05 T:
    # (1 * 0.95 + 2 * 0.90 + 4 * 0.85 + 8 * 0.80) / 16 = 12.55 / 16 = 0.784375, and nothing does better
    # (finding a target earlier needs it nearer the root of the same 15-node search tree).
    assert t["value"] == pytest.approx(0.784375, abs=1e-12)
    assert t["value"] == pytest.approx((1 * 0.95 + 2 * 0.90 + 4 * 0.85 + 8 * 0.80) / 16, abs=1e-12)
