"""Reading submissions safely: a folder or a zip per student, one notebook each, normalised metadata.

Nothing here executes student code.  It decides which notebook to grade, rejects what is not a
notebook, and puts nbgrader's cell metadata back the way the release had it, so that a submission
with edited metadata is graded on its code instead of failing nbgrader's validation as a whole.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

MAX_NOTEBOOK_BYTES = 20 << 20
MAX_ZIP_BYTES = 100 << 20
MAX_ZIP_ENTRIES = 2000
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
IGNORED_PARTS = {"__MACOSX", ".ipynb_checkpoints"}


# Code that reaches into the kernel or the test helpers.  Student code shares the kernel process
# with the tests; the grader resets IPython's hooks before each test (execute.py), but a determined
# student can still subvert later tests from inside the process (frame inspection, patched
# builtins, ...), which no sandbox prevents.  Such code is flagged for a human to review.
SUSPICIOUS = re.compile(
    r"get_ipython|input_transformers|ast_transformers|events\.register|sys\.settrace|"
    r"sys\.setprofile|__closure__|gc\.get_|ctypes|currentframe|_getframe|f_back|f_globals|"
    r"__builtins__|import builtins|linecache|\b_check\b|os\.fork|os\._exit|subprocess|"
    r"InteractiveShell|set_custom_exc|ipykernel")


def suspicious_code(nb: nbformat.NotebookNode) -> list[str]:
    """Sorted distinct suspicious words in the notebook's unlocked code cells."""
    found: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader", {}).get("locked"):
            found.update(m.group(0) for m in SUSPICIOUS.finditer(cell.source))
    return sorted(found)


@dataclass
class Submission:
    """One student's submission as found on disk, before grading."""

    student: str
    origin: Path
    notebook: nbformat.NotebookNode | None = None
    status: str = "ok"            # ok | missing | invalid
    notes: list[str] = field(default_factory=list)


def student_id_for(path: Path) -> str:
    """Student id from a folder name or a zip file's stem; ValueError when it is not a safe id."""
    name = path.stem if path.suffix.lower() == ".zip" else path.name
    if not STUDENT_ID.match(name):
        raise ValueError(
            f"submission {path.name!r}: student id {name!r} must match {STUDENT_ID.pattern} "
            "(letters, digits, _ . @ -)"
        )
    return name


def discover(submissions_dir: str | Path) -> list[Path]:
    """Every student entry (sub-folder or .zip) in ``submissions_dir``, sorted by name."""
    root = Path(submissions_dir)
    if not root.is_dir():
        raise ValueError(f"SUBMISSIONS={str(root)!r} is not a directory of student folders or zips")
    entries = [p for p in sorted(root.iterdir())
               if not p.name.startswith((".", "__")) and (p.is_dir() or p.suffix.lower() == ".zip")]
    seen: dict[str, Path] = {}
    for entry in entries:
        sid = student_id_for(entry)
        if sid in seen:
            raise ValueError(f"student id {sid!r} appears twice: {seen[sid].name} and {entry.name}")
        seen[sid] = entry
    return entries


def _safe_extract(archive: Path, dest: Path) -> None:
    """Extract a zip refusing absolute paths, '..', links, and archives that unpack too large."""
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_ZIP_ENTRIES:
            raise ValueError(f"{archive.name}: {len(infos)} entries (at most {MAX_ZIP_ENTRIES})")
        if sum(i.file_size for i in infos) > MAX_ZIP_BYTES:
            raise ValueError(f"{archive.name}: unpacks to more than {MAX_ZIP_BYTES >> 20} MiB")
        for info in infos:
            parts = Path(info.filename).parts
            if info.filename.startswith("/") or ".." in parts or (info.external_attr >> 28) == 0o12:
                raise ValueError(f"{archive.name}: unsafe entry {info.filename!r}")
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


def load(entry: Path, notebook_name: str, scratch: Path) -> Submission:
    """Find and parse ``notebook_name`` (e.g. ``policy_gradients.ipynb``) in one student's entry.

    A notebook with another name is graded when it is the only one (with a note); several other
    notebooks, none, a file that is not valid notebook JSON, or a bad zip give ``status`` missing or
    invalid and a message for the student.
    """
    sub = Submission(student=student_id_for(entry), origin=entry)
    folder = entry
    if entry.suffix.lower() == ".zip":
        folder = scratch / "unzipped"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            _safe_extract(entry, folder)
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            sub.status, sub.notes = "invalid", [f"the zip file could not be read: {exc}"]
            return sub
    notebooks = _notebooks_in(folder)
    exact = [p for p in notebooks if p.name == notebook_name]
    if exact:
        path = exact[0]
    elif len(notebooks) == 1:
        path = notebooks[0]
        sub.notes.append(f"graded {path.name!r} as {notebook_name!r} (the notebook was renamed)")
    else:
        names = ", ".join(p.name for p in notebooks) or "no .ipynb file"
        sub.status = "missing"
        sub.notes.append(f"no notebook named {notebook_name!r} was found (found: {names})")
        return sub
    sub.notebook, problem = parse_notebook(path)
    if problem:
        sub.status = "invalid"
        sub.notes.append(problem)
    return sub


