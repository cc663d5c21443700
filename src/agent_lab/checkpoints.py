"""Checkpoint files: what the trainer writes, and how any checkpoint is read back, including one a student hands in.

A checkpoint is a ``torch.save`` zip archive of plain data: the model configuration, the weights, the
tokenizer's vocabulary, and the run's counters and history (``save_checkpoint``'s ``extra``). Reading one is a
trust boundary: ``torch.load``'s default unpickler runs any code a file names, so every read here uses
``weights_only=True`` (tensors, numbers, strings, lists, tuples and dicts only), caps the archive's size before
reading it, checks its structure, and builds the policy only after its parameter shapes are known to match the
saved tensors (checked on the ``meta`` device, which allocates nothing). A file that fails any check raises
:class:`CheckpointError`, naming the problem and the fix, and has run nothing.
"""

from __future__ import annotations

import dataclasses
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer

__all__ = ["CheckpointError", "DEFAULT_MAX_BYTES", "save_checkpoint", "read_checkpoint", "load_checkpoint",
           "model_config"]

#: The largest archive (uncompressed) read by default; the project's own checkpoints are far smaller.
DEFAULT_MAX_BYTES = 1 << 30
_SAVE_WITH = "write it with agent_lab.evaluation.save_checkpoint (the trainer's checkpoint.pt is such a file)"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read safely or does not hold what it should."""


def save_checkpoint(path: str | Path, policy: TinyTransformer, tokenizer: WordTokenizer, **extra: Any) -> Path:
    """Write model config, weights, tokenizer and anything in ``extra`` (plain data or tensors) to ``path``.

    Only what ``torch.load(weights_only=True)`` reads back may go in ``extra``; the file is written to a
    temporary name and renamed, so a crash never leaves half a checkpoint.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model_config": policy.cfg.to_dict(), "model": policy.state_dict(), "tokenizer": tokenizer.state_dict()}
    state.update(extra)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)
    return path


def read_checkpoint(path: str | Path, device: str | torch.device = "cpu", *,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """The checked contents of a checkpoint file (or of ``checkpoint.pt`` in a run directory), loaded with
    ``weights_only=True``: a dict with ``model_config``, ``model`` (name -> tensor) and ``tokenizer``."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist (or is not a regular file)")
    _check_archive(path, max_bytes)
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: refused: it holds Python objects that a weights-only load does not build "
                              f"({_unpickler_reason(e)}). agent-lab never runs code from a checkpoint; "
                              f"{_SAVE_WITH}") from None
    except Exception as e:  # a damaged archive: torch raises RuntimeError, EOFError, KeyError, ...
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {str(e)[:200]}); "
                              f"{_SAVE_WITH}") from None
    _check_structure(path, state)
    return state


def _unpickler_reason(error: Exception) -> str:
    """The line of torch's refusal that names what was refused (its first lines advise an unsafe load)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "Unsupported" in line or "unsupported" in line]
    return (named or lines or ["no reason given"])[0][:200]


def _check_archive(path: Path, max_bytes: int) -> None:
    """Refuse, before torch reads it, a file that is not a zip archive or would unpack to more than ``max_bytes``."""
    if path.stat().st_size > max_bytes:
        raise CheckpointError(f"{path}: {path.stat().st_size} bytes is over the limit of {max_bytes} bytes for a "
                              "checkpoint; save only the policy (save_checkpoint with no extra)")
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{path}: not a torch checkpoint archive ({e}); {_SAVE_WITH}") from None
    if unpacked > max_bytes:
        raise CheckpointError(f"{path}: unpacks to {unpacked} bytes, over the limit of {max_bytes} bytes")


def _check_structure(path: Path, state: Any) -> None:
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a checkpoint dict; {_SAVE_WITH}")
    missing = [k for k in ("model_config", "model", "tokenizer") if k not in state]
    if missing:
        raise CheckpointError(f"{path}: no {missing[0]!r} entry; {_SAVE_WITH}")
    weights = state["model"]
    if not (isinstance(weights, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in weights.items())):
        raise CheckpointError(f"{path}: 'model' must map parameter names to tensors; {_SAVE_WITH}")
    vocab = state["tokenizer"].get("vocab") if isinstance(state["tokenizer"], dict) else None
    if not (isinstance(vocab, list) and all(isinstance(w, str) for w in vocab)):
        raise CheckpointError(f"{path}: 'tokenizer' must hold a list of words under 'vocab'; {_SAVE_WITH}")
    if not isinstance(state["model_config"], dict):
        raise CheckpointError(f"{path}: 'model_config' must be a dict of ModelConfig fields; {_SAVE_WITH}")


def model_config(state: dict) -> ModelConfig:
    """The policy's :class:`ModelConfig` saved in a checkpoint. Checkpoints written before the goal-tree probe was
    removed carry ``probe=False, probe_layer=None``, which load; one with a probe is refused, naming why."""
    saved = dict(state["model_config"])
    probe, probe_layer = saved.pop("probe", False), saved.pop("probe_layer", None)
    if probe or probe_layer is not None:
        raise CheckpointError("this checkpoint's policy has a goal-tree probe head, which was removed; retrain it "
                              "or load it with agent-lab 6a78790")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(saved) - known)
    if unknown:
        raise CheckpointError(f"the checkpoint's model_config has an unknown field {unknown[0]!r}; fields are "
                              f"{sorted(known)}")
    try:
        return ModelConfig(**saved)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the checkpoint's model_config is not valid: {e}") from None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", *, expect: ModelConfig | None = None,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[TinyTransformer, WordTokenizer, dict]:
    """Rebuild ``(policy, tokenizer, state)`` from :func:`save_checkpoint`'s file; the policy is in eval mode.

    ``expect``: the architecture the caller requires (``vocab_size`` included when set); any other is refused
    before a parameter is allocated.
    """
    state = read_checkpoint(path, device, max_bytes=max_bytes)
    cfg = model_config(state)
    if expect is not None:
        _check_expected(cfg, expect)
    try:
        tokenizer = WordTokenizer.from_state_dict(state["tokenizer"])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: its tokenizer is not valid: {e}") from None
    _check_shapes(path, cfg, state["model"])
    policy = TinyTransformer(cfg).to(device)
    policy.load_state_dict(state["model"])
    policy.eval()
    return policy, tokenizer, state


def _check_expected(cfg: ModelConfig, expect: ModelConfig) -> None:
    fields = [f.name for f in dataclasses.fields(ModelConfig)
              if not (f.name == "vocab_size" and expect.vocab_size is None)]
    diff = [f"{n}={getattr(cfg, n)!r} (expected {getattr(expect, n)!r})" for n in fields
            if getattr(cfg, n) != getattr(expect, n)]
    if diff:
        raise CheckpointError(f"the checkpoint's policy is not the required architecture: {', '.join(diff)}")


def _check_shapes(path, cfg: ModelConfig, weights: dict) -> None:
    """The saved tensors must be exactly the policy's parameters and buffers (the model holds nothing else, so
    it is no larger than the file): checked on the meta device, where a hostile config allocates nothing."""
    with torch.device("meta"):
        skeleton = TinyTransformer(cfg)
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if want != got:
        wrong = sorted(set(want) ^ set(got)) or [k for k in want if want[k] != got[k]]
        k = wrong[0]
        raise CheckpointError(f"{path}: its weights do not fit its model_config (first difference: {k!r}, saved "
                              f"{got.get(k)}, expected {want.get(k)}); {_SAVE_WITH}")
