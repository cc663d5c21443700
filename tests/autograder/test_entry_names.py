"""Entry names never lose, merge or overwrite a student: distinct names give distinct ids, names that differ only
in case are refused together, dot names and loose notebooks get a row saying why, a Canvas bulk download is
graded one student per entry, and links, hard links and special files in a submission are not read."""
from __future__ import annotations

import os
import socket
import zipfile

import nbformat
import pytest

import toy_assignment as toy
from autograder import submissions


@pytest.fixture()
def release(tmp_path):
    return nbformat.read(toy.write_source(tmp_path / "src") / "toy" / "toy.ipynb", as_version=4)


@pytest.mark.parametrize("first, second", [
    ("alice", "alice_"),                          # trailing punctuation
    ("alice", "alice."),
    ("bob", "\uff42\uff4f\uff42"),                # fullwidth: the same letters under NFKD
    ("file", "\ufb01le"),                         # a ligature, NFKD-equal
    ("jose", "jos\u00e9"),                        # an accent dropped by NFKD
    ("x" * 64 + "a", "x" * 64 + "b"),             # the same first 64 characters
    ("x" * 64, "x" * 65),
    ("erin", ".erin"),                            # dot names
    ("dave", "__dave"),
    ("student", "..."),
])
def test_distinct_entry_names_never_share_an_id(first, second):
    assert submissions.safe_id(first) != submissions.safe_id(second)


def test_canonically_equal_spellings_are_one_name():
    """NFC and NFD spell the same name (a disk may store either): one id, so two such folders are refused."""
    assert submissions.safe_id("jos\u00e9") == submissions.safe_id("jose\u0301")


def test_a_name_that_is_not_utf8_on_disk_gets_an_id_of_its_own():
    """A file name in another encoding reaches Python with lone surrogates (os.fsdecode)."""
    latin1 = os.fsdecode("caf\u00e9".encode("latin-1"))
    assert submissions.safe_id(latin1) not in {submissions.safe_id("caf\u00e9"), submissions.safe_id("caf")}
    assert submissions.safe_id("\ud800").startswith("student~")


def test_entries_that_old_ids_merged_are_each_graded_under_their_own_id(tmp_path):
    names = ["alice", "alice_", "bob", "\uff42\uff4f\uff42", "x" * 64 + "a", "x" * 64 + "b"]
    for name in names:
        (tmp_path / name).mkdir()
    entries = {e.name: e for e in submissions.discover(tmp_path)}
    assert sorted(entries) == sorted(names)
    assert [e.status for e in entries.values()] == ["ok"] * len(names), {n: e.notes for n, e in entries.items()}
    assert len({e.student for e in entries.values()}) == len(names)
    assert entries["alice"].student == "alice" and entries["alice_"].student == "alice_"


def test_names_that_differ_only_in_case_are_refused_together_naming_both(tmp_path):
    (tmp_path / "Bob").mkdir()
    (tmp_path / "bob").mkdir()
    (tmp_path / "carol").mkdir()
    entries = {e.name: e for e in submissions.discover(tmp_path)}
    for name in ("Bob", "bob"):
        assert entries[name].status == "duplicate"
        assert "'Bob'" in entries[name].notes[-1] and "'bob'" in entries[name].notes[-1]
        assert "none of them was graded" in entries[name].notes[-1]
    assert entries["carol"].status == "ok"


@pytest.mark.parametrize("name", ["...", ".erin", "__dave", ".hidden.zip"])
def test_dot_and_dunder_names_get_a_row_saying_why_they_were_not_graded(tmp_path, name):
    if name.endswith(".zip"):
        zipfile.ZipFile(tmp_path / name, "w").close()
    else:
        (tmp_path / name).mkdir()
    (tmp_path / "__MACOSX").mkdir()  # an archiver's folder, not a student's
    entry, = submissions.discover(tmp_path)
    assert (entry.name, entry.status) == (name, "skipped")
    assert "starts with '.' or '__'" in entry.notes[0] and "rename" in entry.notes[0]


