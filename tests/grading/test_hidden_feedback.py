"""Hidden inputs never reach the feedback, and they are not the ones the repository's seeds give.

Each test plants one channel a student's kernel could use to carry the hidden inputs into a message: an exception
class registered in ``builtins`` and named after the input, a forged answer frame whose decode error would quote
numbers the kernel chose, an input stored during a hidden call and raised from a later visible one, and a number
of processes chosen by the kernel. (Claims the kernel makes about itself: ``test_kernel_claims.py``.)
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import nbformat
import pytest

from agent_lab.grading import notebook, runner
from agent_lab.grading.inkernel.checks import Checks, Rng
from agent_lab.grading.remote import KernelDied
from agent_lab.grading.session import KernelSession, LocalKernelManager, SessionLimits

HIDDEN_INPUTS = (48611, 52973, 61231)   # numbers no grader text contains by chance


def _meta(gid: str, **flags) -> dict:
    return {"nbgrader": {"grade_id": gid, "schema_version": 3, "solution": False, "grade": False,
                         "locked": False, **flags}}


def _test_cell(gid: str, code: str, hidden: bool) -> nbformat.NotebookNode:
    if hidden:
        code = f"### BEGIN HIDDEN TESTS\n{code}\n### END HIDDEN TESTS"
    return nbformat.v4.new_code_cell(code, metadata=_meta(gid, grade=True, locked=True, points=1))


# In the notebook's order a hidden test comes first and a visible one after it.
SOURCE = nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_code_cell("from agent_lab.grading.inkernel.checks import Checks\n_check = Checks()",
                              metadata=_meta("setup", locked=True)),
    nbformat.v4.new_code_cell("def echo(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION",
                              metadata=_meta("echo", solution=True)),
    _test_cell("test_hidden_checked", f"for k in {HIDDEN_INPUTS}:\n"
               "    assert _check.call(echo, k) == k, f'hidden case {k % 7}'", hidden=True),
    _test_cell("test_hidden_direct", f"for k in {HIDDEN_INPUTS}:\n    assert echo(k) == k, 'hidden'", hidden=True),
    _test_cell("test_visible_after", "assert _check.call(echo, 3) == 3, 'echo(3) should be 3'", hidden=False),
])


def _run(source: nbformat.NotebookNode, student: str, secret: bytes = b"") -> tuple[list, KernelSession]:
    """Grade ``source`` with ``student`` as its answer cell, as the grader does (a local kernel)."""
    sub = nbformat.from_dict(source)
    sub.cells[1].source = student
    cells, _ = notebook.read_submission(nbformat.writes(sub).encode())
    nb, _ = notebook.assemble(source, cells)
    session = KernelSession(nb, LocalKernelManager, SessionLimits(cell_timeout=20, startup_timeout=60))
    try:
        session.run_notebook()
        session.check_server()
        outcomes = runner.run_tests(runner.test_cells(source), session, runner.interface(source), 20,
                                    secret=secret)
    finally:
        session.close()
    return outcomes, session


def grade(student: str) -> tuple[dict[str, tuple[float, str]], KernelSession]:
    outcomes, session = _run(SOURCE, student)
    return {o.grade_id: (o.score, o.message) for o in outcomes}, session


def _leaked(text: str) -> list[str]:
    """The hidden inputs (or their decimal digits' longest tails) that appear in ``text``."""
    return [str(k) for k in HIDDEN_INPUTS if str(k)[1:] in text]


def _feedback(scores: dict, session: KernelSession) -> str:
    return "\n".join([*(m for _, m in scores.values()), *session.notes])


BUILTIN_CLASS = '''
import builtins
def echo(x):
    name = f"Leak{x}"
    kind = type(name, (Exception,), {"__module__": "builtins"})
    setattr(builtins, name, kind)   # so that `getattr(builtins, name) is kind` in the kernel
    raise kind(name)
'''


def test_an_exception_class_registered_in_builtins_does_not_bring_its_name_into_a_hidden_message():
    scores, session = grade(BUILTIN_CLASS)
    assert scores["test_hidden_checked"][0] == scores["test_hidden_direct"][0] == 0.0
    assert not _leaked(_feedback(scores, session)), _feedback(scores, session)
    assert "a class your code defined" in scores["test_hidden_checked"][1]


def test_a_builtin_exception_is_still_named_in_a_hidden_message():
    scores, _ = grade("def echo(x):\n    raise KeyError(x)")
    assert scores["test_hidden_checked"] == (0.0, "echo raised KeyError")
    assert "KeyError" in scores["test_hidden_direct"][1] and not _leaked(scores["test_hidden_direct"][1])


FORGED_FRAME = '''
import json
from agent_lab.grading.inkernel import wire
_send_frame = wire.send_frame

def _frame(sock, value, x):
    tensor = {{"$": "tensor", "b": 0, "dtype": "float32", "shape": [1]}}
    header = {{"v": {{"id": value["id"], "ok": True, "value": tensor, "changed": {{}}}}, "buffers": [4]}}
    {forge}
    text = json.dumps(header).encode()
    body = len(text).to_bytes(4, "big") + text + bytes(sum(header["buffers"]))
    {body}
    sock.sendall(len(body).to_bytes(8, "big") + body)
    return []

def forged(sock, body, deadline=None):
    value, _ = wire.decode(body)
    if isinstance(value, dict) and value.get("ok") is True and isinstance(value.get("value"), int):
        return _frame(sock, value, value["value"])
    return _send_frame(sock, body, deadline)

wire.send_frame = forged   # every frame the call server sends goes through it
def echo(x):
    return x
'''
FORGERIES = {
    "shape": ('tensor["shape"] = [x]', ""),
    "dtype": ('tensor["dtype"] = f"float{x}"', ""),
    "tag": ('tensor["$"] = f"t{x}"', ""),
    "buffer index": ('tensor["b"] = x', ""),
    "buffer lengths": ('header["buffers"] = [x]', ""),
    "header length": ("", 'body = x.to_bytes(4, "big") + body[4:]'),
    "frame length": ("", 'sock.sendall(int(str(x) * 2).to_bytes(8, "big")); return'),   # over MAX_FRAME
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_answer_frame_breaks_the_protocol_without_quoting_what_the_kernel_chose(forgery):
    forge, body = FORGERIES[forgery]
    scores, session = grade(FORGED_FRAME.format(forge=forge or "pass", body=body or "pass"))
    assert scores["test_hidden_checked"][0] == 0.0, scores
    assert not _leaked(_feedback(scores, session)), _feedback(scores, session)
    assert "broke the protocol" in scores["test_hidden_checked"][1]


STORE_AND_RAISE = '''
SEEN = []
def echo(x):
    if x == 3 and SEEN:
        raise ValueError(f"what the hidden tests sent: {SEEN}")
    SEEN.append(x)
    return x
'''


def test_what_a_hidden_call_received_does_not_come_back_in_a_later_visible_message():
    scores, session = grade(STORE_AND_RAISE)
    assert scores["test_hidden_checked"][0] == scores["test_hidden_direct"][0] == 1.0
    assert not _leaked(_feedback(scores, session)), _feedback(scores, session)
    assert list(scores) == ["test_hidden_checked", "test_hidden_direct", "test_visible_after"]  # notebook order


def test_visible_messages_still_quote_what_the_function_said():
    scores, _ = grade("def echo(x):\n    raise ValueError(f'bad {x}')")
    assert scores["test_visible_after"] == (0.0, "echo raised ValueError: bad 3")


def test_the_note_about_processes_left_running_carries_no_number_the_kernel_chose():
    session = KernelSession(nbformat.v4.new_notebook(), make_manager=lambda: None)
    chosen = set(range(1000, 1000 + 37))   # a fork bomb can choose how many children it leaves
    session._client = SimpleNamespace(km=SimpleNamespace(processes=lambda: chosen))
    session._channel = SimpleNamespace(broken=None, has_stray_data=lambda: False)
    session.gave_up = "stop before replacing the kernel"
    with pytest.raises(KernelDied):
        session.ready()
    assert session.notes and "left processes running" in session.notes[0]
    assert not re.search(r"\d", " ".join(session.notes)), session.notes


# -- hidden inputs come from the course's secret, not from the seeds in the repository -----------------------
SEEDED = nbformat.v4.new_notebook(cells=[
    *SOURCE.cells[:2],
    _test_cell("test_hidden_seeded", "rng = _check.Rng(11768)\nfor _ in range(5):\n"
               "    k = rng.randint(0, 10**9)\n    assert _check.call(echo, k) == k, 'hidden case'", hidden=True),
])
# What anyone can compute from the repository: the inputs the seed 11768 gives without a secret.
_rng = Rng(11768)
KNOWN = [_rng.randint(0, 10**9) for _ in range(5)]
# Answers right only for those inputs (a table built from the public seeds).
LOOKUP = f"def echo(x):\n    assert x in {KNOWN}, 'not an input I precomputed'\n    return x"


def _grade_seeded(secret: bytes) -> float:
    (outcome,), _ = _run(SEEDED, LOOKUP, secret)
    return outcome.score


def test_inputs_precomputed_from_the_repositorys_seeds_do_not_match_the_graders_hidden_inputs(tmp_path):
    assert _grade_seeded(b"") == 1.0   # the seeds alone (a student's own notebook): the table works
    assert _grade_seeded(runner.course_secret(tmp_path / "secret")) == 0.0


def test_the_secret_mixes_into_every_seed_and_the_same_secret_gives_the_same_inputs():
    def draw(checks: Checks, seed: int) -> list[int]:
        rng = checks.Rng(seed)
        return [rng.randint(0, 10**9) for _ in range(3)]

    assert draw(Checks(), 11768) == KNOWN[:3]
    one, other = Checks(secret=b"a" * 64), Checks(secret=b"b" * 64)
    assert draw(one, 11768) == draw(Checks(secret=b"a" * 64), 11768)
    assert len({tuple(draw(c, s)) for c in (Checks(), one, other) for s in (1, 2)}) == 6


def test_the_course_secret_is_made_once_readable_by_its_owner_only_and_then_kept(tmp_path):
    path = tmp_path / "hidden_tests.secret"
    first = runner.course_secret(path)
    assert len(first) >= 32 and oct(path.stat().st_mode & 0o777) == "0o600"
    assert runner.course_secret(path) == first and list(tmp_path.iterdir()) == [path]
    path.write_text("short")
    with pytest.raises(ValueError, match="no usable secret"):
        runner.course_secret(path)


def test_the_private_worlds_base_seed_moves_with_the_secret_and_stays_above_the_public_worlds():
    from agent_lab.envs import make_env

    base = 9_117_680
    assert Checks().secret_seed(base) == base   # a student's notebook, and the repository's own tests
    moved = {Checks(secret=s * 64).secret_seed(base) for s in (b"a", b"b", b"c")}
    assert len(moved) == 3 and all(m > base and (m - base) % 10**6 == 0 for m in moved)
    env = make_env("crafting")
    assert len(env.private_worlds([max(moved) + 20_000], level=1)) == 1
