"""Source-level checks of part 1, chapters 4-8 (no build needed, so they run in well under a second).

The build executes every cell and its asserts; these tests catch what the build cannot: a chapter whose
"In the code" list names a function the package no longer has, a chapter missing its label, its exercises
with folded solutions, or its "In the code" section, and a chapter with fewer than five asserts that compare an
``agent_lab`` result.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from ._asserts import chapter_asserts

PART1 = Path(__file__).resolve().parents[2] / "book" / "part1"
CHAPTERS = {
    "04_baselines.md": "ch-baselines",
    "05_reward_to_go_td_gae.md": "ch-reward-to-go",
    "06_group_relative_advantages.md": "ch-group-advantages",
    "07_off_policy_ppo_kl_rewards.md": "ch-off-policy",
    "08_exercises.md": "ch-exercises",
}
# `agent_lab.module.name` or `agent_lab.module.Name` inside backticks in the "In the code" list.
QUALIFIED = re.compile(r"`(agent_lab(?:\.\w+)+)`")


def _text(name: str) -> str:
    return (PART1 / name).read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def _names_in_the_code(text: str) -> list[tuple[str, str]]:
    """(module, attribute) pairs named in the 'In the code' list, expanding 'module.f, `g`, `h`' lines.

    Only the names before a line's description count (the text after the first "`:").
    """
    items: list[str] = []
    for line in _section(text, "In the code").splitlines():
        if line.startswith("  ") and items:  # continuation of the previous list item
            items[-1] += " " + line.strip()
        else:
            items.append(line)
    pairs = []
    for line in items:
        line = line.split("`:", 1)[0] + "`"
        qualified = QUALIFIED.findall(line)
        if not qualified:
            continue
        module = qualified[0].rsplit(".", 1)[0]
        for token in re.findall(r"`([\w.]+)`", line):
            if token.startswith("agent_lab."):
                mod, _, attr = token.rpartition(".")
                pairs.append((mod, attr))
            elif re.fullmatch(r"\w+", token):
                pairs.append((module, token))
    return pairs


@pytest.mark.parametrize("name, label", sorted(CHAPTERS.items()))
def test_chapter_starts_with_its_label_and_a_title(name, label):
    body = _text(name).split("\n---\n", 1)[1].lstrip("\n")
    first, second = body.splitlines()[:2]
    assert first == f"({label})=", f"{name}: first line after the front matter is {first!r}"
    assert second.startswith("# "), f"{name}: the label must be followed by a '# Title', got {second!r}"


@pytest.mark.parametrize("name", sorted(CHAPTERS))
def test_chapter_ends_with_exercises_then_in_the_code(name):
    text = _text(name)
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[-1] == "In the code", f"{name}: last section is {headings[-1]!r}"
    if name != "08_exercises.md":  # the exercises chapter is all exercises
        assert headings[-2] == "Exercises", f"{name}: section before 'In the code' is {headings[-2]!r}"
        assert ":class: dropdown" in _section(text, "Exercises"), f"{name}: exercise solutions are not folded"


@pytest.mark.parametrize("name", sorted(CHAPTERS))
def test_every_function_named_in_the_code_exists(name):
    pairs = _names_in_the_code(_text(name))
    assert pairs, f"{name}: 'In the code' names no agent_lab function"
    missing = [f"{m}.{a}" for m, a in pairs if not hasattr(importlib.import_module(m), a)]
    assert not missing, f"{name}: 'In the code' names functions the package lacks: {missing}"


@pytest.mark.parametrize("name", sorted(CHAPTERS))
def test_chapter_asserts_agent_lab_results(name):
    # Counted by reading the cells as Python: an assert of arithmetic that uses no agent_lab result does not count.
    checks = [a for a in chapter_asserts(_text(name)) if a.uses_agent_lab]
    assert len(checks) >= 5, f"{name}: only {len(checks)} asserts compare an agent_lab result"


def test_names_parser_expands_shared_module_prefixes():
    text = ("## In the code\n\n- `agent_lab.estimators.gae`, `td_residuals`: see `not_a_name`.\n- plain text line\n"
            "- `agent_lab.envs.make_env` (text),\n  `replay`: more\n")
    assert _names_in_the_code(text) == [
        ("agent_lab.estimators", "gae"), ("agent_lab.estimators", "td_residuals"),
        ("agent_lab.envs", "make_env"), ("agent_lab.envs", "replay"),
    ]
