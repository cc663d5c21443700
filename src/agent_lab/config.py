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
``TrainConfig(env="number-search", algo="dr_grpo", sft_steps=0, lr=3e-2)``; :data:`FLAT` maps each one onto
its section. Each section checks its own fields when it is built; :meth:`TrainConfig.validate` adds the
checks that span sections, so a bad setting fails before any work, with a message naming the field.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_lab.algorithms import RL_ALGORITHMS, make_algorithm
from agent_lab.device import DEVICE_CHOICES
from agent_lab.envs import ENV_NAMES
from agent_lab.estimators.aggregation import OBJECTIVES
from agent_lab.plugins import make_plugins
from agent_lab.policy.model import ModelConfig
from agent_lab.rollout import SamplingConfig

__all__ = ["TrainConfig", "SFTConfig", "AlgorithmConfig", "OptimizerConfig", "EvalConfig", "RunConfig", "FLAT"]


def _count(name: str, value: Any, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a positive" if low == 1 else "a non-negative"
        raise ValueError(f"{name} must be {kind} int, got {value!r}")


def _number(name: str, value: Any, low: float = 0.0, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and (value > low if strict else value >= low)):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {value!r}")


@dataclass
class SFTConfig:
    """The cold start (book/part1/02_sft_rest_rl.md): ``steps`` supervised steps of ``batch_size``
    demonstrations, maximising the token-mean log-likelihood of the planner's actions."""

    steps: int = 0
    batch_size: int = 64
    lr: float | None = None  # None: the optimizer's lr
    lr_decay_steps: int = 0  # the last this many steps anneal lr linearly to 0 (see sft_lr_at); 0: constant

    def __post_init__(self):
        _count("sft_steps", self.steps)
        _count("sft_batch_size", self.batch_size, 1)
        _count("sft_lr_decay_steps", self.lr_decay_steps)
        if self.lr is not None:
            _number("sft_lr", self.lr, strict=True)
        if self.lr_decay_steps > self.steps:
            raise ValueError(f"sft_lr_decay_steps={self.lr_decay_steps} is more than the {self.steps} SFT steps it "
                             "would anneal; lower it or add SFT steps")


@dataclass
class AlgorithmConfig:
    """The RL phase: ``steps`` steps of ``name``, each on ``batch_size`` episodes, that is
    ``batch_size / group_size`` tasks x ``group_size`` samples in contiguous groups. ``objective``: the loss
    normalisation (None: the algorithm's own); ``options``: the algorithm's own settings, the fields of its
    class in :mod:`agent_lab.algorithms` (PPO's ``clip_eps``, ``epochs``, ``minibatches``, ...)."""

    name: str = "dr_grpo"
    steps: int = 40
    batch_size: int = 256
    group_size: int = 8
    objective: str | None = None
    entropy_coef: float = 0.0  # s_ij += entropy_coef * H(pi(. | x_<ij)), an exploration bonus
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.name not in RL_ALGORITHMS:
            raise ValueError(f"algo must be one of {list(RL_ALGORITHMS)}, got {self.name!r}")
        _count("steps", self.steps)
        _count("batch_size", self.batch_size, 1)
        _count("group_size", self.group_size, 1)
        if self.batch_size % self.group_size:
            raise ValueError(f"group_size must divide batch_size, got batch_size={self.batch_size}, "
                             f"group_size={self.group_size}")
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES} or None, got {self.objective!r}")
        _number("entropy_coef", self.entropy_coef)
        self.build(max_tokens=1)  # the algorithm checks its own options

    def build(self, max_tokens: int):
        """The algorithm object (:func:`agent_lab.algorithms.make_algorithm`)."""
        return make_algorithm(self.name, group_size=self.group_size, max_tokens=max_tokens,
                              objective=self.objective, **self.options)


@dataclass
class OptimizerConfig:
    """Adam(lr, betas=(0.9, 0.99), weight_decay), the gradient's global norm clipped at ``grad_clip``."""

    lr: float = 3e-3
    weight_decay: float = 0.0
    grad_clip: float = 1.0

    def __post_init__(self):
        _number("lr", self.lr, strict=True)
        _number("weight_decay", self.weight_decay)
        _number("grad_clip", self.grad_clip, strict=True)


@dataclass
class EvalConfig:
    """Greedy evaluation on the held-out ``split`` every ``every`` steps (0: only at the end of a phase)."""

    every: int = 5
    split: str = "test"
    stop_at_optimum: bool = False  # stop once greedy success reaches the planner's optimum

    def __post_init__(self):
        _count("eval_every", self.every)


