"""Saving training curves must not change the caller's matplotlib backend (a notebook would go blank)."""

import matplotlib
import pytest

from agent_lab.diagnostics import plot_curves

INLINE = "module://matplotlib_inline.backend_inline"  # what a Jupyter kernel uses


@pytest.fixture
def inline_backend():
    previous = matplotlib.get_backend()
    matplotlib.use(INLINE)
    yield
    matplotlib.use(previous)


def test_plot_curves_writes_png_and_keeps_the_callers_backend(tmp_path, inline_backend):
    history = [{"step": i, "success": i / 10, "reward": i / 10, "entropy": 1.0 - i / 10} for i in range(6)]
    path = plot_curves(history, tmp_path / "curves.png", title="run")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "plot_curves must write a PNG"
    assert matplotlib.get_backend() == INLINE, f"plot_curves switched the backend to {matplotlib.get_backend()}"
