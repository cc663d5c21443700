"""The release is what nbgrader makes from the source and holds no solution and no hidden test."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

from .notebook_runner import CRAFTING, ROOT, SOURCE, grade_id, points_by_test

pytestmark = pytest.mark.xdist_group("assignment-release")

NAME = "policy_gradients"
BUILT_RELEASE = ROOT / "assignments" / "release" / NAME / f"{NAME}.ipynb"
VENV_BIN = pathlib.Path(sys.executable).parent


def _nbgrader(course: pathlib.Path, *args: str, timeout: int = 300,
              book_url: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", AGENT_LAB_BOOK_URL=book_url)
    return subprocess.run(
        [str(VENV_BIN / "nbgrader"), *args, "--log-level=WARN"], cwd=course, env=env, capture_output=True,
        text=True, timeout=timeout, check=True,
    )


def _course_copy(tmp: pathlib.Path) -> pathlib.Path:
    """A private nbgrader course (config + source) so tests never touch the real gradebook."""
    course = tmp / "course"
    shutil.copytree(ROOT / "assignments" / "source", course / "source")
    shutil.copy(ROOT / "assignments" / "nbgrader_config.py", course / "nbgrader_config.py")
    return course


def _generate(tmp_path_factory, name: str) -> tuple[pathlib.Path, nbformat.NotebookNode]:
    course = _course_copy(tmp_path_factory.mktemp("release"))
    _nbgrader(course, "generate_assignment", name, "--force")
    return course, nbformat.read(course / "release" / name / f"{name}.ipynb", as_version=4)


@pytest.fixture(scope="session")  # session: xdist may interleave modules on a worker
def fresh_release(tmp_path_factory) -> tuple[pathlib.Path, nbformat.NotebookNode]:
    return _generate(tmp_path_factory, NAME)


@pytest.fixture(scope="session")
def fresh_crafting_release(tmp_path_factory) -> tuple[pathlib.Path, nbformat.NotebookNode]:
    return _generate(tmp_path_factory, "crafting_agent")


def _region_lines(text: str, begin: str, end: str) -> list[str]:
    """Non-trivial lines inside ``### BEGIN ...`` / ``### END ...`` regions."""
    lines = []
    for block in re.findall(rf"### {begin}\n(.*?)### {end}", text, flags=re.S):
        lines += [line.strip() for line in block.splitlines() if len(line.strip()) >= 16]
    return lines


def _cells(nb: nbformat.NotebookNode) -> list[tuple]:
    return [(c.cell_type, c.source, c.get("metadata", {}).get("nbgrader")) for c in nb.cells]


def test_built_release_matches_a_fresh_nbgrader_generation(fresh_release):
    if not BUILT_RELEASE.exists():
        pytest.fail(f"{BUILT_RELEASE.relative_to(ROOT)} is missing: run `make assignments` (make test does)")
    built = nbformat.read(BUILT_RELEASE, as_version=4)
    assert _cells(built) == _cells(fresh_release[1]), "the built release is stale: run `make assignments`"