@dataclass
class RunConfig:
    """Where and how a run executes; none of these change what is learned, except ``resume``'s starting point."""

    device: str = "auto"
    bf16: bool = True  # autocast to bfloat16 on CUDA (ignored elsewhere)
    cpu_threads: int = 1  # torch intra-op threads on the CPU (0: torch's default); tiny models gain nothing from more
    micro_batch_size: int = 0  # episodes per forward/backward; 0: the whole (mini)batch at once
    run_dir: str | None = None  # None: a fresh temporary directory
    checkpoint_every: int = 0  # 0: only at the end
    resume: bool = False  # continue from run_dir/checkpoint.pt
    time_limit_s: float | None = None  # stop after the step during which this many seconds have passed

    def __post_init__(self):
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        for name in ("cpu_threads", "micro_batch_size", "checkpoint_every"):
            _count(name, getattr(self, name))
        if self.time_limit_s is not None:
            _number("time_limit_s", self.time_limit_s, strict=True)
        if self.resume and self.run_dir is None:
            raise ValueError("resume=True needs run_dir (the directory holding checkpoint.pt)")


# ----------------------------------------------------------------------------- flat keywords
#: Flat keyword -> (section, field). ``algorithm.options`` keys belong to one algorithm each (OPTION_OF).
FLAT: dict[str, tuple[str, str]] = {
    **{k: ("model", k) for k in ("d_model", "n_layers", "n_heads", "max_len", "positions")},
    **{k: ("sampling", k) for k in ("temperature", "top_p", "candidate_mask")},
    "sft_steps": ("sft", "steps"), "sft_batch_size": ("sft", "batch_size"), "sft_lr": ("sft", "lr"),
    "sft_lr_decay_steps": ("sft", "lr_decay_steps"),
    "algo": ("algorithm", "name"), "steps": ("algorithm", "steps"), "batch_size": ("algorithm", "batch_size"),
    "group_size": ("algorithm", "group_size"), "objective": ("algorithm", "objective"),
    "entropy_coef": ("algorithm", "entropy_coef"),
    **{k: ("optimizer", k) for k in ("lr", "weight_decay", "grad_clip")},
    "eval_every": ("evaluation", "every"), "eval_split": ("evaluation", "split"),
    "stop_at_optimum": ("evaluation", "stop_at_optimum"),
    **{k: ("run", k) for k in ("device", "bf16", "cpu_threads", "micro_batch_size", "run_dir", "checkpoint_every",
                               "resume", "time_limit_s")},
}
#: Flat keyword of an algorithm's own option -> (algorithm or algorithms, option name, default).
OPTION_OF: dict[str, tuple[str, str, Any]] = {
    "baseline": ("reinforce", "baseline", "none"), "baseline_value": ("reinforce", "baseline_value", 0.0),
    "reward_to_go": ("reinforce", "reward_to_go", False), "gamma": ("reinforce", "gamma", 1.0),
    **{k: (("ppo", "ppo_gae", "vineppo"), name, default) for k, name, default in (
        ("ppo_epochs", "epochs", 4), ("minibatches", "minibatches", 1), ("clip_eps", "clip_eps", 0.2),
        ("kl_coef", "kl_coef", 0.0), ("kl_kind", "kl_kind", "k3"))},
    "gae_gamma": ("ppo_gae", "gamma", 1.0), "gae_lambda": ("ppo_gae", "gae_lambda", 0.95),
    "critic_lr": ("ppo_gae", "critic_lr", 3e-3), "critic_steps": ("ppo_gae", "critic_steps", 50),
    "critic_hidden": ("ppo_gae", "critic_hidden", 64),
    "rest_em_epochs": ("rest_em", "epochs", 2), "rest_em_threshold": ("rest_em", "threshold", 1.0),
    "step_weight": ("gigpo", "step_weight", 1.0), "anchor": ("gigpo", "anchor", "state"),
    "gigpo_gamma": ("gigpo", "gamma", 1.0),
    "branches": ("vineppo", "branches", 2), "vine_gamma": ("vineppo", "gamma", 1.0),
}
#: Flat keywords of the labs' experiments -> (plug-in, option, default). A plug-in is on when its first keyword
#: (its switch) differs from the default.
PLUGIN_OF: dict[str, tuple[str, str, Any]] = {
    "sft_slip_prob": ("recovery_demonstrations", "prob", 0.0),
    "sft_slip_from": ("recovery_demonstrations", "from_step", 0),
    "sft_dagger_prob": ("dagger", "prob", 0.0), "sft_dagger_from": ("dagger", "from_step", 0),
    "sft_observation_weight": ("observation_loss", "weight", 0.0),
    "guide_coef": ("planner_guidance", "coef", 0.0), "resample_rounds": ("dynamic_sampling", "rounds", 0),
}
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


