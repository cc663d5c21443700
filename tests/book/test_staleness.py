"""The build is strict and never stale: changing the package's source forces the notebooks to run again, and a
cell error or a broken reference fails the build.

``scripts/build_book.sh`` keys MyST-NB's jupyter-cache by a hash of every ``*.py`` file of the package
(plus the book config and pyproject.toml): jupyter-cache alone keys only on a notebook's code cells, so
a changed function would otherwise leave yesterday's numbers in the book. This test builds a one-page
book against a scratch package with the real build script (``AGENT_LAB_BOOK_DIR`` and
``AGENT_LAB_SOURCE_DIR`` point it there) and checks that

1. an unchanged package reuses the cached outputs (the printed process id stays the same),
2. a changed package re-executes the page (the new value and a new process id appear), and
3. as a control, a plain ``jupyter-book build`` without the script keeps the stale output -- so the
   script's keying is what makes (2) pass.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml

from ._built import BOOK, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book-staleness")]

CHAPTER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# Staleness probe

```{code-cell} ipython3
import os
import stalepkg
print(f"VALUE={stalepkg.VALUE} PID={os.getpid()}")
```
"""


def _printed(book) -> tuple[str, str]:
    html = (book / "_build" / "html" / "part1" / "00_probe.html").read_text(encoding="utf-8")
    m = re.search(r"VALUE=(\w+) PID=(\d+)", html)
    assert m, "the probe's output is missing from the built page"
    return m.group(1), m.group(2)


@pytest.fixture
def mini_book(tmp_path):
    book, src = tmp_path / "book", tmp_path / "src"
    (src / "stalepkg").mkdir(parents=True)
    book.mkdir()
    config = yaml.safe_load((BOOK / "_config.yml").read_text())
    static = config["sphinx"]["config"]["html_static_path"]
    config["sphinx"]["config"]["html_static_path"] = [str((BOOK / p).resolve()) for p in static]
    (book / "_config.yml").write_text(yaml.safe_dump(config))
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - glob: part1/*\n")
    (book / "intro.md").write_text("# Probe book\n\nA page with math: $x^2$.\n")
    (book / "part1").mkdir()
    (book / "part1" / "00_probe.md").write_text(CHAPTER)  # part*/ chapters go through the parallel pre-execution
    (src / "stalepkg" / "__init__.py").write_text("VALUE = 1\n")
    env = {**os.environ, "AGENT_LAB_BOOK_DIR": str(book), "AGENT_LAB_SOURCE_DIR": str(src),
           "PYTHONPATH": str(src), "AGENT_LAB_BOOK_FORCE": "0"}
    return book, src, env


def _run(cmd, env):
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_changed_package_source_reexecutes_the_book_and_unchanged_source_reuses_the_cache(mini_book):
    book, src, env = mini_book
    script = ["bash", "scripts/build_book.sh"]
    _run(script, env)
    value, pid1 = _printed(book)
    assert value == "1"

    _run(script, env)  # nothing changed: outputs come from the cache
    assert _printed(book) == ("1", pid1)

    (src / "stalepkg" / "__init__.py").write_text("VALUE = 2\n")
    _run(script, env)
    value, pid2 = _printed(book)
    assert value == "2" and pid2 != pid1

    # Control: the same change built without the script's keying stays stale.
    (src / "stalepkg" / "__init__.py").write_text("VALUE = 3\n")
    _run([str(ROOT / ".venv/bin/jupyter-book"), "build", str(book), "--builder", "html", "--all"], env)
    assert _printed(book) == ("2", pid2)


def _build_fails_with(mini_book, chapter_text: str) -> str:
    book, _src, env = mini_book
    (book / "part1" / "00_probe.md").write_text(chapter_text)
    proc = subprocess.run(["bash", "scripts/build_book.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0, "the build succeeded although it should have failed"
    return proc.stdout + proc.stderr


def test_a_cell_error_fails_the_build(mini_book):
    out = _build_fails_with(mini_book, CHAPTER.replace("import stalepkg", "import stalepkg\nassert 1 == 2, 'probe'"))
    assert "AssertionError" in out or "CellExecutionError" in out or "ExecutionError" in out


def test_a_broken_reference_fails_the_build(mini_book):
    out = _build_fails_with(mini_book, CHAPTER + "\nSee {ref}`ch-no-such-chapter`.\n")
    assert "ch-no-such-chapter" in out
