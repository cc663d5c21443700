"""A student's kernel for one grading run: run the notebook's own cells, then answer the grader's calls.

The kernel manager comes from the caller (the autograder's sandbox, or a plain local kernel for the students'
check); it names ``rpc_path``, where the grader listens before the kernel starts, and may define
``after_ready()`` (the sandbox takes the kernel's write access to its socket directory away there),
``after_shutdown()`` (the sandbox kills every process the kernel's uid left behind) and ``processes()`` (the
sandbox lists every live process of the kernel's uid).

When a cell kills the kernel or runs past its timeout, or a call does not answer, the kernel is replaced: a
fresh one starts and the cells that ran before are replayed with their outputs discarded (the cell that killed
or hung the kernel is not), so a submission loses only the tests its broken code affects. A graded function
that leaves processes running after it returns (a fork bomb's children) gets the kernel replaced too, before
the next test: those processes would hold the uid's process, memory and CPU caps and fail a later test of
another function. Outputs are capped while they arrive.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from nbformat.notebooknode import NotebookNode

from agent_lab.grading import inkernel
from agent_lab.grading.inkernel import kernel
from agent_lab.grading.notebook import grade_id, kernel_cells
from agent_lab.grading.remote import Channel, CallFailed, KernelDied

TRUNCATED = "\n[output truncated by the grader: more than {limit} characters]\n"
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain_text(text: str, limit: int = 600) -> str:
    """``text`` without terminal escapes (colours, OSC-8 links) or control characters, at most ``limit`` chars."""
    text = CONTROL.sub("", text).strip()
    return text if len(text) <= limit else text[:limit] + " ..."


@dataclass(frozen=True)
class SessionLimits:
    cell_timeout: int = 300        # seconds of wall time per notebook cell
    startup_timeout: int = 120     # seconds for a kernel to start and its call server to say hello
    max_output_chars: int = 20_000  # output kept per cell
    max_restarts: int = 4          # kernel replacements per notebook


class CappedClient(NotebookClient):
    """nbclient with a cap on each cell's output, applied while the output arrives."""

    max_output_chars = 20_000

    def output(self, outs, msg, display_id, cell_index):  # noqa: D401 (nbclient hook)
        if sum(_size(o) for o in outs) >= self.max_output_chars:
            if not outs or outs[-1].get("name") != "truncated":
                outs.append(NotebookNode(output_type="stream", name="truncated",
                                         text=TRUNCATED.format(limit=self.max_output_chars)))
            return None
        out = super().output(outs, msg, display_id, cell_index)
        if out is not None and _size(out) > self.max_output_chars:
            _truncate(out, self.max_output_chars)
        return out


def _size(out: NotebookNode) -> int:
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


def error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def cell_label(nb: NotebookNode, index: int) -> str:
    """A name a student recognises: the cell's grade id, or the answer cell above an added cell."""
    gid = grade_id(nb.cells[index])
    if gid:
        return repr(gid)
    above = next((grade_id(c) for c in reversed(nb.cells[:index]) if grade_id(c)), None)
    return f"your cell after {above!r}" if above else "your first cell"