def parse_notebook(path: Path) -> tuple[nbformat.NotebookNode | None, str]:
    """(notebook, "") for a valid notebook file, else (None, a message for the student)."""
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return None, f"{path.name} is larger than {MAX_NOTEBOOK_BYTES >> 20} MiB"
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
        nb = nbformat.reads(json.dumps(raw), as_version=4)
        nbformat.validate(nb)
    except (UnicodeDecodeError, json.JSONDecodeError, nbformat.ValidationError, KeyError,
            AttributeError, TypeError) as exc:
        return None, (f"{path.name} is not a valid Jupyter notebook ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); open it in Jupyter, save it, and resubmit")
    return nb, ""


def locked_sources(release_nb: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> source of every locked cell of the release (tests, setup)."""
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in release_nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("locked")
            and c.metadata["nbgrader"].get("grade_id")}


def release_metadata(release_nb: nbformat.NotebookNode) -> dict[str, tuple[str, dict]]:
    """grade_id -> (cell_type, nbgrader metadata) for every nbgrader cell of the release."""
    out = {}
    for cell in release_nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta and meta.get("grade_id"):
            out[meta["grade_id"]] = (cell.cell_type, copy.deepcopy(dict(meta)))
    return out


def normalise(nb: nbformat.NotebookNode, release: dict[str, tuple[str, dict]],
              locked_sources: dict[str, str] | None = None) -> list[str]:
    """Restore the release's nbgrader metadata in place; return notes for the student.

    A cell keeps nbgrader metadata only if its grade_id is one of the release's, seen for the first
    time, on a cell of the same type; it then gets exactly the release's metadata (points, locked,
    flags).  Every other nbgrader marking is dropped, so the cell runs as an ordinary cell.  Test
    cells that are missing are put back by nbgrader (``OverwriteCells.add_missing_cells``) and
    edited locked cells get their original code back (nbgrader's checksum check), so only the notes
    are produced here (``locked_sources``: grade_id -> the release's source of each locked cell).
    """
    notes: list[str] = []
    seen: set[str] = set()
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta is None:
            continue
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if isinstance(gid, str) and gid in release and gid not in seen \
                and cell.cell_type == release[gid][0]:
            seen.add(gid)
            ignored = {"checksum"}  # recomputed by nbgrader; differs between release builds
            if {k: v for k, v in dict(meta).items() if k not in ignored} != \
                    {k: v for k, v in release[gid][1].items() if k not in ignored}:
                notes.append(f"the nbgrader metadata of cell {gid!r} was changed; it was restored")
            cell.metadata["nbgrader"] = nbformat.from_dict(copy.deepcopy(release[gid][1]))
            if locked_sources and gid in locked_sources and cell.source != locked_sources[gid]:
                notes.append(f"the locked cell {gid!r} was edited; the grader runs the original")
        else:
            notes.append(f"a cell carried nbgrader metadata for {str(gid)[:60]!r} that does not "
                         "match the assignment; it was graded as an ordinary cell")
            del cell.metadata["nbgrader"]
    for gid, (_, meta) in release.items():
        if gid not in seen and meta.get("grade"):
            notes.append(f"test cell {gid!r} was missing or renamed; the original was put back")
    if canonical_order(nb, list(release)):
        notes.append("cells were moved; they were graded in the assignment's order (a test "
                     "always runs after the code it tests)")
    return notes


def canonical_order(nb: nbformat.NotebookNode, release_ids: list[str]) -> bool:
    """Put the assignment's cells back in the release order, in place; True if anything moved.

    Each cell the student added travels with the assignment cell above it (cells above the first
    assignment cell stay on top), so helpers stay next to the code that uses them.  Run after
    ``normalise`` has made grade ids unique.
    """
    head: list = []
    groups: dict[str, list] = {}
    current = head
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in release_ids:
            current = groups[gid] = [cell]
        else:
            current.append(cell)
    ordered = head + [c for gid in release_ids if gid in groups for c in groups[gid]]
    moved = [id(c) for c in ordered] != [id(c) for c in nb.cells]
    nb.cells = ordered
    return moved
