"""Reading the submissions folder: one entry per student, names made into ids that never collide.

An entry is a folder or a zip named after the student, or the loose files of one student as a learning-management
system's bulk download lays them side by side (Canvas: ``lastnamefirstname_userid_submissionid_file``).  Nothing
here runs student code, and nothing here can stop a batch: a bad entry (an odd name, a broken zip, no notebook, a
link) gets a status and a message of its own.  The notebook itself is parsed and assembled later, in the entry's
grading process (:mod:`agent_lab.grading.notebook`).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from agent_lab.grading import inkernel
from agent_lab.grading import notebook as _notebook
from agent_lab.grading.notebook import MAX_NOTEBOOK_BYTES, StudentCell

MAX_ZIP_BYTES = 100 << 20
MAX_ZIP_ENTRIES = 2000
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
# An escaped id is a readable slug, this mark and a hash of the whole name.  The mark is not allowed in a kept
# name, so an escaped id never equals a name that was kept as it is.
ESCAPE_MARK = "~"
IGNORED_PARTS = {"__MACOSX", ".ipynb_checkpoints"}
# Files an operating system or Jupyter leaves in a folder; no student made them, so they are not entries.
SYSTEM_FILES = IGNORED_PARTS | {".DS_Store", "Thumbs.db", "desktop.ini"}
# Canvas's bulk download: lastnamefirstname[_LATE]_userid_submissionid_originalname, where Canvas adds "-1", "-2"
# to the original name of a file handed in again.
CANVAS_FILE = re.compile(r"(?P<name>[^_]+)_(?:LATE_)?(?P<user>\d+)_(?P<submission>\d+)_(?P<file>.+)")
CANVAS_COPY = re.compile(r"-\d+(?=\.[^.]*$|$)")

# Code that reaches into the kernel, the interpreter or the operating system.  No score depends on this list:
# the grade is decided outside the student's process.  It points a human reviewer at code worth a look.
SUSPICIOUS = re.compile(
    r"get_ipython|input_transformers|ast_transformers|events\.register|sys\.settrace|"
    r"sys\.setprofile|__closure__|gc\.get_|ctypes|currentframe|_getframe|f_back|f_globals|"
    r"__builtins__|import builtins|linecache|\b_check\b|os\.fork|os\._exit|subprocess|"
    r"InteractiveShell|set_custom_exc|ipykernel|setsid|socket|threading|signal\.|agentlab_grading|"
    r"sys\.modules|importlib|globals\(\)|inspect\.|"
    # Any module of the kernel side but the ones the notebooks import (derived from the folder's package name).
    + re.escape(inkernel.PACKAGE) + r"\b(?!\.(?:" + "|".join(inkernel.STUDENT_FACING) + r")\b)(?:\.\w+)?")


def suspicious_code(cells: list[StudentCell]) -> list[str]:
    """Sorted distinct suspicious words in the student's code cells (for the review column only)."""
    found: set[str] = set()
    for cell in cells:
        if cell.cell_type == "code":
            found.update(m.group(0) for m in SUSPICIOUS.finditer(cell.source))
    return sorted(found)


@dataclass
class Entry:
    """One student's entry in the submissions folder, before grading."""

    student: str                     # the id used in the gradebook: the entry's name, or its escaped form
    origin: Path                     # a folder or a zip; for loose files, the submissions folder
    status: str = "ok"               # ok | duplicate | skipped (neither is graded nor recorded)
    notes: list[str] = field(default_factory=list)
    name: str = ""                   # the name the id was made from
    files: list[Path] = field(default_factory=list)  # loose files (a bulk download), staged before grading


def safe_id(name: str) -> str:
    """The gradebook id of an entry name; distinct names give distinct ids.

    A name that is already a safe id (an ASCII letter or digit, then up to 63 of letters, digits, ``_ . @ -``)
    is kept as it is.  Any other name gets a readable slug (accents dropped, other characters made ``_``), the
    mark ``~`` (never in a kept name) and 10 hex digits of the SHA-256 of the name in NFC (canonically equal
    spellings are one name; a fullwidth or otherwise compatible spelling is another).
    """
    if SAFE_ID.fullmatch(name):
        return name
    canonical = unicodedata.normalize("NFC", name)
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    ascii_name = unicodedata.normalize("NFKD", canonical).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9_.@-]+", "_", ascii_name).strip("._-@")[:48].rstrip("._-@")
    return f"{slug or 'student'}{ESCAPE_MARK}{digest}"


