"""Read the book's code cells as Python and classify their ``assert`` statements (no build needed).

An assert *compares an agent_lab result* when its test reads a name whose value comes from ``agent_lab``: a
name imported from it, or one assigned (directly or through other such names, loops, ``with`` targets,
functions whose bodies use one, ``x.append(...)`` of one) from an expression that uses one. Chapter cells run
in one namespace, so the names carry over from cell to cell.

An assert is *bounds-only* when its comparisons are orderings (``<``, ``>``, ``<=``, ``>=``) and none of
them measures a distance to a stated value: ``abs(a - b) < tol`` (or ``tol > abs(a - b)``, a norm of a
difference) names the exact value and allows a rounding or sampling tolerance, as ``==``, ``math.isclose``,
``torch.allclose`` and the like do.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

CELL = re.compile(r"```\{code-cell\} ipython3\n(.*?)\n```", flags=re.S)
EXACT_CALLS = {"isclose", "allclose", "equal", "approx", "array_equal", "assert_allclose", "assert_close"}
ORDERINGS = (ast.Lt, ast.Gt, ast.LtE, ast.GtE)
MUTATORS = {"append", "extend", "update", "add", "insert", "setdefault", "copy_", "add_"}


@dataclass(frozen=True)
class AssertLine:
    cell: int  # index of the code cell in the chapter
    line: int  # line of the assert within the cell's source
    source: str  # the assert's first line
    uses_agent_lab: bool
    bounds_only: bool
    cell_uses_agent_lab: bool


def code_cells(text: str) -> list[tuple[int, str]]:
    """``(offset in the chapter, Python source)`` of each code cell, cell options and magics blanked out."""
    out = []
    for match in CELL.finditer(text):
        lines, cleaned, in_options = match.group(1).splitlines(), [], False
        for j, line in enumerate(lines):
            if j == 0 and line.strip() == "---":
                in_options = True
            elif in_options:
                in_options = line.strip() != "---"
            elif not (cleaned == [""] * len(cleaned) and line.startswith(":")) and not line.startswith("%"):
                cleaned.append(line)
                continue
            cleaned.append("")
        out.append((match.start(), "\n".join(cleaned)))
    return out


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "agent_lab":
            found |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "agent_lab"}
    return found


def _flows(node: ast.AST) -> list[tuple[list[ast.AST], ast.AST]]:
    """``(targets, value)`` pairs through which a value reaches names in one statement or loop."""
    if isinstance(node, ast.Assign):
        return [(node.targets, node.value)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        return [([node.target], node.value)]
    if isinstance(node, (ast.For, ast.comprehension)):
        return [([node.target], node.iter)]
    if isinstance(node, ast.With):
        return [([i.optional_vars], i.context_expr) for i in node.items if i.optional_vars is not None]
    if isinstance(node, ast.FunctionDef):
        return [([ast.Name(id=node.name)], node)]
    if isinstance(node, ast.Call):
        # An agent_lab call may act on its arguments (a backward pass fills their .grad): they carry its result.
        flows = [([*node.args, *(k.value for k in node.keywords)], node.func)]
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        owner = node.func.value if method in MUTATORS else None  # rows.append(result), table.update(...)
        if isinstance(owner, ast.Name):
            flows.append(([owner], ast.Tuple(elts=[*node.args, *(k.value for k in node.keywords)])))
        return flows
    return []


def _propagate(tree: ast.AST, derived: set[str]) -> None:
    """Grow ``derived`` to a fixpoint over every flow in ``tree``."""
    flows = [f for node in ast.walk(tree) for f in _flows(node)]
    changed = True
    while changed:
        changed = False
        for targets, value in flows:
            if not _names(value) & derived:
                continue
            for target in targets:
                for n in ast.walk(target):
                    name = n.id if isinstance(n, ast.Name) else None
                    if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name):
                        name = n.value.id
                    if name and name not in derived:
                        derived.add(name)
                        changed = True


def _is_closeness_check(compare: ast.Compare) -> bool:
    """``abs(a - b) < tol``, ``tol > abs(x)``, ``(a - b).abs().max() < tol``: a distance to a stated value."""
    if len(compare.ops) != 1:
        return False
    small = compare.left if isinstance(compare.ops[0], (ast.Lt, ast.LtE)) else compare.comparators[0]
    if not isinstance(compare.ops[0], ORDERINGS):
        return False
    for node in ast.walk(small):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("abs", "fabs", "norm"):
                return True
    return False


def is_bounds_only(test: ast.AST) -> bool:
    compares = [n for n in ast.walk(test) if isinstance(n, ast.Compare)]
    calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "") for n in ast.walk(test)
             if isinstance(n, ast.Call)}
    if calls & EXACT_CALLS:
        return False
    exact = [c for c in compares if _is_closeness_check(c) or not all(isinstance(op, ORDERINGS) for op in c.ops)]
    return bool(compares) and not exact


def chapter_asserts(text: str) -> list[AssertLine]:
    """Every assert statement of a chapter's code cells, classified."""
    derived: set[str] = set()
    out = []
    for index, (_, source) in enumerate(code_cells(text)):
        tree = ast.parse(source)
        derived |= _imports(tree)
        _propagate(tree, derived)
        cell_uses = bool(_names(tree) & derived)
        lines = source.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                out.append(AssertLine(index, node.lineno, lines[node.lineno - 1].strip(),
                                      bool(_names(node.test) & derived), is_bounds_only(node.test), cell_uses))
    return out


def chapter_paths(book: Path) -> list[Path]:
    return sorted(p for part in ("part1", "part2", "part3") for p in (book / part).glob("[0-9][0-9]_*.md"))
