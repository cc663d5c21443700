"""Every setting of a training run, in sections that each check themselves (book/part3/00_number_search.md).

::

    TrainConfig
      env, env_options, seed   what to train on, and the seed every random stream derives from
      model       ModelConfig       the policy's sizes (agent_lab.policy.model)
      sampling    SamplingConfig    the declared behaviour policy (agent_lab.rollout)
      sft         SFTConfig         the cold start: supervised steps on the planner's demonstrations
      algorithm   AlgorithmConfig   the RL phase: which algorithm, its batch, its loss and its own options
      optimizer   OptimizerConfig   Adam and gradient clipping, shared by both phases
      evaluation  EvalConfig        greedy evaluation on held-out tasks, and stopping at the optimum
      run         RunConfig         device, threads, micro-batches, run directory, checkpoints, resume
      plugins     {name: options}   the labs' experiments (agent_lab.plugins), off unless named

A run's steps are numbered over both phases: SFT steps ``0 .. sft.steps - 1``, then RL steps up to
``sft.steps + algorithm.steps - 1``. ``TrainConfig`` also takes the flat keywords of the command line
(``--batch-size`` is ``batch_size``) and of ``config.json`` files written before the sections existed:
``TrainConfig(env="number-search", algo="dr_grpo", sft_steps=0, lr=3e-2)``.

Every setting is declared once, as a field with its help (:func:`setting`) on the dataclass that owns it: a
section here, an algorithm's class (its own options) or a plug-in's. :func:`flat_keywords` generates the flat
keywords, their defaults and the command line's options from those declarations; the algorithm and plug-in
classes reach this module through their registries (:data:`DECLARED`), so it imports nothing of the package.
Each section checks its own fields when it is built and :meth:`TrainConfig.validate` the plain checks that
span sections; the checks that ask the registries (the environment, the algorithm and its options, the
plug-ins) run where the run is prepared (:func:`agent_lab.preflight.check_config`), before any work.
"""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

__all__ = ["TrainConfig", "ModelConfig", "SamplingConfig", "SFTConfig", "AlgorithmConfig", "OptimizerConfig",
           "EvalConfig", "RunConfig", "Flat", "flat_keywords", "setting", "declared", "make_declared"]

#: torch.device names a run accepts ("auto": cuda, then mps, then cpu; agent_lab.device.pick_device).
DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")
#: Position encodings of the policy (agent_lab.policy.model).
POSITIONS = ("learned", "rope")
#: How the policy's prompt tokens attend (agent_lab.policy.model): causally, or to the whole prompt.
PROMPT_ATTENTION = ("causal", "bidirectional")