def _named(name: str, origin: Path, status: str = "ok", note: str = "", files: list[Path] | None = None) -> Entry:
    entry = Entry(safe_id(name), origin, status, [note] if note else [], name, list(files or []))
    if entry.student != name and status == "ok":
        entry.notes.append(f"graded as student id {entry.student!r}: the entry's name {name[:80]!r} is not a "
                           "safe id (an ASCII letter or digit, then letters, digits, _ . @ -, at most 64)")
    return entry


def _classify(path: Path) -> Entry | str | None:
    """An entry for one item of the submissions folder, a Canvas group key (str) for a loose Canvas file, or None
    for a file that is not an entry."""
    name = path.name
    if name.startswith((".", "__")):
        return _named(name, path, "skipped", f"not graded: the entry {name[:80]!r} starts with '.' or '__', which "
                                             "marks hidden and system files; rename it to the student's id")
    if path.is_symlink():
        return _named(name, path, "skipped", f"not graded: the entry {name[:80]!r} is a symbolic link and the "
                                             "grader follows no links; copy the folder or file itself")
    if path.is_dir():
        return _named(name, path)
    canvas = CANVAS_FILE.fullmatch(name)
    if canvas and path.is_file():
        return f"{canvas['name']}_{canvas['user']}"
    if path.suffix.lower() == ".zip" and path.is_file():
        return _named(path.stem, path)
    if path.suffix.lower() == ".ipynb":
        return _named(path.stem, path, "skipped",
                      f"not graded: the notebook {name[:80]!r} lies directly in the submissions folder but is not "
                      "named as Canvas names them (lastnamefirstname_userid_submissionid_file.ipynb); put it in "
                      "a folder named after the student")
    return None


def scan(submissions_dir: str | Path) -> tuple[list[Entry], list[str]]:
    """Every student entry in ``submissions_dir`` (sorted by name) and the names of files that are not entries.

    Entries: a sub-folder or a ``.zip`` named after the student; the loose files of one Canvas student (one entry
    per ``lastnamefirstname_userid``); and, not graded but listed with the reason, names starting with ``.`` or
    ``__``, symbolic links and loose notebooks without Canvas's names.  Entries whose ids are equal or differ only
    in case (one folder on a case-insensitive disk) are all marked ``duplicate``, with the fix.
    """
    root = Path(submissions_dir)
    if not root.is_dir():
        raise ValueError(f"SUBMISSIONS={str(root)!r} is not a directory of student folders or zips")
    entries, groups, ignored = [], {}, []
    for path in sorted(root.iterdir()):
        if path.name in SYSTEM_FILES:
            continue
        kind = _classify(path)
        if isinstance(kind, str):
            groups.setdefault(kind, []).append(path)
        elif kind is None:
            ignored.append(path.name)
        else:
            entries.append(kind)
    for key, files in groups.items():
        entries.append(_named(key, root, files=files, note=f"graded from {len(files)} file(s) of a Canvas download "
                                                           "(student id: lastnamefirstname_userid)"))
    _mark_duplicates(entries)
    return sorted(entries, key=lambda e: e.name), ignored


def discover(submissions_dir: str | Path) -> list[Entry]:
    """The entries of :func:`scan`, without the list of files that are not entries."""
    return scan(submissions_dir)[0]


def _mark_duplicates(entries: list[Entry]) -> None:
    by_id: dict[str, list[Entry]] = {}
    for entry in entries:
        by_id.setdefault(entry.student.casefold(), []).append(entry)
    for same in by_id.values():
        if len(same) > 1:
            names = ", ".join(repr(e.name[:80]) for e in same)
            ids = ", ".join(repr(e.student) for e in same)
            for entry in same:
                entry.status = "duplicate"
                entry.notes.append(f"the entries {names} map to the student ids {ids}, which are equal or differ "
                                   "only in case: keep one of them and grade again (none of them was graded)")


