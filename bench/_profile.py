"""Where a benchmark's time and memory go: the resident-memory high-water mark of a block of work, this CPU's
matmul peak, the training FLOPs of a token, and the rates of a run's phases (summed by
:func:`agent_lab.diagnostics.time_profile` from the trainer's ``time_<phase>_s``)."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Iterator
from pathlib import Path

from agent_lab.diagnostics import format_shares


def status_kib(field: str) -> int:
    """A field of ``/proc/self/status`` in KiB (``VmRSS``: resident now; ``VmHWM``: its high-water mark)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} is not in /proc/self/status")


def reset_peak() -> bool:
    """Reset the high-water mark to the current resident size (Linux 4.0+); False where it cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def peak_memory() -> Iterator[dict]:
    """``with peak_memory() as m:`` leaves in ``m["peak_gb"]`` the resident high-water mark during the block (GB,
    1e9 bytes): the mark reset at entry where Linux allows, else the process's lifetime peak (``ru_maxrss``)."""
    out: dict = {}
    exact = reset_peak()
    try:
        yield out
    finally:
        if exact:
            out["peak_gb"] = status_kib("VmHWM") * 1024 / 1e9
        else:  # ru_maxrss is KiB on Linux, bytes on macOS
            out["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
        out["peak_exact"] = exact


def matmul_peak(threads: int, dtype: str = "float32", n: int = 1024, repeat: int = 20) -> float:
    """GFLOP/s of an ``n x n`` matmul on ``threads`` intra-op threads: the ceiling a dense model can reach here."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = (torch.randn(n, n, dtype=getattr(torch, dtype)) for _ in range(2))
        for _ in range(3):
            a @ b
        t = time.perf_counter()
        for _ in range(repeat):
            a @ b
        return 2 * n**3 * repeat / (time.perf_counter() - t) / 1e9
    finally:
        torch.set_num_threads(before)


def train_flops_per_token(model, context: float) -> float:
    """Forward and backward FLOPs of one token (Kaplan et al. 2020): ``6 N + 6 n_layers * context * d_model``, with
    ``N`` the parameters that multiply (every matrix, the tied output head once; no embeddings, biases or norms)
    and ``context`` the mean number of earlier tokens a token attends to (half a causal transcript)."""
    cfg = model.cfg
    n = sum(p.numel() for name, p in model.named_parameters() if p.ndim == 2 and "pos_emb" not in name)
    return 6 * n + 6 * cfg.n_layers * context * cfg.d_model


def throughput(profile: dict, flops_per_token: float, peak_gflops: float) -> dict:
    """Tokens per second of the forward+backward passes and of sampling, and the share of the matmul peak the
    passes reached."""
    loss_s = profile["phase_seconds"].get("loss", 0.0)
    sample_s = profile["phase_seconds"].get("sampling", 0.0)
    train_tps = profile["train_tokens"] / loss_s if loss_s else float("nan")
    achieved = train_tps * flops_per_token / 1e9
    return {"train_tokens_per_s": train_tps, "rollout_tokens_per_s":
            profile["rollout_tokens"] / sample_s if sample_s else float("nan"),
            "train_gflops": achieved, "share_of_matmul_peak": achieved / peak_gflops}


def format_profile(name: str, profile: dict, rates: dict | None = None, peak_dtype: str = "float32") -> str:
    """One line per phase group: its steps, seconds, the share of each phase, and the rates (their share of
    the ``peak_dtype`` matmul peak)."""
    line = f"  {name}: {profile['steps']} steps, {profile['seconds']:.0f} s ({format_shares(profile['shares'])})"
    if rates:
        sampled = rates["rollout_tokens_per_s"]
        line += (f"\n    {rates['train_tokens_per_s']:.0f} tokens/s forward+backward"
                 + (f", {sampled:.0f} tokens/s sampled" if sampled == sampled else "")
                 + f"; {rates['train_gflops']:.1f} GFLOP/s, {rates['share_of_matmul_peak']:.0%} of the "
                 f"{peak_dtype} matmul peak")
    return line