def _assert_nothing_secret(release: nbformat.NotebookNode, source_path: pathlib.Path, stubs: int) -> str:
    text = "\n".join(cell.source for cell in release.cells)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "_hidden_"):
        assert marker not in text, f"the release contains {marker!r}"
    source_text = "\n".join(cell.source for cell in nbformat.read(source_path, as_version=4).cells)
    secret = _region_lines(source_text, "BEGIN SOLUTION", "END SOLUTION")
    secret += _region_lines(source_text, "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
    assert len(secret) > 40  # the check below looks at real code
    public = re.sub(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n.*?### END (SOLUTION|HIDDEN TESTS)", "", source_text, flags=re.S)
    leaked = [line for line in secret if line in text and line not in public]
    assert leaked == [], f"solution or hidden-test lines leaked into the release: {leaked[:5]}"
    code_stubs = [c.source for c in release.cells if c.cell_type == "code"
                  and c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    assert len(code_stubs) == stubs and all("raise NotImplementedError()" in s for s in code_stubs)
    return text


def test_release_holds_no_solution_code_and_no_hidden_test(fresh_release):
    _assert_nothing_secret(fresh_release[1], SOURCE, 5)


def test_the_crafting_release_holds_no_solution_hidden_test_mark_scheme_or_private_seed(fresh_crafting_release):
    text = _assert_nothing_secret(fresh_crafting_release[1], CRAFTING, 5)
    assert "MARK SCHEME" not in text and "PRIVATE_SEED" not in text and "9_117_680" not in text
    answers = [c.source for c in fresh_crafting_release[1].cells if c.cell_type == "markdown"
               and c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    assert answers == ["YOUR ANSWER HERE"] * 2


def test_release_keeps_the_fixed_grade_ids_and_points(fresh_release):
    ids = [grade_id(c) for c in fresh_release[1].cells if grade_id(c)]
    functions = ("reward_to_go", "reinforce_loss", "dr_grpo_advantages", "dr_grpo_loss")
    expected = ["setup"]
    for f in functions:
        expected += [f, f"test_{f}_visible", f"test_{f}_hidden"]
    assert ids == expected + ["train_agent", "test_train_agent"]
    points = points_by_test(fresh_release[1])
    assert all(points[f"test_{f}_hidden"] > points[f"test_{f}_visible"] for f in functions)


BUILT_BOOK = ROOT / "book" / "_build" / "html"


@pytest.mark.parametrize("name, chapters", [
    ("policy_gradients", {"03_score_function_reinforce", "04_baselines", "05_reward_to_go_td_gae",
                          "06_group_relative_advantages"}),
    ("crafting_agent", {"09_tensor_contract", "05_reward_to_go_td_gae", "06_credit_assignment",
                        "07_off_policy_ppo_kl_rewards", "01_crafting"}),
])
def test_book_links_in_the_release_open_built_chapters(name, chapters):
    """Links go to the built HTML (outputs shown), relative to the release folder, and every target exists once
    the book is built (make test builds it first)."""
    release = ROOT / "assignments" / "release" / name / f"{name}.ipynb"
    text = "\n".join(c.source for c in nbformat.read(release, as_version=4).cells if c.cell_type == "markdown")
    links = set(re.findall(r"\]\(([^)]+\.(?:md|html))\)", text))
    assert links and all(link.startswith("../../../book/_build/html/") and link.endswith(".html") for link in links)
    assert {pathlib.PurePosixPath(link).stem for link in links} >= chapters
    if not (BUILT_BOOK / "index.html").exists():
        pytest.skip("the book is not built here (make book)")
    missing = [link for link in links if not (release.parent / link).resolve().is_file()]
    assert missing == []


BOOK_URL = "https://course.example.org/agent-lab/"


@pytest.mark.parametrize("name", ["policy_gradients", "crafting_agent"])
def test_a_release_for_a_published_book_links_to_its_pages(tmp_path, name):
    """With the book's address set (AGENT_LAB_BOOK_URL here; html.baseurl in book/_config.yml for a course), the
    released notebook links to the published chapters, one for each repository-relative link of the source."""
    course = _course_copy(tmp_path)
    _nbgrader(course, "generate_assignment", name, "--force", book_url=BOOK_URL)
    released = nbformat.read(course / "release" / name / f"{name}.ipynb", as_version=4)
    source = nbformat.read(course / "source" / name / f"{name}.ipynb", as_version=4)

    def links(nb):
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        return set(re.findall(r"\]\(([^)]+\.html)\)", text))

    relative = {link.removeprefix("../../../book/_build/html/") for link in links(source)}
    assert relative and links(released) == {BOOK_URL + page for page in relative}
    chapters = ROOT / "book"
    assert all((chapters / page).with_suffix(".md").is_file() for page in relative)


def test_book_links_are_rewritten_only_when_the_book_has_an_address(tmp_path, monkeypatch):
    from agent_lab.book_links import book_url, rewrite_book_links

    text = "[a](../../../book/_build/html/part1/04_baselines.html) and [b](https://x.org/y.html)"
    assert rewrite_book_links(text, "") == text
    assert rewrite_book_links(text, "https://c.org/book") == (
        "[a](https://c.org/book/part1/04_baselines.html) and [b](https://x.org/y.html)")
    with pytest.raises(ValueError, match="http"):
        rewrite_book_links(text, "book.example.org")
    config = tmp_path / "_config.yml"
    config.write_text("title: t\nhtml:\n  baseurl: https://c.org/book\n")
    monkeypatch.delenv("AGENT_LAB_BOOK_URL", raising=False)
    assert book_url(config) == "https://c.org/book"
    assert book_url(tmp_path / "missing.yml") == ""
    monkeypatch.setenv("AGENT_LAB_BOOK_URL", "https://elsewhere.org")
    assert book_url(config) == "https://elsewhere.org"


def test_source_text_has_no_stray_control_characters():
    """Catches an unescaped backslash sequence such as \\a or \\f that turned LaTeX into a control character."""
    for cell in nbformat.read(SOURCE, as_version=4).cells:
        bad = sorted({repr(ch) for ch in cell.source if ord(ch) < 32 and ch != "\n"})
        assert bad == [], f"{grade_id(cell) or cell.cell_type}: {bad}"
