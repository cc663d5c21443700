r"""The book's interactive widgets (ipywidgets 8), each with a static-figure fallback.

Three explorers, each a small class that owns its controls and recomputes its numbers with
``agent_lab`` on every change:

* :func:`baseline_explorer` -- the two-action example (book/part1/04_baselines.md, ``ch-baselines``):
  the exact distribution, mean and variance of the one-sample REINFORCE estimate
  :math:`\hat g = (r(a) - b)\,\partial_\theta \log\pi_\theta(a)` for a baseline ``b``.
* :func:`degenerate_group_explorer` -- groups of ``G`` binary rewards with success probability ``p``
  (book/part1/06_group_relative_advantages.md, ``ch-group-advantages``): :math:`P(\text{degenerate}) = p^G + (1-p)^G`.
* :func:`number_search_playground` -- play number search and see :math:`V^*` of the current history and
  :math:`Q^*` of every guess (book/part1/00_demonstrations_vs_reward.md, ``ch-demonstrations``).

How a widget shows up (the "show" mechanism). Every explorer function takes ``mode``:

* ``"live"``: returns the explorer object; displaying it (last line of a cell) shows the ipywidgets UI.
* ``"static"``: returns a :class:`StaticView`; displaying it shows a PNG figure and one Markdown line that
  says how to open the chapter as a notebook in JupyterLab. No widget model is created, so no
  widget-view output, widget state or widget JavaScript (which the HTML would have to load from a CDN)
  reaches the built book.
* ``"auto"`` (default): ``"static"`` when the environment variable ``AGENT_LAB_STATIC_WIDGETS`` is set to
  ``1`` (``scripts/build_book.sh`` sets it for the book build), ``"live"`` otherwise (a JupyterLab kernel).

The static figures are ordinary functions (``baseline_figure``, ``degenerate_group_figure``,
``number_search_figure``) that the explorers also draw with, so the figure in the book is the one the
live widget shows for the same settings.
"""

from __future__ import annotations

import base64
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

if not os.environ.get("MPLBACKEND"):
    # Never pick an interactive backend implicitly: the figures are rendered to PNG bytes.
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from agent_lab.envs import NumberSearchDP, make_env  # noqa: E402
from agent_lab.envs.number_search_dp import candidates_after  # noqa: E402
from agent_lab.estimators import token_logprobs  # noqa: E402
from agent_lab.training import degenerate_binary_group_probability, reinforce_estimate  # noqa: E402

__all__ = [
    "STATIC_ENV_VAR",
    "StaticView",
    "resolve_mode",
    "two_action_scores",
    "two_action_estimate_distribution",
    "baseline_figure",
    "BaselineExplorer",
    "baseline_explorer",
    "degenerate_group_summary",
    "degenerate_group_figure",
    "DegenerateGroupExplorer",
    "degenerate_group_explorer",
    "number_search_table",
    "number_search_figure",
    "NumberSearchPlayground",
    "number_search_playground",
]

#: Set to ``1`` to make every explorer render its static figure (the book build does this).
STATIC_ENV_VAR = "AGENT_LAB_STATIC_WIDGETS"

_MODES = ("auto", "live", "static")
#: Two-panel figures: about the width of the book's text column (7 inches at the inline backend's dpi), so they are shown at
#: their own size and 10-point ticks stay 10 points on the page instead of shrinking with the image.
FIGSIZE_TWO_PANELS = (7.0, 3.2)


