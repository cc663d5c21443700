"""The training loop: environment -> policy -> rollout -> advantage -> loss -> update -> evaluation.

Book chapter "Training an LM agent from scratch". One function, :func:`train`, runs on one process or
under ``torchrun --nproc_per_node N`` (DDP). Every setting is a field of :class:`TrainConfig` with a plain
default; the run prints and saves the exact loss (seed 000 §6: "report the exact loss").

The fast, reliable number-search recipe used by the book and the assignment is
:func:`fast_number_search_config` (SFT cold start on the planner's demonstrations, then Dr.GRPO, stopping
as soon as the greedy policy reaches the planner's exact optimum 15/16)::

    result = train(fast_number_search_config())

d_model 64, 2 layers, Adam lr 3e-3, 32 demonstrations per SFT step, RL batch 256 = 32 tasks x 8. Measured by
``bench/bench_trainer.py`` on a shared, heavily loaded 2-core machine: the optimum is reached at step
95-145 (11-34 s wall-clock over two runs of 3 seeds), during the SFT phase. Pure RL from random weights
needs the candidate mask (``candidate_mask=True``), large groups and a small entropy bonus; see
``PURE_RL`` in ``bench/bench_trainer.py``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from agent_lab import distributed as D
from agent_lab.algorithms import ALGORITHMS, BASELINES, AlgoState, Algorithm, make_algorithm
from agent_lab.device import DEVICE_CHOICES, pick_device
from agent_lab.diagnostics import MetricsWriter, plot_curves
from agent_lab.envs.base import check_choice
from agent_lab.envs.crafting import PROBE_SCOPES
from agent_lab.estimators.aggregation import OBJECTIVES, aggregate, reduce_loss
from agent_lab.estimators.filtering import mixed_group_rows, unsolved_groups
from agent_lab.estimators.statistics import degenerate_group_fraction, effective_sample_size
from agent_lab.estimators.logprobs import KL_KINDS, entropy_from_logits, kl_estimate, token_log_ratios, token_logprobs
from agent_lab.evaluation import EvalReport, evaluate, load_checkpoint, save_checkpoint
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
from agent_lab.policy.model import POSITIONS
from agent_lab.policy.packing import packed_logits
from agent_lab.rollout import RolloutBatch, SamplingConfig, collect_rollouts, demonstration_batch

GROUP_ALGOS = ("rloo", "grpo", "dr_grpo", "ppo")
GUIDED_ALGOS = ("rloo", "grpo", "dr_grpo")  # one update per batch (guide_coef)


@dataclass
class TrainConfig:
    """Every setting of a run. Defaults are the fast number-search recipe (see the module docstring).

    A run is ``sft_steps`` supervised steps on planner demonstrations (the cold start), then ``steps``
    steps of ``algo`` (``algo="sft"`` runs ``steps`` supervised steps). A step collects ``batch_size``
    episodes = ``batch_size / group_size`` tasks x ``group_size`` samples (contiguous groups).
    """

    env: str = "number-search"
    env_options: dict = field(default_factory=dict)
    algo: str = "dr_grpo"
    steps: int = 40
    sft_steps: int = 0
    batch_size: int = 256
    group_size: int = 8
    sft_batch_size: int = 64
    lr: float = 3e-3
    sft_lr: float | None = None  # None: same as lr
    sft_lr_decay_steps: int = 0  # the last this many SFT steps anneal sft_lr linearly to 0; 0: constant (see sft_lr_at)
    sft_observation_weight: float = 0.0  # SFT also predicts the environment's text (an auxiliary loss); see loss_and_stats
    sft_probe_weight: float = 0.0  # SFT also trains a goal-tree probe at the prompt's base items (crafting); see
    #                                loss_and_stats and Crafting.probe_labels
    sft_probe_scope: str = "base"  # where the probe has targets: "base" (the base line) or "prefix" (every prompt item)
    sft_probe_layer: int | None = None  # the probe reads block k's output (1..n_layers); None: the last hidden state
    sft_slip_prob: float = 0.0  # share of demonstrations with one off-plan action and the planner's recovery (crafting)
    sft_slip_from: int = 0  # recovery demonstrations only from this SFT step on (a late phase); 0: from the start
    sft_dagger_prob: float = 0.0  # share of demonstrations that start from the policy's own sampled episode (DAgger;
    #                               crafting): replayed to a random turn, then the planner's plan; see dagger_actions
    sft_dagger_from: int = 0  # DAgger demonstrations only from this SFT step on; 0: from the start
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # policy
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 256
    positions: str = "learned"  # "learned" embeddings or "rope" (rotary); see ModelConfig
    # sampling (the declared behaviour policy)
    temperature: float = 1.0
    top_p: float = 1.0
    candidate_mask: bool = False  # restrict actions to env.allowed_actions() (sets the env's mask_actions)
    resample_rounds: int = 0  # dynamic sampling: up to this many extra rounds of fresh task groups per RL step while
    #                           too few groups disagree; the update takes the disagreeing ones first (mixed_group_rows)
    guide_coef: float = 0.0  # planner guidance: + guide_coef * SFT loss on the planner's demonstrations of the tasks
    #                          whose group no sample solved (unsolved_groups); 0: off
    # loss
    objective: str | None = None  # None: the algorithm's own normalisation (algorithms.DEFAULT_OBJECTIVE)
    entropy_coef: float = 0.0
    baseline: str = "none"  # reinforce: none | constant | running_mean
    baseline_value: float = 0.0
    reward_to_go: bool = False  # reinforce
    gamma: float = 1.0
    ppo_epochs: int = 4
    minibatches: int = 1
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # ppo: KL penalty to the frozen reference (the policy when RL starts)
    kl_kind: str = "k3"
    rest_em_epochs: int = 2
    rest_em_threshold: float = 1.0
    # evaluation and bookkeeping
    eval_every: int = 5  # greedy evaluation on held-out tasks every this many steps (0: only at the end)
    eval_split: str = "test"
    stop_at_optimum: bool = False  # stop once greedy success reaches the planner's optimum
    seed: int = 0
    device: str = "auto"
    bf16: bool = True  # autocast to bfloat16 on CUDA (ignored on CPU)
    cpu_threads: int = 1  # torch intra-op threads on CPU (0: torch's default). Tiny models gain nothing from
    #                       more, and on a busy machine OpenMP spin-waiting makes 2 threads ~30x slower than 1.
    run_dir: str | None = None  # None: a fresh temporary directory
    checkpoint_every: int = 0  # 0: only at the end
    resume: bool = False  # continue from run_dir/checkpoint.pt
    stop_after: int | None = None  # stop (as if interrupted) after this many total steps; for tests
    time_limit_s: float | None = None  # stop after the step during which this many seconds have passed

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def total_steps(self) -> int:
        return self.sft_steps + self.steps

    @property
    def sft_phase_steps(self) -> int:
        """Steps trained on demonstrations: all of them when ``algo="sft"``, else the cold start."""
        return self.total_steps if self.algo == "sft" else self.sft_steps

    def validate(self, world_size: int = 1) -> None:
        """Raise ``ValueError`` naming the first bad setting; called before any work starts."""
        from agent_lab.envs import ENV_NAMES

        if self.env not in ENV_NAMES:
            raise ValueError(f"env must be one of {list(ENV_NAMES)}, got {self.env!r}")
        if self.algo not in ALGORITHMS:
            raise ValueError(f"algo must be one of {list(ALGORITHMS)}, got {self.algo!r}")
        for name in ("steps", "sft_steps", "sft_slip_from", "sft_dagger_from", "sft_lr_decay_steps", "eval_every",
                     "checkpoint_every", "cpu_threads", "resample_rounds"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")
        for name in ("batch_size", "group_size", "sft_batch_size", "d_model", "n_layers", "n_heads", "max_len",
                     "ppo_epochs", "minibatches", "rest_em_epochs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.total_steps < 1:
            raise ValueError(f"the budget is empty: steps + sft_steps must be >= 1, got {self.steps} + {self.sft_steps}")
        if self.batch_size % self.group_size:
            raise ValueError(f"group_size must divide batch_size, got batch_size={self.batch_size}, "
                             f"group_size={self.group_size}")
        if self.resample_rounds and self.algo not in GROUP_ALGOS:
            raise ValueError(f"resample_rounds keeps task groups whose rewards disagree, which only the group "
                             f"algorithms {GROUP_ALGOS} learn from; algo={self.algo!r}: set resample_rounds=0")
        g = self.guide_coef
        if not (isinstance(g, (int, float)) and g >= 0 and math.isfinite(g)):
            raise ValueError(f"guide_coef must be a finite number >= 0, got {g!r}")
        if g > 0 and self.algo not in GUIDED_ALGOS:
            raise ValueError(f"guide_coef adds demonstrations for task groups no sample solved, which needs one "
                             f"update per rollout batch of groups: algo must be one of {GUIDED_ALGOS}, got "
                             f"{self.algo!r}; set guide_coef=0")
        if g > 0 and world_size > 1:
            raise ValueError(f"guide_coef runs in one process (workers would disagree on how many demonstrations "
                             f"they add); got {world_size} workers: set guide_coef=0 or run without torchrun")
        if self.algo in GROUP_ALGOS and self.group_size < 2:
            raise ValueError(f"algo {self.algo!r} compares samples within a group: group_size must be >= 2, "
                             f"got {self.group_size}")
        n_groups = self.batch_size // self.group_size
        if n_groups % world_size:
            raise ValueError(f"the {n_groups} task groups of a batch must split evenly over {world_size} workers; "
                             f"choose batch_size/group_size divisible by the world size")
        if self.sft_batch_size % world_size:
            raise ValueError(f"sft_batch_size={self.sft_batch_size} must be divisible by the world size {world_size}")
        if self.algo == "ppo" and (self.batch_size // world_size) % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} must divide the per-worker batch "
                             f"{self.batch_size // world_size}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads must divide d_model, got d_model={self.d_model}, n_heads={self.n_heads}")
        for name in ("lr", "temperature", "grad_clip"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if self.sft_lr is not None and not self.sft_lr > 0:
            raise ValueError(f"sft_lr must be positive or None, got {self.sft_lr!r}")
        w = self.sft_observation_weight
        if not (isinstance(w, (int, float)) and w >= 0 and math.isfinite(w)):
            raise ValueError(f"sft_observation_weight must be a finite number >= 0, got {w!r}")
        p = self.sft_probe_weight
        if not (isinstance(p, (int, float)) and p >= 0 and math.isfinite(p)):
            raise ValueError(f"sft_probe_weight must be a finite number >= 0, got {p!r}")
        if p > 0 and self.env != "crafting":
            raise ValueError(f"sft_probe_weight needs probe labels, which only crafting has; env={self.env!r}")
        if p > 0 and self.sft_phase_steps == 0:
            raise ValueError("sft_probe_weight has no effect without SFT steps; set sft_steps >= 1 or the weight to 0")
        check_choice("sft_probe_scope", self.sft_probe_scope, PROBE_SCOPES)
        if self.sft_probe_layer is not None:
            if p == 0:
                raise ValueError("sft_probe_layer has no effect without the probe; set sft_probe_weight > 0 or the layer to None")
            if not (isinstance(self.sft_probe_layer, int) and 1 <= self.sft_probe_layer <= self.n_layers):
                raise ValueError(f"sft_probe_layer must be an int in 1..n_layers={self.n_layers} or None, "
                                 f"got {self.sft_probe_layer!r}")
        for kind, shown, source in (("slip", "the slips", "recovery"), ("dagger", "the policy's mistakes", "branched")):
            prob, first = getattr(self, f"sft_{kind}_prob"), getattr(self, f"sft_{kind}_from")
            if not (isinstance(prob, (int, float)) and 0 <= prob <= 1):
                raise ValueError(f"sft_{kind}_prob must lie in [0, 1], got {prob!r}")
            if prob > 0 and w > 0:
                raise ValueError(f"sft_{kind}_prob and sft_observation_weight cannot be combined: the auxiliary loss "
                                 f"would learn to predict {shown}; set one of them to 0")
            if prob > 0 and self.env != "crafting":
                raise ValueError(f"sft_{kind}_prob needs {source} demonstrations, which only crafting has; "
                                 f"env={self.env!r}")
            if first > 0 and not (prob > 0 and first < self.sft_phase_steps):
                raise ValueError(f"sft_{kind}_from={first} has no effect: it needs sft_{kind}_prob > 0 and fewer than "
                                 f"the {self.sft_phase_steps} SFT steps; set sft_{kind}_from=0 or change those")
        if self.sft_lr_decay_steps > self.sft_phase_steps:
            raise ValueError(f"sft_lr_decay_steps={self.sft_lr_decay_steps} is more than the {self.sft_phase_steps} SFT "
                             "steps it would anneal; lower it or add SFT steps")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES} or None, got {self.objective!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.kl_kind not in KL_KINDS:
            raise ValueError(f"kl_kind must be one of {KL_KINDS}, got {self.kl_kind!r}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError(f"kl_coef and entropy_coef must be >= 0, got {self.kl_coef}, {self.entropy_coef}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        if self.stop_after is not None and not (isinstance(self.stop_after, int) and self.stop_after >= 1):
            raise ValueError(f"stop_after must be a positive int or None, got {self.stop_after!r}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be positive or None, got {self.time_limit_s!r}")
        if self.resume and self.run_dir is None:
            raise ValueError("resume=True needs run_dir (the directory holding checkpoint.pt)")


def fast_number_search_config(**overrides: Any) -> TrainConfig:
    """The book's default number-search run: SFT on planner demonstrations then Dr.GRPO, stop at the optimum.

    ``train(fast_number_search_config())`` reaches greedy success 15/16 in well under a minute on 2 CPU
    cores (see the module docstring for measured figures). Keyword ``overrides`` replace fields.
    """
    base = dict(env="number-search", algo="dr_grpo", sft_steps=200, steps=200, sft_batch_size=32, lr=3e-3,
                d_model=64, n_layers=2, n_heads=4, batch_size=256, group_size=8, eval_every=5,
                stop_at_optimum=True)
    return TrainConfig(**{**base, **overrides})


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained policy, its tokenizer, per-step diagnostics, the final
    greedy evaluation, and the run directory (config.json, loss.txt, metrics.jsonl/csv, curves.png,
    checkpoint.pt)."""

    policy: TinyTransformer
    tokenizer: WordTokenizer
    history: list[dict]
    final_eval: EvalReport | None
    run_dir: Path
    loss_description: str
    seconds: float
    episodes: int
    reached_optimum_at: dict | None = None  # {"step", "seconds", "episodes"} when greedy success hit the optimum


