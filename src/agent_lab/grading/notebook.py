"""The graded notebook is the instructor's release with the student's own cells put in; nothing else is read.

A submission is untrusted input: :func:`read_submission` parses it as plain JSON with size and nesting limits
and keeps only each cell's type, source and nbgrader grade id. :func:`assemble` then starts from the release:
every test cell, every locked cell, all metadata and tags come from there; from the submission it takes the
source of each answer (solution) cell and the code and markdown cells the student added, each placed after the
assignment cell it followed. Outputs, tags, kernelspec and every other field of the submission are dropped.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import nbformat

MAX_NOTEBOOK_BYTES = 20 << 20
MAX_CELLS = 2000
MAX_FILE_BYTES = 64 << 20   # a file handed in beside the notebook (a checkpoint, say)


@dataclass(frozen=True)
class StudentCell:
    cell_type: str          # code | markdown | raw
    source: str
    grade_id: str | None    # the nbgrader grade id the submission claims for it, if any


def _nbgrader(cell: dict) -> dict:
    meta = cell.get("metadata")
    grader = meta.get("nbgrader") if isinstance(meta, dict) else None
    return grader if isinstance(grader, dict) else {}


def _source(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "".join(value)
    return None


def read_submission(raw: bytes, name: str = "the notebook") -> tuple[list[StudentCell] | None, str]:
    """(cells, "") for a usable notebook file, else (None, a message that says what is wrong and the fix)."""
    fix = "open it in Jupyter, save it, and hand it in again"
    if len(raw) > MAX_NOTEBOOK_BYTES:
        return None, f"{name} is larger than {MAX_NOTEBOOK_BYTES >> 20} MiB; clear its outputs and hand it in again"
    try:
        # Over-long integers (in metadata, say) are read as infinity instead of failing the whole file.
        data = json.loads(raw.decode("utf-8"), parse_int=lambda s: int(s) if len(s) <= 100 else float("inf"))
    except UnicodeDecodeError:
        return None, f"{name} is not UTF-8 text, so it is not a Jupyter notebook; {fix}"
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, too-long integers, deep nesting
        return None, f"{name} is not valid notebook JSON ({type(exc).__name__}: {str(exc)[:120]}); {fix}"
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        return None, f"{name} is JSON but not a Jupyter notebook (it has no list of cells); {fix}"
    version = data.get("nbformat")
    if type(version) is not int or version != 4:
        return None, (f"{name} declares nbformat {str(version)[:20]}; the grader reads version 4 notebooks "
                      f"(Jupyter's format since 2015); {fix}")
    if len(data["cells"]) > MAX_CELLS:
        return None, f"{name} has {len(data['cells'])} cells (at most {MAX_CELLS})"
    cells = []
    for i, cell in enumerate(data["cells"]):
        kind = cell.get("cell_type") if isinstance(cell, dict) else None
        source = _source(cell.get("source")) if isinstance(cell, dict) else None
        if kind not in ("code", "markdown", "raw") or source is None:
            return None, f"cell {i} of {name} is not a valid notebook cell (a cell type and a source); {fix}"
        gid = _nbgrader(cell).get("grade_id")
        cells.append(StudentCell(kind, source, gid if isinstance(gid, str) else None))
    return cells, ""


def is_test(cell: nbformat.NotebookNode) -> bool:
    """An autograded test cell: graded code that is not the student's answer."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def assemble(release: nbformat.NotebookNode, cells: list[StudentCell]) -> tuple[nbformat.NotebookNode, list[str]]:
    """The graded notebook (see the module docstring) and notes for the student about what was changed."""
    answers = {grade_id(c): c.cell_type for c in release.cells
               if c.get("metadata", {}).get("nbgrader", {}).get("solution") and grade_id(c)}
    release_ids = [grade_id(c) for c in release.cells if grade_id(c)]
    locked = {grade_id(c): c.source for c in release.cells if grade_id(c)}
    edited: list[str] = []
    taken: dict[str, str] = {}
    added: dict[str | None, list[StudentCell]] = {}
    anchor, order, notes = None, [], []
    for cell in cells:
        gid = cell.grade_id
        if gid in answers and gid not in taken and cell.cell_type == answers[gid]:
            taken[gid] = cell.source
            anchor = gid
            order.append(gid)
        elif gid in release_ids and gid not in answers and cell.cell_type != "raw":
            if gid not in order:  # the student's copy of a locked or test cell: the release's version is used
                anchor = gid
                order.append(gid)
            if cell.source != locked.get(gid, cell.source):
                edited.append(gid)
        elif cell.cell_type in ("code", "markdown") and cell.source.strip():
            added.setdefault(anchor, []).append(StudentCell(cell.cell_type, cell.source, None))
    out = nbformat.v4.new_notebook(metadata=copy.deepcopy(release.metadata))
    out.cells = [_added(c) for c in added.get(None, [])]
    for cell in release.cells:
        new = copy.deepcopy(cell)
        gid = grade_id(cell)
        if gid in taken:
            new.source = taken[gid]
        if new.cell_type == "code":
            new.outputs, new.execution_count = [], None
        out.cells.append(new)
        out.cells += [_added(c) for c in added.get(gid, [])] if gid else []
    missing = [gid for gid in answers if gid not in taken]
    if missing:
        notes.append("no answer was found for " + ", ".join(repr(g) for g in missing)
                     + " (a deleted cell, or its grade id was changed); graded as released")
    deleted = [g for g in release_ids if g not in order and g not in answers and is_test(_by_id(release, g))]
    if deleted:
        notes.append("the test cells " + ", ".join(repr(g) for g in deleted)
                     + " were missing or renamed; the grader ran them anyway")
    if edited:
        notes.append("the locked cells " + ", ".join(repr(g) for g in dict.fromkeys(edited))
                     + " were edited; the grader uses the released versions")
    firsts = list(dict.fromkeys(order))
    if firsts != sorted(firsts, key=release_ids.index):
        notes.append("cells were moved; they were graded in the assignment's order")
    return out, notes


def _by_id(nb: nbformat.NotebookNode, gid: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if grade_id(c) == gid)


def _added(cell: StudentCell) -> nbformat.NotebookNode:
    if cell.cell_type == "code":
        return nbformat.v4.new_code_cell(cell.source)
    return nbformat.v4.new_markdown_cell(cell.source)


def own_cells(release: nbformat.NotebookNode, cells: list[StudentCell]) -> list[StudentCell]:
    """The submission's cells that are the student's: answers and added cells (not copies of locked ones)."""
    locked = {grade_id(c) for c in release.cells
              if grade_id(c) and not c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    return [c for c in cells if c.grade_id not in locked]


def kernel_cells(nb: nbformat.NotebookNode) -> list[int]:
    """Indices of the cells the kernel runs: every code cell except the tests (they run in the grader)."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not is_test(c) and c.source.strip()]


def files_beside(notebook: Path) -> tuple[dict[str, Path], list[str]]:
    """Regular files next to the notebook (name -> path) that a test may read, and notes on those left out."""
    files, notes = {}, []
    for path in sorted(notebook.parent.iterdir()):
        if path == notebook or path.is_symlink() or not path.is_file() or path.suffix == ".ipynb":
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            notes.append(f"{path.name[:80]} is larger than {MAX_FILE_BYTES >> 20} MiB and was not read")
            continue
        files[path.name] = path
    return files, notes
