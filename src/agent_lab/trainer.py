"""The training loop, one process or ``torchrun --nproc_per_node N`` (DDP) (book/part3/00_number_search.md).

A run is a cold start on the planner's demonstrations (SFT), then RL; each phase is a loop of steps over one
run state (:class:`Run`: environment, policy, optimizer, counters, metrics writer)::

    run = start_run(cfg, init)            environment, policy, optimizer; a checkpoint or an earlier run
    SFT step:  demonstrations -> loss -> update
    RL step:   collect -> advantages -> loss -> update      (epochs x minibatches x micro-batches)
    each step: finish_step                evaluate, log, checkpoint, stop at the optimum or the time limit
    finish_run                            checkpoint, final evaluation, curves

:func:`train_sft` and :func:`train_rl` run one phase each and compose: ``train_rl(cfg, init=train_sft(cfg))``
trains what ``train(cfg)`` trains. Every setting is a field of :class:`~agent_lab.config.TrainConfig`; the
algorithm (:mod:`agent_lab.algorithms`) says what its update needs, the labs' experiments are plug-ins
(:mod:`agent_lab.plugins`), and the run prints and saves its exact loss (lecture notes section 7: report the
exact loss).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from agent_lab import distributed as D
from agent_lab import timing
from agent_lab.ahead import Ahead
from agent_lab.algorithms import AlgoState, Algorithm, make_algorithm
from agent_lab.branching import continuation_returns
from agent_lab.config import OptimizerConfig, TrainConfig
from agent_lab.critic import policy_features
from agent_lab.device import HeapTrimmer, autocast_dtype, map_large_blocks, pick_device, release_freed_memory
from agent_lab.diagnostics import (MetricsWriter, Progress, describe_run, phase_times, plot_curves, rejected_share,
                                   rollout_diagnostics, summarise_updates)
from agent_lab.estimators.logprobs import token_logprobs
from agent_lab.evaluation import EvalReport, evaluate, load_checkpoint, model_config, save_checkpoint
from agent_lab.plugins import AuxiliaryLoss, Collector, DemonstrationSource, Plugin, make_plugins
from agent_lab.policy import TinyTransformer, WordTokenizer
from agent_lab.preflight import check_config
from agent_lab.rollout import RolloutBatch, demonstration_batch
from agent_lab.streams import branch_generator, demonstration_rng, group_rollouts, task_rng
from agent_lab.timing import span
from agent_lab.update import gradient_step, loss_and_stats, policy_logits, take

# rejected_share lives in diagnostics; it stays importable from here for bench/bench_no_mask.py and the book
__all__ = ["train", "train_sft", "train_rl", "TrainConfig", "TrainResult", "Run", "policy_logits", "loss_and_stats",
           "max_action_tokens", "sft_lr_at", "rejected_share"]

AdvantageFn = Callable[[Tensor, int], Tensor]
LossFn = Callable[[Tensor, Tensor, Tensor, int], Any]


@dataclass
class TrainResult:
    """What a phase or a run returns: the trained policy and its tokenizer, per-step diagnostics, the final
    greedy evaluation, and the run directory (config.json, loss.txt, metrics.jsonl/csv, curves.png,
    checkpoint.pt, final_eval.json). A result is a valid ``init`` for :func:`train_rl`."""

    policy: TinyTransformer
    tokenizer: WordTokenizer
    history: list[dict]
    final_eval: EvalReport | None
    run_dir: Path
    loss_description: str
    seconds: float
    episodes: int
    reached_optimum_at: dict | None = None  # {"step", "seconds", "episodes"} when greedy success hit the optimum
    config: TrainConfig | None = None
    stopped: str | None = None  # "optimum" or "time limit" when the run stopped before its last step

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoint.pt"


@dataclass
class Run:
    """The state one run threads through its steps. Plug-ins read it; only the loop below changes it."""

    cfg: TrainConfig
    env: Any
    tok: WordTokenizer
    model: TinyTransformer
    ddp_model: Any  # the DDP wrapper under torchrun, else the model itself
    optimizer: torch.optim.Optimizer
    device: torch.device
    amp_dtype: torch.dtype | None
    info: D.DistInfo
    algo: Algorithm
    sft_algo: Algorithm
    plugins: list[Plugin]
    run_dir: Path
    state: AlgoState = field(default_factory=AlgoState)
    ref_model: TinyTransformer | None = None  # the frozen policy when RL starts, if the algorithm needs one
    step: int = 0
    episodes: int = 0
    elapsed0: float = 0.0  # seconds of earlier sessions (a resumed run)
    t0: float = field(default_factory=time.perf_counter)
    history: list[dict] = field(default_factory=list)
    reached: dict | None = None
    stopped: str | None = None
    last_eval: EvalReport | None = None
    trim_heap: HeapTrimmer = field(default_factory=HeapTrimmer)  # after each step and rollout: freed memory to the OS
    description: str = ""
    precision: str = "float32"  # the autocast dtype (or float32) and why (device.autocast_dtype)
    writer: MetricsWriter | None = None
    # the user's functions in place of the algorithm's (train's advantage_fn, loss_fn): RL steps only
    advantage_fn: AdvantageFn | None = None
    loss_fn: LossFn | None = None
    # plain data that a program driving the loop keeps with the run (bench/crafting_curve.py's curve so far):
    # saved in every checkpoint and restored with it, so the driver resumes exactly where the run does
    driver_state: dict = field(default_factory=dict)
    ahead: Ahead | None = None  # SFT batches built a step ahead on a second thread (cfg.run.prepare_ahead)

    def amp(self):
        """Autocast to ``amp_dtype`` (bf16 on CUDA, or on a fast-bf16 CPU with cpu_bf16), else a no-op."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def elapsed(self) -> float:
        return self.elapsed0 + time.perf_counter() - self.t0

    def of_kind(self, kind: type, phase: str | None = None) -> list:
        return [p for p in self.plugins if isinstance(p, kind) and (phase is None or p.phase == phase)]


