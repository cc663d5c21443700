"""nbgrader's Execute preprocessor, made to survive hostile notebooks.

Stock nbgrader stops grading a notebook when the kernel dies (``os._exit``, a resource limit) and,
after a cell timeout, keeps sending cells to a kernel that may still be spinning.  Either way the
student loses every point, including those for the parts that were right.  This subclass:

* runs every kernel in the sandbox (:class:`autograder.sandbox.SandboxKernelManager`), whatever
  kernel the notebook names;
* when a cell kills the kernel or times out, records a clear error in that cell, starts a fresh
  kernel, replays the earlier cells that succeeded (outputs discarded) and goes on; a cell that
  killed or hung the kernel is not replayed, so it is charged once, to the parts that depend on it;
* caps each cell's output (``max_output_chars``) while it arrives, so megabytes of prints cannot
  exhaust the grader's memory;
* gives up (remaining cells get an error) after ``max_restarts`` restarts or when the notebook's
  wall-time budget is spent;
* before each test cell, resets the IPython hooks through which earlier (student) code could rewrite
  or silence the test: input and AST transformers, custom exception handlers, event callbacks from
  outside IPython, trace functions, and per-instance overrides of the shell's run/traceback methods.
  The reset travels as a ``user_expressions`` entry of an empty execute request, which IPython
  evaluates without passing it through those transformers.  If the shell's own classes were
  patched, the test is not run and earns nothing (``GraderIntegrityError``).  This raises the bar;
  it cannot make a process that runs student code trustworthy (see autograder/README.md).
"""
from __future__ import annotations

import time
import typing as t

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Dict, Integer

from . import sandbox
from .sandbox import SandboxKernelManager

TRUNCATED = "\n[output truncated by the grader: more than {limit} characters]\n"

RESET_HOOKS = r'''
import os, sys
import IPython, ipykernel
from IPython.core.inputtransformer2 import TransformerManager
ip = IPython.get_ipython()
trusted_dirs = tuple(os.path.dirname(m.__file__) for m in (IPython, ipykernel))
trusted_modules = ("IPython", "ipykernel", "matplotlib", "matplotlib_inline", "ipywidgets", "comm")
problems = []
for name in ("run_cell", "run_cell_async", "run_ast_nodes", "run_code", "transform_cell",
             "transform_ast", "showtraceback", "_showtraceback", "showsyntaxerror",
             "user_expressions", "should_run_async", "_run_cell", "get_exception_only"):
    ip.__dict__.pop(name, None)
    code = getattr(getattr(getattr(type(ip), name, None), "__code__", None), "co_filename", "")
    if getattr(type(ip), name, None) is not None and not code.startswith(trusted_dirs):
        problems.append(name)
ip.input_transformer_manager = TransformerManager()
ip.input_transformers_post = []
ip.ast_transformers = []
ip.custom_exceptions = ()
for callbacks in ip.events.callbacks.values():
    callbacks[:] = [cb for cb in callbacks
                    if str(getattr(getattr(cb, "__func__", cb), "__module__", "")).startswith(trusted_modules)]
sys.settrace(None)
sys.setprofile(None)
result = "tampered: " + ", ".join(problems) if problems else "hooks-reset"
'''
RESET_EXPRESSION = f"(lambda ns: (exec({RESET_HOOKS!r}, ns), ns['result'])[1])({{}})"


