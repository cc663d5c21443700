"""The widgets are live in JupyterLab: start a real JupyterLab server (offline, no token), open a notebook
that shows the three explorers in headless Chromium, run it, click a playground button and check the
numbers the widgets display. Also checks that every chapter opens as a notebook through jupytext (how
the book tells readers to open a chapter in JupyterLab)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from ._built import ROOT, chapter_sources
from .test_browser import CHROMIUM, CHROMIUM_ARGS, LOCAL_HOSTS

CELLS = [
    "from agent_lab.widgets import baseline_explorer, degenerate_group_explorer, number_search_playground",
    "number_search_playground(11)",
    "baseline_explorer(0.25, 0.0)",
    "degenerate_group_explorer(0.01, 8)",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "widgets.ipynb")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "AGENT_LAB_STATIC_WIDGETS"}  # a live kernel
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")  # no user settings leak in
    cmd = [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={tmp_path}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(base + "api/status", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
    yield base, tmp_path / "lab.log"
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _kernel_states(base: str) -> list[str]:
    """Execution states of the kernels behind the server's open notebooks ('starting', 'idle', 'busy', ...)."""
    with urllib.request.urlopen(base + "api/sessions", timeout=10) as r:
        return [s["kernel"]["execution_state"] for s in json.load(r) if s.get("kernel")]


def _wait_for_idle_kernel(page, base: str, timeout: float) -> bool:
    # Sleep through Playwright, never time.sleep: the sync API runs the route handler (and so lets the page's
    # requests, the kernel start among them, through) only while the test is inside a Playwright call.
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if "idle" in _kernel_states(base):
                return True
        except OSError:
            pass
        page.wait_for_timeout(1000)
    return False


def _diagnosis(page, base: str, log: Path, errors: list[str]) -> str:
    """What a failed run looked like: the notebook's text, the kernels, console errors and the server log.
    A screenshot goes to test-output/book/jupyterlab_failure.png."""
    out = ROOT / "test-output" / "book"
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    try:
        page.screenshot(path=str(out / "jupyterlab_failure.png"))
        parts.append("notebook text:\n" + page.locator(".jp-Notebook").inner_text(timeout=10_000)[:2000])
    except Exception as e:  # the diagnosis must not hide the failure
        parts.append(f"page unreadable: {e}")
    try:
        parts.append(f"kernel states: {_kernel_states(base)}")
    except OSError as e:
        parts.append(f"sessions unreadable: {e}")
    parts.append(f"console errors: {errors[:10]}")
    parts.append("server log (tail):\n" + log.read_text()[-3000:])
    return "\n".join(parts)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.xdist_group("book-browser")
def test_widgets_are_live_and_interactive_in_jupyterlab(lab):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    base, log = lab
    blocked, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})

        def route(r):
            if urlparse(r.request.url).hostname in LOCAL_HOSTS or r.request.url.startswith(("data:", "blob:")):
                r.continue_()
            else:
                blocked.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(base + "lab/tree/widgets.ipynb")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        new_game = page.locator("button.jupyter-button", has_text="new game")
        # Run the notebook only once its kernel is up and idle (a loaded 2-core machine starts kernels slowly),
        # through the Run menu's "Run All Cells", which needs no keyboard focus. Run it again if the playground
        # has not shown up (re-running replaces the outputs); on failure, say what the page and kernel looked like.
        for attempt in range(4):
            if not _wait_for_idle_kernel(page, base, timeout=240):
                pytest.fail("the notebook's kernel never became idle\n" + _diagnosis(page, base, log, errors))
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
            try:
                new_game.wait_for(timeout=120_000)
                break
            except Exception:
                page.keyboard.press("Escape")  # close the menu if it is still open
        else:
            pytest.fail("the number-search playground never appeared after running the notebook 4 times\n"
                        + _diagnosis(page, base, log, errors))
        page.get_by_text("variance-optimal baseline b*").wait_for(timeout=180_000)
        page.get_by_text("P(degenerate)").wait_for(timeout=180_000)
        text = page.locator(".jp-Notebook").inner_text()
        assert "0.9375" in text                 # V* of the empty history: 15/16
        assert "0.1875" in text                 # p(1-p) at p = 0.25
        assert "0.9227" in text                 # 0.99^8 + 0.01^8
        first_figure = page.locator(".jp-OutputArea img").first.get_attribute("src")
        page.locator("button.jupyter-button").filter(has_text="8").first.click()
        page.get_by_text("8 -> higher").wait_for(timeout=120_000)
        page.get_by_text("9..16 (8 numbers), 3 guesses left").wait_for(timeout=120_000)
        # The Q* figure of the playground is redrawn for the new history.
        page.wait_for_function(
            "old => { const img = document.querySelector('.jp-OutputArea img'); return img && img.src !== old; }",
            arg=first_figure, timeout=120_000)
        out = ROOT / "test-output" / "book"
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "jupyterlab_widgets.png"))
        browser.close()
    assert not blocked, f"JupyterLab tried to reach the network: {blocked[:5]}"
    assert not errors, f"console errors: {errors[:5]}"


def test_every_chapter_opens_as_a_notebook_with_jupytext_and_myst_nb_alike():
    jupytext = pytest.importorskip("jupytext")
    from myst_nb.core.read import read_myst_markdown_notebook

    for src in chapter_sources():
        text = src.read_text(encoding="utf-8")
        via_jupytext = [c.source for c in jupytext.reads(text, fmt="md:myst").cells if c.cell_type == "code"]
        via_myst_nb = [c.source for c in read_myst_markdown_notebook(text).cells if c.cell_type == "code"]
        assert via_jupytext == via_myst_nb and via_jupytext, f"{src}: jupytext and MyST-NB see different code cells"


def test_static_hint_tells_how_to_open_a_chapter_in_jupyterlab():
    from agent_lab.widgets import StaticView

    hint = StaticView(b"", "book/part1/00_demonstrations_vs_reward.md", {}).hint
    assert ".venv/bin/jupyter lab book/part1/00_demonstrations_vs_reward.md" in hint
    assert "Jupytext Notebook" in hint
    assert Path(ROOT / "book/part1/00_demonstrations_vs_reward.md").is_file()