# ----------------------------------------------------------------------------- small pure pieces
def build_env(cfg: TrainConfig):
    from agent_lab.envs import make_env

    opts = dict(cfg.env_options)
    if cfg.candidate_mask:
        opts["mask_actions"] = True
    return make_env(cfg.env, **opts)


def max_action_tokens(env) -> int:
    """Most policy tokens an episode can hold (``TextEnv.max_policy_tokens``): Dr.GRPO's constant normaliser."""
    return int(env.max_policy_tokens)


def policy_logits(model, batch: RolloutBatch, temperature: float, with_probe: bool = False) -> Tensor | tuple:
    """Teacher-forced logits ``[B, L-1, V]`` under the sampling transform (recorded masks, temperature),
    so that with unchanged weights ``token_logprobs`` equals the recorded behaviour log-probs. With
    ``with_probe``, also the model's probe logits ``[B, L]`` (one per token, unshifted): ``(logits, probe)``.

    Top-p truncation is *not* re-applied (it is not differentiable in the support): with ``top_p < 1`` the
    behaviour policy differs from the trained one, and PPO's ratio is what corrects for it. The pass runs on
    packed rows (:func:`~agent_lab.policy.packing.packed_logits`): same logits, less padding."""
    out = packed_logits(model, batch.input_ids, batch.attention_mask, **({"with_probe": True} if with_probe else {}))
    V = batch.allowed_tokens.shape[-1]
    logits = out[:, :-1, :V].float().masked_fill(~batch.allowed_tokens, float("-inf")) / temperature
    return (logits, out[:, :, V].float()) if with_probe else logits