def make_optimizer(params, o: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW(lr, betas=(0.9, 0.99), weight_decay): the decay is decoupled, ``theta <- theta * (1 - lr * wd)``
    beside the Adam step, so its pull does not pass through Adam's per-weight normalisation (with an L2 term
    in the gradient it would, and a weight with small gradients would be decayed hardest). At ``wd = 0`` it is
    Adam."""
    return torch.optim.AdamW(params, lr=o.lr, betas=(0.9, 0.99), weight_decay=o.weight_decay)


# ----------------------------------------------------------------------------- entry points
def train(config: TrainConfig | None = None, advantage_fn: AdvantageFn | None = None, loss_fn: LossFn | None = None,
          progress: bool = True, **overrides: Any) -> TrainResult:
    """Train a policy from scratch: the SFT cold start (``sft.steps``), then RL (``algorithm.steps``).

    Keyword ``overrides`` replace settings (flat keywords such as ``lr=1e-3`` or sections). Student hooks:
    ``advantage_fn(rewards [B], group_size) -> [B]`` replaces the algorithm's advantage; ``loss_fn(logprobs
    [B, L-1], action_mask [B, L-1] bool, advantages [B], max_tokens)`` replaces its surrogate and normalisation
    and returns the loss (a 0-dim tensor) or a pair ``(numerator, denominator)``; for PPO, whose clipped
    surrogate is not REINFORCE's, it is ``loss_fn(logprobs, old_logprobs, advantages, action_mask, clip_eps,
    ref_logprobs, kl_coef) -> (loss, stats)`` (each algorithm's ``user_loss`` says). Under DDP the gradient is
    averaged over workers, so a returned loss is exact for a normaliser fixed per sequence (Dr.GRPO's ``B *
    max_tokens``: every worker holds ``B / W`` episodes); a normaliser that depends on the data (a token count)
    must come as the pair, whose denominator is summed over workers (``estimators.reduce_loss``).
    """
    cfg = _prepare(config, overrides, loss_fn)
    with _cpu_threads(cfg):
        run = start_run(cfg, phases=("sft", "rl"), advantage_fn=advantage_fn, loss_fn=loss_fn, progress=progress)
        if run.step < cfg.sft.steps:
            run_phase(run, cfg.sft.steps, progress)
        if run.stopped is None and run.step < cfg.total_steps:
            run_phase(run, cfg.total_steps, progress)
        return finish_run(run)


def train_sft(config: TrainConfig | None = None, *, progress: bool = True, **overrides: Any) -> TrainResult:
    """The cold start alone: ``sft.steps`` supervised steps, a run of its own (its own run directory and
    checkpoint). Continue it with ``train_rl(config, init=result)``."""
    cfg = _prepare(config, overrides)
    if cfg.sft.steps < 1:
        raise ValueError("train_sft needs sft_steps >= 1")
    with _cpu_threads(cfg):
        run = start_run(cfg, phases=("sft",), progress=progress)
        if run.step < cfg.sft.steps:
            run_phase(run, cfg.sft.steps, progress)
        return finish_run(run)


def train_rl(config: TrainConfig | None = None, *, init: TrainResult | str | Path | TinyTransformer | None = None,
             advantage_fn: AdvantageFn | None = None, loss_fn: LossFn | None = None, progress: bool = True,
             **overrides: Any) -> TrainResult:
    """The RL phase: steps ``sft.steps .. sft.steps + algorithm.steps - 1`` of the run.

    ``init`` is where RL starts: a :class:`TrainResult` or a checkpoint (or run directory) continues that run
    (weights, optimizer state, counters and history); a policy starts from its weights with a fresh
    optimizer; ``None`` starts from random weights, which needs ``sft.steps == 0``. ``resume=True`` continues
    this run's own checkpoint instead. Student hooks as in :func:`train`.
    """
    cfg = _prepare(config, overrides, loss_fn)
    if cfg.algorithm.steps < 1:
        raise ValueError("train_rl needs steps >= 1")
    if init is None and not cfg.run.resume and cfg.sft.steps > 0:
        raise ValueError(f"RL starts after the {cfg.sft.steps}-step cold start: pass init=train_sft(config), or set "
                         "sft_steps=0 to start RL from random weights")
    with _cpu_threads(cfg):
        run = start_run(cfg, phases=("rl",), init=init, advantage_fn=advantage_fn, loss_fn=loss_fn,
                        progress=progress)
        if run.step < cfg.sft.steps:
            raise ValueError(f"RL starts after the {cfg.sft.steps}-step cold start, but the run is at step {run.step}: "
                             "pass init=train_sft(config) (or a checkpoint that finished it), or set sft_steps=0")
        run_phase(run, cfg.total_steps, progress)
        return finish_run(run)


def _prepare(config: TrainConfig | None, overrides: dict, loss_fn: LossFn | None = None) -> TrainConfig:
    """The run's configuration with ``overrides`` applied, checked in full before any work."""
    cfg = (config or TrainConfig()).replace(**overrides)
    check_config(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    if loss_fn is not None and cfg.run.micro_batch_size:
        raise ValueError("micro_batch_size splits the loss's normaliser, which a loss_fn keeps to itself: set "
                         "micro_batch_size=0 with loss_fn")
    return cfg


@contextlib.contextmanager
def _cpu_threads(cfg: TrainConfig):
    """Torch's intra-op threads for the run on the CPU (restored after): on a busy machine OpenMP spin-waiting
    makes more threads slower for models this small."""
    before = torch.get_num_threads()
    if pick_device(cfg.run.device).type == "cpu" and cfg.run.cpu_threads > 0:
        torch.set_num_threads(cfg.run.cpu_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- the run state
def build_env(cfg: TrainConfig):
    from agent_lab.envs import make_env

    opts = dict(cfg.env_options)
    if cfg.sampling.candidate_mask:
        opts["mask_actions"] = True
    return make_env(cfg.env, **opts)


def max_action_tokens(env) -> int:
    """Most policy tokens an episode can hold (``TextEnv.max_policy_tokens``): Dr.GRPO's constant normaliser."""
    return int(env.max_policy_tokens)


def start_run(cfg: TrainConfig, phases: tuple[str, ...], init=None, advantage_fn: AdvantageFn | None = None,
              loss_fn: LossFn | None = None, progress: bool = False) -> Run:
    """Build the run: environment, tokenizer, policy (seeded), optimizer, the user's functions; then restore a
    checkpoint (``resume``) or continue ``init``; write config.json and loss.txt and open the metrics."""
    map_large_blocks()  # large tensors straight back to the OS when freed, so held memory cannot creep up
    device = pick_device(cfg.run.device)
    info = D.setup(device.type)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
    env = build_env(cfg)
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(cfg.seed)  # identical initial weights on every worker
    model = TinyTransformer(dataclasses.replace(cfg.model, vocab_size=len(tok))).to(device)
    ddp_model = model
    if info.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(model, device_ids=[info.local_rank] if device.type == "cuda" else None)
    o = cfg.optimizer
    optimizer = make_optimizer(model.parameters(), o)
    max_tok = max_action_tokens(env)
    run_dir = Path(cfg.run.run_dir) if cfg.run.run_dir else Path(tempfile.mkdtemp(prefix=f"agent-lab-{cfg.env}-"))
    amp_dtype, precision = autocast_dtype(device, cfg.run.bf16, cfg.run.cpu_bf16)
    run = Run(cfg, env, tok, model, ddp_model, optimizer, device, amp_dtype, info,
              cfg.algorithm.build(max_tok), make_algorithm("sft", group_size=1, max_tokens=max_tok),
              make_plugins(cfg.plugins), run_dir, advantage_fn=advantage_fn, loss_fn=loss_fn, precision=precision)
    source = run_dir / "checkpoint.pt" if cfg.run.resume else init
    if cfg.run.resume and not source.exists():
        raise ValueError(f"resume=True but {source} does not exist")
    if isinstance(source, TinyTransformer):
        model.load_state_dict(source.state_dict())
        run.step = cfg.sft.steps
    elif source is not None:
        restore(run, source.checkpoint if isinstance(source, TrainResult) else Path(source))
    run.description = describe_run(run, phases)
    run.ahead = _prepare_ahead(run)
    _open_run_dir(run, progress)
    return run


def restore(run: Run, path: Path) -> None:
    """Continue the run saved at ``path`` (a checkpoint or its directory): weights, optimizer, counters, history."""
    _, tok, saved = load_checkpoint(path, run.device)
    if tok.vocab != run.tok.vocab:
        raise ValueError(f"{path}: the checkpoint's vocabulary differs from env {run.cfg.env!r} "
                         f"{run.cfg.env_options}'s; use the environment options it was trained with")
    mine = dataclasses.replace(run.model.cfg, vocab_size=None)
    theirs = dataclasses.replace(model_config(saved), vocab_size=None)
    if mine != theirs:
        diff = [f"{f.name}: {getattr(theirs, f.name)!r} (config: {getattr(mine, f.name)!r})"
                for f in dataclasses.fields(mine) if getattr(mine, f.name) != getattr(theirs, f.name)]
        raise ValueError(f"{path}: the checkpoint's policy differs from the configuration's model: {', '.join(diff)}")
    run.model.load_state_dict(saved["model"])
    if "optimizer" not in saved:  # a policy alone (save_checkpoint's export): its weights, a fresh optimizer
        if run.cfg.run.resume:
            raise ValueError(f"{path} holds a policy alone (no optimizer state, counters or history), so no run "
                             "resumes from it: pass it as init= to start the RL phase from its weights")
        run.step = run.cfg.sft.steps
        return
    run.optimizer.load_state_dict(saved["optimizer"])
    run.state = AlgoState(**saved["algo_state"])
    if saved.get("algorithm") and saved.get("config", {}).get("algorithm", {}).get("name") == run.algo.name:
        run.algo.load_state_dict(saved["algorithm"])  # a critic; an SFT checkpoint or another algorithm has none
    run.step, run.elapsed0, run.episodes = saved["step"], saved["elapsed_s"], saved["episodes"]
    run.history, run.reached = list(saved["history"]), saved.get("reached_optimum_at")
    run.driver_state = dict(saved.get("driver_state") or {})
    if saved.get("ref_model") is not None:
        run.ref_model = TinyTransformer(run.model.cfg).to(run.device)
        run.ref_model.load_state_dict(saved["ref_model"])
        run.ref_model.eval()


def _open_run_dir(run: Run, progress: bool) -> None:
    if not run.info.is_main:
        return
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "config.json").write_text(json.dumps(run.cfg.to_dict(), indent=2))
    (run.run_dir / "loss.txt").write_text(run.description + "\n")
    if progress:
        print(run.description, file=sys.stderr)
    run.writer = MetricsWriter(run.run_dir)
    for row in run.history:  # a resumed or continued run's earlier steps, each once
        run.writer.write(row)


def save(run: Run) -> None:
    if run.info.is_main:
        save_checkpoint(run.run_dir / "checkpoint.pt", run.model, run.tok, optimizer=run.optimizer.state_dict(),
                        algo_state=run.state.to_dict(), step=run.step, elapsed_s=run.elapsed(),
                        episodes=run.episodes, history=run.history, config=run.cfg.to_dict(),
                        reached_optimum_at=run.reached, loss_description=run.description,
                        ref_model=run.ref_model.state_dict() if run.ref_model is not None else None,
                        algorithm=run.algo.state_dict(), driver_state=run.driver_state)


def finish_run(run: Run) -> TrainResult:
    """Checkpoint, final greedy evaluation (the last step's when it has one), metrics CSV and curves; the heap's
    freed memory goes back to the OS (a next phase in this process starts from what it needs, not from ours)."""
    if run.ahead is not None:
        run.ahead.close()
    save(run)
    last = run.history[-1] if run.history else {}
    final = run.last_eval if (run.last_eval is not None and "eval_success" in last) else _evaluate(run)
    if run.writer is not None:
        run.writer.flush_csv()
        plot_curves(run.history, run.run_dir / "curves.png",
                    title=f"{run.cfg.env} {run.algo.name if run.cfg.algorithm.steps else 'sft'} seed {run.cfg.seed}")
        (run.run_dir / "final_eval.json").write_text(json.dumps(final.to_dict(), indent=2))
    release_freed_memory()
    return TrainResult(run.model, run.tok, run.history, final, run.run_dir, run.description, run.elapsed(),
                       run.episodes, run.reached, run.cfg, run.stopped)


def _evaluate(run: Run) -> EvalReport:
    return evaluate(run.model, run.env, run.cfg.evaluation.split, "greedy", tokenizer=run.tok, seed=run.cfg.seed,
                    candidate_mask=run.cfg.sampling.candidate_mask)


# ----------------------------------------------------------------------------- the loop
def run_phase(run: Run, end: int, progress: bool) -> None:
    """Steps ``run.step .. end - 1`` of the phase the run is in (SFT before ``sft.steps``, then RL), each
    finished by :func:`finish_step`."""
    sft = run.step < run.cfg.sft.steps
    bar = Progress(end, run.step, desc="sft" if sft else run.algo.name, enabled=progress and run.info.is_main)
    for step in range(run.step, end):
        timing.take()  # a step's phases start empty (work between steps is no step's)
        t = time.perf_counter()
        row = sft_step(run, step) if sft else rl_step(run, step)
        finish_step(run, row, t, last=step == end - 1)
        bar.update(row)
        if run.stopped is not None:
            break
    bar.close()


def finish_step(run: Run, row: dict, t_start: float, last: bool) -> None:
    """After a step: episode counts, timing, evaluation, the metrics row, checkpoint, and the stop rules.

    ``step_s`` is the step's seconds before its evaluation; ``time_<phase>_s`` (:mod:`agent_lab.timing`) split
    the step and its evaluation into phases, and ``time_other_s`` is what no phase covered."""
    cfg = run.cfg
    for k in ("success", "reward_mean", "loss", "observation_nll"):
        if k in row:
            row[k] = D.all_mean(row[k], run.info)
    run.episodes += row.pop("_episodes")
    step = row["step"]
    row.update(episodes=run.episodes, step_s=time.perf_counter() - t_start, elapsed_s=run.elapsed())
    every = cfg.evaluation.every
    if (every and (step + 1) % every == 0) or last:
        with span("evaluation"):
            run.last_eval = rep = _evaluate(run)
        row.update(eval_success=rep.success, optimum=rep.optimum)
        if run.reached is None and rep.success >= rep.optimum - 1e-9:
            run.reached = {"step": step + 1, "seconds": row["elapsed_s"], "episodes": run.episodes}
    row.update(phase_times(timing.take(), time.perf_counter() - t_start))
    run.history.append(row)
    if run.writer is not None:
        run.writer.write(row)
    run.step = step + 1
    if cfg.run.checkpoint_every and run.step % cfg.run.checkpoint_every == 0:
        save(run)
    reason = ("optimum" if cfg.evaluation.stop_at_optimum and run.reached is not None else
              "time limit" if cfg.run.time_limit_s is not None and row["elapsed_s"] >= cfg.run.time_limit_s else None)
    if D.all_mean(float(reason is not None), run.info) > 0:  # every worker stops at the same step
        run.stopped = reason or "another worker stopped"
    run.trim_heap(time.perf_counter() - t_start)


def sft_lr_at(cfg: TrainConfig, step: int) -> float:
    """The SFT learning rate at ``step``, warmup-stable-decay: over the first W = ``sft.warmup_steps`` steps linear
    up to ``lr0`` = ``sft.lr`` (or the optimizer's lr), constant, then over the last D = ``sft.lr_decay_steps`` of
    the T SFT steps linear to zero:

        lr(s) = lr0 * (s + 1) / W      for s < W                (the first step moves, by lr0 / W)
        lr(s) = lr0                    for W <= s < T - D
        lr(s) = lr0 * (T - s) / D      for T - D <= s < T       (the last step still moves, by lr0 / D)

    The warmup keeps Adam's first steps, whose second-moment estimates rest on a handful of gradients, small;
    annealing lets Adam settle into the minimum that constant-rate noise keeps it circling."""
    lr0 = cfg.sft.lr or cfg.optimizer.lr
    end, d, w = cfg.sft.steps, cfg.sft.lr_decay_steps, cfg.sft.warmup_steps
    if step < w:
        return lr0 * (step + 1) / w
    return lr0 if step < end - d else lr0 * (end - step) / d


def _set_lr(run: Run, lr: float) -> float:
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    return lr


def sft_batch(run: Run, step: int) -> tuple[RolloutBatch, dict]:
    """Step ``step``'s SFT batch: this worker's share of ``sft.batch_size`` tasks and their demonstrations, and
    what the demonstration sources log. Every draw is seeded by the step, so the batch depends on it alone."""
    cfg = run.cfg
    with span("environment"):
        tasks = run.env.sample_tasks(task_rng(cfg.seed, step), cfg.sft.batch_size, split="train")
    tasks = tasks[D.shard(cfg.sft.batch_size, run.info)]
    demos, trained, rng, row = None, None, demonstration_rng(cfg.seed, step, run.info.rank), {}
    with span("demonstrations"):
        for source in run.of_kind(DemonstrationSource):
            demos, trained, figures = source.demonstrations(run, tasks, step, demos, trained, rng)
            row.update(figures)
        batch = demonstration_batch(run.env, run.tok, tasks, run.device, demos=demos, trained=trained)
    return batch, row


def _prepare_ahead(run: Run) -> Ahead | None:
    """With ``run.prepare_ahead``, SFT batches built a step ahead on a second thread, on an environment of its
    own (the run's stays the main thread's); None otherwise or when no SFT step is left."""
    if not run.cfg.run.prepare_ahead or run.step >= run.cfg.sft.steps:
        return None
    view = copy.copy(run)  # what a demonstration source reads; the policy-playing ones are refused (preflight)
    view.env = build_env(run.cfg)
    return Ahead(lambda step: sft_batch(view, step), end=run.cfg.sft.steps)


def sft_step(run: Run, step: int) -> dict:
    """One SFT step: its batch (:func:`sft_batch`, built a step ahead with ``run.prepare_ahead``), one update.
    ``ahead_s``: the seconds a second thread spent building the batch while the step before trained."""
    cfg = run.cfg
    row: dict[str, Any] = {"step": step, "phase": "sft", "lr": _set_lr(run, sft_lr_at(cfg, step))}
    if run.ahead is None:
        batch, figures = sft_batch(run, step)
    else:
        with span("demonstrations"):  # what is left of the wait for the worker
            (batch, figures), row["ahead_s"] = run.ahead.take(step)
    row.update(figures)
    adv = run.sft_algo.advantages(batch, run.state)
    row.update(_gradient_step(run, batch, adv, run.sft_algo, phase="sft"))
    row.update(success=float(batch.success.float().mean()), _episodes=cfg.sft.batch_size)
    return row


def rl_step(run: Run, step: int) -> dict:
    """One RL step: collect, advantages, (reference log-probs), update, diagnostics."""
    row: dict[str, Any] = {"step": step, "phase": run.algo.name, "lr": _set_lr(run, run.cfg.optimizer.lr)}
    if step == run.cfg.sft.steps and run.cfg.sft.steps and run.cfg.optimizer.rl_fresh_optimizer:
        # Adam divides by the running second moment: left from SFT, whose gradients are far larger than a
        # policy gradient's, it would shrink RL's steps until it decays; RL starts as a fresh optimizer would
        run.optimizer.state.clear()
    if run.algo.needs_reference() and run.ref_model is None:  # the frozen reference: the policy when RL starts
        run.ref_model = copy.deepcopy(run.model).eval()
    t = time.perf_counter()
    with span("sampling"):
        batch, sampled, figures = collect(run, step)
    row.update(figures, rollout_s=time.perf_counter() - t, rollout_tokens=float(sampled.attention_mask.sum()))
    run.trim_heap(row["rollout_s"])  # the sampler's freed cache back before the update allocates its activations
    with span("advantages"):
        adv = advantages(run, batch)
    for aux in run.of_kind(AuxiliaryLoss, "rl"):
        row.update(aux.prepare(run, batch))
    with span("reference"):
        ref_lp = reference_logprobs(run, batch)
    updates = update(run, batch, adv, ref_lp)
    row.update(summarise_updates(updates))
    row.update(rollout_diagnostics(run, batch, sampled, adv))
    # every sampled episode counts, on every worker
    row["_episodes"] = round(D.all_mean(float(len(sampled) + row.get("branch_episodes", 0)), run.info)
                             * run.info.world_size)
    return row


def collect(run: Run, step: int) -> tuple[RolloutBatch, RolloutBatch, dict]:
    """The step's rollouts: ``(update batch, every sampled episode, figures)``; a collector plug-in may draw more.
    An algorithm that branches (``Algorithm.continuations``) gets the update batch's continuation returns."""
    collectors = run.of_kind(Collector)
    if collectors:
        batch, sampled, figures = collectors[0].collect(run, step)
    else:
        batch = sampled = group_rollouts(run, step)
        figures = {}
    k, gamma = run.algo.continuations()
    if k:  # the algorithm's values come from continuations of the update batch's saved states
        returns, cost = continuation_returns(run.model, run.tok, batch, k, run.cfg.sampling,
                                             branch_generator(run.cfg.seed, step, run.info.rank, run.device),
                                             gamma=gamma, autocast_dtype=run.amp_dtype)
        batch = dataclasses.replace(batch, continuation_returns=returns)
        figures = {**figures, **cost}
    return batch, sampled, figures


def advantages(run: Run, batch: RolloutBatch) -> Tensor:
    """The RL batch's advantages: the user's ``advantage_fn`` of the episode returns when the run has one, else
    the algorithm's, with the policy's decision states when it reads them (a critic)."""
    if run.advantage_fn is None:
        features = None
        if run.algo.needs_decision_states:
            with torch.no_grad(), run.amp():
                features = policy_features(run.model, batch)
        return run.algo.advantages(batch, run.state, features)
    rewards = batch.episode_return
    adv = run.advantage_fn(rewards, run.cfg.algorithm.group_size)
    if not (isinstance(adv, Tensor) and adv.shape == rewards.shape):
        raise ValueError(f"advantage_fn must return a tensor of shape {tuple(rewards.shape)}, got "
                         f"{type(adv).__name__} {tuple(getattr(adv, 'shape', ()))}")
    return adv


def reference_logprobs(run: Run, batch: RolloutBatch) -> Tensor | None:
    """``[B, L-1]`` log-probs of the batch's tokens under the frozen reference, if the algorithm has one."""
    if run.ref_model is None:
        return None
    with torch.no_grad(), run.amp():
        return token_logprobs(policy_logits(run.ref_model, batch, batch.temperature), batch.input_ids[:, 1:])


def update(run: Run, batch: RolloutBatch, adv: Tensor, ref_lp: Tensor | None) -> list[dict]:
    """``algo.epochs`` passes over the batch, each in ``algo.minibatches`` optimizer steps (CleanRL's loop)."""
    algo, out = run.algo, []
    n_mb = algo.minibatches
    per = len(batch) // n_mb
    for _epoch in range(algo.epochs):
        for m in range(n_mb):
            mb, mb_adv, mb_ref = (batch, adv, ref_lp) if n_mb == 1 else take(batch, adv, ref_lp,
                                                                             slice(m * per, (m + 1) * per))
            # before the first optimizer step theta = theta_old: the sampler and the trainer must agree
            out.append(_gradient_step(run, mb, mb_adv, algo, phase="rl", ref_lp=mb_ref, sampler_view=not out))
    return out


def _gradient_step(run: Run, batch: RolloutBatch, adv: Tensor, algo: Algorithm, phase: str,
                   ref_lp: Tensor | None = None, sampler_view: bool = False) -> dict:
    """One optimizer step of ``phase`` with its auxiliary losses; the user's ``loss_fn`` replaces RL's loss only."""
    terms = [lambda mb, lp, whole, last, aux=aux: aux.term(run, mb, lp, whole, last)
             for aux in run.of_kind(AuxiliaryLoss, phase)]
    rl = phase == "rl"
    return gradient_step(run.model, run.optimizer, batch, adv, algo, grad_clip=run.cfg.optimizer.grad_clip,
                         entropy_coef=run.cfg.algorithm.entropy_coef if rl else 0.0, ref_logprobs=ref_lp,
                         loss_fn=run.loss_fn if rl else None, micro_batch_size=run.cfg.run.micro_batch_size,
                         terms=terms, ddp=run.ddp_model if run.info.enabled else None, amp=run.amp(),
                         sampler_view=sampler_view)

