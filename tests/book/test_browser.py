"""Open every page of the built book in headless Chromium, offline, and check what a reader sees.

A local HTTP server serves ``book/_build/html``; every request to any other host is aborted and
recorded as a failure. On each page: math is typeset by MathJax (``mjx-container`` elements, no raw
``$$`` left in the text), every image has loaded, the console has no errors, no request failed, and
every internal link points to an existing page and anchor; no code cell, output, display equation or table is
wider than the text column at 1280 px, and no figure is shown at less than 90% of the width it was drawn at (its
ticks would shrink below 9 pt). Screenshots of three pages are written to
``test-output/book/`` (git-ignored).

Uses Playwright's Python driver with Debian's ``/usr/bin/chromium``.
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from ._built import ROOT, built_html, html_pages, parse

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.xdist_group("book-browser")]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUT = ROOT / "test-output" / "book"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def server():
    root = built_html()
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", root
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing; install Debian's chromium (make sysdeps)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


# JavaScript run in the page once it has loaded and MathJax (if any) has finished typesetting.
_PAGE_CHECK = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const mathNodes = document.querySelectorAll('.math, span.math, div.math');
  const typeset = document.querySelectorAll('mjx-container').length;
  // Raw TeX left in visible text outside code blocks.
  const clone = document.querySelector('main') ? document.querySelector('main').cloneNode(true) : document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container').forEach(n => n.remove());
  const text = clone.textContent;
  const imgs = Array.from(document.images).map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0}));
  // Horizontal overflow: code, outputs, display equations and tables wider than the column they sit in.
  const root = document.querySelector('main') || document.body;
  const wide = Array.from(root.querySelectorAll(OVERFLOW_SELECTORS))
    .filter(el => el.scrollWidth > el.clientWidth + 1)
    .map(el => ({kind: el.tagName.toLowerCase() + (el.className ? '.' + String(el.className).split(' ')[0] : ''),
                 text: (el.textContent || '').trim().slice(0, 60), width: el.scrollWidth, column: el.clientWidth}));
  // Cell-output figures shown smaller than they were drawn: their type shrinks with them.
  const shrunk = Array.from(root.querySelectorAll('div.cell_output img'))
    .filter(i => i.naturalWidth > 0 && i.getBoundingClientRect().width < MIN_FIGURE_SCALE * i.naturalWidth)
    .map(i => ({src: (i.getAttribute('src') || '').slice(0, 60), drawn: i.naturalWidth,
                shown: Math.round(i.getBoundingClientRect().width)}));
  return {mathNodes: mathNodes.length, typeset, rawDisplayMath: text.includes('$$'),
          rawInlineBegin: /\\\\\\(|\\\\begin\\{/.test(text), imgs, wide, shrunk};
}
"""
# What must fit the text column at 1280 px: code and its outputs (Pygments blocks), display math, tables.
OVERFLOW_SELECTORS = ", ".join(["div.cell_input pre", "div.cell_output pre", "div.highlight pre",
                                'mjx-container[display="true"]', "table", ".pst-scrollable-table-container"])
# A figure drawn with 10-point ticks and shown at 90% of its size still has 9-point ticks.
MIN_FIGURE_SCALE = 0.9
_PAGE_CHECK = _PAGE_CHECK.replace("OVERFLOW_SELECTORS", repr(OVERFLOW_SELECTORS)).replace(
    "MIN_FIGURE_SCALE", str(MIN_FIGURE_SCALE))


