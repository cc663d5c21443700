"""Links from the assignments to the course book, made to work where students open the released notebooks.

The source notebooks link each part to its built chapter relative to ``assignments/source/<name>/``
(``../../../book/_build/html/part1/05_reward_to_go_td_gae.html``). Those links open only inside the course's
repository, after ``make book``. Where the course publishes the built book (``book/_config.yml``'s
``html.baseurl``, or ``AGENT_LAB_BOOK_URL``, which wins), releasing rewrites them to that address, so a released
copy opened anywhere (JupyterLab, a zip on a laptop) links to the published pages.
:class:`BookLinks` does this as an nbgrader preprocessor (``assignments/nbgrader_config.py``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Unicode

__all__ = ["SOURCE_PREFIX", "BookLinks", "book_url", "rewrite_book_links"]

#: How a source notebook links to a built chapter.
SOURCE_PREFIX = "../../../book/_build/html/"
_CONFIG = Path(__file__).resolve().parents[2] / "book" / "_config.yml"
_LINK = re.compile(r"\]\(" + re.escape(SOURCE_PREFIX) + r"([^)\s]+)\)")


def book_url(config: Path = _CONFIG) -> str:
    """Where the built book is published: ``AGENT_LAB_BOOK_URL``, else ``html.baseurl`` of ``config``; ``""`` when
    it is not published (the links then stay relative to the repository)."""
    env = os.environ.get("AGENT_LAB_BOOK_URL", "").strip()
    if env:
        return env
    if not config.is_file():
        return ""
    html = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("html") or {}
    return str(html.get("baseurl") or "").strip()


def rewrite_book_links(text: str, base_url: str) -> str:
    """Markdown ``text`` with every ``](../../../book/_build/html/PAGE)`` link pointing at ``base_url/PAGE``;
    unchanged when ``base_url`` is empty. Other links are left alone."""
    if not base_url:
        return text
    if not re.match(r"^https?://", base_url):
        raise ValueError(f"the book's address must be an http(s) URL (html.baseurl in book/_config.yml or "
                         f"AGENT_LAB_BOOK_URL), got {base_url!r}")
    base = base_url.rstrip("/") + "/"
    return _LINK.sub(lambda m: f"]({base}{m.group(1)})", text)


class BookLinks(Preprocessor):
    """nbgrader preprocessor: rewrite the book links of every markdown cell to the published book."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off unless enabled
    base_url = Unicode("", help="where the built book is published; empty: keep the repository-relative "
                                "links").tag(config=True)

    def preprocess(self, nb, resources):
        if not self.base_url:
            self.log.warning("The released notebooks link to the book inside this repository "
                             "(book/_build/html): set html.baseurl in book/_config.yml, or AGENT_LAB_BOOK_URL, to "
                             "where the built book is published and release again")
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown":
            cell.source = rewrite_book_links(cell.source, self.base_url)
        return cell, resources
