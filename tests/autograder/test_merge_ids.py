"""A grade lands only on its own student: a later entry of another name never replaces a recorded student's grade
(not by a shared id, not by an id that differs only in case), entries that were not graded leave the gradebook
and the feedback alone, and a batch that graded nothing fails."""
from __future__ import annotations

import pytest

import toy_assignment as toy
from autograder import grade, submissions

pytestmark = pytest.mark.filterwarnings("ignore:.*not in session")  # nbgrader's SQLAlchemy noise
POINTS = {"test_square_visible": 1.0, "test_square_hidden": 2.0, "test_cube_hidden": 3.0}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    grade.prepare_course(root / "out", toy.write_source(root / "src"), toy.NAME)
    return root / "out"


def _result(student: str, earned: bool, status: str = "graded") -> grade.StudentResult:
    return grade.StudentResult(student, status, [grade.TestResult(g, p if earned else 0.0, p, "")
                                                 for g, p in POINTS.items()])


def _score(out, student: str) -> float:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}", grade.COURSE_ID) as gb:
        return gb.find_submission_notebook(toy.NAME, toy.NAME, student).score


def _grade_folder(out, folder, earned: bool) -> list[grade.StudentResult]:
    """What grade_all does after grading: each entry's result merged under the entry's id and name."""
    results = []
    for entry in submissions.discover(folder):
        result = _result(entry.student, earned, "graded" if entry.status == "ok" else entry.status)
        grade.merge(result, out, toy.NAME, None, entry.name)
        results.append(result)
    return results


def test_a_later_blank_entry_named_alice_underscore_leaves_alices_grade(course, tmp_path):
    (tmp_path / "first" / "alice").mkdir(parents=True)
    _grade_folder(course, tmp_path / "first", earned=True)
    (tmp_path / "second" / "alice_").mkdir(parents=True)
    result, = _grade_folder(course, tmp_path / "second", earned=False)
    assert _score(course, "alice") == 6 and result.student == "alice_" and _score(course, "alice_") == 0


def test_an_entry_whose_id_another_name_already_holds_is_not_recorded(course):
    assert grade.merge(_result("dora", True), course, toy.NAME, None, "dora")
    stale = _result("dora", False)            # the same id from another name: a stale id, a hash collision
    assert not grade.merge(stale, course, toy.NAME, None, "dora ")
    assert stale.status == "conflict" and "'dora'" in stale.notes[-1] and "rename this entry" in stale.notes[-1]
    assert _score(course, "dora") == 6
    again = _result("dora", False)            # the same entry graded again replaces its own grade
    assert grade.merge(again, course, toy.NAME, None, "dora") and _score(course, "dora") == 0


def test_an_id_that_differs_only_in_case_from_a_recorded_one_is_not_recorded(course):
    assert grade.merge(_result("bob", True), course, toy.NAME, None, "bob")
    other = _result("Bob", False)
    assert not grade.merge(other, course, toy.NAME, None, "Bob") and other.status == "conflict"
    assert _score(course, "bob") == 6


@pytest.mark.parametrize("status", grade.NOT_RECORDED)
def test_entries_that_were_not_graded_leave_the_gradebook_alone(course, status):
    assert grade.merge(_result("erin", True), course, toy.NAME, None, "erin")
    assert not grade.merge(_result("erin", False, status), course, toy.NAME, None, "erin")
    assert _score(course, "erin") == 6


def test_a_broken_record_of_entry_names_is_named_with_the_fix(tmp_path):
    (tmp_path / grade.ENTRY_NAMES).write_text("{not json")
    with pytest.raises(ValueError, match="entry_names.json cannot be read .* delete it"):
        grade.claim_id(tmp_path, "alice", "alice")
    (tmp_path / grade.ENTRY_NAMES).write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a map of student ids"):
        grade.entry_names(tmp_path)


def test_a_batch_that_graded_nothing_fails_and_says_why():
    assert "no entry was found" in grade.nothing_graded([])
    problem = grade.nothing_graded([_result("a", False, "skipped"), _result("b", False, "missing"),
                                    _result("c", False, "skipped")])
    assert problem.startswith("nothing was graded (2 skipped, 1 missing)")
    assert grade.nothing_graded([_result("a", False, "skipped"), _result("b", False)]) is None