class KernelSession:
    """The kernel of one notebook (see the module docstring); ``notes`` collects messages for the student."""

    def __init__(self, nb: NotebookNode, make_manager: Callable[[], Any], limits: SessionLimits = SessionLimits(),
                 cwd: str | None = None) -> None:
        self.nb, self.make_manager, self.limits, self.cwd = nb, make_manager, limits, cwd
        self.notes: list[str] = []
        self.restarts = 0
        self.gave_up = ""
        self._done: list[int] = []     # kernel cells that ran without killing or hanging the kernel
        self._client: CappedClient | None = None
        self._channel: Channel | None = None
        self._settled: set[int] = set()  # the processes there were once the cells had run

    # -- kernels --------------------------------------------------------------------------------------------
    def _start(self) -> None:
        km = self.make_manager()
        listener = Channel.listen(km.rpc_path)   # before the kernel exists: nothing else can take the path
        os.chmod(km.rpc_path, 0o666)             # the kernel runs as another user in the sandbox
        client = CappedClient(self.nb, km=km, timeout=self.limits.cell_timeout,
                              allow_errors=True, startup_timeout=self.limits.startup_timeout,
                              kernel_name="python3", record_timing=False,
                              shutdown_kernel="immediate")  # no state to save; the uid is reaped after
        client.max_output_chars = self.limits.max_output_chars
        self._client = client
        try:
            client.start_new_kernel(cwd=self.cwd)
            client.start_new_kernel_client()
            self._channel = Channel.accept(listener, self.limits.startup_timeout)
        finally:
            listener.close()
        if hasattr(km, "after_ready"):
            km.after_ready()

    def _stop(self) -> None:
        client, self._client = self._client, None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if client is None:
            return
        try:
            client._cleanup_kernel()
        except Exception:  # noqa: BLE001 - the kernel may be gone already
            pass
        if client.km is not None and hasattr(client.km, "after_shutdown"):
            client.km.after_shutdown()

    def close(self) -> None:
        self._stop()

    def _replace(self) -> None:
        """A fresh kernel with the cells that ran so far replayed (outputs discarded)."""
        self._stop()
        self.restarts += 1
        if self.restarts > self.limits.max_restarts:
            self.gave_up = f"the kernel was replaced {self.limits.max_restarts} times; the rest was not run"
            return
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - grade what ran; the rest is marked not run
            self.gave_up = f"a fresh kernel could not be started ({type(exc).__name__})"
            return
        for index in self._done:
            original = self.nb.cells[index]
            replay = nbformat.v4.new_code_cell(original.source)
            status = self._execute(replay, index)
            self.nb.cells[index] = original  # nbclient stores the executed cell back into the notebook
            if status in ("died", "timeout"):
                self.gave_up = f"{cell_label(self.nb, index)} failed when it was replayed in a fresh kernel"
                return
        self._settle()

    def _processes(self) -> set[int]:
        """The live processes of the kernel's sandbox (empty where the manager cannot list them)."""
        km = self._client.km if self._client is not None else None
        return set(km.processes()) if km is not None and hasattr(km, "processes") else set()

    def _settle(self) -> None:
        """The processes running now belong to the notebook; any later one was started by a graded call."""
        self._settled = self._processes()

    # -- cells ----------------------------------------------------------------------------------------------
    def _execute(self, cell: NotebookNode, index: int) -> str:
        """Run one cell: "ok", "error", "died" or "timeout"."""
        try:
            self._client.execute_cell(cell, index)
        except DeadKernelError:
            cell.outputs.append(error_output(
                "KernelDied", "the kernel died while running this cell (os._exit, a crash, or the memory, "
                "CPU-time or process limit); the next cells ran in a fresh kernel"))
            return "died"
        except CellTimeoutError:
            cell.outputs.append(error_output(
                "CellTimeoutError", f"this cell ran longer than {self.limits.cell_timeout} s; the next cells ran "
                "in a fresh kernel"))
            return "timeout"
        for out in cell.get("outputs", []):
            if out.get("name") == "truncated":
                out["name"] = "stdout"
        return "error" if any(o.get("output_type") == "error" for o in cell.outputs) else "ok"

    def run_notebook(self) -> None:
        """Start the kernel and run every kernel cell once, in order, keeping their (capped) outputs."""
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - no kernel: every test will say so
            self.gave_up = f"the kernel could not be started ({type(exc).__name__}: {plain_text(str(exc), 200)})"
            return
        for index in kernel_cells(self.nb):
            cell = self.nb.cells[index]
            if self.gave_up:
                cell.outputs = [error_output("NotRun", self.gave_up)]
                continue
            status = self._execute(cell, index)
            if status in ("ok", "error"):
                self._done.append(index)
            if status != "ok":
                self._note_failure(index)
            if status in ("died", "timeout"):
                self._replace()
        self._settle()

    def _note_failure(self, index: int) -> None:
        errors = [o for o in self.nb.cells[index].outputs if o.get("output_type") == "error"]
        if errors:
            text = plain_text(f"{errors[-1].get('ename', 'Error')}: {errors[-1].get('evalue', '')}", 300)
            self.notes.append(f"{cell_label(self.nb, index)} failed: {text}")

    # -- calls ----------------------------------------------------------------------------------------------
    def current(self) -> Channel:
        """The channel calls go through now (it may be broken: its calls then fail with the reason)."""
        if self._channel is None:
            raise KernelDied(self.gave_up or "the kernel is not running")
        return self._channel

    def ready(self) -> Channel:
        """A live channel for the next test: the kernel is replaced first if the last call broke it."""
        if self._channel is not None and self._channel.broken is None:
            left = self._processes() - self._settled
            if self._channel.has_stray_data():
                self._channel.broken = KernelDied("the kernel sent answers nobody asked for")
            elif left:
                self._channel.broken = KernelDied("a graded call left processes running")
                # No count: the kernel chooses how many processes it leaves, so a count could carry a hidden input.
                self.notes.append("a graded function left processes running after it returned (os.fork?); they "
                                  "were stopped and the next test ran in a fresh kernel")
        if self._channel is not None and self._channel.broken is None:
            return self._channel
        if self.gave_up:
            raise KernelDied(self.gave_up)
        self._replace()
        if self.gave_up or self._channel is None:
            raise KernelDied(self.gave_up or "the kernel could not be replaced")
        return self._channel

    def check_server(self) -> None:
        """After the cells: make sure the call server still answers (student code may have broken it)."""
        if self._channel is not None and self._channel.broken is None and not self._channel.ping():
            self._channel.broken = KernelDied("the kernel's call server stopped answering after the notebook ran")
            self.notes.append("after your cells ran, the kernel no longer answered the grader; it was restarted")



class LocalKernelManager(AsyncKernelManager):
    """A grading kernel on this machine, without a sandbox (the students' check): the same view of
    ``agent_lab`` as in the sandbox (:func:`agent_lab.grading.inkernel.view_files`), copied to a temporary
    folder."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scratch = tempfile.mkdtemp(prefix="agent-lab-check-")
        self.rpc_path = os.path.join(self.scratch, "rpc.sock")
        self.transport, self.ip = "ipc", os.path.join(self.scratch, "k")  # unix sockets, not TCP
        view = os.path.join(self.scratch, "view")
        for dest, src in inkernel.view_files().items():
            os.makedirs(os.path.dirname(os.path.join(view, dest)), exist_ok=True)
            shutil.copyfile(src, os.path.join(view, dest))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self._spec = KernelSpec(argv=kernel.kernel_argv(sys.executable, self.rpc_path), language="python",
                                display_name="Python 3 (agent-lab check)", env={**env, "PYTHONPATH": view})

    @property
    def kernel_spec(self) -> KernelSpec:
        return self._spec

    @property
    def ipykernel(self) -> bool:
        return True

    def after_shutdown(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)