def _check_page(browser, base: str, rel: str) -> tuple[list[str], object]:
    """Load one page offline; return the problems found and the open page (for a screenshot)."""
    problems: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)  # a loaded 2-core machine can be slow to load and typeset a page

    def route(r):
        host = urlparse(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:")) or host in LOCAL_HOSTS:
            r.continue_()
        else:
            problems.append(f"external request blocked: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})")
            if urlparse(r.url).hostname in LOCAL_HOSTS else None)
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.goto(base + rel, wait_until="load")
    if rel == "index.html":  # Sphinx's index.html only redirects to the root document
        page.wait_for_url("**/intro.html", timeout=10_000)
        page.wait_for_load_state("load")
    result = page.evaluate(_PAGE_CHECK)
    if result["mathNodes"] and not result["typeset"]:
        problems.append(f"{result['mathNodes']} math nodes but nothing typeset by MathJax")
    if result["rawDisplayMath"]:
        problems.append("raw $$ left in the page text")
    if result["rawInlineBegin"]:
        problems.append("raw \\( or \\begin{ left in the page text")
    problems += [f"image did not load: {i['src'][:80]}" for i in result["imgs"] if not i["ok"]]
    problems += [f"overflows horizontally ({w['kind']}, {w['width']} px in a {w['column']} px column): "
                 f"{w['text']!r}" for w in result["wide"]]
    problems += [f"figure shown at {s['shown']} px but drawn {s['drawn']} px wide (its type shrinks below 9 pt; "
                 f"draw it narrower): {s['src']}" for s in result["shrunk"]]
    return problems, page


def _broken_links(root: Path, page_path: Path, ids_cache: dict) -> list[str]:
    """Internal ``<a href>`` targets of one page that do not exist (file or anchor)."""
    bad = []
    for href in parse(page_path).links:
        if href.startswith(("mailto:", "javascript:")) or urlparse(href).scheme in ("http", "https"):
            continue
        url, frag = urldefrag(href)
        target = page_path if not url else (page_path.parent / unquote(urlparse(url).path)).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or root.resolve() not in target.resolve().parents:
            bad.append(f"{href} -> missing {target}")
            continue
        if frag and target.suffix == ".html":
            if target not in ids_cache:
                ids_cache[target] = parse(target).ids
            if unquote(frag) not in ids_cache[target]:
                bad.append(f"{href} -> no id {frag!r} in {target.name}")
    return bad


def test_every_page_renders_offline_with_math_images_and_no_errors(server, browser):
    base, root = server
    pages = [p.relative_to(root).as_posix() for p in html_pages(root)]
    assert "intro.html" in pages and len(pages) >= 5
    OUT.mkdir(parents=True, exist_ok=True)
    shots = ["intro.html"] + [p for p in pages if p.startswith("part1/")][:1]
    shots += [p for p in pages if p.startswith("part1/03")][:1] or [p for p in pages if p.startswith("part")][-1:]
    failures = {}
    typeset_pages = 0
    for rel in pages:
        problems, page = _check_page(browser, base, rel)
        if page.locator("mjx-container").count():
            typeset_pages += 1
        if rel in shots:
            page.screenshot(path=str(OUT / (rel.replace("/", "__").replace(".html", ".png"))), full_page=False)
        page.close()
        if problems:
            failures[rel] = problems
    assert not failures, "\n".join(f"{k}:\n  " + "\n  ".join(v[:10]) for k, v in failures.items())
    assert typeset_pages > 0, "MathJax typeset nothing anywhere: the math check would prove nothing"
    assert len(list(OUT.glob("*.png"))) >= 3


def test_no_internal_link_is_broken():
    root = built_html()
    cache: dict = {}
    bad = {}
    for page in html_pages(root):
        broken = _broken_links(root, page, cache)
        if broken:
            bad[page.relative_to(root).as_posix()] = broken
    assert not bad, "\n".join(f"{k}: {v[:5]}" for k, v in bad.items())


def test_blocked_external_request_is_reported(browser, server):
    # The network guard itself must be able to fail: a page that loads an external script is caught.
    base, _ = server
    page = browser.new_page()
    seen = []

    def route(r):
        if urlparse(r.request.url).hostname in LOCAL_HOSTS:
            r.continue_()
        else:
            seen.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(base + "intro.html")
    page.evaluate("""() => new Promise(res => { const s = document.createElement('script');
        s.src = 'https://cdn.example.org/x.js'; s.onerror = res; s.onload = res; document.head.appendChild(s); })""")
    page.close()
    assert seen == ["https://cdn.example.org/x.js"]


def test_link_checker_detects_a_missing_target(tmp_path):
    (tmp_path / "a.html").write_text('<a href="b.html">x</a><a href="#here">y</a><p id="there"></p>')
    bad = _broken_links(tmp_path, tmp_path / "a.html", {})
    assert len(bad) == 2
