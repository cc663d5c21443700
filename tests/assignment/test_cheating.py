"""The notebook's tests cannot be fooled by fake return objects or by monkeypatched comparison functions.

The hidden and visible tests read tensors with torch's C-level methods into plain Python floats and
compare them with float arithmetic, so redefining ``==``, ``torch.allclose``, ``numpy.testing`` and
friends changes nothing. (The autograder's own tests run the same attacks through the sandbox.)
"""

from __future__ import annotations

import pytest

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
numpy.isclose = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
numpy.testing.assert_array_equal = lambda *a, **k: None
math.isclose = lambda *a, **k: True
_real_grad = torch.autograd.grad
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
        assert "must return a torch.Tensor" in score.messages[grade], score.messages[grade]


@pytest.mark.parametrize("function", GRADED_FUNCTIONS)
def test_a_tensor_subclass_that_claims_equality_gets_no_credit(function):
    body = "    return torch.zeros(3, dtype=torch.float64).as_subclass(_Agreeable)\n"
    score = run_notebook({function: _fake(function, body, TENSOR_SUBCLASS)})
    assert not score.passed[f"test_{function}_visible"] and not score.passed[f"test_{function}_hidden"]


def test_monkeypatched_comparisons_do_not_rescue_wrong_code():
    """Wrong code plus every comparison patched to "equal": the affected functions still get 0."""
    wrong = MUTANTS["rtg_gamma_off_by_one"].source
    score = run_notebook({"reward_to_go": MONKEYPATCH + wrong, "reinforce_loss": MUTANTS["rl_token_mean"].source})
    for function in ("reward_to_go", "reinforce_loss"):
        for kind in ("visible", "hidden"):
            assert not score.passed[f"test_{function}_{kind}"], score.messages
    # The correct functions keep full credit: the patches do not leak into their grades.
    points = points_by_test()
    for function in ("dr_grpo_advantages", "dr_grpo_loss"):
        for kind in ("visible", "hidden"):
            grade = f"test_{function}_{kind}"
            assert score.points[grade] == points[grade], score.messages[grade]


def test_patching_the_reference_to_agree_with_wrong_code_gets_no_credit():
    """A student who rewires agent_lab's reference to the same wrong formula is caught by the cross-check."""
    wrong = MUTANTS["adv_batch_mean"].source
    tamper = wrong + "\nagent_lab.estimators.group_centered_advantages = lambda r, g: r - r.mean()\n"
    score = run_notebook({"dr_grpo_advantages": tamper})
    assert not score.passed["test_dr_grpo_advantages_hidden"]


def test_every_public_reference_is_switched_off_while_student_code_runs_and_restored_after():
    import agent_lab.estimators as estimators
    import agent_lab.training as training

    from .notebook_runner import cell_source, restored_globals

    functions = [(m.__name__, n, getattr(m, n)) for m in (estimators, training) for n in m.__all__]
    functions = [(m, n, f) for m, n, f in functions if callable(f) and not isinstance(f, type)]
    assert len(functions) > 30
    still_working: list[str] = []

    def student_code():
        for module, name, function in functions:
            try:
                function()
            except RuntimeError as exc:
                if "switched off" in str(exc):
                    continue
                still_working.append(f"{module}.{name}")
            except Exception:
                still_working.append(f"{module}.{name}")

    with restored_globals():
        namespace: dict = {}
        exec(cell_source("setup"), namespace)
        namespace["_check"].call(student_code)
    assert still_working == []
    assert estimators.reward_to_go([1.0, 1.0], 0.5).tolist() == [1.5, 1.0]  # restored afterwards
