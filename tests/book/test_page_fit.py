"""Source-level page fit (no build): every code cell and literal block (pseudocode in a ```text fence) of the book
wraps at 88 characters, so it fits the text column without a horizontal scrollbar. The browser test checks what the
built pages actually show."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._asserts import CELL

BOOK = Path(__file__).resolve().parents[2] / "book"
WIDTH = 88
CHAPTERS = sorted(BOOK.glob("part*/[0-9][0-9]_*.md"))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_code_cells_wrap_at_88_characters(chapter):
    text = chapter.read_text(encoding="utf-8")
    long = []
    for cell in CELL.finditer(text):
        first = text[:cell.start(1)].count("\n") + 1
        long += [f"line {first + i}: {len(line)} characters" for i, line in enumerate(cell.group(1).splitlines())
                 if len(line) > WIDTH]
    assert not long, f"{chapter.relative_to(BOOK)}: code longer than {WIDTH} characters (wrap it):\n" + "\n".join(long)


def literal_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fence that is not a code cell or a directive."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = None if fence is not None else line
        elif fence is not None and not fence.startswith("```{"):
            out.append((number, line))
    return out


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_literal_blocks_wrap_at_88_characters(chapter):
    long = [f"line {n}: {len(line)} characters" for n, line in literal_blocks(chapter.read_text(encoding="utf-8"))
            if len(line) > WIDTH]
    assert not long, f"{chapter.relative_to(BOOK)}: literal block wider than {WIDTH} characters:\n" + "\n".join(long)


def test_literal_blocks_are_found():
    text = "x\n```text\nshort\n" + "y" * 90 + "\n```\n```{code-cell} ipython3\nz = 1\n```\n"
    assert literal_blocks(text) == [(3, "short"), (4, "y" * 90)]


def test_the_check_sees_every_chapter():
    assert len(CHAPTERS) >= 20 and any(p.parent.name == "part3" for p in CHAPTERS)
