"""A tiny nbgrader assignment (pure Python, no torch) for fast sandbox and pipeline tests."""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NAME = "toy"


def _meta(grade_id: str, *, solution=False, grade=False, locked=False, points=0):
    meta = {"grade_id": grade_id, "solution": solution, "grade": grade, "locked": locked,
            "schema_version": 3}
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


SOLUTION_SQUARE = "def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION"
SOLUTION_CUBE = "def cube(x):\n    ### BEGIN SOLUTION\n    return x * x * x\n    ### END SOLUTION"


def write_source(root: Path) -> Path:
    """Write ``root/toy/toy.ipynb`` (an nbgrader source notebook) and return ``root``."""
    nb = new_notebook(cells=[
        new_markdown_cell("# Toy assignment", metadata=_meta("intro", locked=True)),
        new_code_cell(SOLUTION_SQUARE, metadata=_meta("square", solution=True)),
        new_code_cell("assert square(2) == 4, 'square(2) should be 4'",
                      metadata=_meta("test_square_visible", grade=True, locked=True, points=1)),
        new_code_cell("assert square(2) == 4\n### BEGIN HIDDEN TESTS\n"
                      "assert square(-3) == 9, 'square(-3) should be 9'\n### END HIDDEN TESTS",
                      metadata=_meta("test_square_hidden", grade=True, locked=True, points=2)),
        new_code_cell(SOLUTION_CUBE, metadata=_meta("cube", solution=True)),
        new_code_cell("### BEGIN HIDDEN TESTS\nassert cube(2) == 8, 'cube(2) should be 8'\n"
                      "### END HIDDEN TESTS",
                      metadata=_meta("test_cube_hidden", grade=True, locked=True, points=3)),
        new_markdown_cell("Why is a cube an odd function? (graded by hand)", metadata=_meta("explain_q", locked=True)),
        new_markdown_cell("=== BEGIN MARK SCHEME ===\nMention that (-x)^3 = -x^3.\n=== END MARK SCHEME ===",
                          metadata=_meta("explain", solution=True, grade=True, points=2)),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder = root / NAME
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{NAME}.ipynb")
    return root


def solved(release: nbformat.NotebookNode, **bodies: str) -> nbformat.NotebookNode:
    """The release with the solution cells named in ``bodies`` replaced (grade_id -> source)."""
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in bodies:
            cell.source = bodies[gid]
    return nb
