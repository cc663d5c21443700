"""`agent-lab recipes` finds make bench's results through the working directory or AGENT_LAB_RESULTS, never
through a path relative to the installed package: it works the same from a copy of the package outside the
repository (as a non-editable install is), and a results folder that is named but absent is a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A copy of the package outside the repository, as ``pip install .`` would put it in site-packages."""
    site = tmp_path_factory.mktemp("site-packages")
    shutil.copytree(ROOT / "src" / "agent_lab", site / "agent_lab", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _recipes(site: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    code = "import agent_lab, sys; print(agent_lab.__file__); from agent_lab.cli import main; sys.exit(main())"
    environ = {**{k: v for k, v in os.environ.items() if k != "AGENT_LAB_RESULTS"}, "PYTHONPATH": str(site), **env}
    return subprocess.run([sys.executable, "-c", code, "recipes"], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(not (RESULTS / "bench_trainer.json").is_file(), reason="make bench has not recorded results")
def test_an_installed_package_reads_the_results_of_the_checkout_it_runs_in(installed, tmp_path):
    inside = _recipes(installed, ROOT / "book")  # anywhere inside the checkout
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.splitlines()[0].startswith(str(installed)), "the copy, not the repository, was imported"
    assert "measured by make bench" in inside.stdout
    outside = _recipes(installed, tmp_path)
    assert outside.returncode == 0, outside.stderr
    assert "measured by make bench" not in outside.stdout and "set AGENT_LAB_RESULTS" in outside.stdout
    named = _recipes(installed, tmp_path, AGENT_LAB_RESULTS=str(RESULTS))
    assert named.returncode == 0 and "measured by make bench" in named.stdout


def test_a_results_folder_that_is_named_but_absent_is_a_clear_error(installed, tmp_path):
    missing = tmp_path / "no-such-folder"
    out = _recipes(installed, tmp_path, AGENT_LAB_RESULTS=str(missing))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"AGENT_LAB_RESULTS={str(missing)!r} is not a folder" in out.stderr
