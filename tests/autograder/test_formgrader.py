"""Answers graded by hand: the grader leaves them to nbgrader's formgrader, and a grade entered there in a
real browser lands in the gradebook and in ``grades.csv``.

The toy assignment has one written answer (``explain``, 2 points). One student answers it, another leaves it
as released: the first needs a manual grade, the second scores 0 for it (nbgrader's rule). Then a real Jupyter
server runs formgrader on the grader's course, headless Chromium opens the student's submission there, types a
score into the answer's box, and the gradebook and a fresh ``grades.csv`` export hold it. The server is
started as the README says, so all of this runs under formgrader's Content-Security-Policy
(autograder/formgrader_csp.py).
"""
from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pytest

import formgrader_helpers as fg
import toy_assignment as toy
from autograder import grade

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.xdist_group("autograder"),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                 reason="the grading sandbox needs root and bubblewrap")]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The toy assignment graded for ana (answered the written question) and ben (did not)."""
    bodies = {"square": "def square(x):\n    return x * x", "cube": "def cube(x):\n    return x ** 3"}
    return fg.grade_toy(tmp_path_factory.mktemp("formgrader"), {
        "ana": lambda release: toy.solved(release, explain="Because (-x)^3 = -(x^3): the sign comes out.",
                                          **bodies),
        "ben": lambda release: toy.solved(release, **bodies)})


def _grade_row(out: Path, student: str):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        nb = gb.find_submission_notebook(toy.NAME, toy.NAME, student)
        g = next(g for g in nb.grades if g.name == "explain")
        total = gb.find_submission(toy.NAME, student).score
        return nb.id, g.auto_score, g.manual_score, g.needs_manual_grade, total


def test_a_written_answer_waits_for_a_person_and_an_unanswered_one_scores_zero(graded):
    out, results = graded
    assert results["ana"].score == results["ana"].max_score == 6.0   # the three autograded tests
    _, auto, manual, needs, total = _grade_row(out, "ana")
    assert (auto, manual, needs, total) == (None, None, True, 6.0)
    _, auto, manual, needs, total = _grade_row(out, "ben")
    assert (auto, manual, needs, total) == (0.0, None, False, 6.0)
    page = (out / "course" / "feedback" / "ana" / toy.NAME / f"{toy.NAME}.html").read_text()
    assert "graded by hand" in page and "up to 2 points graded by hand" in page


def test_formgraders_pages_work_under_the_content_security_policy(graded, tmp_path):
    """The pages the README walks through load their data with formgrader's own scripts, and the browser
    refuses nothing of the server's own (only MathJax, which nbconvert loads from a CDN)."""
    out, _ = graded
    with fg.serve(out / "course", tmp_path) as base, fg.browser(base) as (page, _):
        page.goto(f"{base}/formgrader/manage_assignments", wait_until="load")
        page.get_by_role("link", name=toy.NAME).first.wait_for(timeout=60_000)
        page.goto(f"{base}/formgrader/manage_submissions/{toy.NAME}", wait_until="load")
        page.get_by_text("ana").first.wait_for(timeout=60_000)
        page.goto(f"{base}/formgrader/gradebook/{toy.NAME}/{toy.NAME}", wait_until="load")
        page.locator("a[href*='/formgrader/submissions/']").first.wait_for(state="attached", timeout=60_000)
        fg.open_submission(page, base, _grade_row(out, "ben")[0])
        page.locator("span.name-hidden.glyphicon").click()   # an inline handler of formgrader's template
        page.locator("a.name-shown").first.wait_for(state="visible", timeout=10_000)
        refused = [r for r in page.csp_refusals if "cdnjs.cloudflare.com/ajax/libs/mathjax" not in r]
    assert refused == []
    assert any("mathjax" in r for r in page.csp_refusals)   # the cost the README states


def test_a_grade_entered_in_formgrader_lands_in_the_gradebook_and_grades_csv(graded, tmp_path):
    out, _ = graded
    submission_id = _grade_row(out, "ana")[0]
    with fg.serve(out / "course", tmp_path) as base, fg.browser(base) as (page, _):
        fg.open_submission(page, base, submission_id)   # under the README's server and its CSP
        box = page.locator("input#explain")
        box.fill("1.5")
        with page.expect_response(lambda r: "/formgrader/api/grade/" in r.url and r.request.method == "PUT",
                                  timeout=30_000) as saved:
            box.press("Tab")  # the change event saves the grade
        assert saved.value.ok
    _, auto, manual, needs, total = _grade_row(out, "ana")
    assert (auto, manual, needs, total) == (None, 1.5, False, 7.5)
    assert grade.main(["--out", str(out), "--export-only"]) == 0
    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert float(rows["ana"]["score"]) == 7.5 and float(rows["ben"]["score"]) == 6.0
