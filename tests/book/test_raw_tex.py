"""No page of the built book shows raw TeX: every `$...$` of the sources must come out as typeset math.

Math that MyST's parser did not recognise stays in the page as text: a `$`, a `\\Phi`, a `\\frac`. The classic
cause is a source line inside inline math that starts with `- `, `+ ` or `* `: Markdown reads it as a list
item, the math is cut in two, and the reader sees a bullet, raw TeX and a formula without its minus sign.
Sphinx puts every math it did parse in an element of class `math` (MathJax typesets those), so any `$` or TeX
command left in the text outside such an element, code and literal blocks aside, is math the reader sees raw.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ._built import BOOK, built_html, html_pages

FIXTURES = Path(__file__).with_name("fixtures")
# A `$`, a TeX command such as \Phi or \frac, or MathJax's own delimiters \( \) \[ \] left in the text.
RAW_TEX = re.compile(r"\$|\\[A-Za-z]+|\\[()\[\]]")
# Text in these elements is code, or not shown as prose: a `$` or a backslash there is meant literally.
LITERAL_TAGS = {"pre", "code", "kbd", "samp", "tt", "script", "style", "textarea", "head"}
LITERAL_CLASSES = {"math", "literal", "highlight", "MathJax", "mjx-chtml"}
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
             "wbr"}


class _RawTexFinder(HTMLParser):
    """Collects the text outside math, code and literal elements, with the line it starts on."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, literal: this element or one above it is exempt)
        self.found: list[tuple[int, str]] = []

    def _literal(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def handle_starttag(self, tag, attrs):
        if tag in VOID_TAGS:
            return
        classes = set((dict(attrs).get("class") or "").split())
        self.stack.append((tag, self._literal() or tag in LITERAL_TAGS or bool(classes & LITERAL_CLASSES)))

    def handle_endtag(self, tag):
        # Pop to the matching start tag; an end tag without one (malformed HTML) is ignored.
        for depth in range(len(self.stack) - 1, -1, -1):
            if self.stack[depth][0] == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data):
        if not self._literal() and RAW_TEX.search(data):
            self.found.append((self.getpos()[0], data))


def raw_tex(html: str) -> list[str]:
    """Each stretch of a page's text showing a `$` or a TeX command outside a math element, with its line."""
    finder = _RawTexFinder()
    finder.feed(html)
    finder.close()
    out = []
    for line, text in finder.found:
        hit = RAW_TEX.search(text)
        excerpt = " ".join(text[max(0, hit.start() - 60):hit.end() + 60].split())
        out.append(f"line {line}: ...{excerpt}...")
    return out


def test_the_finder_flags_the_list_item_that_broke_a_formula_in_two():
    # The paragraph of part2/06 as the book built it when a line of inline math started with "- \Phi(s_t)$".
    html = (FIXTURES / "raw_tex_list_item.html").read_text(encoding="utf-8")
    found = raw_tex(html)
    assert any("\\gamma\\Phi(s_{t+1})" in f for f in found), found
    assert any("\\Phi(s_t)" in f for f in found), found


def test_the_finder_ignores_typeset_math_code_and_literals():
    html = ('<p>Cost <span class="math notranslate nohighlight">\\(\\frac{1}{2}\\)</span> and</p>'
            '<div class="math notranslate nohighlight">\\[\\sum_i x_i\\]</div>'
            '<div class="highlight"><pre>print("$5", "\\\\n")</pre></div>'
            '<p><code class="docutils literal"><span class="pre">$HOME\\n</span></code><br>fine</p>')
    assert raw_tex(html) == []
    assert len(raw_tex('<p>a <em>raw</em> \\mathbb{E} after</p><p>and a $ sign</p>')) == 2


def _dollars(line: str) -> int:
    """How many inline-math `$` a source line holds (code spans, `$$` and an escaped `\\$` do not count)."""
    return re.sub(r"`[^`]*`", "", line).replace("$$", "").replace("\\$", "").count("$")


def list_items_inside_math(text: str) -> list[int]:
    """Line numbers of source lines that sit inside inline math and start with `- `, `+ ` or `* `."""
    bad, inline, fence = [], False, False  # inline: inside a `$...$` that began on an earlier line
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            fence, inline = not fence, False
            continue
        if fence or stripped.startswith("$$") or not stripped:
            inline = False  # a blank line ends the paragraph, and with it any inline math
            continue
        if inline and stripped[:2] in ("- ", "+ ", "* "):
            bad.append(number)
        inline = (inline + _dollars(line)) % 2 == 1
    return bad


def test_no_source_line_inside_inline_math_starts_a_list_item():
    """The same slip, caught in the sources without a build."""
    assert list_items_inside_math("shaping, $F = \\gamma\\Phi(s')\n- \\Phi(s)$, does not") == [2]
    sources = [page for page in sorted(BOOK.rglob("*.md")) if "_build" not in page.parts]
    bad = [f"{page.relative_to(BOOK)}:{number}" for page in sources
           for number in list_items_inside_math(page.read_text(encoding="utf-8"))]
    assert not bad, ("a line inside inline math starts with '- ', '+ ' or '* ', which Markdown reads as a "
                     "list item (reflow the paragraph so that the line starts elsewhere):\n" + "\n".join(bad))


def test_no_page_shows_raw_tex():
    root = built_html()
    bad = {}
    for page in html_pages(root):
        found = raw_tex(page.read_text(encoding="utf-8", errors="replace"))
        if found:
            bad[str(page.relative_to(root))] = found[:5]
    assert not bad, ("math left as raw text outside a typeset math element (a `$` or a TeX command the "
                     "reader sees as is; often a source line inside `$...$` that starts with `- `, `+ ` or "
                     "`* `):\n"
                     + "\n".join(f"{page}:\n  " + "\n  ".join(lines) for page, lines in bad.items()))
