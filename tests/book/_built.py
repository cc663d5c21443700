"""Shared helpers for the tests that read the built book (``make book`` writes ``book/_build/html``)."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
# AGENT_LAB_BOOK_HTML points the tests at another build (e.g. a scratch copy); default: make book's output.
HTML = Path(os.environ.get("AGENT_LAB_BOOK_HTML", BOOK / "_build" / "html"))
CHAPTER_GLOB = "part*/[0-9][0-9]_*.md"


def built_html() -> Path:
    """The build directory, or a test failure that says how to make it."""
    if not (HTML / "index.html").is_file():
        pytest.fail(f"the book is not built: {HTML / 'index.html'} is missing; run `make book` first")
    return HTML


def chapter_sources() -> list[Path]:
    """Every chapter file the toc's globs pick up, in book order."""
    return sorted(BOOK.glob(CHAPTER_GLOB), key=lambda p: (p.parent.name, p.name))


def html_pages(root: Path) -> list[Path]:
    """Every HTML page of the build except Sphinx's own sources copies."""
    return sorted(p for p in root.rglob("*.html") if "_sources" not in p.parts and "_static" not in p.parts)


def chapter_title(source: Path) -> tuple[str, str]:
    """``(label, title)`` of a chapter: its ``(label)=`` line and the ``# Title`` that follows."""
    label = title = None
    for line in source.read_text(encoding="utf-8").splitlines():
        if label is None:
            m = re.fullmatch(r"\((ch-[a-z0-9-]+)\)=", line.strip())
            if m:
                label = m.group(1)
            continue
        if line.strip():
            m = re.fullmatch(r"#\s+(.+)", line.strip())
            title = m.group(1).strip() if m else None
            break
    return label, title


class ResourceParser(HTMLParser):
    """Collects what a page loads (scripts, styles, images, frames, fonts) and every element id."""

    LOADING = {
        "script": ("src",),
        "link": ("href",),
        "img": ("src", "srcset"),
        "iframe": ("src",),
        "source": ("src", "srcset"),
        "video": ("src", "poster"),
        "audio": ("src",),
        "embed": ("src",),
        "object": ("data",),
    }

    def __init__(self) -> None:
        super().__init__()
        self.resources: list[tuple[str, str]] = []  # (tag, url)
        self.links: list[str] = []  # <a href>
        self.ids: set[str] = set()
        self.inline_styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for attr in self.LOADING.get(tag, ()):
            if a.get(attr):
                if tag == "link" and (a.get("rel") or "") in ("canonical", "next", "prev", "index", "search"):
                    continue  # navigation links, nothing is loaded
                self.resources.append((tag, a[attr]))
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if a.get("style"):
            self.inline_styles.append(a["style"])
        if tag == "style":
            self._in_style = True

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.inline_styles.append(data)


def parse(path: Path) -> ResourceParser:
    parser = ResourceParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


EXTERNAL = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""", re.IGNORECASE)


def css_external_urls(css: str) -> list[str]:
    """``url(...)`` and ``@import`` targets in CSS text that point off the build (data: URIs are fine)."""
    out = []
    for m in CSS_URL.finditer(css):
        url = m.group(1) or m.group(2)
        if EXTERNAL.match(url):
            out.append(url)
    return out