def _default_model() -> ModelConfig:
    return ModelConfig(d_model=64, n_layers=2, n_heads=4, max_len=256)


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
        if env not in ENV_NAMES:
            raise ValueError(f"env must be one of {list(ENV_NAMES)}, got {env!r}")
        _count("seed", seed)
        self.env, self.env_options, self.seed = env, dict(env_options or {}), seed
        given = {"model": model or _default_model(), "sampling": sampling or SamplingConfig(),
                 "sft": sft or SFTConfig(), "algorithm": algorithm or AlgorithmConfig(),
                 "optimizer": optimizer or OptimizerConfig(), "evaluation": evaluation or EvalConfig(),
                 "run": run or RunConfig()}
        sections, plugin_opts = _apply_flat({k: asdict(v) for k, v in given.items()}, dict(plugins or {}), flat)
        for name, cls in SECTIONS.items():
            setattr(self, name, cls(**sections[name]))
        if self.sampling.decoding != "sampled":
            raise ValueError("sampling.decoding must be 'sampled' for training (greedy decoding is for evaluation)")
        make_plugins(plugin_opts)  # each plug-in checks its own options
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
        """The checks that span sections (each section checked its own fields); ``ValueError`` naming the field."""
        if self.total_steps < 1:
            raise ValueError(f"the budget is empty: steps + sft_steps must be >= 1, got {self.algorithm.steps} + "
                             f"{self.sft.steps}")
        algo, a = self.algorithm.build(max_tokens=1), self.algorithm
        if self.algorithm.steps and algo.needs_groups and a.group_size < 2:
            raise ValueError(f"algo {a.name!r} compares samples within a group: group_size must be >= 2, "
                             f"got {a.group_size}")
        if self.algorithm.steps and algo.needs_decision_states and world_size > 1:
            raise ValueError(f"algo {a.name!r} fits its critic on one process's batch; run it without torchrun")
        n_groups = a.batch_size // a.group_size
        if n_groups % world_size:
            raise ValueError(f"the {n_groups} task groups of a batch must split evenly over {world_size} workers; "
                             f"choose batch_size/group_size divisible by the world size")
        if (a.batch_size // world_size) % algo.minibatches:
            raise ValueError(f"minibatches={algo.minibatches} must divide the per-worker batch "
                             f"{a.batch_size // world_size}")
        if self.sft.batch_size % world_size:
            raise ValueError(f"sft_batch_size={self.sft.batch_size} must be divisible by the world size {world_size}")
        for plugin in make_plugins(self.plugins):
            plugin.check(self, world_size)


def _apply_flat(sections: dict[str, dict], plugins: dict, flat: dict) -> tuple[dict, dict]:
    """Fold flat keywords into section dicts and plug-in options (see :data:`FLAT`)."""
    for key, (default, why) in REMOVED.items():
        if key in flat and flat.pop(key) != default:
            raise ValueError(f"{key} is no longer a setting: {why}")
    unknown = sorted(set(flat) - set(FLAT) - set(OPTION_OF) - set(PLUGIN_OF))
    if unknown:
        known = sorted({*FLAT, *OPTION_OF, *PLUGIN_OF})
        raise ValueError(f"unknown TrainConfig field {unknown[0]!r}; flat fields are {known} and sections are "
                         f"{list(SECTIONS)}")
    algo = sections["algorithm"]
    given_name = algo["name"]
    for key, (section, name) in FLAT.items():
        if key in flat:
            sections[section][name] = flat[key]
    if algo["name"] == "sft":  # the flat form's SFT-only run: every step imitates the planner
        if algo.get("objective") is not None:
            raise ValueError("objective applies to the RL algorithm; SFT steps always take the token mean")
        sections["sft"]["steps"] += algo["steps"]
        algo.update(name=AlgorithmConfig.name, steps=0, objective=None)
    options = dict(algo["options"]) if "algo" not in flat or flat["algo"] == given_name else {}
    for key, (owner, name, default) in OPTION_OF.items():
        owners = (owner,) if isinstance(owner, str) else owner
        if key in flat:
            if algo["name"] in owners:
                options[name] = flat[key]
            elif flat[key] != default:
                names = ", ".join(map(repr, owners[:-1])) + " or " * (len(owners) > 1) + repr(owners[-1])
                raise ValueError(f"{key}={flat[key]!r} is an option of algo {names}, not of "
                                 f"{algo['name']!r}; drop it or set algo={owners[0]!r}")
    algo["options"] = options
    _apply_plugin_flags(plugins, flat)
    return sections, plugins


def _apply_plugin_flags(plugins: dict, flat: dict) -> None:
    """A plug-in's flat keywords: its switch (the first listed) at the default turns it off; others tune it. A
    keyword given at its default still replaces the plug-in's option (``sft_slip_from=0`` on a recipe that
    starts its slips later starts them at once); it only turns on nothing."""
    keys: dict[str, list[str]] = {}
    for key, (plugin, _, _) in PLUGIN_OF.items():
        keys.setdefault(plugin, []).append(key)
    for plugin, names in keys.items():
        switch = names[0]
        given = {PLUGIN_OF[k][1]: flat[k] for k in names if k in flat}
        changed = [k for k in names if k in flat and flat[k] != PLUGIN_OF[k][2]]
        if switch in flat and flat[switch] == PLUGIN_OF[switch][2]:
            plugins.pop(plugin, None)  # the switch set to its default: off
        if plugin in plugins:
            plugins[plugin] = {**plugins[plugin], **given}
        elif changed:
            if switch not in changed:
                raise ValueError(f"{changed[0]}={flat[changed[0]]!r} has no effect without {switch}; set {switch} or "
                                 f"drop {changed[0]}")
            plugins[plugin] = given