def demonstration_probe_targets(env, tasks: list, shape: tuple[int, int], device, scope: str = "base") -> Tensor:
    """``[B, L]`` goal-tree probe targets of demonstration transcripts: each task's ``env.probe_labels(task,
    scope)`` at its prompt's positions (1.., after ``<bos>``), -1 (no target) everywhere else."""
    out = torch.full(shape, -1, dtype=torch.long)
    for b, task in enumerate(tasks):
        labels = env.probe_labels(task, scope)
        out[b, 1 : 1 + len(labels)] = torch.tensor(labels, dtype=torch.long)
    return out.to(device)


def _task_rng(cfg: TrainConfig, step: int, round_: int = 0) -> np.random.Generator:
    """Tasks of ``step`` depend only on (seed, step, round): a resumed run draws exactly the same tasks."""
    return np.random.default_rng([cfg.seed, step, 7] + ([round_] if round_ else []))


def _sample_generator(cfg: TrainConfig, step: int, rank: int, device, round_: int = 0) -> torch.Generator:
    seed = ((cfg.seed * 1_000_003 + step) * 1_009 + rank) % (2**62)
    if round_:
        seed = int(np.random.SeedSequence([seed, round_]).generate_state(1, np.uint64)[0]) % (2**62)
    return torch.Generator(device=device).manual_seed(seed)


