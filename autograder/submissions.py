"""Reading the submissions folder: one entry (folder or zip) per student, names made into safe ids.

Nothing here runs student code, and nothing here can stop a batch: a bad entry (an odd name, a broken zip, no
notebook) gets a status and a message of its own.  The notebook itself is parsed and assembled later, in the
entry's grading process (:mod:`agent_lab.grading.notebook`).
"""
from __future__ import annotations

import re
import shutil
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from agent_lab.grading.notebook import MAX_NOTEBOOK_BYTES, StudentCell, files_beside  # noqa: F401

MAX_ZIP_BYTES = 100 << 20
MAX_ZIP_ENTRIES = 2000
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
IGNORED_PARTS = {"__MACOSX", ".ipynb_checkpoints"}

# Code that reaches into the kernel, the interpreter or the operating system.  No score depends on this list:
# the grade is decided outside the student's process.  It points a human reviewer at code worth a look.
SUSPICIOUS = re.compile(
    r"get_ipython|input_transformers|ast_transformers|events\.register|sys\.settrace|"
    r"sys\.setprofile|__closure__|gc\.get_|ctypes|currentframe|_getframe|f_back|f_globals|"
    r"__builtins__|import builtins|linecache|\b_check\b|os\.fork|os\._exit|subprocess|"
    r"InteractiveShell|set_custom_exc|ipykernel|setsid|socket|threading|signal\.|agentlab_grading|"
    r"agent_lab\.grading\.(?:server|wire|kernel)|sys\.modules|importlib|globals\(\)|inspect\.")


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

    student: str                     # the id used in the gradebook: the entry's name, made safe
    origin: Path
    status: str = "ok"               # ok | duplicate
    notes: list[str] = field(default_factory=list)


def safe_id(name: str) -> str:
    """A gradebook-safe id for an entry name: accents dropped, other characters replaced by ``_``."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    cleaned = re.sub(r"[^A-Za-z0-9_.@-]+", "_", ascii_name).strip("._-@")[:64]
    return cleaned or "student"


def discover(submissions_dir: str | Path) -> list[Entry]:
    """Every student entry (sub-folder or ``.zip``) in ``submissions_dir``, sorted by name.

    Names that are not safe ids are graded under a safe version with a note; entries whose names map to the
    same id are all marked ``duplicate`` (not graded, not written to the gradebook) with the fix.
    """
    root = Path(submissions_dir)
    if not root.is_dir():
        raise ValueError(f"SUBMISSIONS={str(root)!r} is not a directory of student folders or zips")
    entries = []
    for path in sorted(root.iterdir()):
        if path.name.startswith((".", "__")) or not (path.is_dir() or path.suffix.lower() == ".zip"):
            continue
        name = path.stem if path.suffix.lower() == ".zip" and path.is_file() else path.name
        entry = Entry(safe_id(name), path)
        if entry.student != name:
            entry.notes.append(f"graded as student id {entry.student!r}: the entry's name {name[:80]!r} is not a "
                               "safe id (letters, digits, _ . @ -)")
        entries.append(entry)
    by_id: dict[str, list[Entry]] = {}
    for entry in entries:
        by_id.setdefault(entry.student, []).append(entry)
    for same in by_id.values():
        if len(same) > 1:
            names = ", ".join(repr(e.origin.name) for e in same)
            for entry in same:
                entry.status = "duplicate"
                entry.notes.append(f"the entries {names} all belong to student id {entry.student!r}: keep one of "
                                   "them and grade again (none of them was graded)")
    return entries


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


def _notebooks_in(folder: Path) -> list[Path]:
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder).parts
        if IGNORED_PARTS.isdisjoint(rel) and path.is_file() and not path.is_symlink():
            found.append(path)
    return found


def load(origin: Path, notebook_name: str, scratch: Path) -> tuple[str, bytes | None, list[str], Path | None]:
    """(status, the notebook's bytes, notes, the notebook's path) for one entry: ``ok``, ``missing`` or ``invalid``.

    A notebook with another name is graded when it is the only one (with a note); several other notebooks, none,
    or a zip that cannot be read give ``missing`` or ``invalid`` and a message for the student.
    """
    folder, notes = origin, []
    if origin.is_file():
        folder = scratch / "unzipped"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            _safe_extract(origin, folder)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError) as exc:
            return "invalid", None, [f"the zip file could not be read: {str(exc)[:200]}"], None
    notebooks = _notebooks_in(folder)
    exact = [p for p in notebooks if p.name == notebook_name]
    if exact:
        path = exact[0]
    elif len(notebooks) == 1:
        path = notebooks[0]
        notes.append(f"graded {path.name[:80]!r} as {notebook_name!r} (the notebook was renamed)")
    else:
        names = ", ".join(p.name[:80] for p in notebooks[:10]) or "no .ipynb file"
        return "missing", None, [f"no notebook named {notebook_name!r} was found (found: {names})"], None
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return "invalid", None, [f"{path.name[:80]} is larger than {MAX_NOTEBOOK_BYTES >> 20} MiB; clear its "
                                 "outputs and hand it in again"], None
    return "ok", path.read_bytes(), notes, path
