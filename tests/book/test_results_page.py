"""The results page (book/part3/02_results.md) reads as figures: every section opens with a figure that
has alt text (or says which benchmark has not run yet), its tables are folded below it, and each provenance
line is printed once."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import yaml

from ._asserts import CELL
from ._built import BOOK, built_html

SOURCE = BOOK / "part3" / "02_results.md"


def _cell_options(text: str) -> list[tuple[dict, str]]:
    """(options, code) of every code cell; options: the YAML block between ``---`` lines, if any."""
    out = []
    for cell in CELL.finditer(text):
        code = cell.group(1)
        m = re.match(r"---\n(.*?)\n---\n", code, re.S)
        if m:
            out.append((yaml.safe_load(m.group(1)) or {}, code[m.end():]))
        else:
            out.append(({}, code))
    return out


def test_every_cell_that_draws_a_figure_gives_it_alt_text():
    cells = _cell_options(SOURCE.read_text(encoding="utf-8"))
    drawing = [(opts, code) for opts, code in cells if "plt.show()" in code]
    assert len(drawing) >= 10, "the results page should draw a figure per section"
    missing = [code.strip().splitlines()[0] for opts, code in drawing
               if not ((opts.get("mystnb") or {}).get("image") or {}).get("alt", "").strip()]
    assert not missing, f"figure cells without mystnb.image.alt: {missing}"


class _Sections(HTMLParser):
    """Per ``<section>`` of the page body (h2 level): its images' alt texts, its text and its tables, inside
    or outside a ``<details>`` fold."""

    def __init__(self):
        super().__init__()
        self.sections: list[dict] = []
        self._depth = 0  # open <section> elements
        self._details = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._depth += 1
            if self._depth == 2:
                self.sections.append({"id": a.get("id"), "alts": [], "tables": 0, "open_tables": 0,
                                      "text": ""})
        elif tag == "details":
            self._details += 1
        elif self.sections and self._depth >= 2:
            if tag == "img":
                self.sections[-1]["alts"].append((a.get("alt") or "").strip())
            elif tag == "table":
                self.sections[-1]["tables"] += 1
                self.sections[-1]["open_tables"] += self._details == 0

    def handle_data(self, data):
        if self.sections and self._depth >= 2:
            self.sections[-1]["text"] += data

    def handle_endtag(self, tag):
        if tag == "section":
            self._depth -= 1
        elif tag == "details":
            self._details -= 1


def _sections() -> list[dict]:
    parser = _Sections()
    parser.feed((built_html() / "part3" / "02_results.html").read_text(encoding="utf-8"))
    return parser.sections


#: What a section without its benchmark's records says instead of drawing a figure.
NOT_YET = re.compile(r"Not measured yet on this checkout|No crafting learning curve committed yet")


def test_every_section_shows_a_figure_with_alt_text_and_folds_its_tables():
    sections = _sections()
    assert len(sections) >= 10
    bare = [s["id"] for s in sections if not s["alts"] and not NOT_YET.search(s["text"])]
    assert not bare, f"sections without a figure (or a line saying what is not measured yet): {bare}"
    no_alt = [s["id"] for s in sections if not all(s["alts"])]
    assert not no_alt, f"figures without alt text in: {no_alt}"
    unfolded = [s["id"] for s in sections if s["open_tables"]]
    assert not unfolded, f"tables outside a dropdown in: {unfolded}"
    assert sum(s["tables"] for s in sections) >= 10


def test_no_line_of_the_page_is_printed_twice():
    text = re.sub(r"<[^>]+>", "", (built_html() / "part3" / "02_results.html").read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("Measured by")]
    assert lines and len(lines) == len(set(lines)), "a provenance line is printed twice"


def test_the_share_column_that_repeats_greedy_is_gone():
    page = (built_html() / "part3" / "02_results.html").read_text(encoding="utf-8")
    heads = re.findall(r"<th[^>]*>(.*?)</th>", page, re.S)
    assert not any(re.sub(r"<[^>]+>", "", h).strip() == "share" for h in heads)
