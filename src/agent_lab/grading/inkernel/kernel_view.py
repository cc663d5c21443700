"""The grading kernel's ``agent_lab/__init__.py``: a view of the package with the reference code left out.

While a notebook is graded, the kernel imports this file as ``agent_lab`` (the grader puts a directory
holding it, the files of ``agent_lab/grading/inkernel/`` and nothing else first on the kernel's path; in the
sandbox the real sources are not even mounted). So a graded function cannot call the library's reference implementations:
``import agent_lab.estimators`` fails with the message below. Imported under any other name (as
``agent_lab.grading.inkernel.kernel_view`` by the grader, say) this module does nothing.
"""
from __future__ import annotations

import importlib.abc
import sys

# Run as the view's agent_lab/__init__.py, this import finds agent_lab.grading.inkernel in the view.
from agent_lab.grading.inkernel import PACKAGE, allowed_in_kernel

MESSAGE = ("{name} is not available while your notebook is graded: the graded functions must be your own "
           f"code (only torch, numpy and {PACKAGE}.checks are there). Remove the import from your cells.")


class _ReferenceBlocker(importlib.abc.MetaPathFinder):
    """Refuse every ``agent_lab`` submodule that :func:`allowed_in_kernel` refuses, with a clear message."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith("agent_lab.") and not allowed_in_kernel(name):
            raise ModuleNotFoundError(MESSAGE.format(name=name), name=name)
        return None


if __name__ == "agent_lab":
    __version__ = "grading view"
    sys.meta_path.insert(0, _ReferenceBlocker())

    def __getattr__(name: str):
        raise AttributeError(MESSAGE.format(name=f"agent_lab.{name}"))
