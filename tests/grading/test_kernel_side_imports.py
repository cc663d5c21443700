"""The kernel side (``agent_lab/grading/inkernel/``) imports nothing but itself, the standard library, torch and
numpy: the grading kernel's view holds only that folder, so any other import would fail there, or (for a
module of ``agent_lab``) bring reference code into the student's process."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from agent_lab.grading import inkernel

# What the kernel's interpreter has besides the standard library: torch and numpy, and the Jupyter kernel
# itself, which the launcher starts (ipykernel) and whose namespace the call server reads (IPython).
THIRD_PARTY = {"torch", "numpy", "ipykernel", "IPython"}


def imported_names(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) for every import in ``source``, at any depth; a relative import is written with its
    leading dots (``.wire``, ``..remote``); ``from a import b`` gives ``a.b``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):  # each imported name, as it may be a module itself
            base = "." * node.level + (node.module + "." if node.module else "")
            found.extend((node.lineno, base + alias.name) for alias in node.names)
    return found


def foreign_imports(path: Path, package: str) -> list[str]:
    """``file:line name`` for each import in ``path`` from outside ``package`` (a module of the package's folder),
    the standard library and :data:`THIRD_PARTY`."""
    bad = []
    for line, name in imported_names(path.read_text()):
        if name.startswith("."):
            inside = not name.startswith("..")
        else:
            top = name.split(".")[0]
            inside = (name == package or name.startswith(package + ".") or top in sys.stdlib_module_names
                      or top in THIRD_PARTY)
        if not inside:
            bad.append(f"{path.name}:{line} {name}")
    return bad


def kernel_side_files() -> list[Path]:
    return sorted(Path(inkernel.__file__).parent.glob("*.py"))


def test_every_kernel_side_module_imports_only_the_folder_the_standard_library_torch_and_numpy():
    files = kernel_side_files()
    assert {p.stem for p in files} >= {"__init__", "checks", "kernel", "kernel_view", "server", "wire"}
    bad = [entry for path in files for entry in foreign_imports(path, inkernel.PACKAGE)]
    assert bad == [], f"kernel-side modules import from outside {inkernel.PACKAGE}: {bad}"


def test_the_views_grading_init_imports_nothing():
    """``agent_lab/grading/__init__.py`` goes into the view as it is, so it must import nothing."""
    init = Path(inkernel.__file__).parent.parent / "__init__.py"
    assert inkernel.view_files()["agent_lab/grading/__init__.py"] == init.resolve()
    assert imported_names(init.read_text()) == []


@pytest.mark.parametrize("planted", [
    "from agent_lab.grading.remote import StudentFunction\n",      # grader side
    "import agent_lab.estimators\n",                               # reference code
    "def f():\n    from agent_lab import config\n",                # nested in a function
    "from .. import session\n",                                    # relative, out of the folder
    "import nbformat\n",                                           # a package the kernel need not have
])
def test_a_planted_import_from_outside_the_folder_is_reported(tmp_path, planted):
    module = tmp_path / "planted.py"
    module.write_text(f"import os\nimport torch\nfrom . import wire\n{planted}")
    bad = foreign_imports(module, inkernel.PACKAGE)
    assert len(bad) == 1 and int(bad[0].split(":")[1].split()[0]) >= 4, bad  # the planted one, not lines 1-3


def test_imports_from_the_folder_the_standard_library_torch_and_numpy_pass(tmp_path):
    module = tmp_path / "fine.py"
    module.write_text("from __future__ import annotations\nimport json, numpy as np\nimport torch.nn\n"
                      f"from {inkernel.PACKAGE}.wire import Opaque\nfrom . import checks\n"
                      f"import {inkernel.PACKAGE}\nfrom agent_lab.grading import inkernel\n")
    assert foreign_imports(module, inkernel.PACKAGE) == []


def test_the_view_and_the_allow_list_derive_from_the_folder():
    """Every file of the folder is in the kernel's view, under the package's own path, and importable there;
    nothing of ``agent_lab`` outside the folder is."""
    view = inkernel.view_files()
    for path in kernel_side_files():
        assert view[f"agent_lab/grading/inkernel/{path.name}"] == path.resolve()
    assert len(view) == len(kernel_side_files()) + 2
    assert inkernel.module_names() == sorted(p.stem for p in kernel_side_files() if p.stem != "__init__")
    for name in inkernel.module_names():
        assert inkernel.allowed_in_kernel(f"{inkernel.PACKAGE}.{name}")
    for name in ("agent_lab.grading.remote", "agent_lab.grading.session", "agent_lab.estimators",
                 "agent_lab.grading.inkernelx"):
        assert not inkernel.allowed_in_kernel(name), name