# ----------------------------------------------------------------------------------------------
# The show mechanism
# ----------------------------------------------------------------------------------------------
def resolve_mode(mode: str = "auto") -> str:
    """``"live"`` or ``"static"`` for a requested ``mode`` (see the module docstring)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {list(_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    flag = os.environ.get(STATIC_ENV_VAR, "").strip().lower()
    return "static" if flag in ("1", "true", "yes", "on") else "live"


def _figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


@dataclass(frozen=True)
class StaticView:
    """What an explorer shows in the built book: a figure and a line on how to run it live.

    ``png`` is the figure as PNG bytes, ``chapter`` the chapter's source path (``book/part1/...md``),
    ``summary`` the numbers the figure shows (so a cell can also ``assert`` on them).
    """

    png: bytes
    chapter: str
    summary: dict

    @property
    def hint(self) -> str:
        """The Markdown line shown under the figure."""
        return (
            "*Static figure.* For the live widget, open this chapter in JupyterLab: "
            f"`.venv/bin/jupyter lab {self.chapter}` (then *Open With → Jupytext Notebook* and run the cells)."
        )

    def _ipython_display_(self) -> None:
        from IPython.display import Image, Markdown, display

        display(Image(data=self.png, format="png"))
        display(Markdown(self.hint))

    def _repr_html_(self) -> str:  # used by non-IPython HTML renderers
        data = base64.b64encode(self.png).decode("ascii")
        return f'<img alt="static figure" src="data:image/png;base64,{data}"/><p>{self.hint}</p>'


def _check_chapter(chapter: str) -> str:
    if not isinstance(chapter, str) or not chapter.endswith(".md"):
        raise ValueError(f"chapter must be the chapter's .md path (e.g. 'book/part1/04_baselines.md'), got {chapter!r}")
    return chapter


def _probability(name: str, value: Any, *, open_interval: bool = False) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number in [0, 1], got {value!r}") from exc
    lo_ok = value > 0.0 if open_interval else value >= 0.0
    hi_ok = value < 1.0 if open_interval else value <= 1.0
    if math.isnan(value) or not (lo_ok and hi_ok):
        bounds = "(0, 1)" if open_interval else "[0, 1]"
        raise ValueError(f"{name} must lie in {bounds}, got {value!r}")
    return value


def _finite(name: str, value: Any) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a finite real number, got {value!r}") from exc
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


# ----------------------------------------------------------------------------------------------
# 1. The two-action baseline example (book/part1/04_baselines.md)
# ----------------------------------------------------------------------------------------------
def two_action_scores(p: float) -> tuple[float, float]:
    r"""Scores :math:`\partial_\theta \log\pi_\theta(a)` of actions A and B, by autograd, at :math:`\sigma(\theta) = p`.

    The policy is :math:`\pi_\theta = \operatorname{softmax}([\theta, 0])`, so :math:`\pi_\theta(A) = \sigma(\theta)`;
    the derivatives come out as :math:`1 - p` and :math:`-p`. Book chapter: "Baselines" (``ch-baselines``).
    """
    p = _probability("p", p, open_interval=True)
    theta = torch.tensor(math.log(p) - math.log1p(-p), dtype=torch.float64, requires_grad=True)
    logits = torch.stack([theta, torch.zeros_like(theta)]).expand(1, 2, 2)  # [B=1, two positions, V=2]
    logprobs = token_logprobs(logits, torch.tensor([[0, 1]]))  # log pi(A), log pi(B)
    return tuple(float(torch.autograd.grad(logprobs[0, a], theta, retain_graph=True)[0]) for a in (0, 1))


def two_action_estimate_distribution(
    p: float, baseline: float, rewards: tuple[float, float] = (1.0, 0.0)
) -> dict:
    r"""Exact distribution of the one-sample REINFORCE estimate in the two-action example.

    Actions A and B have probabilities :math:`p=\sigma(\theta)` and :math:`1-p`; their scores
    :math:`\partial_\theta\log p = 1-p` and :math:`\partial_\theta\log(1-p) = -p` come from
    :func:`two_action_scores` (autograd, returned as ``scores``). One sample gives
    :math:`\hat g = (r(a) - b)\,\partial_\theta\log\pi_\theta(a)`, computed with
    :func:`agent_lab.training.reinforce_estimate` (N = 1). Returns ``values`` (the estimate for A, for B),
    ``probs`` ``(p, 1-p)``, ``mean``, ``variance`` (exact, over the two outcomes), ``true_gradient``
    :math:`(r_A - r_B)\,p(1-p)` and ``optimal_baseline`` :math:`b^* = E[RZ^2]/E[Z^2]`.
    Book: book/part1/04_baselines.md (``ch-baselines``).
    """
    p = _probability("p", p, open_interval=True)
    b = _finite("baseline", baseline)
    if len(rewards) != 2:
        raise ValueError(f"rewards must be a pair (r_A, r_B), got {rewards!r}")
    r_a, r_b = (_finite("rewards[0]", rewards[0]), _finite("rewards[1]", rewards[1]))
    score_a, score_b = two_action_scores(p)
    g_a = reinforce_estimate([(score_a,)], [r_a], [b])[0]
    g_b = reinforce_estimate([(score_b,)], [r_b], [b])[0]
    mean = p * g_a + (1.0 - p) * g_b
    variance = p * (g_a - mean) ** 2 + (1.0 - p) * (g_b - mean) ** 2
    ez2 = p * score_a**2 + (1.0 - p) * score_b**2
    erz2 = p * r_a * score_a**2 + (1.0 - p) * r_b * score_b**2
    return {
        "values": (g_a, g_b),
        "scores": (score_a, score_b),
        "probs": (p, 1.0 - p),
        "mean": mean,
        "variance": variance,
        "true_gradient": (r_a - r_b) * p * (1.0 - p),
        "optimal_baseline": erz2 / ez2,
    }


def baseline_figure(p: float = 0.25, baseline: float = 0.0, rewards: tuple[float, float] = (1.0, 0.0)) -> Figure:
    """Two panels: the estimate's distribution at ``baseline``, and its variance against the baseline."""
    d = two_action_estimate_distribution(p, baseline, rewards)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=FIGSIZE_TWO_PANELS)
    labels = [f"A (prob {d['probs'][0]:.3g})", f"B (prob {d['probs'][1]:.3g})"]
    ax0.bar(labels, d["values"], color=["tab:blue", "tab:red"], alpha=0.8)
    ax0.axhline(d["true_gradient"], color="k", ls="--", lw=1, label=f"true gradient {d['true_gradient']:.4g}")
    ax0.axhline(0.0, color="0.6", lw=0.8)
    ax0.set_ylabel("one-sample estimate")
    ax0.set_title(f"p = {p:.4g}, b = {baseline:.3g}: mean {d['mean']:.4g}, var {d['variance']:.4g}", fontsize=10)
    ax0.legend(loc="best", fontsize=9)
    lo = min(-0.5, baseline - 0.25, d["optimal_baseline"] - 0.25)
    hi = max(1.5, baseline + 0.25, d["optimal_baseline"] + 0.25)
    grid = [lo + (hi - lo) * i / 200 for i in range(201)]
    ax1.plot(grid, [two_action_estimate_distribution(p, b, rewards)["variance"] for b in grid], color="tab:green")
    ax1.axvline(baseline, color="k", ls="--", lw=1, label=f"b = {baseline:.3g}")
    ax1.axvline(d["optimal_baseline"], color="tab:purple", ls=":", lw=1.5, label=f"b* = {d['optimal_baseline']:.3g}")
    ax1.set_xlabel("baseline b")
    ax1.set_ylabel("variance of the estimate")
    ax1.set_title("variance against the baseline", fontsize=10)
    ax1.legend(loc="best", fontsize=9)
    fig.tight_layout()
    return fig


