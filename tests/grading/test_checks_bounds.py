"""The checks look at sizes before they convert or print anything a student's function returned.

A returned tensor can be far larger than the test expects (an expanded view costs the kernel nothing): turning
it into Python numbers or text first would make the grader's own process as large as the student chose.
"""
from __future__ import annotations

import pytest
import torch

from agent_lab.grading.inkernel import checks
from agent_lab.grading.inkernel.checks import Checks

HUGE = torch.zeros(1, dtype=torch.uint8).expand(64 << 20)   # 64 Mi elements, one byte of storage


@pytest.fixture()
def no_tolist(monkeypatch):
    """Converting a tensor of more than a million elements to Python numbers fails the test."""
    real = torch.Tensor.tolist

    def bounded(self):
        assert self.numel() <= 1 << 20, f"tolist() on {self.numel()} elements"
        return real(self)
    monkeypatch.setattr(torch.Tensor, "tolist", bounded)


@pytest.mark.parametrize("hidden", [False, True])
def test_a_wrong_shape_is_reported_without_converting_the_values(no_tolist, hidden):
    with pytest.raises(AssertionError, match="should have shape") as info:
        Checks(hidden=hidden).check_tensor(HUGE, "f", (2,), torch.uint8)
    assert ("67108864" in str(info.value)) is not hidden


@pytest.mark.parametrize("hidden", [False, True])
def test_a_scalar_check_of_a_huge_tensor_converts_nothing(no_tolist, hidden):
    with pytest.raises(AssertionError, match="scalar"):
        Checks(hidden=hidden).check_scalar_loss(HUGE.float(), "loss", torch.float32)


@pytest.mark.parametrize("hidden", [False, True])
def test_too_many_values_are_refused_before_they_are_compared(no_tolist, hidden):
    with pytest.raises(AssertionError, match="far more values") as info:
        Checks(hidden=hidden).check_close(HUGE, [1, 2], "f")
    assert ("67108864" in str(info.value)) is not hidden
    with pytest.raises(AssertionError, match="far more values"):
        Checks().values(HUGE, "f")


def test_values_of_an_ordinary_tensor_are_unchanged():
    shape, dtype, got = Checks().values(torch.arange(6).reshape(2, 3), "f")
    assert shape == (2, 3) and dtype == torch.int64 and got == [[0, 1, 2], [3, 4, 5]]


def test_show_formats_only_the_prefix_it_prints():
    formatted = []

    class Counted:
        def __repr__(self) -> str:
            formatted.append(1)
            return "x" * 10
    text = checks.show([[Counted()] * 1000] * 1000, limit=240)
    assert len(text) <= 240 + len(" ...]") and text.startswith("[[xxxxxxxxxx, ")
    assert len(formatted) < 30


@pytest.mark.parametrize("value, text", [
    (1.23456789, "1.234568"), ([1, 2.5, [True]], "[1, 2.5, [True]]"), ([], "[]"), ([[]], "[[]]"),
    (list(range(100)), str(list(range(100)))[:20] + " ...]"),
])
def test_show_is_the_short_text_it_was(value, text):
    assert checks.show(value, limit=20 if len(text) > 20 else 240) == text