def test_a_linked_entry_gets_a_row_and_is_not_followed(tmp_path):
    (tmp_path / "real").mkdir()
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "mallory").symlink_to(tmp_path / "real")
    entry, = submissions.discover(subs)
    assert entry.status == "skipped" and "symbolic link" in entry.notes[0]


def _canvas_folder(root, release):
    root.mkdir()
    nbformat.write(release, root / "smithjohn_123_456_toy.ipynb")
    nbformat.write(release, root / "doejane_LATE_77_900_toy-1.ipynb")
    (root / "doejane_LATE_77_901_policy.pt").write_bytes(b"weights")
    nbformat.write(release, root / "alice.ipynb")
    (root / "grades.csv").write_text("not an entry")
    return root


def test_a_flat_canvas_download_is_graded_one_entry_per_student(tmp_path, release):
    root = _canvas_folder(tmp_path / "subs", release)
    entries, ignored = submissions.scan(root)
    by_id = {e.student: e for e in entries}
    assert sorted(by_id) == ["alice", "doejane_77", "smithjohn_123"] and ignored == ["grades.csv"]
    assert by_id["smithjohn_123"].status == by_id["doejane_77"].status == "ok"
    assert [p.name for p in by_id["doejane_77"].files] == ["doejane_LATE_77_900_toy-1.ipynb",
                                                           "doejane_LATE_77_901_policy.pt"]
    assert by_id["alice"].status == "skipped" and "lastnamefirstname_userid" in by_id["alice"].notes[0]
    staged = tmp_path / "staged"
    submissions.stage(by_id["doejane_77"], staged)
    assert sorted(p.name for p in staged.iterdir()) == ["policy.pt", "toy.ipynb"]
    status, raw, notes, path = submissions.load(staged, "toy.ipynb", tmp_path / "scratch")
    assert status == "ok" and raw and notes == []
    assert submissions.files_beside(path)[0] == {"policy.pt": staged / "policy.pt"}


def test_staging_refuses_a_hard_linked_loose_file(tmp_path, release):
    root = _canvas_folder(tmp_path / "subs", release)
    os.link(root / "smithjohn_123_456_toy.ipynb", tmp_path / "elsewhere.ipynb")
    entry = next(e for e in submissions.discover(root) if e.student == "smithjohn_123")
    with pytest.raises(ValueError, match="not a regular file with one name"):
        submissions.stage(entry, tmp_path / "staged")


def test_hard_links_and_special_files_in_a_submission_are_not_read_with_the_reason(tmp_path, release):
    secret = tmp_path / "instructor_only.ipynb"   # a file the grader can read and the student must not hand in
    nbformat.write(release, secret)
    folder = tmp_path / "eve"
    folder.mkdir()
    os.link(secret, folder / "toy.ipynb")
    os.link(secret, folder / "notes.txt")
    os.mkfifo(folder / "pipe.pt")
    (folder / "link.pt").symlink_to(secret)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "sock"))
        status, raw, notes, _ = submissions.load(folder, "toy.ipynb", tmp_path / "scratch")
    assert (status, raw) == ("missing", None)
    text = "\n".join(notes)
    for name, reason in (("toy.ipynb", "a hard link (the file has 3 names)"), ("pipe.pt", "a named pipe"),
                         ("link.pt", "a symbolic link"), ("sock", "a socket")):
        assert f"'{name}' was not read: it is {reason}" in text, text


def test_a_hard_link_beside_the_notebook_is_not_offered_to_the_tests(tmp_path, release):
    folder = tmp_path / "frank"
    folder.mkdir()
    nbformat.write(release, folder / "toy.ipynb")
    (tmp_path / "reference.pt").write_bytes(b"the course's reference agent")
    os.link(tmp_path / "reference.pt", folder / "agent.pt")
    (folder / "own.pt").write_bytes(b"own")
    status, _, notes, path = submissions.load(folder, "toy.ipynb", tmp_path / "scratch")
    assert status == "ok" and any("'agent.pt' was not read: it is a hard link" in n for n in notes)
    assert submissions.files_beside(path)[0] == {"own.pt": folder / "own.pt"}