def error_output(ename: str, evalue: str) -> NotebookNode:
    """An nbformat error output; nbgrader counts a test cell with one as failed."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


class SandboxExecute(Execute):
    """Execute preprocessor with a sandboxed kernel, kernel restarts and an output cap."""

    max_restarts = Integer(4, config=True, help="kernel restarts allowed per notebook")
    max_output_chars = Integer(20_000, config=True, help="characters of output kept per cell")
    notebook_timeout = Integer(1500, config=True, help="wall-time budget in seconds per notebook")
    timeout_by_grade_id = Dict(value_trait=Integer(), config=True,
                               help="per-cell timeouts that differ from `timeout`, by grade id")

    def _get_timeout(self, cell):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") if cell else None
        if gid in self.timeout_by_grade_id:
            return self.timeout_by_grade_id[gid]
        return super()._get_timeout(cell)

    def __init__(self, **kwargs: t.Any) -> None:
        kwargs["kernel_manager_class"] = SandboxKernelManager
        super().__init__(**kwargs)

    # -- output cap -----------------------------------------------------------------------------
    def output(self, outs, msg, display_id, cell_index):  # noqa: D401 (nbclient hook)
        size = sum(_output_size(o) for o in outs)
        if size >= self.max_output_chars:
            if not outs or outs[-1].get("name") != "truncated":
                outs.append(NotebookNode(output_type="stream", name="stdout",
                                         text=TRUNCATED.format(limit=self.max_output_chars)))
                outs[-1]["name"] = "truncated"  # marker, fixed back to stdout after the cell
            return None
        out = super().output(outs, msg, display_id, cell_index)
        if out is not None and _output_size(out) > self.max_output_chars:
            _truncate(out, self.max_output_chars)
        return out

    # -- resilient execution --------------------------------------------------------------------
    def preprocess(self, nb, resources=None, km=None):
        self._started = time.monotonic()
        self._restarts = 0
        self._done: list[int] = []      # indices of cells that ran without killing the kernel
        self._gave_up = ""
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not cell.source.strip():
            return cell, resources
        if self._gave_up:
            cell.outputs = [error_output("NotRun", self._gave_up)]
            return cell, resources
        left = self.notebook_timeout - (time.monotonic() - self._started)
        if left <= 0:
            self._gave_up = (f"the notebook used its {self.notebook_timeout} s time budget; "
                             "this cell was not run")
            cell.outputs = [error_output("NotRun", self._gave_up)]
            return cell, resources
        try:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                verdict = self._reset_hooks()
                if verdict != "hooks-reset":
                    cell.outputs = [error_output(
                        "GraderIntegrityError", "earlier code changed how the kernel runs cells "
                        f"({verdict}); this test was not run and earns no points")]
                    self._done.append(index)
                    return cell, resources
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            cell.outputs.append(error_output(
                "KernelDied", "the kernel died while running this cell (os._exit, a crash, or the "
                "memory, CPU-time or process limit); later cells run in a fresh kernel"))
            self._recover(index)
            return cell, resources
        except CellTimeoutError as exc:
            reason = str(exc).splitlines()[1:2] or [""]
            cell.outputs.append(error_output(
                "CellTimeoutError", f"this cell ran longer than {self._get_timeout(cell)} s or the kernel "
                f"stopped answering ({reason[0].strip()}); later cells run in a fresh kernel"))
            self._recover(index)
            return cell, resources
        _fix_markers(cell)
        if any(o.get("ename") == "CellTimeoutError" for o in cell.outputs):
            cell.outputs = [o for o in cell.outputs if o.get("ename") != "CellTimeoutError"]
            cell.outputs.append(error_output(
                "CellTimeoutError", f"this cell ran longer than {self._get_timeout(cell)} s (interrupted); "
                "later cells run in a fresh kernel"))
            self._recover(index)
        else:
            self._done.append(index)
        return cell, resources

    def _reset_hooks(self) -> str:
        """Run RESET_HOOKS in the kernel; return its verdict ("hooks-reset" when all is well)."""
        msg_id = self.kc.execute("", silent=True, store_history=False, allow_stdin=False,
                                 user_expressions={"reset": RESET_EXPRESSION})
        try:
            reply = self.wait_for_reply(msg_id)
        except (DeadKernelError, CellTimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - no reply means no trustworthy test
            return f"the hook reset got no reply ({type(exc).__name__})"
        value = (reply or {}).get("content", {}).get("user_expressions", {}).get("reset", {})
        if value.get("status") != "ok":
            return "the hook reset could not run"
        return str(value.get("data", {}).get("text/plain", "")).strip("'\"")

    def _recover(self, failed_index: int) -> None:
        """Start a fresh kernel and replay the cells before ``failed_index`` that succeeded."""
        _fix_markers(self.nb.cells[failed_index])
        self._restarts += 1
        if self._restarts > self.max_restarts:
            self._gave_up = f"the kernel was restarted {self.max_restarts} times; this cell was not run"
            return
        self._restart_kernel()
        if self._gave_up:
            return
        for index in list(self._done):
            original = self.nb.cells[index]
            replay = NotebookNode(cell_type="code", metadata={}, outputs=[], source=original.source)
            try:
                super().preprocess_cell(replay, {}, index)
            except (DeadKernelError, CellTimeoutError):
                self._gave_up = f"cell {index} failed when it was replayed after a kernel restart"
                return
            finally:
                self.nb.cells[index] = original  # nbclient stores the executed cell back into nb

    def _restart_kernel(self) -> None:
        uid = self.km.sandbox_uid
        try:
            self._cleanup_kernel()
        except Exception:  # noqa: BLE001 - the old kernel may already be gone
            self.log.warning("cleaning up the dead kernel failed", exc_info=True)
        sandbox.reap(uid)  # leftovers (a fork bomb's children) would starve the new kernel
        self.km = self.create_kernel_manager()
        try:
            self.start_new_kernel(cwd=self.resources.get("metadata", {}).get("path") or None)
            self.start_new_kernel_client()
        except Exception as exc:  # noqa: BLE001 - grade what ran; the rest is marked not run
            self._gave_up = f"the kernel could not be restarted ({type(exc).__name__}: {exc})"
            if self.km is None:  # nbclient dropped it; setup_kernel's cleanup needs one
                self.km = self.create_kernel_manager()


def _output_size(out: NotebookNode) -> int:
    if out.get("output_type") == "stream":
        return len(out.get("text", ""))
    if out.get("output_type") == "error":
        return len(out.get("evalue", "")) + sum(len(x) for x in out.get("traceback", []))
    return sum(len(str(v)) for v in out.get("data", {}).values())


def _truncate(out: NotebookNode, limit: int) -> None:
    note = TRUNCATED.format(limit=limit)
    if out.get("output_type") == "stream":
        out["text"] = out["text"][:limit] + note
    elif out.get("output_type") == "error":
        out["evalue"] = out["evalue"][:limit]
        out["traceback"] = [line[:limit] for line in out["traceback"][-20:]]
    else:
        out["data"] = {"text/plain": str(out.get("data", {}).get("text/plain", ""))[:limit] + note}


def _fix_markers(cell: NotebookNode) -> None:
    for out in cell.get("outputs", []):
        if out.get("name") == "truncated":
            out["name"] = "stdout"
