"""The built book holds every chapter that the toc's globs list, under its own title, and each chapter
file starts with its label line and title (the book's layout rule)."""

from __future__ import annotations

import re

import yaml

from ._built import BOOK, built_html, chapter_sources, chapter_title, html_pages, parse


def test_toc_globs_cover_every_part_folder():
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text())
    globs = [c["glob"] for part in toc["parts"] for c in part["chapters"] if "glob" in c]
    assert globs == ["part1/*", "part2/*", "part3/*"]
    assert toc["root"] == "intro"


def test_every_chapter_starts_with_a_label_line_and_a_title():
    sources = chapter_sources()
    assert len(sources) >= 4
    problems = []
    for src in sources:
        label, title = chapter_title(src)
        if not label or not title:
            problems.append(f"{src.relative_to(BOOK)}: label={label!r} title={title!r}")
    assert not problems, "chapters must start with '(ch-...)=' then '# Title':\n" + "\n".join(problems)


def test_chapter_labels_are_unique():
    labels = [chapter_title(src)[0] for src in chapter_sources()]
    assert len(labels) == len(set(labels)), labels


def test_built_book_contains_every_chapter_under_its_title():
    root = built_html()
    missing = []
    for src in chapter_sources():
        page = root / src.relative_to(BOOK).with_suffix(".html")
        if not page.is_file():
            missing.append(f"{page.relative_to(root)} (no page)")
            continue
        _, title = chapter_title(src)
        html_title = re.search(r"<title>(.*?)</title>", page.read_text(encoding="utf-8"), re.S)
        plain = re.sub(r"[`*$\\{}]", "", title)
        if not html_title or plain.split()[0] not in html_title.group(1):
            missing.append(f"{page.relative_to(root)} (title {html_title.group(1) if html_title else None!r})")
    assert not missing, "chapters missing from the build:\n" + "\n".join(missing)


def test_home_page_navigation_links_every_chapter_in_order():
    root = built_html()
    links = [h.split("#")[0] for h in parse(root / "intro.html").links]
    expected = [src.relative_to(BOOK).with_suffix(".html").as_posix() for src in chapter_sources()]
    positions = [links.index(e) if e in links else -1 for e in expected]
    assert -1 not in positions, [e for e, p in zip(expected, positions) if p == -1]
    assert positions == sorted(positions), "the sidebar does not list the chapters in file-name order"


def test_no_page_is_built_that_the_toc_does_not_list():
    root = built_html()
    expected = {src.relative_to(BOOK).with_suffix(".html").as_posix() for src in chapter_sources()}
    extra = [p.relative_to(root).as_posix() for p in html_pages(root)
             if p.relative_to(root).parts[0].startswith("part") and p.relative_to(root).as_posix() not in expected]
    assert not extra, f"stale or unlisted pages in the build: {extra}"
