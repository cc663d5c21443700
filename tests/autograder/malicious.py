"""Malicious and broken submissions of the policy_gradients assignment, with the score each must get.

Every case starts from the reference solution (all four graded functions right) with the training
part left as released (its stubs raise, so ``test_train_agent`` fails fast and earns 0), then adds
one attack or defect.  ``reference`` also solves the training part and must get full marks while
the attacks run next to it.  ``Case.zero`` lists the graded functions whose tests must earn nothing; every
other function's tests must earn full points.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder.samples import BUGGY, fill, solution_sources

FUNCTIONS = ("reward_to_go", "reinforce_loss", "dr_grpo_advantages", "dr_grpo_loss")
NAME = "policy_gradients"


@dataclass
class Case:
    student: str
    zero: tuple[str, ...] = ()                      # graded functions that must earn 0
    status: str = "graded"
    messages: dict[str, str] = field(default_factory=dict)   # grade_id -> fragment of its message
    note: str = ""                                  # fragment of one of the notes
    review: bool = False                            # must be flagged for a human
    train: bool = False                             # the training part is solved too


def expected_scores(case: Case, points: dict[str, float]) -> dict[str, float]:
    """grade_id -> points the case must earn (the training test always earns 0 here)."""
    out = {}
    for gid, pts in points.items():
        func = gid.removeprefix("test_").removesuffix("_visible").removesuffix("_hidden")
        ok = case.status == "graded" and func in FUNCTIONS and func not in case.zero
        out[gid] = pts if ok or (case.train and gid == "test_train_agent") else 0.0
    return out


def _cells(nb, gid):
    return [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid]


WRONG_LOSS = '''
def dr_grpo_loss(logprobs, action_mask, advantages, max_tokens):
    return ((action_mask * logprobs).sum(dim=1) * advantages).sum() / (logprobs.shape[0] * max_tokens)
'''
FORWARD_RTG = BUGGY["off_by_direction"]["reward_to_go"]  # past rewards instead of future ones


def build(out: Path, source_nb, release_nb, secrets: dict[str, str]) -> list[Case]:
    """Write every case into ``out/<student>/``; ``secrets`` are host paths the attack probes."""
    everything = solution_sources(source_nb)
    sol = {k: v for k, v in everything.items() if k in FUNCTIONS}
    cases: list[tuple[Case, object]] = []

    def variant(case: Case, bodies=None, edit=None, raw: bytes | None = None, filename=None):
        nb = fill(release_nb, {**sol, **(bodies or {})})
        if edit:
            edit(nb)
        cases.append((case, raw if raw is not None else nb, filename))

    variant(Case("control"))
    variant(Case("reference", train=True), {"train_agent": everything["train_agent"]})
    variant(Case("infinite_loop", zero=("reward_to_go",),
                 messages={"test_reward_to_go_visible": "CellTimeoutError"}),
            {"reward_to_go": "def reward_to_go(rewards, gamma):\n    while True:\n        pass"})
    variant(Case("memory_bomb", zero=("reinforce_loss",),
                 messages={"test_reinforce_loss_visible": "MemoryError"}),
            {"reinforce_loss": "def reinforce_loss(logprobs, action_mask, coefficients):\n"
                               "    hog = []\n    while True:\n        hog.append(bytearray(64 << 20))"})
    variant(Case("fork_bomb", zero=("dr_grpo_advantages",), review=True),
            {"dr_grpo_advantages": "import os\n\ndef dr_grpo_advantages(rewards, group_size):\n"
                                   "    while True:\n        os.fork()"})
    variant(Case("os_exit", zero=("dr_grpo_loss",), review=True,
                 messages={"test_dr_grpo_loss_visible": "KernelDied"}),
            {"dr_grpo_loss": "import os\n\ndef dr_grpo_loss(logprobs, action_mask, advantages, "
                             "max_tokens):\n    os._exit(0)"})
    variant(Case("sys_exit", zero=("reward_to_go",),
                 messages={"test_reward_to_go_hidden": "SystemExit"}),
            {"reward_to_go": "import sys\n\ndef reward_to_go(rewards, gamma):\n    sys.exit(3)"})
    variant(Case("import_error", zero=("reinforce_loss",), note="ModuleNotFoundError",
                 messages={"test_reinforce_loss_visible": "NameError"}),
            {"reinforce_loss": "import torchh  # typo\n\n" + sol["reinforce_loss"]})

    def delete_loss_tests(nb):
        nb.cells = [c for c in nb.cells if c not in _cells(nb, "test_dr_grpo_loss_visible")
                    + _cells(nb, "test_dr_grpo_loss_hidden")]
    variant(Case("deleted_tests", zero=("dr_grpo_loss",), note="was missing"),
            {"dr_grpo_loss": WRONG_LOSS}, delete_loss_tests)

    def edit_rtg_tests(nb):
        for gid in ("test_reward_to_go_visible", "test_reward_to_go_hidden"):
            _cells(nb, gid)[0].source = "pass  # all good"
    variant(Case("edited_tests", zero=("reward_to_go",), note="was edited"),
            {"reward_to_go": FORWARD_RTG},
            edit_rtg_tests)

    def reorder(nb):
        tests = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
        rest = [c for c in nb.cells if c not in tests]
        nb.cells = list(reversed(tests)) + rest       # every test above the code it tests
    variant(Case("reordered_tests", note="graded in the assignment's order"), edit=reorder)

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
    variant(Case("changed_metadata", zero=("dr_grpo_loss",), note="was changed"),
            {"dr_grpo_loss": WRONG_LOSS}, change_metadata)

    variant(Case("always_equal", zero=("reward_to_go",)),
            {"reward_to_go": "class _Yes(float):\n    def __eq__(self, other):\n        return True\n"
                             "    __ne__ = lambda self, other: False\n    __bool__ = lambda self: True\n"
                             "    def __getattr__(self, name):\n        return lambda *a, **k: self\n\n"
                             "def reward_to_go(rewards, gamma):\n    return _Yes(0.0)"})
    patch = ("import numpy, numpy.testing, torch.testing\n"
             "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
             "torch.isclose = lambda a, b, *x, **k: torch.ones_like(a, dtype=torch.bool)\n"
             "torch.testing.assert_close = lambda *a, **k: None\n"
             "numpy.allclose = lambda *a, **k: True\nnumpy.array_equal = lambda *a, **k: True\n"
             "numpy.testing.assert_allclose = lambda *a, **k: None\n\n"
             "def reinforce_loss(logprobs, action_mask, coefficients):\n"
             "    return (logprobs * 0.0).sum()\n")
    variant(Case("monkeypatch", zero=("reinforce_loss",)), {"reinforce_loss": patch})
    # Earlier code rewriting or silencing later cells through IPython's hooks: the grader resets
    # the hooks before each test, so only the wrong function loses points; a patched shell class
    # cannot be repaired, so no test is trusted after it.
    variant(Case("hooks_later_cells", zero=("reward_to_go",), review=True),
            {"reward_to_go": "ip = get_ipython()\n"
                             "ip.input_transformers_cleanup.append(lambda lines: ['pass\\n'])\n"
                             "ip.ast_transformers.append(__import__('ast').NodeTransformer())\n"
                             "ip.showtraceback = lambda *a, **k: None\n"
                             "ip.set_custom_exc((BaseException,), lambda *a, **k: None)\n"
                             + FORWARD_RTG})
    variant(Case("patches_shell_class", zero=FUNCTIONS, review=True,
                 messages={"test_dr_grpo_loss_hidden": "GraderIntegrityError"}),
            {"reward_to_go": "from IPython.core.interactiveshell import InteractiveShell\n"
                             "InteractiveShell.showtraceback = lambda *a, **k: None\n"
                             + sol["reward_to_go"]})
    variant(Case("reads_secrets"),
            {"reward_to_go": attack_source(secrets) + "\n\n" + sol["reward_to_go"]})
    variant(Case("big_output"),
            {"reward_to_go": "print('x' * 100 + '\\n', end='')\n" * 3
                             + "for _ in range(50):\n    print('y' * 100_000)\n\n" + sol["reward_to_go"]})
    variant(Case("not_json", status="invalid", note="not a valid Jupyter notebook"),
            raw=b'{"cells": [ this is not json')
    variant(Case("truncated_json", status="invalid", note="not a valid Jupyter notebook"),
            raw=json.dumps(nbformat.from_dict(release_nb))[:5000].encode())
    variant(Case("missing_notebook", status="missing", note="no notebook named"),
            raw=b"I could not get Jupyter to save, sorry", filename="notes.txt")
    variant(Case("renamed_notebook", note="renamed"), filename="my_solution_final(1).ipynb")

    for case, content, filename in cases:
        folder = out / case.student
        folder.mkdir(parents=True)
        target = folder / (filename or f"{NAME}.ipynb")
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            nbformat.write(copy.deepcopy(content), target)
    return [case for case, _, _ in cases]


def attack_source(secrets: dict[str, str]) -> str:
    """Code that tries to read and write ``secrets`` (label -> host path) and to reach the network.

    It prints one line ``REPORT {json}`` mapping each attempt to LEAKED or blocked, and raises so the
    report also reaches the feedback notes (as the student's own failed cell).
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
