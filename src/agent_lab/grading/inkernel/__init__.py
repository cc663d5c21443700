"""The modules that run inside the student's grading kernel, and nothing else.

Everything in this folder is copied into the kernel's view of ``agent_lab`` (the sandbox binds it
read-only, the students' check copies it), so it must import only itself, the standard library, torch and
numpy: ``tests/grading/test_kernel_side_imports.py`` checks that. This folder's listing is the one place
that says which modules the kernel sees: the view (:func:`view_files`), the kernel's import allow-list
(:func:`allowed_in_kernel`, used by ``kernel_view.py``) and the submissions' review pattern derive from it.

* ``kernel``: the launcher the kernelspec runs (starts the call server, then ipykernel);
* ``server``: the call server that runs the student's functions on the grader's request;
* ``wire``: the frames both sides exchange (plain values and tensors, never pickle);
* ``checks``: the helpers test cells use, the same in a student's notebook and in the grader;
* ``kernel_view``: the kernel's ``agent_lab/__init__.py``, which refuses every other ``agent_lab`` module.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE = __name__
# What a student's own cells may name of this package (the setup cell imports the checks from here).
STUDENT_FACING = ("checks",)


def module_names() -> list[str]:
    """The module names in this folder (``checks``, ``kernel``, ...), sorted; ``__init__`` left out."""
    return sorted(p.stem for p in Path(__file__).resolve().parent.glob("*.py") if p.stem != "__init__")


def allowed_in_kernel(name: str) -> bool:
    """Whether the grading kernel may import the ``agent_lab`` module ``name``: this package, its modules and
    the (empty) ``agent_lab.grading`` above it. Only this folder is in the kernel's view anyway."""
    return name in ("agent_lab.grading", PACKAGE) or name.startswith(PACKAGE + ".")


def view_files() -> dict[str, Path]:
    """Destination in the kernel's view of ``agent_lab`` -> the file that goes there.

    The package's own ``__init__`` is replaced by ``kernel_view.py``; ``agent_lab/grading/__init__.py``
    imports nothing, so it goes as it is; every file of this folder goes under its own name."""
    here = Path(__file__).resolve().parent
    folder = "/".join(PACKAGE.split("."))
    view = {"agent_lab/__init__.py": here / "kernel_view.py",
            "agent_lab/grading/__init__.py": here.parent / "__init__.py"}
    for path in sorted(here.glob("*.py")):
        view[f"{folder}/{path.name}"] = path
    return view
