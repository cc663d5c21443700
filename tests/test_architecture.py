"""ARCHITECTURE.md's module map and its "who calls whom" list agree with the package's imports: every module
(or package) of src/agent_lab is on the map, every import between them is an arrow of the list and every arrow
an import, and no arrow points up the list. A new module or a new import fails here until the map says so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "agent_lab"
DOC = ROOT / "ARCHITECTURE.md"


def units(package: Path = PACKAGE) -> set[str]:
    """The top-level modules and sub-packages of the package: the pieces the map names."""
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def _imported(path: Path, package: Path) -> set[str]:
    """Every ``agent_lab.*`` module a file imports, anywhere in its code, as dotted names."""
    here = ["agent_lab", *path.relative_to(package).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {module} | {f"{module}.{a.name}" for a in node.names}  # `from agent_lab import trainer`
    return {name for name in found if name.startswith("agent_lab.")}


def imports(package: Path = PACKAGE) -> set[tuple[str, str]]:
    """Arrows ``(importer, imported)`` between the package's units (an import inside one unit is no arrow)."""
    known, arrows = units(package), set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).parts
        source = parts[0].removesuffix(".py")
        if source not in known:
            continue  # the package's own __init__.py
        for name in _imported(path, package):
            target = name.split(".")[1]
            if target in known and target != source:
                arrows.add((source, target))
    return arrows


def _code_block(text: str, after: str) -> str:
    start = text.index("```", text.index(after))
    return text[text.index("\n", start) + 1: text.index("```", start + 3)]


def mapped_units(text: str) -> set[str]:
    """The names on the module map's first level (``  trainer.py``, ``  grading/``)."""
    block = _code_block(text, "# Architecture")
    return {m.group(1) for m in re.finditer(r"^  (\w+)(?:\.py|/)\s", block, re.M)}


def listed_arrows(text: str) -> tuple[list[str], set[tuple[str, str]]]:
    """The "who calls whom" list: its units in order (leaves last) and its arrows. A line reads
    ``importer -> imported, ...`` and may continue on indented lines; remarks in parentheses are ignored."""
    block = re.sub(r"\([^)]*\)", "", _code_block(text, "## Who calls whom"))
    order, arrows, source = [], set(), None
    for line in block.splitlines():
        if line.startswith("leaves"):
            order += [n.strip() for n in line.removeprefix("leaves").split(",")]
            source = None
            continue
        if "->" in line:
            source, line = (x.strip() for x in line.split("->", 1))
            order.append(source)
        arrows |= {(source, n.strip()) for n in line.split(",") if n.strip() and source}
    return order, arrows


def test_every_module_of_the_package_is_on_the_module_map_and_nothing_else():
    mapped, actual = mapped_units(DOC.read_text()), units()
    assert actual - mapped == set(), f"ARCHITECTURE.md's module map lacks {sorted(actual - mapped)}"
    assert mapped - actual == set(), f"ARCHITECTURE.md's module map names modules that do not exist: " \
                                     f"{sorted(mapped - actual)}"


def test_who_calls_whom_lists_exactly_the_imports_between_modules():
    order, listed = listed_arrows(DOC.read_text())
    actual = imports()
    assert actual - listed == set(), \
        f"imports missing from ARCHITECTURE.md's who-calls-whom: {sorted(actual - listed)}"
    assert listed - actual == set(), f"arrows in ARCHITECTURE.md's who-calls-whom that no import makes: " \
                                     f"{sorted(listed - actual)}"
    twice = sorted({n for n in order if order.count(n) > 1})
    assert set(order) == units() and not twice, (
        f"each module is one line of who-calls-whom (or a leaf), once: missing "
        f"{sorted(units() - set(order))}, not modules {sorted(set(order) - units())}, twice {twice}")


def test_calls_go_down_the_list_never_up():
    order, listed = listed_arrows(DOC.read_text())
    up = [(a, b) for a, b in sorted(listed) if order.index(b) <= order.index(a)]
    assert up == [], f"these arrows point up ARCHITECTURE.md's who-calls-whom list: {up}"


def test_the_reader_sees_a_new_import_or_module(tmp_path):
    """The checks above see what they claim to: an added import and an added module (here in a copy)."""
    copy = tmp_path / "agent_lab"
    (copy / "grading" / "kernel").mkdir(parents=True)
    (copy / "__init__.py").write_text("")
    (copy / "config.py").write_text("import json\n")
    (copy / "grading" / "__init__.py").write_text("from . import kernel\n")
    (copy / "grading" / "kernel" / "__init__.py").write_text("")
    (copy / "grading" / "kernel" / "wire.py").write_text("def f():\n    from ...config import x\n")
    (copy / "widgets.py").write_text("from agent_lab import config, grading\n"
                                     "import agent_lab.grading.kernel.wire\n")
    assert units(copy) == {"config", "grading", "widgets"}
    assert imports(copy) == {("grading", "config"), ("widgets", "config"), ("widgets", "grading")}
