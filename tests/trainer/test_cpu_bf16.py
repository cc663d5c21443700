"""RunConfig.cpu_bf16: bfloat16 autocast on the CPU, only where the CPU has fast bf16 (agent_lab.device:
cpu_fast_bf16 reads the CPU's features from torch, autocast_dtype decides), with those features mocked both
ways; the run's description says which precision it used and why, and a short SFT run under it learns."""

from __future__ import annotations

import contextlib
from types import MappingProxyType

import pytest
import torch
from conftest import FAST

from agent_lab.config import TrainConfig
from agent_lab.device import autocast_dtype, cpu_fast_bf16
from agent_lab.trainer import train

#: torch.cpu.get_capabilities() of an AMX machine (a Sapphire Rapids Xeon) and of an AVX-512 one without bf16.
AMX_CPU = {"architecture": "x86_64", "avx2": True, "avx512_f": True, "amx_tile": True, "amx_bf16": True,
           "avx512_bf16": True}
PLAIN_CPU = {"architecture": "x86_64", "avx2": True, "avx512_f": True, "amx_tile": False, "amx_bf16": False,
             "avx512_bf16": False}
CPU = torch.device("cpu")


@pytest.fixture
def cpu_features(monkeypatch):
    """``cpu_features(mapping)``: torch reports ``mapping`` as this CPU's features from now on."""
    def use(features: dict) -> None:
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: MappingProxyType(features))
    return use


def test_fast_bf16_is_amx_or_avx512_bf16_and_nothing_else():
    assert cpu_fast_bf16(AMX_CPU) == "amx_bf16"
    assert cpu_fast_bf16({**PLAIN_CPU, "avx512_bf16": True}) == "avx512_bf16"  # bf16 dot products, no AMX
    assert cpu_fast_bf16(PLAIN_CPU) is None
    assert cpu_fast_bf16({**PLAIN_CPU, "amx_tile": True, "amx_int8": True}) is None  # tiles without bf16
    assert cpu_fast_bf16({"architecture": "arm64", "bf16": True}) is None and cpu_fast_bf16({}) is None


def test_fast_bf16_is_read_from_torch_and_absent_where_torch_cannot_tell(cpu_features, monkeypatch):
    cpu_features(AMX_CPU)
    assert cpu_fast_bf16() == "amx_bf16"
    cpu_features(PLAIN_CPU)
    assert cpu_fast_bf16() is None
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    assert cpu_fast_bf16() is None


@pytest.mark.parametrize("features, device, cuda_bf16, cpu_bf16, dtype, says", [
    (AMX_CPU, CPU, True, True, torch.bfloat16, "bfloat16 autocast on the CPU (cpu_bf16; this CPU has amx_bf"),
    (PLAIN_CPU, CPU, True, True, None, "float32: cpu_bf16 is on, but this CPU has none of amx_bf16, avx5"),
    (AMX_CPU, CPU, True, False, None, "float32"),  # the default: a fast CPU alone turns nothing on
    (PLAIN_CPU, torch.device("cuda"), True, False, torch.bfloat16, "bfloat16 autocast on CUDA (bf16)"),
    (AMX_CPU, torch.device("cuda"), False, True, None, "float32"),  # cpu_bf16 is about the CPU only
    (AMX_CPU, torch.device("mps"), True, True, None, "float32 (cpu_bf16 applies to the CPU, not mps)"),
])
def test_the_autocast_dtype_follows_the_device_the_settings_and_the_cpu(cpu_features, features, device,
                                                                          cuda_bf16, cpu_bf16, dtype, says):
    cpu_features(features)
    got, why = autocast_dtype(device, cuda_bf16, cpu_bf16)
    assert got == dtype and why.startswith(says)


@contextlib.contextmanager
def linear_output_dtypes():
    """The dtypes of every ``nn.Linear``'s output computed inside the block (a global forward hook)."""
    seen: set[torch.dtype] = set()

    def hook(module, args, out):
        if isinstance(module, torch.nn.Linear):
            seen.add(out.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def _sft(path, **settings):
    """A short SFT run of a tiny number-search policy: its losses, its Linears' output dtypes, loss.txt."""
    cfg = TrainConfig(**{**FAST, "algo": "sft", "steps": 12, "sft_lr": 3e-3, **settings})
    with linear_output_dtypes() as seen:
        result = train(cfg, run_dir=str(path), progress=False)
    return [h["loss"] for h in result.history], seen, (path / "loss.txt").read_text()


def test_cpu_bf16_autocasts_on_a_fast_bf16_cpu_only_and_the_run_still_learns(cpu_features, tmp_path):
    cpu_features(AMX_CPU)
    bf16, seen, text = _sft(tmp_path / "amx", cpu_bf16=True)
    assert torch.bfloat16 in seen  # the forward passes ran in bfloat16 (the loss upcasts the logits)
    assert "precision: bfloat16 autocast on the CPU (cpu_bf16; this CPU has amx_bf16)" in text
    default, seen_default, text = _sft(tmp_path / "default")  # cpu_bf16 off: float32 even on this CPU
    assert seen_default == {torch.float32} and "precision: float32\n" in text
    cpu_features(PLAIN_CPU)
    refused, seen_plain, text = _sft(tmp_path / "plain", cpu_bf16=True)
    assert seen_plain == {torch.float32} and "float32: cpu_bf16 is on, but this CPU has none" in text
    assert refused == default  # float32 on a CPU without fast bf16: exactly the run without the setting
    # it learns: the loss falls, step by step as in float32, within bfloat16's rounding of the passes
    assert bf16[-1] < 0.7 * bf16[0] and bf16 != default
    assert bf16 == pytest.approx(default, abs=0.02)