def _readout_html(rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><td style='padding-right:1em'>{k}</td><td><b>{v}</b></td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


class _Explorer:
    """Shared plumbing: an ``ipywidgets.VBox`` of controls, a readout and a figure output."""

    def __init__(self, controls: list) -> None:
        import ipywidgets as w

        self.readout = w.HTML()
        self.figure = w.Output()
        self.widget = w.VBox([*controls, self.readout, self.figure])
        self.summary: dict = {}

    def _observe(self, *controls: Any) -> None:
        for c in controls:
            c.observe(lambda _change: self.update(), names="value")

    def _show(self, rows: Sequence[tuple[str, str]], fig: Figure | None) -> None:
        from IPython.display import Image, display

        self.readout.value = _readout_html(rows)
        self.figure.clear_output(wait=True)
        if fig is not None:
            # PNG bytes, not display(fig): a Figure only renders as an image under the inline backend,
            # and a kernel started with MPLBACKEND=Agg would show "<Figure size ...>" instead.
            png = _figure_png(fig)
            with self.figure:
                display(Image(data=png, format="png"))

    def update(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


class BaselineExplorer(_Explorer):
    """Sliders for p and the baseline b; shows the estimate's distribution, mean and variance."""

    def __init__(self, p: float = 0.25, baseline: float = 0.0, draw: bool = True) -> None:
        import ipywidgets as w

        two_action_estimate_distribution(p, baseline)  # validate before building controls
        self.p = w.FloatSlider(value=p, min=0.01, max=0.99, step=0.01, description="p = σ(θ)")
        self.baseline = w.FloatSlider(value=baseline, min=-1.0, max=2.0, step=0.05, description="baseline b")
        self.draw = draw
        super().__init__([self.p, self.baseline])
        self._observe(self.p, self.baseline)
        self.update()

    def update(self) -> None:
        d = two_action_estimate_distribution(self.p.value, self.baseline.value)
        self.summary = d
        rows = [
            ("estimate if A is drawn", f"{d['values'][0]:.4f}"),
            ("estimate if B is drawn", f"{d['values'][1]:.4f}"),
            ("mean (= true gradient p(1-p))", f"{d['mean']:.4f}"),
            ("variance", f"{d['variance']:.4f}"),
            ("variance-optimal baseline b*", f"{d['optimal_baseline']:.4f}"),
        ]
        self._show(rows, baseline_figure(self.p.value, self.baseline.value) if self.draw else None)


def baseline_explorer(
    p: float = 0.25, baseline: float = 0.0, *, mode: str = "auto", chapter: str = "book/part1/04_baselines.md"
) -> BaselineExplorer | StaticView:
    """The two-action baseline explorer (live widget or static figure; see the module docstring)."""
    if resolve_mode(mode) == "live":
        return BaselineExplorer(p, baseline)
    return StaticView(_figure_png(baseline_figure(p, baseline)), _check_chapter(chapter),
                      two_action_estimate_distribution(p, baseline))


# ----------------------------------------------------------------------------------------------
# 2. Degenerate groups (book/part1/06_group_relative_advantages.md)
# ----------------------------------------------------------------------------------------------
def degenerate_group_summary(p: float, group_size: int, tasks: int = 100) -> dict:
    r"""All-success, all-failure and degenerate probabilities of a group of ``group_size`` binary rewards.

    :math:`P(\text{all succeed}) = p^G`, :math:`P(\text{all fail}) = (1-p)^G`, their sum from
    :func:`agent_lab.training.degenerate_binary_group_probability`; ``useful_groups`` is the expected number of
    the ``tasks`` groups with mixed rewards, :math:`\text{tasks}\,(1 - P(\text{degenerate}))`, and
    ``rollouts`` the rollouts they cost, ``tasks * G``. Book: book/part1/06_group_relative_advantages.md.
    """
    p = _probability("p", p)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise ValueError(f"tasks must be a positive integer, got {tasks!r}")
    degenerate = degenerate_binary_group_probability(p, group_size)
    return {
        "all_success": p**group_size,
        "all_failure": (1.0 - p) ** group_size,
        "degenerate": degenerate,
        "useful_groups": tasks * (1.0 - degenerate),
        "rollouts": tasks * group_size,
    }


def degenerate_group_figure(p: float = 0.01, group_size: int = 8, sizes: Sequence[int] = (2, 4, 8, 16, 64)) -> Figure:
    """P(degenerate) against p for several group sizes, with the chosen (p, G) marked."""
    s = degenerate_group_summary(p, group_size)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=FIGSIZE_TWO_PANELS)
    grid = [i / 400 for i in range(401)]
    for g in sorted(set(sizes) | {group_size}):
        ax0.plot(grid, [degenerate_binary_group_probability(x, g) for x in grid], lw=2 if g == group_size else 1,
                 label=f"G = {g}")
    ax0.plot([p], [s["degenerate"]], "ko")
    ax0.set_xlabel("success probability p")
    ax0.set_ylabel("P(all rewards equal)")
    ax0.set_title(f"p = {p:.4g}, G = {group_size}: P(degenerate) = {s['degenerate']:.4g}", fontsize=10)
    ax0.legend(fontsize=9)
    ax1.bar(["all fail", "all succeed", "mixed"], [s["all_failure"], s["all_success"], 1 - s["degenerate"]],
            color=["tab:red", "tab:blue", "tab:green"])
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("probability")
    ax1.set_title("kinds of group", fontsize=10)
    fig.tight_layout()
    return fig


class DegenerateGroupExplorer(_Explorer):
    """Sliders for p and the group size G; shows how often a group gives no centred signal."""

    def __init__(self, p: float = 0.01, group_size: int = 8, draw: bool = True) -> None:
        import ipywidgets as w

        degenerate_group_summary(p, group_size)
        self.p = w.FloatSlider(value=p, min=0.0, max=1.0, step=0.005, readout_format=".3f", description="p")
        self.group_size = w.IntSlider(value=group_size, min=1, max=64, description="group size G")
        self.draw = draw
        super().__init__([self.p, self.group_size])
        self._observe(self.p, self.group_size)
        self.update()

    def update(self) -> None:
        s = degenerate_group_summary(self.p.value, self.group_size.value)
        self.summary = s
        rows = [
            ("P(all fail) = (1-p)^G", f"{s['all_failure']:.4f}"),
            ("P(all succeed) = p^G", f"{s['all_success']:.4f}"),
            ("P(degenerate)", f"{s['degenerate']:.4f}"),
            ("mixed groups per 100 tasks", f"{s['useful_groups']:.1f} (for {s['rollouts']} rollouts)"),
        ]
        self._show(rows, degenerate_group_figure(self.p.value, self.group_size.value) if self.draw else None)


def degenerate_group_explorer(
    p: float = 0.01, group_size: int = 8, *, mode: str = "auto",
    chapter: str = "book/part1/06_group_relative_advantages.md",
) -> DegenerateGroupExplorer | StaticView:
    """The degenerate-group explorer (live widget or static figure; see the module docstring)."""
    if resolve_mode(mode) == "live":
        return DegenerateGroupExplorer(p, group_size)
    return StaticView(_figure_png(degenerate_group_figure(p, group_size)), _check_chapter(chapter),
                      degenerate_group_summary(p, group_size))


# ----------------------------------------------------------------------------------------------
# 3. Number-search playground (book/part1/00_demonstrations_vs_reward.md)
# ----------------------------------------------------------------------------------------------
def number_search_table(history: Sequence[tuple[int | None, str]] = (), n: int = 16, k: int = 4,
                        reward: str = "binary") -> dict:
    r"""What the playground shows for a history: candidates, :math:`V^*(h)` and :math:`Q^*(h, a)` for every guess.

    Values come from :class:`agent_lab.envs.NumberSearchDP` (success probability for ``reward="binary"``,
    expected return :math:`1 - 0.05T` for ``"length"``), the hidden number being uniform on the candidates.
    Returns ``candidates`` ``(lo, hi)``, ``turn`` (guesses made), ``value``, ``q`` (dict guess -> value) and
    ``optimal`` (the guesses attaining the maximum). Book: book/part1/00_demonstrations_vs_reward.md (``ch-demonstrations``).
    """
    dp = _dp(n, k, reward)
    history = tuple((g, f) for g, f in history)
    q = {a: v for a, v in dp.q_values(history).items() if a is not None}
    return {
        "candidates": candidates_after(history, n),
        "turn": len(history),
        "value": dp.value(history),
        "q": q,
        "optimal": dp.optimal_actions(history),
    }


def _dp(n: int, k: int, reward: str) -> NumberSearchDP:
    """One planner per setting, so its memo table is reused by every query of the playground."""
    key = (n, k, reward)
    if key not in _DP_CACHE:
        _DP_CACHE[key] = NumberSearchDP(n=n, k=k, reward=reward)
    return _DP_CACHE[key]


_DP_CACHE: dict = {}


def _play(hidden: int, guesses: Sequence[int], n: int, k: int, reward: str) -> list[dict]:
    """Play ``guesses`` against the real environment; one record per turn (history before it, answer, reward)."""
    env = make_env("number-search", n=n, guesses=k, reward=reward)
    env.reset([hidden])
    history: list[tuple[int | None, str]] = []
    records = []
    for g in guesses:
        if env.done[0]:
            raise ValueError(f"guesses {list(guesses)!r} continue after the episode ended (hidden number {hidden})")
        step = env.step([f"guess {g}"])
        records.append({"history": tuple(history), "guess": g, "feedback": step.observations[0],
                        "reward": float(step.rewards[0]), "done": bool(step.done[0])})
        history.append((g if step.info[0]["action"] is not None else None, step.observations[0]))
    return records


def number_search_figure(hidden: int = 11, guesses: Sequence[int] = (8, 12, 10, 11), n: int = 16, k: int = 4,
                         reward: str = "binary") -> Figure:
    """One panel per turn of a scripted game: :math:`Q^*` of every guess, the chosen guess and the answer."""
    records = _play(hidden, guesses, n, k, reward)
    fig, axes = plt.subplots(len(records), 1, figsize=(FIGSIZE_TWO_PANELS[0], 1.7 * len(records) + 0.4), sharex=True, squeeze=False)
    xs = list(range(1, n + 1))
    for ax, rec in zip(axes[:, 0], records):
        t = number_search_table(rec["history"], n, k, reward)
        colors = ["tab:green" if a in t["optimal"] else "0.7" for a in xs]
        ax.bar(xs, [t["q"][a] for a in xs], color=colors)
        ax.bar([rec["guess"]], [t["q"][rec["guess"]]], color="none", edgecolor="k", lw=2)
        lo, hi = t["candidates"]
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("Q*")
        ax.set_title(f"turn {t['turn'] + 1}: candidates {lo}..{hi}, V* = {t['value']:.4g}; "
                     f"guess {rec['guess']} (Q* = {t['q'][rec['guess']]:.4g}) -> {rec['feedback']}", fontsize=9)
    axes[-1, 0].set_xticks(xs)
    axes[-1, 0].set_xlabel("guess (green: optimal, black outline: the guess made)")
    fig.suptitle(f"number search, hidden number {hidden}, {k} guesses", fontsize=10)
    fig.tight_layout()
    return fig


class NumberSearchPlayground(_Explorer):
    """Play number search: guess buttons, the feedback, V* of the history and Q* of every guess.

    Drive it from code with :meth:`guess` and :meth:`new_game`; ``summary`` holds the numbers shown.
    """

    def __init__(self, hidden: int = 11, n: int = 16, k: int = 4, reward: str = "binary", draw: bool = True) -> None:
        import ipywidgets as w

        self.n, self.k, self.reward, self.draw = n, k, reward, draw
        _dp(n, k, reward)  # validates n, k, reward
        self.hidden = w.BoundedIntText(value=hidden, min=1, max=n, description="hidden")
        self.new_game_button = w.Button(description="new game")
        self.buttons = [w.Button(description=str(a), layout=w.Layout(width="3.2em")) for a in range(1, n + 1)]
        for a, b in zip(range(1, n + 1), self.buttons):
            b.on_click(lambda _b, a=a: self.guess(a))
        self.new_game_button.on_click(lambda _b: self.new_game())
        self.hidden.observe(lambda _c: self.new_game(), names="value")
        super().__init__([w.HBox([self.hidden, self.new_game_button]), w.HBox(self.buttons)])
        self.new_game()

    def new_game(self) -> None:
        """Start over with the current hidden number."""
        self.env = make_env("number-search", n=self.n, guesses=self.k, reward=self.reward)
        self.env.reset([int(self.hidden.value)])
        self.history: list[tuple[int | None, str]] = []
        self.rewards: list[float] = []
        self.update()

    def guess(self, a: int) -> str:
        """Make guess ``a`` in the environment; returns its answer (``higher``, ``lower``, ``correct``)."""
        if self.env.done[0]:
            raise ValueError("the game is over; call new_game() to play again")
        step = self.env.step([f"guess {a}"])
        self.history.append((a if step.info[0]["action"] is not None else None, step.observations[0]))
        self.rewards.append(float(step.rewards[0]))
        self.update()
        return step.observations[0]

    def update(self) -> None:
        over = bool(self.env.done[0])
        moves = ", ".join(f"{g} -> {f}" for g, f in self.history) or "(none yet)"
        rows = [("guesses so far", moves), ("return so far", f"{sum(self.rewards):g}")]
        fig = None
        if over:
            self.summary = {"over": True, "return": sum(self.rewards), "history": list(self.history)}
            rows.append(("game over", "found it" if self.history[-1][1] == "correct" else "out of guesses"))
        else:
            t = number_search_table(self.history, self.n, self.k, self.reward)
            self.summary = {"over": False, "return": sum(self.rewards), "history": list(self.history), **t}
            lo, hi = t["candidates"]
            rows += [
                ("candidates", f"{lo}..{hi} ({hi - lo + 1} numbers), {self.k - t['turn']} guesses left"),
                ("V*(history)", f"{t['value']:.4f}"),
                ("optimal guesses", ", ".join(map(str, t["optimal"]))),
            ]
            if self.draw:
                fig, ax = plt.subplots(figsize=(FIGSIZE_TWO_PANELS[0], 2.2))
                xs = list(range(1, self.n + 1))
                ax.bar(xs, [t["q"][a] for a in xs],
                       color=["tab:green" if a in t["optimal"] else "0.7" for a in xs])
                ax.set_xticks(xs)
                ax.set_ylim(0, 1.05)
                ax.set_ylabel("Q*(history, guess)")
        self._show(rows, fig)


def number_search_playground(
    hidden: int = 11, *, guesses: Sequence[int] = (8, 12, 10, 11), n: int = 16, k: int = 4, reward: str = "binary",
    mode: str = "auto", chapter: str = "book/part1/00_demonstrations_vs_reward.md",
) -> NumberSearchPlayground | StaticView:
    """The number-search playground (live) or, in the book, the figure of the scripted game ``guesses``."""
    if resolve_mode(mode) == "live":
        return NumberSearchPlayground(hidden, n, k, reward)
    records = _play(hidden, guesses, n, k, reward)
    summary = {"turns": [{**number_search_table(r["history"], n, k, reward), "guess": r["guess"],
                          "feedback": r["feedback"]} for r in records],
               "return": sum(r["reward"] for r in records)}
    return StaticView(_figure_png(number_search_figure(hidden, guesses, n, k, reward)), _check_chapter(chapter),
                      summary)