def group_tasks(env, cfg: TrainConfig, step: int, round_: int = 0) -> list:
    """``batch_size / group_size`` tasks, each repeated ``group_size`` times in contiguous rows."""
    tasks = env.sample_tasks(_task_rng(cfg, step, round_), cfg.batch_size // cfg.group_size, split="train")
    return [t for t in tasks for _ in range(cfg.group_size)]


def collect_groups(model, tok, env, cfg: TrainConfig, step: int, info, sampling: SamplingConfig, device,
                   amp_dtype) -> tuple[RolloutBatch, RolloutBatch, int]:
    """This worker's rollouts of RL step ``step``: its share of :func:`group_tasks`. With ``resample_rounds``,
    more rounds of fresh tasks follow while fewer groups disagree than the update holds, and the update takes
    the disagreeing groups first (:func:`~agent_lab.estimators.mixed_group_rows`). Returns the update batch,
    every sampled episode (for the diagnostics; the same batch without resampling) and the number of rounds."""
    batches: list[RolloutBatch] = []
    for r in range(cfg.resample_rounds + 1):
        all_tasks = group_tasks(env, cfg, step, r)
        tasks = all_tasks[D.shard(len(all_tasks), info)]
        batches.append(collect_rollouts(model, tok, env, tasks, sampling, _sample_generator(cfg, step, info.rank,
                                        device, r), policy_version=step, autocast_dtype=amp_dtype))
        returns = torch.cat([b.episode_return for b in batches])
        n_mixed = round((1.0 - float(degenerate_group_fraction(returns, cfg.group_size))) * len(returns))
        if n_mixed >= len(batches[0]):  # rows of groups that disagree fill the update
            break
    if len(batches) == 1:
        return batches[0], batches[0], 1
    every = RolloutBatch.concat(batches, pad_id=tok.pad_id)
    rows = mixed_group_rows(every.episode_return, cfg.group_size, len(batches[0]) // cfg.group_size)
    return every.select(rows), every, len(batches)


def sft_lr_at(cfg: TrainConfig, step: int) -> float:
    """The SFT learning rate at ``step``, stable then decaying (warmup-stable-decay without the warmup): constant
    ``sft_lr`` (or ``lr``), then over the last D = ``sft_lr_decay_steps`` of the phase's T SFT steps, linear to zero:

        lr(s) = lr0                    for s < T - D
        lr(s) = lr0 * (T - s) / D      for T - D <= s < T   (the last step still moves, by lr0 / D)

    Annealing lets Adam settle into the minimum that constant-rate noise keeps it circling."""
    lr0 = cfg.sft_lr or cfg.lr
    end, d = cfg.sft_phase_steps, cfg.sft_lr_decay_steps
    return lr0 if step < end - d else lr0 * (end - step) / d


def dagger_actions(model, tok, env, tasks: list, cfg: TrainConfig, step: int, info, device,
                   amp_dtype) -> tuple[list[list[str] | None], dict]:
    """DAgger's half of an SFT step: each task is drawn with probability ``sft_dagger_prob``, the policy plays
    the drawn ones (sampled as the run declares, without gradients), and their action texts are returned
    (``None`` for the others) for :func:`~agent_lab.rollout.demonstration_batch`; plus the row's figures."""
    draws = np.random.default_rng([cfg.seed, step, 13, info.rank]).random(len(tasks))
    drawn = np.flatnonzero(draws < cfg.sft_dagger_prob)
    acts: list[list[str] | None] = [None] * len(tasks)
    if len(drawn) == 0:
        return acts, {"dagger_episodes": 0}
    sampling = SamplingConfig(cfg.temperature, cfg.top_p, "sampled", cfg.candidate_mask)
    played = collect_rollouts(model, tok, env, [tasks[k] for k in drawn], sampling,
                              _sample_generator(cfg, step, info.rank, device), policy_version=step,
                              autocast_dtype=amp_dtype)
    for k, log in zip(drawn, played.episode_logs):
        acts[k] = [turn["text"] for turn in log["turns"]]
    return acts, {"dagger_episodes": len(drawn), "dagger_success": float(played.success.float().mean())}


def describe_run(cfg: TrainConfig, algo: Algorithm, sft: Algorithm | None, n_params: int) -> str:
    lines = [f"agent-lab train: env={cfg.env} {cfg.env_options or ''} algo={cfg.algo} seed={cfg.seed}",
             f"policy: decoder-only transformer d_model={cfg.d_model} n_layers={cfg.n_layers} "
             f"n_heads={cfg.n_heads} ({n_params} parameters)",
             f"sampling: temperature={cfg.temperature} top_p={cfg.top_p} candidate_mask={cfg.candidate_mask} "
             "(behaviour log-probs recorded under this transform)"]
    if sft is not None:
        lines.append(f"phase 1 ({cfg.sft_steps} steps, {cfg.sft_batch_size} demonstrations/step, "
                     f"lr={cfg.sft_lr or cfg.lr}"
                     + (f", linear to 0 over the last {cfg.sft_lr_decay_steps}" if cfg.sft_lr_decay_steps else "")
                     + f"): {sft.describe()}")
    if cfg.sft_slip_prob > 0:
        lines.append(f"SFT recovery demonstrations: {cfg.sft_slip_prob:.0%} of transcripts contain one off-plan action "
                     "(not imitated), then the planner's shortest plan from there"
                     + (f"; from SFT step {cfg.sft_slip_from} on" if cfg.sft_slip_from else ""))
    if cfg.sft_dagger_prob > 0:
        lines.append(f"SFT DAgger demonstrations: {cfg.sft_dagger_prob:.0%} of transcripts replay the policy's own "
                     "episode on the task (sampled as declared above, not imitated) to a uniformly drawn turn, then "
                     "the planner's shortest plan from there"
                     + (f"; from SFT step {cfg.sft_dagger_from} on" if cfg.sft_dagger_from else ""))
    if cfg.sft_observation_weight > 0:
        lines.append(f"SFT auxiliary loss: + {cfg.sft_observation_weight} * mean NLL of the environment's tokens "
                     "(prompt and observations) in the demonstrations")
    if cfg.sft_probe_weight > 0:
        lines.append(f"SFT auxiliary loss: + {cfg.sft_probe_weight} * mean binary cross-entropy of a linear probe on the "
                     + ("last hidden state" if cfg.sft_probe_layer is None else f"output of block {cfg.sft_probe_layer}")
                     + (" at each base item of the prompt" if cfg.sft_probe_scope == "base" else
                        " at each item of the prompt's recipe and base lines")
                     + ": is it in the goal's tree (as far as the lines so far show)? "
                     + f"(Crafting.probe_labels, scope {cfg.sft_probe_scope!r})")
    lines.append(f"phase {2 if sft else 1} ({cfg.steps} steps, batch {cfg.batch_size} = "
                 f"{cfg.batch_size // cfg.group_size} tasks x {cfg.group_size}, lr={cfg.lr}): {algo.describe()}")
    if cfg.guide_coef:
        lines.append(f"planner guidance: loss += {cfg.guide_coef} * SFT loss (token mean) on the planner's demonstration "
                     "of each task whose group no sample solved")
    if cfg.resample_rounds:
        lines.append(f"dynamic sampling: up to {cfg.resample_rounds} more rounds of {cfg.batch_size // cfg.group_size} "
                     "fresh tasks while too few groups have unequal rewards; the update takes those groups first, "
                     "then all-equal ones, to the same batch size")
    if cfg.entropy_coef > 0:
        lines.append(f"entropy bonus: s_ij += {cfg.entropy_coef} * H(pi(. | x_<ij))")
    lines.append(f"optimizer: Adam(lr={cfg.lr}, betas=(0.9, 0.99), weight_decay={cfg.weight_decay}); "
                 f"gradient-norm clipping at {cfg.grad_clip}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- one update
def loss_and_stats(
    model, batch: RolloutBatch, advantages: Tensor, algo: Algorithm, cfg: TrainConfig,
    ref_logprobs: Tensor | None = None, loss_fn: Callable | None = None, probe_targets: Tensor | None = None,
) -> tuple[Tensor, dict]:
    """The loss of one (mini)batch, globally normalised over workers, and its diagnostics.

    ``loss = -reduce_loss(aggregate(surrogate, mask, objective))``; with a student ``loss_fn`` the loss is
    ``loss_fn(logprobs, mask, advantages, max_tokens)`` instead: a 0-dim tensor is used as it is, a pair
    ``(numerator, denominator)`` becomes ``reduce_loss(numerator, denominator)`` (see :func:`train`).
    ``probe_targets [B, L]`` (1/0, -1 for none; :func:`demonstration_probe_targets`) adds ``cfg.sft_probe_weight`` times
    the probe's mean binary cross-entropy over the targeted tokens.
    """
    if probe_targets is not None:
        z, probe = policy_logits(model, batch, batch.temperature, with_probe=True)
    else:
        z = policy_logits(model, batch, batch.temperature)
    targets = batch.input_ids[:, 1:]
    logprobs = token_logprobs(z, targets)  # [B, L-1]
    mask = algo.loss_mask(batch, advantages)
    stats: dict[str, Any] = {}
    need_entropy = cfg.entropy_coef > 0
    with torch.set_grad_enabled(need_entropy and torch.is_grad_enabled()):
        ent = entropy_from_logits(z)  # [B, L-1]
    am = batch.action_mask
    n_tok = am.sum().clamp(min=1)
    stats["entropy"] = float((ent.detach() * am).sum() / n_tok)
    if loss_fn is not None:
        loss = loss_fn(logprobs, mask, advantages, algo.max_tokens)
        if isinstance(loss, tuple) and len(loss) == 2 and all(isinstance(x, Tensor) and x.ndim == 0 for x in loss):
            loss = reduce_loss(*loss)  # the normaliser summed over workers
        elif not (isinstance(loss, Tensor) and loss.ndim == 0):
            raise ValueError(f"loss_fn must return a 0-dim tensor or a pair (numerator, denominator) of 0-dim "
                             f"tensors, got {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}")
    else:
        s, pstats = algo.surrogate(logprobs, batch, advantages, ref_logprobs)
        if need_entropy:
            s = s + cfg.entropy_coef * ent
        num, den = aggregate(s, mask, algo.objective, turn_ids=batch.turn_ids, max_tokens=algo.max_tokens)
        loss = reduce_loss(-num, den)
        for k, v in pstats.items():
            stats[k] = float(v)
        if algo.name == "sft" and cfg.sft_observation_weight > 0:
            # Predicting the environment's replies (what a craft consumes, which items are base) exercises the
            # same look-ups in the prompt that choosing an action needs, on ~5x more tokens per transcript (crafting).
            env_tokens = batch.attention_mask[:, 1:] & ~batch.action_mask
            o_num, o_den = aggregate(logprobs, env_tokens, "token_mean")
            observation_nll = -reduce_loss(o_num, o_den)
            loss = loss + cfg.sft_observation_weight * observation_nll
            stats["observation_nll"] = float(observation_nll.detach())
    if probe_targets is not None:
        # Dense supervision of the feature the first gets need: which listed base items the goal's tree uses.
        # Each SFT transcript has ~3 such get decisions but 3-8 base items with a 1/0 answer apiece.
        targeted = probe_targets >= 0
        target = probe_targets.clamp(min=0).float()
        bce = torch.nn.functional.binary_cross_entropy_with_logits(probe, target, reduction="none")
        p_num, p_den = aggregate(bce, targeted, "token_mean")
        probe_loss = reduce_loss(p_num, p_den)
        loss = loss + cfg.sft_probe_weight * probe_loss
        stats["probe_loss"] = float(probe_loss.detach())
        stats["probe_accuracy"] = float(((probe.detach() > 0) == (target > 0))[targeted].float().mean())
    with torch.no_grad():
        lr_tok = token_log_ratios(logprobs.detach(), batch.old_logprobs, am)  # log pi/mu on action tokens
        ratio = lr_tok.exp()[am]
        if algo.uses_rollouts and ratio.numel():
            stats["ratio_mean"] = float(ratio.mean())
            stats["ratio_max"] = float(ratio.max())
            # KL(mu || pi) from the behaviour samples: k3 with log r = log pi - log mu
            stats["kl_behaviour"] = float(kl_estimate(batch.old_logprobs, logprobs.detach(), "k3", am).sum() / n_tok)
            # ESS of the per-episode importance weights prod_j pi/mu, as a share of the batch
            stats["ess_fraction"] = float(effective_sample_size((lr_tok * am).sum(-1), log_weights=True)) / len(am)
        if ref_logprobs is not None:
            stats["kl_reference"] = float(kl_estimate(logprobs.detach(), ref_logprobs, "k3", am).sum() / n_tok)
    if "clip_frac_pos" in stats:
        n_pos, n_neg = stats.get("n_pos", 0.0), stats.get("n_neg", 0.0)
        stats["clip_fraction"] = (stats["clip_frac_pos"] * n_pos + stats["clip_frac_neg"] * n_neg) / max(n_pos + n_neg, 1)
    for k in ("n_pos", "n_neg", "n_tokens", "approx_kl", "ratio_min"):
        stats.pop(k, None)
    return loss, stats


def optimizer_step(model, optimizer, loss: Tensor, grad_clip: float) -> dict:
    """Backward, clip the global gradient norm, step. Returns the norm before and after clipping."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    before = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
    after = min(before, grad_clip) if math.isfinite(before) else float("nan")
    optimizer.step()
    return {"grad_norm_before": before, "grad_norm_after": after}


# ----------------------------------------------------------------------------- the loop
def train(
    config: TrainConfig | None = None,
    advantage_fn: Callable[[Tensor, int], Tensor] | None = None,
    loss_fn: Callable[[Tensor, Tensor, Tensor, int], Tensor] | None = None,
    progress: bool = True,
    **overrides: Any,
) -> TrainResult:
    """Train a policy from scratch; see :class:`TrainConfig`. Keyword ``overrides`` replace config fields.

    Student hooks: ``advantage_fn(rewards [B], group_size) -> [B]`` replaces the algorithm's advantage;
    ``loss_fn(logprobs [B, L-1], action_mask [B, L-1], advantages [B], max_tokens)`` replaces its surrogate
    and normalisation. It returns either the loss (a 0-dim tensor) or a pair ``(numerator, denominator)``
    of the loss to minimise. Under DDP the gradient is averaged over workers, so a returned loss is exact
    for a normaliser fixed per sequence (Dr.GRPO's ``B * max_tokens``: every worker holds ``B / W``
    episodes); a normaliser that depends on the data (a token count) must come as the pair, whose
    denominator is summed over workers (:func:`~agent_lab.estimators.aggregation.reduce_loss`).
    """
    cfg = copy.deepcopy(config) if config is not None else TrainConfig()
    for k, v in overrides.items():
        if not hasattr(cfg, k):
            raise ValueError(f"unknown TrainConfig field {k!r}")
        setattr(cfg, k, v)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg.validate(world)  # every check before any work
    device = pick_device(cfg.device)
    threads_before = torch.get_num_threads()
    if device.type == "cpu" and cfg.cpu_threads > 0:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        return _train(cfg, device, advantage_fn, loss_fn, progress)
    finally:
        torch.set_num_threads(threads_before)


def _train(cfg: TrainConfig, device: torch.device, advantage_fn, loss_fn, progress: bool) -> TrainResult:
    if loss_fn is not None and cfg.algo == "ppo":
        raise ValueError("loss_fn replaces the REINFORCE-style surrogate; it cannot be combined with algo='ppo'")
    info = D.setup(device.type)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
    amp_dtype = torch.bfloat16 if (cfg.bf16 and device.type == "cuda") else None

    env = build_env(cfg)
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(cfg.seed)  # identical initial weights on every worker
    model = TinyTransformer(ModelConfig(len(tok), cfg.d_model, cfg.n_layers, cfg.n_heads, max_len=cfg.max_len,
                                        positions=cfg.positions, probe=cfg.sft_probe_weight > 0,
                                        probe_layer=cfg.sft_probe_layer)).to(device)
    max_tok = max_action_tokens(env)
    rl_algo = "sft" if cfg.algo == "sft" else cfg.algo
    epochs = cfg.ppo_epochs if rl_algo == "ppo" else cfg.rest_em_epochs if rl_algo == "rest_em" else 1
    algo = make_algorithm(rl_algo, group_size=cfg.group_size, max_tokens=max_tok, objective=cfg.objective,
                          epochs=epochs, baseline=cfg.baseline, baseline_value=cfg.baseline_value,
                          reward_to_go=cfg.reward_to_go, gamma=cfg.gamma, clip_eps=cfg.clip_eps,
                          kl_coef=cfg.kl_coef, kl_kind=cfg.kl_kind, minibatches=cfg.minibatches,
                          threshold=cfg.rest_em_threshold)
    sft = make_algorithm("sft", group_size=1, max_tokens=max_tok) if cfg.sft_steps > 0 and rl_algo != "sft" else None
    guide_algo = (sft or make_algorithm("sft", group_size=1, max_tokens=max_tok)) if cfg.guide_coef else None
    description = describe_run(cfg, algo, sft, model.num_parameters())
    if advantage_fn is not None:
        description += "\nadvantage: replaced by the user's advantage_fn(rewards, group_size)"
    if loss_fn is not None:
        description += "\nloss: replaced by the user's loss_fn(logprobs, action_mask, advantages, max_tokens)"

    run_dir = Path(cfg.run_dir) if cfg.run_dir else Path(tempfile.mkdtemp(prefix=f"agent-lab-{cfg.env}-{cfg.algo}-"))
    ddp_model = model
    if info.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(model, device_ids=[info.local_rank] if device.type == "cuda" else None,
                        find_unused_parameters=model.probe is not None)  # the probe sits out the RL phase
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    state = AlgoState()
    ref_model: TinyTransformer | None = None
    history: list[dict] = []
    start, elapsed0, episodes = 0, 0.0, 0
    reached: dict | None = None
    ckpt = run_dir / "checkpoint.pt"
    if cfg.resume:
        if not ckpt.exists():
            raise ValueError(f"resume=True but {ckpt} does not exist")
        _, _, saved = load_checkpoint(ckpt, device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = AlgoState(**saved["algo_state"])
        start, elapsed0, episodes = saved["step"], saved["elapsed_s"], saved["episodes"]
        history, reached = saved["history"], saved.get("reached_optimum_at")
        if saved.get("ref_model") is not None:
            ref_model = TinyTransformer(model.cfg).to(device)
            ref_model.load_state_dict(saved["ref_model"])
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        (run_dir / "loss.txt").write_text(description + "\n")
        if progress:
            print(description, file=sys.stderr)
    writer = MetricsWriter(run_dir, resume=cfg.resume) if info.is_main else None
    if writer is not None and cfg.resume:
        writer.truncate(start)

    def save(step: int) -> None:
        if info.is_main:
            save_checkpoint(ckpt, model, tok, optimizer=optimizer.state_dict(), algo_state=state.to_dict(),
                            step=step, elapsed_s=elapsed0 + time.perf_counter() - t0, episodes=episodes,
                            history=history, config=cfg.to_dict(), reached_optimum_at=reached,
                            ref_model=ref_model.state_dict() if ref_model is not None else None,
                            loss_description=description)

    bar = None
    if progress and info.is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.total_steps, initial=start, desc=f"{cfg.algo}", file=sys.stderr, leave=True)
    t0 = time.perf_counter()
    end = cfg.total_steps if cfg.stop_after is None else min(cfg.total_steps, cfg.stop_after)
    for step in range(start, end):
        is_sft = step < cfg.sft_phase_steps
        lr_now = sft_lr_at(cfg, step) if is_sft else cfg.lr
        for g in optimizer.param_groups:
            g["lr"] = lr_now
        row: dict[str, Any] = {"step": step, "phase": "sft" if is_sft else cfg.algo, "lr": lr_now}
        ts = time.perf_counter()
        if is_sft:
            tasks = env.sample_tasks(_task_rng(cfg, step), cfg.sft_batch_size, split="train")[D.shard(cfg.sft_batch_size, info)]
            slip_prob = cfg.sft_slip_prob if step >= cfg.sft_slip_from else 0.0
            acts = None
            if cfg.sft_dagger_prob > 0 and step >= cfg.sft_dagger_from:
                acts, dagger_row = dagger_actions(model, tok, env, tasks, cfg, step, info, device, amp_dtype)
                row.update(dagger_row)
            batch = demonstration_batch(env, tok, tasks, device, slip_prob=slip_prob, policy_actions=acts,
                                        seed_or_rng=np.random.default_rng([cfg.seed, step, 11, info.rank]))
            algo_now = sft or algo
            adv = algo_now.advantages(batch, state)
            targets = (demonstration_probe_targets(env, tasks, tuple(batch.input_ids.shape), device, cfg.sft_probe_scope)
                       if cfg.sft_probe_weight else None)
            with _autocast(device, amp_dtype):
                loss, st = loss_and_stats(ddp_model, batch, adv, algo_now, cfg, probe_targets=targets)
            st.update(optimizer_step(model, optimizer, loss, cfg.grad_clip))
            row.update(st, loss=float(loss.detach()), success=float(batch.success.float().mean()))
            n_ep = cfg.sft_batch_size
        else:
            if cfg.kl_coef > 0 and ref_model is None:  # the frozen reference: the policy when RL starts
                ref_model = copy.deepcopy(model).eval()
            sampling = SamplingConfig(cfg.temperature, cfg.top_p, "sampled", cfg.candidate_mask)
            batch, sampled, rounds = collect_groups(model, tok, env, cfg, step, info, sampling, device, amp_dtype)
            t_roll = time.perf_counter() - ts
            rewards = batch.episode_return
            if advantage_fn is not None:
                adv = advantage_fn(rewards, cfg.group_size)
                if not (isinstance(adv, Tensor) and adv.shape == rewards.shape):
                    raise ValueError(f"advantage_fn must return a tensor of shape {tuple(rewards.shape)}, got "
                                     f"{type(adv).__name__} {tuple(getattr(adv, 'shape', ()))}")
            else:
                adv = algo.advantages(batch, state)
            guide = None
            if cfg.guide_coef:  # the planner shows the tasks no sample solved (their centred advantages are all 0)
                unsolved = unsolved_groups(batch.success.float(), cfg.group_size).nonzero().reshape(-1).tolist()
                if unsolved:
                    guide = demonstration_batch(env, tok, [batch.tasks[g * cfg.group_size] for g in unsolved], device)
                row["guided_groups"] = len(unsolved)
            ref_lp = None
            if ref_model is not None:
                with torch.no_grad(), _autocast(device, amp_dtype):
                    ref_lp = token_logprobs(policy_logits(ref_model, batch, batch.temperature), batch.input_ids[:, 1:])
            n_mb = cfg.minibatches if rl_algo == "ppo" else 1
            per = len(batch) // n_mb
            stats_acc: list[dict] = []
            for _epoch in range(algo.epochs):
                for m in range(n_mb):
                    idx = slice(m * per, (m + 1) * per)
                    mb = batch if n_mb == 1 else batch.select(torch.arange(len(batch))[idx])
                    mb_adv = adv if n_mb == 1 else adv[idx]
                    mb_ref = ref_lp if (ref_lp is None or n_mb == 1) else ref_lp[idx][:, : mb.input_ids.shape[1] - 1]
                    with _autocast(device, amp_dtype):
                        loss, st = loss_and_stats(ddp_model, mb, mb_adv, algo, cfg, mb_ref, loss_fn)
                        if guide is not None:
                            g_adv = guide_algo.advantages(guide, state)
                            g_loss, _ = loss_and_stats(ddp_model, guide, g_adv, guide_algo, cfg)
                            loss = loss + cfg.guide_coef * g_loss
                            st["guide_nll"] = float(g_loss.detach())
                    st.update(optimizer_step(model, optimizer, loss, cfg.grad_clip))
                    st["loss"] = float(loss.detach())
                    stats_acc.append(st)
            first, last = stats_acc[0], stats_acc[-1]
            row.update(last)
            row["kl_behaviour"] = last.get("kl_behaviour", float("nan"))
            row["ratio_max"] = max(s.get("ratio_max", float("nan")) for s in stats_acc)
            row["ratio_first_epoch"] = first.get("ratio_mean", float("nan"))
            row["grad_norm_before"] = first["grad_norm_before"]
            row["grad_norm_after"] = first["grad_norm_after"]
            every = sampled.episode_return  # reward, success and all-equal groups of every sampled episode
            row.update(
                reward_mean=float(every.mean()), reward_std=float(every.std()) if len(every) > 1 else 0.0,
                success=float(sampled.success.float().mean()),
                degenerate_fraction=float(degenerate_group_fraction(every, cfg.group_size)),
                advantage_abs_mean=float(adv.abs().mean()),
                episode_turns=float(batch.num_turns.float().mean()),
                action_tokens=float(batch.num_action_tokens.float().mean()),
                rollout_s=t_roll, policy_lag=0,
            )
            if cfg.resample_rounds:
                row["rollout_rounds"] = D.all_mean(float(rounds), info)
                row["update_degenerate_fraction"] = float(degenerate_group_fraction(rewards, cfg.group_size))
            n_ep = cfg.batch_size  # every sampled episode counts, on every worker
            if cfg.resample_rounds:
                n_ep = round(D.all_mean(float(len(sampled)), info) * info.world_size)
        for k in ("success", "reward_mean", "loss", "observation_nll"):
            if k in row:
                row[k] = D.all_mean(row[k], info)
        episodes += n_ep
        row["episodes"] = episodes
        row["step_s"] = time.perf_counter() - ts
        row["elapsed_s"] = elapsed0 + time.perf_counter() - t0
        last_step = step == end - 1
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last_step:
            rep = evaluate(model, env, cfg.eval_split, "greedy", tokenizer=tok, seed=cfg.seed,
                           candidate_mask=cfg.candidate_mask)
            row.update(eval_success=rep.success, optimum=rep.optimum)
            if reached is None and rep.success >= rep.optimum - 1e-9:
                reached = {"step": step + 1, "seconds": row["elapsed_s"], "episodes": episodes}
        history.append(row)
        if writer is not None:
            writer.write(row)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(success=f"{row.get('success', float('nan')):.2f}",
                            eval=f"{row.get('eval_success', float('nan')):.2f}")
        if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
            save(step + 1)
        stop = (cfg.stop_at_optimum and reached is not None) or (
            cfg.time_limit_s is not None and row["elapsed_s"] >= cfg.time_limit_s)
        if D.all_mean(float(stop), info) > 0:  # every worker stops at the same step
            end = step + 1
            break
    if bar is not None:
        bar.close()
    save(end)
    final = evaluate(model, env, cfg.eval_split, "greedy", tokenizer=tok, seed=cfg.seed,
                           candidate_mask=cfg.candidate_mask)
    seconds = elapsed0 + time.perf_counter() - t0
    if writer is not None:
        writer.flush_csv()
        plot_curves(history, run_dir / "curves.png", title=f"{cfg.env} {cfg.algo} seed {cfg.seed}")
        (run_dir / "final_eval.json").write_text(json.dumps(final.to_dict(), indent=2))
    return TrainResult(model, tok, history, final, run_dir, description, seconds, episodes, reached)


class _autocast:
    """bf16 autocast on CUDA when requested, a no-op elsewhere."""

    def __init__(self, device, dtype):
        self.ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else None

    def __enter__(self):
        return self.ctx.__enter__() if self.ctx is not None else None

    def __exit__(self, *a):
        return self.ctx.__exit__(*a) if self.ctx is not None else False
