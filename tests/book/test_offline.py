"""The built book needs nothing from the network: no script, style, font, image or frame is loaded
from an http(s) URL, MathJax is served from the build, and no widget JavaScript or launch button
reaches the pages."""

from __future__ import annotations

import pytest

from ._built import EXTERNAL, built_html, css_external_urls, html_pages, parse

FORBIDDEN_SNIPPETS = (
    "application/vnd.jupyter.widget-view+json",  # a widget view would need the CDN widget manager
    "application/vnd.jupyter.widget-state+json",
    "require.min.js",
    "embed-amd.js",
    "unpkg.com",
    "cdn.jsdelivr.net",
    "cdnjs.cloudflare.com",
    "mybinder.org",
    "colab.research.google.com",
    "thebe-launch-button",
    "THEBE_JS_URL",
)


def test_no_page_loads_an_external_resource():
    root = built_html()
    bad = []
    for page in html_pages(root):
        parsed = parse(page)
        bad += [f"{page.relative_to(root)}: <{tag}> {url}" for tag, url in parsed.resources if EXTERNAL.match(url)]
        for css in parsed.inline_styles:
            bad += [f"{page.relative_to(root)}: inline style {url}" for url in css_external_urls(css)]
    assert not bad, "pages load resources from outside the build:\n" + "\n".join(bad[:30])


def test_no_stylesheet_in_the_build_imports_external_fonts_or_styles():
    root = built_html()
    bad = []
    for css in (root / "_static").rglob("*.css"):
        bad += [f"{css.relative_to(root)}: {u}" for u in css_external_urls(css.read_text(errors="replace"))]
    assert not bad, "stylesheets reference external URLs:\n" + "\n".join(bad[:30])


def test_no_widget_javascript_cdn_or_launch_button_in_any_page():
    root = built_html()
    bad = []
    for page in html_pages(root):
        text = page.read_text(encoding="utf-8", errors="replace")
        bad += [f"{page.relative_to(root)}: {s}" for s in FORBIDDEN_SNIPPETS if s in text]
    assert not bad, "\n".join(bad[:30])


def test_mathjax_is_served_from_the_build_on_every_page_with_math():
    root = built_html()
    assert (root / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax was not copied into _static"
    assert list((root / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff")), (
        "MathJax's CHTML fonts are missing from the build"
    )
    pages_with_math = 0
    for page in html_pages(root):
        text = page.read_text(encoding="utf-8", errors="replace")
        if 'class="math' not in text:
            continue
        pages_with_math += 1
        scripts = [url for tag, url in parse(page).resources if tag == "script" and "mathjax" in url.lower()]
        assert scripts, f"{page.relative_to(root)} has math but loads no MathJax"
        assert all(not EXTERNAL.match(u) and "_static/mathjax/" in u for u in scripts), (page, scripts)
    assert pages_with_math > 0, "no page has math: the scan would prove nothing"


@pytest.mark.parametrize("css", ["a{background:url(https://x.org/a.png)}", "@import 'http://x.org/f.css';",
                                 "b{src:url(//fonts.example/f.woff2)}"])
def test_css_scan_detects_external_references(css):
    # The scanner itself must be able to fail.
    assert css_external_urls(css)


def test_css_scan_allows_data_and_relative_urls():
    assert css_external_urls("a{background:url(data:image/svg+xml;utf8,<svg/>)} b{src:url(../fonts/x.woff2)}") == []


def test_every_widget_shows_a_static_figure_and_the_jupyterlab_line_in_the_book():
    import re

    from ._built import BOOK, chapter_sources

    root = built_html()
    calls = re.compile(r"\b(baseline_explorer|degenerate_group_explorer|number_search_playground)\(")
    checked = 0
    for src in chapter_sources():
        text = src.read_text(encoding="utf-8")
        # only calls inside code cells count (prose may name the functions)
        code = "\n".join(re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", text, re.S))
        if not calls.search(code):
            continue
        page = root / src.relative_to(BOOK).with_suffix(".html")
        html = page.read_text(encoding="utf-8")
        rel = src.relative_to(BOOK.parent).as_posix()
        assert "Static figure." in html, f"{page.name}: the widget did not render its static figure"
        assert re.search(r"jupyter</span>\s*<span[^>]*>lab</span>\s*<span[^>]*>" + re.escape(rel), html), (
            f"{page.name}: no 'open in JupyterLab' line naming {rel}")
        checked += 1
    assert checked >= 1, "no chapter uses a widget: nothing was checked"