def unsafe_file(path: Path) -> str | None:
    """Why the grader will not read ``path`` (a link, a hard link, a pipe, a device, a socket), or None."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if stat.S_ISREG(info.st_mode):
        return f"a hard link (the file has {info.st_nlink} names)" if info.st_nlink > 1 else None
    if stat.S_ISDIR(info.st_mode):
        return None
    kinds = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device file"),
             (stat.S_ISBLK, "a device file"))
    return next((what for test, what in kinds if test(info.st_mode)), "not a regular file")


def unsafe_files(folder: Path) -> dict[str, str]:
    """Relative path -> reason for everything under ``folder`` the grader will not read (links are not
    followed)."""
    found = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(top) / name
            reason = unsafe_file(path)
            if reason:
                found[str(path.relative_to(folder))] = reason
    return found


def _refusal_notes(refused: dict[str, str]) -> list[str]:
    notes = [f"{rel[:100]!r} was not read: it is {why}; hand in plain files (a copy, not a link)"
             for rel, why in list(refused.items())[:10]]
    if len(refused) > 10:
        notes.append(f"and {len(refused) - 10} more such files were not read")
    return notes


def read_plain(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file with one name, checked on the open file (no link is followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise ValueError(f"{path.name[:80]!r} is not a regular file with one name (a link or a special file)")
        if info.st_size > max_bytes:
            raise ValueError(f"{path.name[:80]!r} is larger than {max_bytes >> 20} MiB")
        return handle.read(max_bytes + 1)


def stage(entry: Entry, dest: Path) -> None:
    """Copy an entry's loose files into ``dest`` under their original names (Canvas's prefix and its ``-N``
    resubmission suffix removed); raises ValueError naming the file when one cannot be taken."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in entry.files:
        match = CANVAS_FILE.fullmatch(path.name)
        original = CANVAS_COPY.sub("", match["file"]) if match else path.name
        target = dest / original
        if original in {"", ".", ".."} or "/" in original or target.exists():
            raise ValueError(f"the file {path.name[:100]!r} cannot be taken as {original[:80]!r} (another file of "
                             "this student has that name)")
        target.write_bytes(read_plain(path, max(_notebook.MAX_FILE_BYTES, MAX_NOTEBOOK_BYTES)))


def _safe_extract(archive: Path, dest: Path) -> None:
    """Extract a zip refusing absolute paths, '..', links, and archives that unpack too large."""
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_ZIP_ENTRIES:
            raise ValueError(f"{len(infos)} entries (at most {MAX_ZIP_ENTRIES})")
        if sum(i.file_size for i in infos) > MAX_ZIP_BYTES:
            raise ValueError(f"it unpacks to more than {MAX_ZIP_BYTES >> 20} MiB")
        for info in infos:
            parts = Path(info.filename).parts
            if info.filename.startswith("/") or ".." in parts or (info.external_attr >> 28) == 0o12:
                raise ValueError(f"unsafe entry {info.filename[:100]!r}")
            target = dest.joinpath(*parts) if parts else dest
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)


def _notebooks_in(folder: Path, refused: dict[str, str]) -> list[Path]:
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if IGNORED_PARTS.isdisjoint(rel.parts) and str(rel) not in refused and path.is_file():
            found.append(path)
    return found


def _unpacked(origin: Path, scratch: Path) -> tuple[Path | None, list[str]]:
    """The folder to read: the entry itself, or its zip unpacked with checks (None and the reason on failure)."""
    if not origin.is_file():
        return origin, []
    reason = unsafe_file(origin)
    if reason:
        return None, [f"the zip file was not read: it is {reason}; hand in the file itself"]
    folder = scratch / "unzipped"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        _safe_extract(origin, folder)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError) as exc:
        return None, [f"the zip file could not be read: {str(exc)[:200]}"]
    return folder, []


def load(origin: Path, notebook_name: str, scratch: Path) -> tuple[str, bytes | None, list[str], Path | None]:
    """(status, the notebook's bytes, notes, the notebook's path) for one entry: ``ok``, ``missing`` or ``invalid``.

    A notebook with another name is graded when it is the only one (with a note); several other notebooks, none,
    or a zip that cannot be read give ``missing`` or ``invalid`` and a message for the student.  Links, hard links
    and special files are not read, each with a note.
    """
    folder, notes = _unpacked(origin, scratch)
    if folder is None:
        return "invalid", None, notes, None
    refused = unsafe_files(folder)
    notes += _refusal_notes(refused)
    notebooks = _notebooks_in(folder, refused)
    exact = [p for p in notebooks if p.name == notebook_name]
    if exact:
        path = exact[0]
    elif len(notebooks) == 1:
        path = notebooks[0]
        notes.append(f"graded {path.name[:80]!r} as {notebook_name!r} (the notebook was renamed)")
    else:
        names = ", ".join(p.name[:80] for p in notebooks[:10]) or "no .ipynb file"
        return "missing", None, notes + [f"no notebook named {notebook_name!r} was found (found: {names})"], None
    try:
        raw = read_plain(path, MAX_NOTEBOOK_BYTES)
    except (ValueError, OSError) as exc:
        return "invalid", None, notes + [f"{exc}; clear its outputs, hand in a plain copy and grade again"], None
    return "ok", raw, notes, path


def files_beside(notebook_path: Path) -> tuple[dict[str, Path], list[str]]:
    """The files next to the notebook a test may read (:func:`agent_lab.grading.notebook.files_beside`), without
    hard links (:func:`load` has already noted every file it did not read)."""
    files, notes = _notebook.files_beside(notebook_path)
    return {name: path for name, path in files.items() if unsafe_file(path) is None}, notes
