"""Formgrader tests: the toy assignment graded, formgrader started as the README says, Chromium on it."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest

import toy_assignment as toy
from autograder import formgrader, grade, sandbox

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def grade_toy(root: Path, notebooks: dict[str, Callable[[nbformat.NotebookNode], nbformat.NotebookNode]]
              ) -> tuple[Path, dict]:
    """The toy assignment graded for each student in ``notebooks`` (student -> a function of the release that
    returns what the student hands in): the grader's output folder and the results by student."""
    source = toy.write_source(root / "source")
    out, subs = root / "out", root / "subs"
    release = nbformat.read(grade.prepare_course(out, source, toy.NAME), as_version=4)
    for student, hand_in in notebooks.items():
        (subs / student).mkdir(parents=True)
        nbformat.write(hand_in(release), subs / student / f"{toy.NAME}.ipynb")
    results = grade.grade_all(subs, out=out, source_root=source, assignment=toy.NAME, jobs=2,
                              limits=sandbox.Limits(cell_timeout=30, notebook_timeout=300))
    return out, {r.student: r for r in results}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(course: Path, scratch: Path) -> Iterator[str]:
    """A formgrader server on ``course`` started with the README's command; yields its base URL."""
    port = _free_port()
    env = dict(formgrader.environment(), JUPYTER_CONFIG_DIR=str(scratch / "config"))
    cmd = formgrader.command(course, ["--allow-root", f"--port={port}", "--ip=127.0.0.1",
                                      "--ServerApp.token=", "--ServerApp.password="])
    log_path = scratch / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 120
            while True:
                try:
                    urllib.request.urlopen(base + "/api/status", timeout=2)
                    break
                except OSError:
                    assert proc.poll() is None and time.time() < deadline, log_path.read_text()
                    time.sleep(0.5)
            yield base
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@contextlib.contextmanager
def browser(base: str) -> Iterator[tuple[object, list[str]]]:
    """A headless Chromium page that may reach only ``base``; yields it and every URL it requested.

    The page's ``csp_refusals`` lists every Content-Security-Policy refusal the browser reported."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if not Path(CHROMIUM).exists():
        pytest.skip("no /usr/bin/chromium (make sysdeps installs it)")
    requested: list[str] = []
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = chromium.new_page()
        page.on("request", lambda request: requested.append(request.url))
        page.csp_refusals = []
        page.on("console", lambda m: page.csp_refusals.append(m.text) if "Content Security Policy" in m.text
                else None)
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                   else route.abort())
        try:
            yield page, requested
        finally:
            chromium.close()


def open_submission(page, base: str, submission_id: str) -> None:  # noqa: ANN001 - a playwright Page
    """Open a submission in formgrader and wait until formgrader's own scripts have loaded its grades."""
    page.goto(f"{base}/formgrader/submissions/{submission_id}/", wait_until="load")
    # The score boxes are in the served HTML, but their change handlers are bound only once formgrader's
    # own request for the grades has answered; typing before that saves nothing.
    page.wait_for_function("() => window.formgrader && formgrader.grades && formgrader.grades.loaded"
                           " && formgrader.grade_uis.length > 0", timeout=60_000)
