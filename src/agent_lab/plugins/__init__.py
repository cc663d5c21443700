"""The labs' experiments as plug-ins: small pieces the training loop calls at fixed points, off unless named
(book/part3/01_crafting.md). The core trainer knows only the three interfaces below, never a plug-in's name.

A plug-in is a dataclass whose fields are its options, each declared with ``agent_lab.config.setting`` (a
default, a help text and its flat keyword), registered under its name; a run turns it on with
``TrainConfig(plugins={"recovery_demonstrations": {"prob": 0.5, "from_step": 1200}})`` or with its flat
keywords (``sft_slip_prob=0.5, sft_slip_from=1200``). One of those is its switch, declared with ``off=``: the
value that leaves the plug-in off. Three kinds, three points in the loop:

* :class:`DemonstrationSource` (SFT): rewrites the demonstrations of a step's tasks before the batch is built;
  ``recovery_demonstrations`` and ``dagger`` (:mod:`.demonstrations`);
* :class:`AuxiliaryLoss` (SFT or RL): adds a term to each micro-batch's loss; ``observation_loss``,
  ``reread_copy_loss``, ``needed_items_loss`` and ``planner_guidance`` (:mod:`.losses`);
* :class:`Collector` (RL): gathers the step's rollouts in place of the plain draw; ``dynamic_sampling``
  (:mod:`.sampling`).

Hooks receive the run state (``run``: its ``cfg``, ``env``, ``tok``, ``model``, ``ddp_model``, ``device``,
``amp_dtype``, ``info``, ``algo``, ``sft_algo``) to read, and call only the layers below the trainer
(rollouts, demonstrations, losses). A new piece is one class with ``@register`` in one of these modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from agent_lab.config import declared, make_declared

__all__ = ["Plugin", "DemonstrationSource", "AuxiliaryLoss", "Collector", "PLUGINS", "register", "make_plugins"]


@dataclass
class Plugin:
    """Base: options are the dataclass fields; ``check`` refuses a configuration it cannot serve."""

    name: ClassVar[str] = ""

    def check(self, cfg, world_size: int) -> None:
        """Raise ``ValueError`` naming the setting and the fix (called before any work)."""

    def describe(self, cfg) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


class DemonstrationSource(Plugin):
    """SFT: per task, the ``[(observation, action), ...]`` to imitate and which actions are imitated."""

    #: whether the transcripts depend on the current policy (so they cannot be built a step ahead,
    #: ``run.prepare_ahead``)
    plays_policy: ClassVar[bool] = False

    def demonstrations(self, run, tasks: list, step: int, demos: list | None, trained: list | None,
                       rng) -> tuple[list | None, list | None, dict]:
        """Return ``(demos, trained, row)``; ``None`` demos mean the planner's plain ones. ``rng`` is the step's
        shared draw stream (:func:`agent_lab.streams.demonstration_rng`); ``row`` is logged."""
        return demos, trained, {}


class AuxiliaryLoss(Plugin):
    """A term added to the loss of the phase named ``phase`` ("sft" or "rl")."""

    phase: ClassVar[str] = "sft"

    def prepare(self, run, batch) -> dict:
        """Called once per step with the step's batch, before the update; returns figures to log."""
        return {}

    def term(self, run, micro, logprobs: Tensor, whole, last: bool) -> tuple[Tensor | None, dict]:
        """The term for micro-batch ``micro`` of ``whole`` (``logprobs [b, L-1]`` with gradient): normalise by
        the whole batch, so micro-batches sum to the unsplit term. Statistics are summed over micro-batches."""
        return None, {}


class Collector(Plugin):
    """RL: gathers the rollouts of a step instead of one round of ``batch_size`` episodes."""

    def collect(self, run, step: int) -> tuple[Any, Any, dict]:  # pragma: no cover - overridden
        """``(update batch, every sampled episode, row)``."""
        raise NotImplementedError


#: name -> class; the registry lives in agent_lab.config, which reads each plug-in's declared options from it.
PLUGINS: dict[str, type[Plugin]] = declared("plugin")


def register(cls: type[Plugin]) -> type[Plugin]:
    PLUGINS[cls.name] = cls
    return cls


def make_plugins(options: dict[str, dict]) -> list[Plugin]:
    """The plug-ins named in ``options`` ({name: {option: value}}), in registry order; checks each one's options."""
    if not isinstance(options, dict):
        raise ValueError(f"plugins must map plug-in names to option dicts, got {options!r}")
    unknown = sorted(set(options) - set(PLUGINS))
    if unknown:
        raise ValueError(f"unknown plug-in {unknown[0]!r}; plug-ins are {sorted(PLUGINS)}")
    out = []
    for name in PLUGINS:
        if name in options:
            opts = options[name]
            if not isinstance(opts, dict):
                raise ValueError(f"plugins[{name!r}] must be a dict of options, got {opts!r}")
            out.append(make_declared("plugin", name, opts))
    collectors = [p.name for p in out if isinstance(p, Collector)]
    if len(collectors) > 1:
        raise ValueError(f"at most one collector plug-in may be on, got {collectors}")
    return out


from agent_lab.plugins import demonstrations, losses, sampling  # noqa: E402,F401  (registers the plug-ins)
