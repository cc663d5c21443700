"""Tables that cells print as Markdown (the results page's) reach the reader as tables, not as pipes and dashes."""

from __future__ import annotations

import re

from ._built import built_html, html_pages

# A Markdown table's header rule, as written ("|---|") or after Sphinx's smart quotes ("|—|"), in the page's text.
RAW_RULE = re.compile(r"\|\s*(?:-{3,}|—)\s*\|")


def visible_text(page: str) -> str:
    """The page without its code and output blocks (where a literal table may stand) and without tags."""
    page = re.sub(r"<pre\b.*?</pre>", " ", page, flags=re.S)
    return re.sub(r"<[^>]+>", " ", page)


def test_no_page_shows_a_markdown_table_as_text():
    root = built_html()
    raw = [str(p.relative_to(root)) for p in html_pages(root) if RAW_RULE.search(visible_text(p.read_text()))]
    assert not raw, f"Markdown tables rendered as text (render cells' Markdown as MyST) on: {raw}"


def test_the_results_page_renders_its_tables():
    page = (built_html() / "part3" / "02_results.html").read_text()
    assert page.count("<table") >= 5, "the results page should show its benchmark tables as tables"


def test_the_check_sees_a_raw_table_and_ignores_one_in_code():
    assert RAW_RULE.search(visible_text("<p>| a | b |\n|—|—|\n| 1 | 2 |</p>"))
    assert RAW_RULE.search(visible_text("<p>|---|---|</p>"))
    assert not RAW_RULE.search(visible_text("<pre>|---|---|</pre><table><tr><td>1</td></tr></table>"))
