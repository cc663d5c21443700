"""Answers graded by hand: the grader leaves them to nbgrader's formgrader, and a grade entered there in a real
browser lands in the gradebook and in ``grades.csv``.

The toy assignment has one written answer (``explain``, 2 points). One student answers it, another leaves it as
released: the first needs a manual grade, the second scores 0 for it (nbgrader's rule). Then a real Jupyter
server runs formgrader on the grader's course, headless Chromium opens the student's submission there, types a
score into the answer's box, and the gradebook and a fresh ``grades.csv`` export hold it.
"""
from __future__ import annotations

import csv
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

import toy_assignment as toy
from autograder import grade, sandbox

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.xdist_group("autograder"),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                 reason="the grading sandbox needs root and bubblewrap")]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The toy assignment graded for ana (answered the written question) and ben (did not)."""
    root = tmp_path_factory.mktemp("formgrader")
    source = toy.write_source(root / "source")
    out, subs = root / "out", root / "subs"
    release = nbformat.read(grade.prepare_course(out, source, toy.NAME), as_version=4)
    for student, answer in (("ana", "Because (-x)^3 = -(x^3): the sign comes out."), ("ben", None)):
        nb = toy.solved(release, square="def square(x):\n    return x * x", cube="def cube(x):\n    return x ** 3",
                        **({"explain": answer} if answer else {}))
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / f"{toy.NAME}.ipynb")
    results = grade.grade_all(subs, out=out, source_root=source, assignment=toy.NAME, jobs=2,
                              limits=sandbox.Limits(cell_timeout=30, notebook_timeout=300))
    return out, {r.student: r for r in results}


def _grade_row(out: Path, student: str):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        nb = gb.find_submission_notebook(toy.NAME, toy.NAME, student)
        g = next(g for g in nb.grades if g.name == "explain")
        return nb.id, g.auto_score, g.manual_score, g.needs_manual_grade, gb.find_submission(toy.NAME, student).score


def test_a_written_answer_waits_for_a_person_and_an_unanswered_one_scores_zero(graded):
    out, results = graded
    assert results["ana"].score == results["ana"].max_score == 6.0   # the three autograded tests
    _, auto, manual, needs, total = _grade_row(out, "ana")
    assert (auto, manual, needs, total) == (None, None, True, 6.0)
    _, auto, manual, needs, total = _grade_row(out, "ben")
    assert (auto, manual, needs, total) == (0.0, None, False, 6.0)
    page = (out / "course" / "feedback" / "ana" / toy.NAME / f"{toy.NAME}.html").read_text()
    assert "graded by hand" in page and "up to 2 points graded by hand" in page


def test_a_grade_entered_in_formgrader_lands_in_the_gradebook_and_grades_csv(graded, tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if not Path(CHROMIUM).exists():
        pytest.skip("no /usr/bin/chromium (make sysdeps installs it)")
    out, _ = graded
    course = out / "course"
    submission_id = _grade_row(out, "ana")[0]
    port = _free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), PYTHONPATH=str(grade.REPO))
    cmd = [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser", f"--port={port}",
           "--ip=127.0.0.1", "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={course}"]
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 120
            while True:
                try:
                    urllib.request.urlopen(base + "/api/status", timeout=2)
                    break
                except OSError:
                    assert proc.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()
                    time.sleep(0.5)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                           else route.abort())
                page.goto(f"{base}/formgrader/submissions/{submission_id}/", wait_until="load")
                box = page.locator("input#explain")
                box.wait_for(timeout=60_000)
                # The input is in the served HTML, but its change handler is bound only once formgrader's
                # own request for the grades has answered; typing before that saves nothing.
                page.wait_for_function("() => window.formgrader && formgrader.grades && formgrader.grades.loaded"
                                       " && formgrader.grade_uis.length > 0", timeout=60_000)
                box.fill("1.5")
                with page.expect_response(lambda r: "/formgrader/api/grade/" in r.url and r.request.method == "PUT",
                                          timeout=30_000) as saved:
                    box.press("Tab")  # the change event saves the grade
                assert saved.value.ok
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    _, auto, manual, needs, total = _grade_row(out, "ana")
    assert (auto, manual, needs, total) == (None, 1.5, False, 7.5)
    assert grade.main(["--out", str(out), "--export-only"]) == 0
    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert float(rows["ana"]["score"]) == 7.5 and float(rows["ben"]["score"]) == 6.0
