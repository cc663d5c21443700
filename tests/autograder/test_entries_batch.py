"""One batch in the sandbox over entries whose names used to lose, merge or skip a student: each entry is graded
under its own id or gets a row saying why not, nothing lands on another student's record, a Canvas student's loose
notebook is graded, and a notebook hard-linked to the instructor's source (solutions and all) is not read."""
from __future__ import annotations

import os

import nbformat
import pytest

import toy_assignment as toy
from autograder import grade
from sandbox_marks import BATCH

pytestmark = BATCH + [pytest.mark.filterwarnings("ignore:.*not in session")]
BODIES = {"square": "def square(x):\n    return x * x", "cube": "def cube(x):\n    return x ** 3"}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("entries")
    out, subs = root / "out", root / "subs"
    source = toy.write_source(root / "src")
    release = nbformat.read(grade.prepare_course(out, source, toy.NAME), as_version=4)
    solved = toy.solved(release, **BODIES)
    for folder, nb in (("alice", solved), ("alice_", release), ("Bob", solved), ("bob", solved), (".erin", solved)):
        (subs / folder).mkdir(parents=True)
        nbformat.write(nb, subs / folder / "toy.ipynb")
    nbformat.write(solved, subs / "smithjohn_LATE_123_456_toy.ipynb")
    nbformat.write(solved, subs / "stray.ipynb")
    (subs / "eve").mkdir()
    os.link(out / "course" / "source" / toy.NAME / "toy.ipynb", subs / "eve" / "toy.ipynb")
    results = grade.grade_all(subs, out=out, source_root=source, assignment=toy.NAME, jobs=2)
    return out, {r.student: r for r in results}


def _recorded(out) -> dict[str, float]:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        return {s.id: gb.find_submission(toy.NAME, s.id).score for s in gb.students}


def test_every_entry_has_a_row_under_its_own_id(batch):
    _, results = batch
    statuses = {sid: r.status for sid, r in results.items() if "~" not in sid}
    assert statuses == {"alice": "graded", "alice_": "graded", "Bob": "duplicate", "bob": "duplicate",
                        "smithjohn_123": "graded", "eve": "missing", "stray": "skipped"}
    erin, = (r for sid, r in results.items() if "~" in sid)
    assert len(results) == 8 and erin.status == "skipped" and "starts with '.'" in erin.notes[0]
    assert "not named as Canvas names them" in results["stray"].notes[0]


def test_grades_land_only_on_their_own_students(batch):
    out, results = batch
    assert _recorded(out) == {"alice": 6.0, "alice_": 0.0, "smithjohn_123": 6.0, "eve": 0.0}
    assert results["alice"].score == 6.0 and results["smithjohn_123"].score == 6.0
    feedback = {p.name for p in (out / "course" / "feedback").iterdir()}
    assert feedback == {"alice", "alice_", "smithjohn_123", "eve"}


def test_a_notebook_hard_linked_to_the_source_is_not_read(batch):
    _, results = batch
    eve = results["eve"]
    assert eve.score == 0 and any("'toy.ipynb' was not read: it is a hard link" in n for n in eve.notes), eve.notes