def setting(default: Any = MISSING, help: str = "", *, flat: str | bool = True, off: Any = MISSING,
            factory: Any = MISSING) -> Any:
    """A declared setting: a dataclass field whose metadata holds its ``help``. ``flat``: its flat keyword
    (``True``: the field's own name; ``False``: none, set it through its section); ``off``: on a plug-in's
    switch, the value that leaves the plug-in off (its flat keyword's default)."""
    meta: dict[str, Any] = {"help": help, "flat": flat}
    if off is not MISSING:
        meta["off"] = off
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _count(name: str, value: Any, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a positive" if low == 1 else "a non-negative"
        raise ValueError(f"{name} must be {kind} int, got {value!r}")


def _number(name: str, value: Any, low: float = 0.0, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and (value > low if strict else value >= low)):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {value!r}")


@dataclass
class ModelConfig:
    """Sizes of the policy (agent_lab.policy.model). Its own defaults (d_model 64, 2 layers, 4 heads, ~0.1M
    parameters) train on 2 CPU cores."""

    vocab_size: int | None = setting(None, "the tokenizer's vocabulary size (None: the trainer fills in its "
                                           "tokenizer's)", flat=False)
    d_model: int = setting(64, "width of the policy's residual stream")
    n_layers: int = setting(2, "transformer blocks")
    n_heads: int = setting(4, "attention heads per block (must divide d_model)")
    d_ff: int | None = setting(None, "MLP width (None: 4 * d_model)", flat=False)
    max_len: int = setting(512, "longest transcript, in tokens")
    dropout: float = setting(0.0, "dropout probability", flat=False)
    positions: str = setting("learned", "learned | rope: position embeddings (GPT-2) or rotary (attention "
                                        "sees offsets)")
    prompt_attention: str = setting("causal", "causal | bidirectional: the prompt's tokens (<bos>, the first "
                                              "observation, its newline) attend to each other in both "
                                              "directions, as in a prefix-LM; every later token attends "
                                              "causally")
    line_positions: bool = setting(False, "add a learned embedding of each token's offset in its line (0 at the "
                                          "newline before it), so a line's first word and the tokens of one "
                                          "line are found without counting tokens")
    line_heads: bool = setting(False, "add a learned embedding of the first word of each token's line (none on a "
                                      "newline), so every token of a recipe line carries the item the line is "
                                      "for and a look-up by item reads any token of its line in one hop")

    token_match: float = setting(0.0, "starting gain of a same-word attention bias (0: none): every head adds a "
                                      "learned gain, starting here, to its attention score wherever the query's "
                                      "token is the key's, so a word's mention finds its other mentions (a recipe "
                                      "line's ingredient, that item's own line) before any weight has learnt to")
    token_match_heads: int | None = setting(None, "how many heads of each block start with token_match's gain (the "
                                                  "first ones; the others start at 0 and are free to learn other "
                                                  "patterns); None: every head")

    def __post_init__(self):
        for name in ("line_positions", "line_heads"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.token_match, bool) or not isinstance(self.token_match, (int, float)) \
                or not math.isfinite(self.token_match):
            raise ValueError(f"token_match must be a finite number (the bias's starting gain; 0 for none), got "
                             f"{self.token_match!r}")
        h = self.token_match_heads
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or not 1 <= h <= self.n_heads):
            raise ValueError(f"token_match_heads must be None (every head) or a number of heads from 1 to n_heads "
                             f"({self.n_heads}), got {h!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
            v = getattr(self, name)
            bad = isinstance(v, bool) or not isinstance(v, int) or v < 1
            if (v is not None or name != "vocab_size") and bad:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got d_model={self.d_model}, "
                             f"n_heads={self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.prompt_attention not in PROMPT_ATTENTION:
            raise ValueError(f"prompt_attention must be one of {PROMPT_ATTENTION}, got "
                             f"{self.prompt_attention!r}")
        if self.positions == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"rotary positions need an even head size, got d_model/n_heads = "
                             f"{self.d_model // self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SamplingConfig:
    """The declared sampling policy (agent_lab.rollout). ``decoding`` is "sampled" or "greedy" (argmax of the
    masked logits).

    ``temperature`` divides the logits; ``top_p`` keeps the smallest set of tokens whose probability
    reaches ``top_p`` (1.0 = no truncation); ``candidate_mask`` restricts actions to the environment's
    ``allowed_actions()`` when it has one (the lecture's structured action mask).
    """

    temperature: float = setting(1.0, "divides the logits before sampling")
    top_p: float = setting(1.0, "nucleus sampling: the probability mass kept (1.0: no truncation)")
    decoding: str = setting("sampled", "sampled | greedy (greedy is for evaluation)", flat=False)
    candidate_mask: bool = setting(False, "sample only actions the environment allows (the structured action "
                                          "mask)")

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.decoding not in ("sampled", "greedy"):
            raise ValueError(f"decoding must be 'sampled' or 'greedy', got {self.decoding!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SFTConfig:
    """The cold start (book/part1/02_sft_rest_rl.md): ``steps`` supervised steps of ``batch_size``
    demonstrations, maximising the token-mean log-likelihood of the planner's actions."""

    steps: int = setting(0, "supervised steps on planner demonstrations first", flat="sft_steps")
    batch_size: int = setting(64, "demonstrations per SFT step", flat="sft_batch_size")
    lr: float | None = setting(None, "the SFT phase's learning rate (None: the optimizer's lr)",
                               flat="sft_lr")
    lr_decay_steps: int = setting(0, "the last this many SFT steps anneal the learning rate linearly to 0 "
                                     "(0: constant)", flat="sft_lr_decay_steps")
    warmup_steps: int = setting(0, "the first this many SFT steps raise the learning rate linearly from lr / "
                                   "warmup_steps to lr (0: no warmup)", flat="sft_warmup_steps")

    def __post_init__(self):
        _count("sft_steps", self.steps)
        _count("sft_batch_size", self.batch_size, 1)
        _count("sft_lr_decay_steps", self.lr_decay_steps)
        _count("sft_warmup_steps", self.warmup_steps)
        if self.lr is not None:
            _number("sft_lr", self.lr, strict=True)
        if self.lr_decay_steps > self.steps:
            raise ValueError(f"sft_lr_decay_steps={self.lr_decay_steps} is more than the {self.steps} SFT steps it "
                             "would anneal; lower it or add SFT steps")
        if self.warmup_steps + self.lr_decay_steps > self.steps:
            raise ValueError(f"sft_warmup_steps={self.warmup_steps} and sft_lr_decay_steps={self.lr_decay_steps} "
                             f"overlap within the {self.steps} SFT steps; lower one or add SFT steps")


@dataclass
class AlgorithmConfig:
    """The RL phase: ``steps`` steps of ``name``, each on ``batch_size`` episodes, that is
    ``batch_size / group_size`` tasks x ``group_size`` samples in contiguous groups. ``objective``: the loss
    normalisation (None: the algorithm's own); ``options``: the algorithm's own settings, the fields of its
    class in :mod:`agent_lab.algorithms` (PPO's ``clip_eps``, ``epochs``, ``minibatches``, ...). Whether the
    name and the options exist is checked where the run is prepared (:mod:`agent_lab.preflight`)."""

    name: str = setting("dr_grpo", "the RL algorithm (sft: supervised steps only)", flat="algo")
    steps: int = setting(40, "RL steps (after the SFT cold start)")
    batch_size: int = setting(256, "episodes per RL step")
    group_size: int = setting(8, "samples per task (contiguous groups)")
    objective: str | None = setting(None, "the loss normalisation (None: the algorithm's own)")
    entropy_coef: float = setting(0.0, "exploration bonus: s_ij += entropy_coef * H(pi(. | x_<ij))")
    options: dict = setting(help="the algorithm's own options (the fields of its class)", flat=False,
                            factory=dict)

    def __post_init__(self):
        _count("steps", self.steps)
        _count("batch_size", self.batch_size, 1)
        _count("group_size", self.group_size, 1)
        if self.batch_size % self.group_size:
            raise ValueError(f"group_size must divide batch_size, got batch_size={self.batch_size}, "
                             f"group_size={self.group_size}")
        _number("entropy_coef", self.entropy_coef)

    def build(self, max_tokens: int):
        """The algorithm object: the class registered under ``name`` (``agent_lab.algorithms.register``)."""
        return make_declared("algorithm", self.name, self.options, group_size=self.group_size,
                             max_tokens=max_tokens, objective=self.objective)


@dataclass
class OptimizerConfig:
    """AdamW(lr, betas=(0.9, 0.99), weight_decay), the gradient's global norm clipped at ``grad_clip``."""

    lr: float = setting(3e-3, "Adam's learning rate")
    weight_decay: float = setting(0.0, "decoupled weight decay (AdamW): each step scales the weights by "
                                       "1 - lr * weight_decay")
    grad_clip: float = setting(1.0, "the gradient's global norm is clipped at this")
    rl_fresh_optimizer: bool = setting(False, "clear Adam's moments when RL takes over from SFT, so RL steps "
                                              "are not scaled by the SFT gradients' running second moment")

    def __post_init__(self):
        if not isinstance(self.rl_fresh_optimizer, bool):
            raise ValueError(f"rl_fresh_optimizer must be True or False, got {self.rl_fresh_optimizer!r}")
        _number("lr", self.lr, strict=True)
        _number("weight_decay", self.weight_decay)
        _number("grad_clip", self.grad_clip, strict=True)


@dataclass
class EvalConfig:
    """Greedy evaluation on the held-out ``split`` every ``every`` steps (0: only at the end of a phase)."""

    every: int = setting(5, "greedy evaluation every this many steps (0: only at the end of a phase)",
                         flat="eval_every")
    split: str = setting("test", "the held-out split evaluated", flat="eval_split")
    stop_at_optimum: bool = setting(False, "stop once greedy success reaches the planner's optimum")

    def __post_init__(self):
        _count("eval_every", self.every)


@dataclass
class RunConfig:
    """Where and how a run executes; none of these change what is learned, except ``resume``'s starting point."""

    device: str = setting("auto", " | ".join(DEVICE_CHOICES))
    bf16: bool = setting(True, "autocast to bfloat16 on CUDA (ignored elsewhere)")
    cpu_bf16: bool = setting(False, "autocast to bfloat16 on the CPU too, where it has fast bf16 (AMX or "
                                    "AVX512-BF16, detected); float32 on any other CPU")
    cpu_threads: int = setting(1, "torch intra-op threads on the CPU (0: torch's default); tiny models gain "
                                  "nothing from more")
    micro_batch_size: int = setting(0, "episodes per forward/backward (0: the whole batch); the gradient "
                                       "does not change")
    prepare_ahead: bool = setting(False, "build each SFT step's demonstrations on a second thread while the step "
                                         "before it trains (the same batches; not with DAgger, which plays the "
                                         "policy)")
    run_dir: str | None = setting(None, "where the run writes its files (None: a fresh temporary directory)")
    checkpoint_every: int = setting(0, "checkpoint every this many steps (0: only at the end)")
    resume: bool = setting(False, "continue from run_dir/checkpoint.pt")
    time_limit_s: float | None = setting(None, "stop after the step during which this many seconds have "
                                               "passed")

    def __post_init__(self):
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        for name in ("cpu_threads", "micro_batch_size", "checkpoint_every"):
            _count(name, getattr(self, name))
        if self.time_limit_s is not None:
            _number("time_limit_s", self.time_limit_s, strict=True)
        if not isinstance(self.prepare_ahead, bool):
            raise ValueError(f"prepare_ahead must be True or False, got {self.prepare_ahead!r}")
        if self.resume and self.run_dir is None:
            raise ValueError("resume=True needs run_dir (the directory holding checkpoint.pt)")


# ----------------------------------------------------------------------------- declared options
#: The registries of the classes whose fields are settings beyond the sections: the algorithms (filled by
#: ``agent_lab.algorithms.register``) and the plug-ins (``agent_lab.plugins.register``). They live here, as
#: plain data, so that this module reads each class's declared fields without importing the modules above it.
DECLARED: dict[str, dict[str, type]] = {"algorithm": {}, "plugin": {}}
_LABEL = {"algorithm": "algo", "plugin": "plug-in"}


def declared(kind: str) -> dict[str, type]:
    """The registry of ``kind`` ("algorithm" or "plugin"): name -> class, in registration order."""
    return DECLARED[kind]


def declared_options(cls: type) -> tuple[str, ...]:
    """The settings a registered class accepts: its fields declared with :func:`setting` (help metadata)."""
    return tuple(f.name for f in fields(cls) if "help" in f.metadata)


def make_declared(kind: str, name: str, options: dict, **fixed: Any) -> Any:
    """The ``kind`` registered as ``name``, built with its own ``options`` (and the caller's ``fixed``
    arguments); an unknown name or option is refused with the choices."""
    classes, label = DECLARED[kind], _LABEL[kind]
    if name not in classes:
        raise ValueError(f"{label} must be one of {list(classes)}, got {name!r}")
    known = declared_options(classes[name])
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{label} {name!r} has no option {unknown[0]!r}; its options are {list(known)}")
    return classes[name](**fixed, **options)


# ----------------------------------------------------------------------------- flat keywords
@dataclass(frozen=True)
class Flat:
    """One flat keyword (``batch_size``; ``--batch-size`` on the command line), generated from its field."""

    place: str  # a section of SECTIONS, "options" (an algorithm's own) or "plugins"
    name: str  # the field it sets there
    default: Any  # TrainConfig's default; on a plug-in's switch, the value that leaves the plug-in off
    help: str
    type: Any  # the field's type, None removed (what the command line parses)
    owners: tuple[str, ...] = ()  # the algorithms, or the plug-in, that declare it
    switch: bool = False  # a plug-in's on/off keyword


def _field_type(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]  # resolves the annotation's text (``float | None``)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _keyed_fields(cls: type):
    """``(field, flat keyword)`` for each declared field of ``cls`` that has one."""
    for f in fields(cls):
        flat = f.metadata.get("flat", False)
        if "help" in f.metadata and flat:
            yield f, f.name if flat is True else flat


def _own_default(f) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


def _add(out: dict[str, Flat], key: str, new: Flat) -> None:
    """Add keyword ``key``; algorithms that inherit one option (PPO's ``epochs``) share its keyword."""
    old = out.get(key)
    if old is None:
        out[key] = new
    elif new.place == "options" and (old.place, old.name, old.default) == (new.place, new.name, new.default):
        out[key] = replace(old, owners=old.owners + new.owners)
    else:
        raise TypeError(f"flat keyword {key!r} is declared by {old.owners or old.place} and by "
                        f"{new.owners or new.place}; give one of the fields its own setting(flat=...) name")


def flat_keywords() -> dict[str, Flat]:
    """Every flat keyword, generated from the declared fields: each section's, then each registered
    algorithm's options, then each plug-in's (generated again whenever a registry has changed)."""
    registered = tuple((kind, name, cls) for kind, classes in DECLARED.items() for name, cls in classes.items())
    if registered not in _GENERATED:
        _GENERATED.clear()
        _GENERATED[registered] = _generate_flat_keywords()
    return dict(_GENERATED[registered])


#: The last generated table, keyed by the registries it was generated from.
_GENERATED: dict[tuple, dict[str, Flat]] = {}


def _generate_flat_keywords() -> dict[str, Flat]:
    out: dict[str, Flat] = {}
    defaults = _default_sections()
    for section, cls in SECTIONS.items():
        for f, key in _keyed_fields(cls):
            _add(out, key, Flat(section, f.name, getattr(defaults[section], f.name), f.metadata["help"],
                                _field_type(cls, f.name)))
    for kind, place in (("algorithm", "options"), ("plugin", "plugins")):
        for owner, cls in DECLARED[kind].items():
            keyed = list(_keyed_fields(cls))
            if place == "plugins" and keyed and sum("off" in f.metadata for f, _ in keyed) != 1:
                raise TypeError(f"plug-in {owner!r} has flat keywords but not one switch: declare exactly "
                                "one of its fields with setting(off=<the value that leaves it off>)")
            for f, key in keyed:
                switch = "off" in f.metadata
                _add(out, key, Flat(place, f.name, f.metadata["off"] if switch else _own_default(f),
                                    f.metadata["help"], _field_type(cls, f.name), (owner,), switch))
    return out


#: Removed settings: saved files that hold their default still load; anything else is refused with the reason.
REMOVED: dict[str, tuple[Any, str]] = {
    "sft_probe_weight": (0.0, "the goal-tree probe was removed (no recipe and no executed chapter cell used it)"),
    "sft_probe_scope": ("base", "the goal-tree probe was removed (no recipe and no executed chapter cell used it)"),
    "sft_probe_layer": (None, "the goal-tree probe was removed (no recipe and no executed chapter cell used it)"),
    "stop_after": (None, "a cold start is now a run of its own: train_sft(config), then "
                         "train_rl(config, init=that result)"),
}
SECTIONS = {"model": ModelConfig, "sampling": SamplingConfig, "sft": SFTConfig, "algorithm": AlgorithmConfig,
            "optimizer": OptimizerConfig, "evaluation": EvalConfig, "run": RunConfig}


def _default_sections() -> dict[str, Any]:
    """TrainConfig's sections when none is given: each section's defaults, except a shorter context than a
    standalone policy's (number search's transcripts are short)."""
    return {name: ModelConfig(max_len=256) if name == "model" else cls() for name, cls in SECTIONS.items()}


@dataclass(init=False)
class TrainConfig:
    """Every setting of a run (see the module docstring). Build it from sections, flat keywords, or both::

        TrainConfig(algorithm=AlgorithmConfig("ppo", steps=100, options={"epochs": 2}))
        TrainConfig(algo="ppo", steps=100, ppo_epochs=2)          # the same run
    """

    env: str
    env_options: dict
    seed: int
    model: ModelConfig
    sampling: SamplingConfig
    sft: SFTConfig
    algorithm: AlgorithmConfig
    optimizer: OptimizerConfig
    evaluation: EvalConfig
    run: RunConfig
    plugins: dict

    def __init__(self, env: str = "number-search", env_options: dict | None = None, seed: int = 0, *,
                 model: ModelConfig | None = None, sampling: SamplingConfig | None = None,
                 sft: SFTConfig | None = None, algorithm: AlgorithmConfig | None = None,
                 optimizer: OptimizerConfig | None = None, evaluation: EvalConfig | None = None,
                 run: RunConfig | None = None, plugins: dict | None = None, **flat: Any):
        _count("seed", seed)
        if not isinstance(plugins or {}, dict):
            raise ValueError(f"plugins must map plug-in names to option dicts, got {plugins!r}")
        self.env, self.env_options, self.seed = env, dict(env_options or {}), seed
        passed = {"model": model, "sampling": sampling, "sft": sft, "algorithm": algorithm,
                  "optimizer": optimizer, "evaluation": evaluation, "run": run}
        given = {k: passed[k] or default for k, default in _default_sections().items()}
        sections, plugin_opts = _apply_flat({k: asdict(v) for k, v in given.items()}, dict(plugins or {}), flat)
        for name, cls in SECTIONS.items():
            setattr(self, name, cls(**sections[name]))
        if self.sampling.decoding != "sampled":
            raise ValueError("sampling.decoding must be 'sampled' for training (greedy decoding is for evaluation)")
        self.plugins = plugin_opts

    # ----- views -----------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.sft.steps + self.algorithm.steps

    def to_dict(self) -> dict:
        """The nested form written to ``config.json`` (JSON values only)."""
        return {"env": self.env, "env_options": dict(self.env_options), "seed": self.seed,
                **{name: asdict(getattr(self, name)) for name in SECTIONS}, "plugins": dict(self.plugins)}

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Read :meth:`to_dict`'s form, or the flat form of a ``config.json`` written before the sections."""
        d = dict(d)
        if any(isinstance(d.get(name), dict) for name in SECTIONS):
            top = (d.pop("env", "number-search"), d.pop("env_options", None), d.pop("seed", 0))
            plugins = d.pop("plugins", None)
            unknown = sorted(set(d) - set(SECTIONS))
            if unknown:
                raise ValueError(f"unknown config section {unknown[0]!r}; sections are {list(SECTIONS)}")
            return cls(*top, plugins=plugins, **{k: SECTIONS[k](**v) for k, v in d.items()})
        d.pop("stop_after", None)  # a saved run's own stop point, not a setting of the run
        return cls(**d)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` applied: sections (``run=RunConfig(...)``) or flat keywords (``lr=1e-3``)."""
        current = {name: getattr(self, name) for name in SECTIONS}
        sections = {k: changes.pop(k) for k in list(changes) if k in SECTIONS}
        top = {k: changes.pop(k, getattr(self, k)) for k in ("env", "env_options", "seed", "plugins")}
        return TrainConfig(top["env"], top["env_options"], top["seed"], plugins=top["plugins"],
                           **{**current, **sections}, **changes)

    def validate(self, world_size: int = 1) -> None:
        """The checks that span sections and need no registry (each section checked its own fields);
        ``ValueError`` naming the field. Those that ask the environment, the algorithm or the plug-ins run
        where the run is prepared: :func:`agent_lab.preflight.check_config`, which calls this first."""
        if self.total_steps < 1:
            raise ValueError(f"the budget is empty: steps + sft_steps must be >= 1, got {self.algorithm.steps} + "
                             f"{self.sft.steps}")
        a = self.algorithm
        n_groups = a.batch_size // a.group_size
        if n_groups % world_size:
            raise ValueError(f"the {n_groups} task groups of a batch must split evenly over {world_size} workers; "
                             f"choose batch_size/group_size divisible by the world size")
        if self.sft.batch_size % world_size:
            raise ValueError(f"sft_batch_size={self.sft.batch_size} must be divisible by the world size {world_size}")


def _apply_flat(sections: dict[str, dict], plugins: dict, flat: dict) -> tuple[dict, dict]:
    """Fold flat keywords into section dicts and plug-in options (see :func:`flat_keywords`)."""
    for key, (default, why) in REMOVED.items():
        if key in flat and flat.pop(key) != default:
            raise ValueError(f"{key} is no longer a setting: {why}")
    keys = flat_keywords()
    unknown = sorted(set(flat) - set(keys))
    if unknown:
        hint = "" if DECLARED["algorithm"] else (" (no algorithm is registered yet: import agent_lab.algorithms "
                                                 "and agent_lab.plugins to declare their options)")
        raise ValueError(f"unknown TrainConfig field {unknown[0]!r}; flat fields are {sorted(keys)} and sections "
                         f"are {list(SECTIONS)}{hint}")
    algo = sections["algorithm"]
    given_name = algo["name"]
    for key, s in keys.items():
        if key in flat and s.place in SECTIONS:
            sections[s.place][s.name] = flat[key]
    if algo["name"] == "sft":  # the flat form's SFT-only run: every step imitates the planner
        if algo.get("objective") is not None:
            raise ValueError("objective applies to the RL algorithm; SFT steps always take the token mean")
        sections["sft"]["steps"] += algo["steps"]
        algo.update(name=AlgorithmConfig.name, steps=0, objective=None)
    options = dict(algo["options"]) if "algo" not in flat or flat["algo"] == given_name else {}
    for key, s in keys.items():
        if key in flat and s.place == "options":
            if algo["name"] in s.owners:
                options[s.name] = flat[key]
            elif flat[key] != s.default:
                *rest, last = map(repr, s.owners)
                names = ", ".join(rest) + " or " * bool(rest) + last
                raise ValueError(f"{key}={flat[key]!r} is an option of algo {names}, not of "
                                 f"{algo['name']!r}; drop it or set algo={s.owners[0]!r}")
    algo["options"] = options
    _apply_plugin_flags(plugins, flat, {k: s for k, s in keys.items() if s.place == "plugins"})
    return sections, plugins


def _apply_plugin_flags(plugins: dict, flat: dict, keys: dict[str, Flat]) -> None:
    """A plug-in's flat keywords: its switch at its off value turns it off; others tune it. A keyword given
    at its default still replaces the plug-in's option (``sft_slip_from=0`` on a recipe that starts its slips
    later starts them at once); it only turns on nothing."""
    by_plugin: dict[str, list[str]] = {}
    for key, s in keys.items():
        by_plugin.setdefault(s.owners[0], []).append(key)
    for plugin, names in by_plugin.items():
        switch = next(k for k in names if keys[k].switch)
        given = {keys[k].name: flat[k] for k in names if k in flat}
        changed = [k for k in names if k in flat and flat[k] != keys[k].default]
        if switch in flat and flat[switch] == keys[switch].default:
            plugins.pop(plugin, None)  # the switch set to its off value: off
        if plugin in plugins:
            plugins[plugin] = {**plugins[plugin], **given}
        elif changed:
            if switch not in changed:
                raise ValueError(f"{changed[0]}={flat[changed[0]]!r} has no effect without {switch}; set {switch} or "
                                 f"drop {changed[0]}")
            plugins[plugin] = given
