"""Device choice shared by the trainer, the benchmarks and the book."""

import torch

DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")


def pick_device(name: str = "auto") -> torch.device:
    """Return the device named by ``name``; ``"auto"`` picks cuda, then mps, then cpu.

    Raises ``ValueError`` for an unknown name or a device that is not available here.
    """
    if name not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {name!r}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False; use --device auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps' requested but MPS is not available; use --device auto or cpu")
    return torch.device(name)
