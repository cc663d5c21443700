"""intro.md promises that a cell checks every number in the solutions: each chapter with a folded Solutions
block has, after it, a code cell that asserts (no built book needed)."""

from __future__ import annotations

import re

from ._built import BOOK, chapter_sources

SOLUTIONS = re.compile(r"^```\{admonition\} Solutions", re.M)
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.M | re.S)


def solution_check_problem(text: str) -> str | None:
    """Why a chapter's solutions go unchecked, or None: no code cell with an ``assert`` after its Solutions."""
    found = SOLUTIONS.search(text)
    if found is None:
        return None
    after = text[found.end():]
    if not any(re.search(r"^\s*assert\b", body, re.M) for body in CELL.findall(after)):
        return "no code cell with an assert after its Solutions block"
    return None


def test_the_check_rule_needs_an_asserting_cell_after_the_solutions():
    solutions = "```{admonition} Solutions\n:class: dropdown\n\n1. It is 2.\n```\n"
    check = "```{code-cell} ipython3\n# Check the solutions.\nassert 1 + 1 == 2\n```\n"
    before = "```{code-cell} ipython3\nassert True\n```\n"
    assert solution_check_problem(solutions + check) is None
    assert solution_check_problem(before + solutions) is not None  # a cell above does not check them
    assert solution_check_problem(solutions + "```{code-cell} ipython3\nprint(2)\n```\n") is not None
    assert solution_check_problem("# A chapter without exercises\n") is None


def test_every_chapters_solutions_are_checked_by_a_cell():
    problems = [f"{src.relative_to(BOOK)}: {why}" for src in chapter_sources()
                if (why := solution_check_problem(src.read_text()))]
    assert not problems, ("intro.md promises a cell that checks every number in the solutions; add one after "
                          "the Solutions block of:\n" + "\n".join(problems))
