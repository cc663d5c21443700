"""The asserts of parts 1, 2 and 3 check agent_lab results, and exactly where the prose states an exact figure.

Source-level (no build): every code cell of ``book/part1``, ``book/part2`` and ``book/part3`` is parsed as Python (see
``_asserts.py`` for how an assert is classified). Two rules:

* In a cell that uses ``agent_lab``, an assert that reads no ``agent_lab`` result checks only the chapter's own
  arithmetic. That is allowed when it says so with a ``# by hand:`` comment on its line; otherwise it is an
  assert that looks like a check of the package and is not one.
* A bounds-only assert (orderings, no equality and no distance to a stated value) must not stand in for a figure
  the prose states next to the cell: a multiple ("twelvefold", "three times") the cell does not assert exactly,
  or a decimal or fraction that a literal bound of the assert merely brackets (``> 0.92`` beside "0.923"). A
  multiple the prose itself states as a bound ("at least twice") is a bound, and a bound checks it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ._asserts import CELL, chapter_asserts, chapter_paths, code_cells, is_bounds_only

BOOK = Path(__file__).resolve().parents[2] / "book"
BY_HAND = "# by hand:"
NUMBER_WORDS = {"twice": 2, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20, "hundred": 100}
MULTIPLE = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r")fold\b|\b(\d+|" + "|".join(NUMBER_WORDS) +
                      r")\s+times\b|\b(twice)\b", re.I)
BOUND_WORDS = re.compile(r"\b(at least|at most|more than|fewer than|less than|up to)\s+$", re.I)
FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+|\d+/\d+)(?!\w|\.\d|/)")
CHAPTERS = [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in chapter_paths(BOOK)]


def adjacent_prose(text: str) -> list[tuple[str, str]]:
    """For each code cell, ``(before, after)``: the Markdown of its own section up to the neighbouring code cells."""
    cells = list(CELL.finditer(text))
    out = []
    for i, cell in enumerate(cells):
        before = text[cells[i - 1].end() if i else 0:cell.start()]
        after = text[cell.end():cells[i + 1].start() if i + 1 < len(cells) else len(text)]
        before = re.split(r"^#{1,6} .*$", before, flags=re.M)[-1]  # from the last heading on
        after = re.split(r"^#{1,6} .*$", after, flags=re.M)[0]  # up to the next heading
        out.append((before, after))
    return out


def stated_multiples(prose: str) -> set[int]:
    found = set()
    for match in MULTIPLE.finditer(prose):
        if BOUND_WORDS.search(prose[:match.start()]):
            continue  # "at least twice": the prose states a bound, not an exact figure
        word = next(g for g in match.groups() if g).lower()
        found.add(int(word) if word.isdigit() else NUMBER_WORDS[word])
    return found


def stated_figures(prose: str) -> set[float]:
    out = set()
    for figure in FIGURE.findall(prose):
        num, _, den = figure.partition("/")
        if not den or float(den) != 0:
            out.add(float(num) / float(den) if den else float(num))
    return out


def _literals(node: ast.AST, *, into_calls: bool = False) -> set[float]:
    """Numbers written in an expression; indices never count, call arguments only with ``into_calls``."""
    if isinstance(node, ast.Constant):
        return {float(node.value)} if type(node.value) in (int, float) else set()
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return {-v for v in _literals(node.operand)}
    if isinstance(node, ast.Subscript) or isinstance(node, ast.Call) and not into_calls:
        return set()
    children = ast.iter_child_nodes(node)
    return set().union(*(_literals(child, into_calls=into_calls) for child in children))


def _assert_nodes(source: str) -> list[ast.Assert]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assert)]


def unread_results(text: str) -> list[str]:
    """Asserts in agent_lab cells that read no agent_lab result and do not say they check arithmetic."""
    return [f"cell {a.cell}: {a.source}" for a in chapter_asserts(text)
            if a.cell_uses_agent_lab and not a.uses_agent_lab and BY_HAND not in a.source]


def _exact_literals(source: str) -> set[float]:
    tests = [a.test for a in _assert_nodes(source) if not is_bounds_only(a.test)]
    return set().union(*(_literals(t, into_calls=True) for t in tests))


def bounds_beside_exact_figures(text: str) -> list[str]:
    """Bounds-only asserts next to prose that states the exact figure (see the module docstring).

    Prose between two code cells of one section is read with both: a multiple it states may be asserted
    exactly by either of them.
    """
    problems = []
    cells = code_cells(text)
    exact = [_exact_literals(source) for _, source in cells]
    for index, ((_, source), (before, after)) in enumerate(zip(cells, adjacent_prose(text))):
        bounds = [a for a in _assert_nodes(source) if is_bounds_only(a.test)]
        if not bounds:
            continue
        lines = source.splitlines()
        checked_before = exact[index] | (exact[index - 1] if index else set())
        checked_after = exact[index] | (exact[index + 1] if index + 1 < len(cells) else set())
        missing = (stated_multiples(before) - checked_before) | (stated_multiples(after) - checked_after)
        for multiple in sorted(missing):
            problems.append(f"cell {index}: the prose states a {multiple}-fold figure that no exact assert checks "
                            f"(bounds-only: {lines[bounds[0].lineno - 1].strip()})")
        figures = {f for f in stated_figures(before + "\n" + after) if f not in exact[index]}  # asserted: fine
        for node in bounds:
            for bound in _literals(node.test) - {0.0, 1.0}:
                near = [f for f in figures if f != bound and abs(f - bound) <= 0.1 * abs(f)]
                if near:
                    problems.append(f"cell {index}: {lines[node.lineno - 1].strip()} bounds by {bound:g} what the "
                                    f"prose states as {near[0]:g}; assert the exact value")
    return problems


@pytest.mark.parametrize("path", CHAPTERS)
def test_asserts_in_agent_lab_cells_read_agent_lab_results(path):
    problems = unread_results(path.read_text(encoding="utf-8"))
    assert not problems, (f"{path.name}: asserts that compare no agent_lab result (compare one, or mark pure "
                          f"arithmetic with '{BY_HAND} why'):\n" + "\n".join(problems))


@pytest.mark.parametrize("path", CHAPTERS)
def test_no_bounds_only_assert_where_the_prose_states_an_exact_figure(path):
    problems = bounds_beside_exact_figures(path.read_text(encoding="utf-8"))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


# ----- the rules themselves fail on the patterns they are for ---------------------------------------

def chapter(prose: str, code: str) -> str:
    return f"{prose}\n\n```{{code-cell}} ipython3\n{code}\n```\n"


def test_an_arithmetic_assert_in_an_agent_lab_cell_is_flagged_unless_marked():
    code = ("import math\nfrom agent_lab.estimators import prob_at_least_one_success\n"
            "p = prob_at_least_one_success(0.01, 100)\n"
            "assert math.isclose(0.25 * 0.75, 0.1875)\n"
            "assert round(float(p), 3) == 0.634\n")
    assert unread_results(chapter("Text.", code)) == ["cell 0: assert math.isclose(0.25 * 0.75, 0.1875)"]
    marked = code.replace("0.1875)\n", f"0.1875)  {BY_HAND} 3/16\n")
    assert unread_results(chapter("Text.", marked)) == []


def test_results_flow_through_assignments_loops_calls_and_cells():
    cells = [
        "import torch\nfrom agent_lab import estimators as est\nrows = []\n",
        "for g in (2, 4):\n    rows.append(est.degenerate_group_probability(0.5, g))\nfirst = rows[0]\n",
        "x = torch.zeros(2, requires_grad=True)\nnum, den = est.aggregate(x[None], torch.ones(1, 2), 'token_mean')\n"
        "(num / den).backward()\nassert first == 0.5 and x.grad.tolist() == [0.5, 0.5]\n",
    ]
    text = "".join(chapter("Text.", c) for c in cells)
    (result,) = chapter_asserts(text)
    assert result.uses_agent_lab and result.cell_uses_agent_lab and not result.bounds_only


def test_a_bound_beside_a_stated_multiple_or_figure_is_flagged():
    prose = "The largest ratio grows twelvefold, and the share is 0.923."
    code = "from agent_lab import estimators as est\nr = est.top_share([1.0, 2.0])\nassert r > 10 * 0.05\n"
    problems = bounds_beside_exact_figures(chapter(prose, code))
    assert len(problems) == 1 and "12-fold" in problems[0]
    assert len(bounds_beside_exact_figures(chapter(prose, code.replace("r > 10 * 0.05", "r > 0.92")))) == 2
    assert bounds_beside_exact_figures(chapter("Each plan crafts at least twice.", code)) == []
    assert len(bounds_beside_exact_figures(chapter("Each plan crafts twice.", code))) == 1
    exact = code + "assert round(float(r / 0.05)) == 12\nassert math.isclose(r, 0.923)\n"
    assert bounds_beside_exact_figures(chapter(prose, exact.replace("r > 10 * 0.05", "r > 0.92"))) == []


@pytest.mark.parametrize("test, bounds_only", [
    ("a > 10 * b", True), ("0 <= f <= 1", True), ("a < b < c", True),
    ("abs(a - 0.25) < 1e-3", False), ("float((a - b).abs().max()) < 1e-9", False), ("a == b", False),
    ("math.isclose(a, b)", False), ("torch.allclose(a, b) and a > 0", False), ("x in y", False),
])
def test_bounds_only_means_orderings_without_a_distance_to_a_stated_value(test, bounds_only):
    assert is_bounds_only(ast.parse(test, mode="eval").body) is bounds_only
