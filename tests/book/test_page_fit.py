"""Page fit of the text: every code cell and literal block (pseudocode in a ```text fence) of the book
wraps at 88 characters, so it fits the text column without a horizontal scrollbar, and so does every line a cell
prints in the built book. The browser test checks what the built pages actually show."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from ._asserts import CELL
from ._built import built_html

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


class _OutputText(HTMLParser):
    """The text of every ``<pre>`` inside a cell's output (``div.cell_output``) of a built page."""

    def __init__(self):
        super().__init__()
        self.blocks: list[str] = []
        self._divs: list[bool] = []  # for each open div: is it a cell output?
        self._pre = 0

    def handle_starttag(self, tag, attrs):
        if tag == "div":
            self._divs.append("cell_output" in (dict(attrs).get("class") or "").split())
        elif tag == "pre" and any(self._divs):
            self._pre += 1
            self.blocks.append("")

    def handle_endtag(self, tag):
        if tag == "div" and self._divs:
            self._divs.pop()
        elif tag == "pre" and self._pre:
            self._pre -= 1

    def handle_data(self, data):
        if self._pre:
            self.blocks[-1] += data


def long_output_lines(page: str) -> list[str]:
    parser = _OutputText()
    parser.feed(page)
    return [line for block in parser.blocks for line in block.splitlines() if len(line) > WIDTH]


def test_long_output_lines_are_found():
    page = ('<div class="cell_output docutils container"><div class="output stream"><pre>short\n' + "y" * 90
            + '</pre></div></div><div class="cell_input"><pre>' + "z" * 95 + "</pre></div>")
    assert long_output_lines(page) == ["y" * 90]


def test_printed_outputs_wrap_at_88_characters():
    """What a cell prints fits the text column too: a longer line would wrap in the page and break its table."""
    root = built_html()
    long = {}
    for page in sorted(root.glob("part*/*.html")):
        lines = long_output_lines(page.read_text(encoding="utf-8"))
        if lines:
            long[page.relative_to(root).as_posix()] = [f"{len(line)}: {line[:70]}" for line in lines]
    assert not long, f"printed lines longer than {WIDTH} characters:\n" + "\n".join(
        f"{k}:\n  " + "\n  ".join(v) for k, v in long.items())
