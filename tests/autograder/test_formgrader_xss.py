"""Stored XSS in formgrader: nothing a student or their kernel made runs as script in an instructor's browser.

Mal hands in the toy assignment with every payload of :mod:`xss_payloads` in the written answer (raw HTML
in markdown: ``<img onerror>``, ``<script>``, ``javascript:`` links, SVG with script, iframes, CSS ``url()``)
and in cells of their own whose outputs are ``Javascript``, ``HTML``, ``Markdown``, SVG and widget displays,
printed text and an exception.
Each payload, if it ran, would request a marker URL and set the submission's grades to 99 through
formgrader's API. Headless Chromium opens Mal's submission in formgrader, started as the README says, clicks
the payload links, and finds no marker requested and no grade changed, while formgrader's own scripts still
load the grades.

A second test plants unsanitised HTML straight into an autograded notebook (as if the sanitiser had missed
it): the Content-Security-Policy of :mod:`autograder.formgrader_csp` still stops it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest

import formgrader_helpers as fg
import toy_assignment as toy
import xss_payloads as xss
from autograder import grade

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.xdist_group("autograder"),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                 reason="the grading sandbox needs root and bubblewrap")]

SQUARE, CUBE = "def square(x):\n    return x * x", "def cube(x):\n    return x ** 3"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The toy assignment graded for mal (every payload) and ana (honest)."""
    def mal(release):
        nb = toy.solved(release, square=SQUARE, cube=CUBE, explain=xss.markdown_answer())
        nb.cells.append(nbformat.v4.new_code_cell(xss.OUTPUTS_CODE))
        nb.cells.append(nbformat.v4.new_code_cell(xss.ERROR_CODE))
        nb.cells.append(nbformat.v4.new_markdown_cell(xss.MARKDOWN["md-img-onerror"]))
        return nb

    return fg.grade_toy(tmp_path_factory.mktemp("formgrader_xss"), {
        "mal": mal,
        "ana": lambda release: toy.solved(release, square=SQUARE, cube=CUBE,
                                          explain="Because (-x)^3 = -(x^3).")})


def _grades(out: Path) -> dict:
    """Every grade of every student: (auto score, manual score, extra credit), and each submission's id."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        rows, ids = {}, {}
        for student in ("mal", "ana"):
            nb = gb.find_submission_notebook(toy.NAME, toy.NAME, student)
            ids[student] = nb.id
            rows.update({(student, g.name): (g.auto_score, g.manual_score, g.extra_credit)
                         for g in nb.grades})
        return {"grades": rows, "ids": ids}


def _changed(before: dict, after: dict) -> dict:
    """The grades that differ: (student, grade) -> (before, after)."""
    new = after["grades"]
    return {k: (v, new.get(k)) for k, v in before["grades"].items() if new.get(k) != v}


def _visit(page, base: str, submission_id: str, requests: list[str]) -> list[str]:  # noqa: ANN001
    """Open a submission, click every payload link, let pending requests land; the marker URLs requested."""
    fg.open_submission(page, base, submission_id)   # formgrader's own scripts work under the policy
    for link in page.get_by_text("XSS-LINK").all():
        link.click(no_wait_after=True)
    page.wait_for_timeout(3000)
    return sorted({url.split(xss.MARKER, 1)[1] for url in requests if xss.MARKER in url})


def test_the_grader_kept_the_honest_parts_of_the_payload_submission(graded):
    out, results = graded
    assert results["mal"].status == "graded" and results["mal"].score == results["ana"].score == 6.0
    kept = nbformat.read(out / "course" / "autograded" / "mal" / toy.NAME / f"{toy.NAME}.ipynb", as_version=4)
    answer = next(c for c in kept.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "explain")
    assert "$(-x)^3 = -(x^3)$" in answer.source and "<strong>the sign comes out</strong>" in answer.source
    outputs = [o for c in kept.cells for o in c.get("outputs", [])]
    assert any("outputs published" in o.get("text", "") for o in outputs)
    # printed text and exception text stay as text: the page escapes them (the browser test checks that)
    assert any("/xss/out-stream" in o.get("text", "") for o in outputs)
    assert any(o.get("ename") == "ValueError" and "/xss/out-error" in o.evalue for o in outputs)
    feedback = (out / "course" / "feedback" / "mal" / toy.NAME / f"{toy.NAME}.html").read_text()
    assert "ValueError: &lt;img src=x onerror=" in feedback and "<img" not in feedback   # the note, escaped


def test_no_payload_runs_in_formgrader_and_no_grade_changes(graded, tmp_path):
    out, _ = graded
    before = _grades(out)
    with fg.serve(out / "course", tmp_path) as base, fg.browser(base) as (page, requests):
        ran = _visit(page, base, before["ids"]["mal"], requests)
        page_html = page.content()
    changed = _changed(before, _grades(out))
    assert (ran, changed) == ([], {}), f"ran or loaded in formgrader: {ran}; grades changed: {changed}"
    assert "the sign comes out" in page_html     # the answer itself is shown


def test_the_content_security_policy_stops_script_the_sanitiser_missed(graded, tmp_path):
    out, _ = graded
    before = _grades(out)
    kept = out / "course" / "autograded" / "ana" / toy.NAME / f"{toy.NAME}.ipynb"
    nb = nbformat.read(kept, as_version=4)   # as if sanitising had missed these: written as they are
    nb.cells.append(nbformat.v4.new_markdown_cell(xss.MARKDOWN["md-script"] + "\n\n"
                                                  + xss.MARKDOWN["svg-onload"]))
    nb.cells.append(nbformat.v4.new_markdown_cell(xss.MARKDOWN["md-img-onerror"]))
    nb.cells.append(nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output(
        "display_data", data={"application/javascript": xss.js("raw-javascript-output")})]))
    nbformat.write(nb, kept)
    with fg.serve(out / "course", tmp_path) as base, fg.browser(base) as (page, requests):
        ran = _visit(page, base, before["ids"]["ana"], requests)
    changed = _changed(before, _grades(out))
    assert (ran, changed) == ([], {}), f"ran despite the policy: {ran}; grades changed: {changed}"
