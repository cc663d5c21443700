"""Objects that claim to be right, patched comparisons and a patched library earn nothing.

The tests run in the grader's process, so what a submission patches in its own kernel (``torch``, ``numpy``,
the checks, ``==``) cannot reach them, and what comes back across the boundary is rebuilt from plain bytes: an
object is only its class name there, a tensor subclass only its values.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent_lab.grading import inkernel
from .mutants import MUTANTS
from .notebook_runner import GRADED_FUNCTIONS, points_by_test, run_notebook

pytestmark = pytest.mark.xdist_group("assignment-cheating")

ALWAYS_EQUAL = '''
class _Anything:
    """Equal to everything, close to everything, and a float of whatever is asked."""
    shape = property(lambda self: self)
    dtype = torch.float64
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __float__(self): return 0.0
    def __getattr__(self, name): return lambda *a, **k: self
    def __iter__(self): return iter(())
    def __len__(self): return 0
'''

TENSOR_SUBCLASS = '''
class _Agreeable(torch.Tensor):
    """A real tensor whose comparisons and conversions all say "yes, equal"."""
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("tolist", "item", "__float__"):
            return 1.1
        if name in ("eq", "__eq__", "isclose", "allclose", "equal"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})
'''

MONKEYPATCH = '''
import math, numpy, numpy.testing, torch.testing
torch.allclose = lambda *a, **k: True
torch.isclose = lambda a, b, *r, **k: torch.ones_like(torch.as_tensor(a), dtype=torch.bool)
torch.equal = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
torch.Tensor.__eq__ = lambda self, other: True
torch.Tensor.tolist = lambda self: [1.1, 1.0]
torch.Tensor.item = lambda self: 1.425
numpy.allclose = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
math.isclose = lambda *a, **k: True
torch.autograd.grad = lambda *a, **k: (torch.zeros(2, 3, dtype=torch.float64),)
'''

SIGNATURES = {
    "reward_to_go": "def reward_to_go(rewards, gamma):",
    "reinforce_loss": "def reinforce_loss(logprobs, action_mask, coefficients):",
    "dr_grpo_advantages": "def dr_grpo_advantages(rewards, group_size):",
    "dr_grpo_loss": "def dr_grpo_loss(logprobs, action_mask, advantages, max_tokens):",
}


def _fake(function: str, body: str, prelude: str = "") -> str:
    return prelude + "\n" + SIGNATURES[function] + "\n" + body


@pytest.mark.parametrize("function", GRADED_FUNCTIONS)
def test_an_object_equal_to_everything_gets_no_credit(function):
    score = run_notebook({function: _fake(function, "    return _Anything()\n", ALWAYS_EQUAL)})
    for kind in ("visible", "hidden"):
        grade = f"test_{function}_{kind}"
        assert not score.passed[grade]
    assert "must return a torch.Tensor, got an object of type _Anything" in score.messages[
        f"test_{function}_visible"]


@pytest.mark.parametrize("function", GRADED_FUNCTIONS)
def test_a_tensor_subclass_that_claims_equality_gets_no_credit(function):
    body = "    return torch.zeros(3, dtype=torch.float64).as_subclass(_Agreeable)\n"
    score = run_notebook({function: _fake(function, body, TENSOR_SUBCLASS)})
    assert not score.passed[f"test_{function}_visible"] and not score.passed[f"test_{function}_hidden"]


def test_monkeypatched_comparisons_in_the_kernel_do_not_rescue_wrong_code():
    wrong = MUTANTS["rtg_gamma_off_by_one"].source
    score = run_notebook({"reward_to_go": MONKEYPATCH + wrong, "reinforce_loss": MUTANTS["rl_token_mean"].source})
    for function in ("reward_to_go", "reinforce_loss"):
        for kind in ("visible", "hidden"):
            assert not score.passed[f"test_{function}_{kind}"], score.messages
    points = points_by_test()
    for function in ("dr_grpo_advantages", "dr_grpo_loss"):
        for kind in ("visible", "hidden"):
            grade = f"test_{function}_{kind}"
            assert score.points[grade] == points[grade], score.messages[grade]


def test_the_grading_kernel_can_import_no_agent_lab_module_but_the_checks(tmp_path):
    """Every module of the package, imported in a process that sees the grading view, fails clearly."""
    import pkgutil

    import agent_lab

    names = [m.name for m in pkgutil.walk_packages(agent_lab.__path__, "agent_lab.")]
    kernel_side = ("checks", "wire", "server", "kernel", "kernel_view")
    allowed = {"agent_lab.grading", "agent_lab.grading.inkernel"} | {
        f"agent_lab.grading.inkernel.{name}" for name in kernel_side}
    assert len(names) > 20
    for dest, src in inkernel.view_files().items():
        (tmp_path / dest).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / dest).write_bytes(src.read_bytes())
    probe = ("import importlib, json, sys\nout = {}\nfor name in sys.argv[1:]:\n"
             "    try:\n        importlib.import_module(name)\n        out[name] = 'imported'\n"
             "    except ImportError as exc:\n        out[name] = str(exc)\nprint(json.dumps(out))")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    import json
    got = json.loads(proc.stdout)
    for name, outcome in got.items():
        if name in allowed:
            assert outcome == "imported", (name, outcome)
        else:
            assert "is not available while your notebook is graded" in outcome, (name, outcome)
