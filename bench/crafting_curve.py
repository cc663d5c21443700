"""Crafting learning curve: train a recipe in the background, resumably, evaluating as it goes.

    python bench/crafting_curve.py --recipe crafting-full --seed 0 --threads 2 --every-sft 250 --every-rl 25

(or ``make crafting-curve ARGS="..."``). The run lives in a folder outside the checkout (``--run-dir``,
default ``~/runs/crafting_curve/<recipe>-seed<k>/``): the trainer's files (``checkpoint.pt``,
``metrics.jsonl``, ``config.json``, ``loss.txt``), ``sessions.jsonl`` (one line per start: date, CPU, threads,
commit, process id, the step it started from) and ``curve.jsonl``, the curve:

* a ``header`` line: recipe, seed, overrides, the whole configuration, the decoding (greedy, with or without
  the candidate mask: the setting the recipe trains in), the evaluation sizes and intervals, the target, the
  CPU model and its AVX2 / AVX-512 / AMX flags, torch's threads, the commit and the command;
* a ``sample`` line every ``--every-sft`` SFT steps and every ``--every-rl`` RL steps (and at the end of each
  phase): step, phase (``sft`` or ``rl``), demonstrations and RL episodes so far, the mean training loss since
  the previous line, training seconds and CPU seconds so far (evaluation excluded), the evaluation's seconds,
  and per split (``test``, ``held_out_goals``) and level the greedy success on ``--sample`` worlds per level
  with its 95% Wilson interval, the planner's success on the same worlds and the share of it, and the failed
  episodes by first mistake (``agent_lab.envs.crafting.first_mistake``); ``nll``: per level, the planner's
  actions on the test split's worlds of that line scored by the policy, by the token's role
  (``_action_nll.action_nll``: which decisions the imitation loss is made of); ``target_met``;
  after RL steps, ``rl``: the sampled batches' diagnostics since the previous line (:data:`RL_DIAGNOSTICS`);
* a ``confirm`` line when a sample meets the target, or when the recipe's steps run out: the same figures on
  ``--confirm`` worlds per level. Training stops when the confirmation meets the target too (or when the steps
  run out); otherwise it goes on. A curve without a ``confirm`` line is partial.

The crafting target: each split and each level judged on its own, greedy success at least 95% of the planner's
at levels 1 and 2 (depth <= 2) and at least 80% at level 3 and deeper.

The run checkpoints at every evaluation (weights, optimizer, counters, history and the curve so far, in one
file). Started again with the same arguments, it resumes from that checkpoint and rewrites ``curve.jsonl`` to
it. It needs ``PYTHONHASHSEED`` set (``make`` sets 0), so that a resumed process hashes strings as the first
one did; every random draw of a step depends only on (seed, step) (``agent_lab.streams``) and the learning
rate only on the step, so the resumed curve equals the uninterrupted one but for its seconds (``WALL_CLOCK``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from _action_nll import action_nll  # noqa: E402
from _results import commit, cpu_flags, cpu_model  # noqa: E402

from agent_lab import timing  # noqa: E402
from agent_lab import trainer as T  # noqa: E402
from agent_lab.config import TrainConfig  # noqa: E402
from agent_lab.envs.crafting import first_mistake  # noqa: E402
from agent_lab.evaluation import evaluate  # noqa: E402
from agent_lab.preflight import check_config  # noqa: E402
from agent_lab.recipes import recipe  # noqa: E402

SPLITS = ("test", "held_out_goals")
#: Fields of the curve that measure time or name the session (its start, its commit), not what was learned:
#: two runs of the same curve differ in them and only in them.
WALL_CLOCK = ("train_s", "cpu_s", "eval_s", "started", "commit")


@dataclass
class CurveOptions:
    """One curve's settings; all but ``run_dir`` must match when a run resumes."""

    recipe: str = "crafting-full"
    seed: int = 0
    run_dir: Path | None = None
    threads: int = 2
    every_sft: int = 250
    every_rl: int = 25
    sample: int = 20  # worlds per level of each evaluation along the curve
    confirm: int = 200  # worlds per level of the confirmation
    overrides: dict = field(default_factory=dict)  # TrainConfig keywords on top of the recipe
    branch_from: Path | None = None  # another curve's run folder, at the end of its SFT phase: RL starts there

    def folder(self) -> Path:
        default = Path.home() / "runs" / "crafting_curve" / f"{self.recipe}-seed{self.seed}"
        return Path(self.run_dir or default)


def target_share(level: int) -> float:
    """The share of the planner's success that level ``level`` must reach: 0.95 at depth <= 2, else 0.80."""
    return 0.95 if level <= 2 else 0.80


def curve_config(opts: CurveOptions) -> TrainConfig:
    """The recipe with the overrides, run in ``opts.folder()``; the harness checkpoints and evaluates it."""
    cfg = recipe(opts.recipe, seed=opts.seed, cpu_threads=opts.threads, **opts.overrides)
    if cfg.env != "crafting":
        raise ValueError(f"recipe {opts.recipe!r} trains env {cfg.env!r}; the crafting curve needs a "
                         "crafting recipe (agent-lab recipes lists them)")
    cfg = cfg.replace(run_dir=str(opts.folder()), checkpoint_every=0, eval_every=0, stop_at_optimum=False,
                      time_limit_s=None)
    check_config(cfg)
    return cfg


#: Run settings that change no line of the curve: where the run lives, and whether its batches are built a step
#: ahead (the same batches); a run may resume with others.
NOT_THE_CURVE = ("run_dir", "resume", "prepare_ahead")


def settings(opts: CurveOptions, cfg: TrainConfig) -> dict:
    """What decides the curve: the same on every resume of a run."""
    config = cfg.to_dict()
    config["run"] = {k: v for k, v in config["run"].items() if k not in NOT_THE_CURVE}
    overrides = {k: v for k, v in opts.overrides.items() if k not in NOT_THE_CURVE}
    return {"recipe": opts.recipe, "seed": opts.seed, "overrides": overrides, "config": config,
            "decoding": "greedy", "candidate_mask": cfg.sampling.candidate_mask, "splits": list(SPLITS),
            "sample_per_level": opts.sample, "confirm_per_level": opts.confirm, "every_sft": opts.every_sft,
            "every_rl": opts.every_rl, "torch_threads": opts.threads,
            "python_hash_seed": os.environ.get("PYTHONHASHSEED"),
            "branch_from": str(opts.branch_from) if opts.branch_from else None}


def machine_record() -> dict:
    return {"started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), "cpu": cpu_model(),
            "cpu_flags": cpu_flags(), "cores": os.cpu_count(), "torch": str(torch.__version__),
            "torch_threads": torch.get_num_threads(), "commit": commit()}


def header(opts: CurveOptions, cfg: TrainConfig, argv: list[str]) -> dict:
    target = {"level <= 2": target_share(2), "level >= 3": target_share(3),
              "of": "the planner's success on the same worlds, each split and level on its own"}
    return {"kind": "header", **settings(opts, cfg), "target": target, "interval": "Wilson 95%",
            **machine_record(), "command": " ".join(["python bench/crafting_curve.py", *argv])}


# ----------------------------------------------------------------------------- evaluation
def evaluate_splits(run: T.Run, per_level: int) -> dict:
    """Greedy success per split and level on the first ``per_level`` worlds of each level (a fixed sample),
    decoded as the run trains (with or without the candidate mask), beside the planner's on those worlds."""
    out = {}
    levels = len(run.env.train_levels)
    for split in SPLITS:
        tasks = run.env.eval_tasks(split, per_level * levels)  # levels in turn: per_level worlds of each
        rep = evaluate(run.model, run.env, split, "greedy", tasks=tasks, tokenizer=run.tok, seed=run.cfg.seed,
                       candidate_mask=run.cfg.sampling.candidate_mask, classify=first_mistake)
        out[split] = {g: {"n": r["n"], "successes": round(r["success"] * r["n"]), "success": r["success"],
                          "ci_low": r["ci_low"], "ci_high": r["ci_high"], "planner": r["optimum"],
                          "share": r["success"] / r["optimum"] if r["optimum"] else None,
                          "mistakes": r["failures"]}
                      for g, r in sorted(rep.by_group.items())}
    return out


def meets_target(splits: dict) -> bool:
    """Every split and level at its share of the planner (levels are named "level N")."""
    return all(r["share"] is not None and r["share"] >= target_share(int(g.split()[-1])) - 1e-12
               for levels in splits.values() for g, r in levels.items())


# ----------------------------------------------------------------------------- the loop
def next_stop(step: int, sft_steps: int, total: int, every_sft: int, every_rl: int) -> int:
    """The step count at which the next evaluation falls: every ``every_sft`` SFT steps, at the end of SFT,
    every ``every_rl`` RL steps and at the last step."""
    if step < sft_steps:
        return min(sft_steps, (step // every_sft + 1) * every_sft)
    return min(total, sft_steps + ((step - sft_steps) // every_rl + 1) * every_rl)


def train_until(run: T.Run, end: int) -> None:
    """Steps ``run.step .. end - 1``, SFT then RL as :func:`agent_lab.trainer.train` runs them; their wall and
    CPU seconds are added to the curve's clocks (the evaluations are not)."""
    state = run.driver_state
    for step in range(run.step, end):
        timing.take()  # a step's phases start empty, as in the trainer's own loop
        t, cpu = time.perf_counter(), time.process_time()
        row = T.sft_step(run, step) if step < run.cfg.sft.steps else T.rl_step(run, step)
        T.finish_step(run, row, t, last=False)
        state["train_s"] += time.perf_counter() - t
        state["cpu_s"] += time.process_time() - cpu


def counts(run: T.Run) -> tuple[int, int]:
    """(demonstrations, RL episodes) so far."""
    demos = max((h["episodes"] for h in run.history if h["phase"] == "sft"), default=0)
    return demos, run.episodes - demos


#: What an RL line also says about the sampled batches since the previous line (means of the trainer's rows):
#: sampled success, the share of refused actions, the policy's entropy, the share of groups whose episodes all
#: scored the same (no signal for a group algorithm), the mean |advantage| and the turns per episode.
RL_DIAGNOSTICS = ("success", "rejected_share", "entropy", "degenerate_fraction", "advantage_abs_mean",
                  "episode_turns")


def rl_diagnostics(history: list[dict], since: int, until: int) -> dict:
    """Means of :data:`RL_DIAGNOSTICS` over the RL rows of steps ``since .. until - 1`` (a key no row logs is
    left out); empty when the window holds no RL step."""
    rows = [h for h in history if since <= h["step"] < until and h["phase"] != "sft"]
    out = {}
    for key in RL_DIAGNOSTICS:
        values = [h[key] for h in rows if isinstance(h.get(key), (int, float))]
        if values:
            out[key] = sum(values) / len(values)
    return out


def evaluation_line(run: T.Run, kind: str, per_level: int, since: int) -> dict:
    """One curve line at the run's current step; ``since``: the previous line's step (the loss's window)."""
    t = time.perf_counter()
    splits = evaluate_splits(run, per_level)
    nll = action_nll(run.model, run.env, run.tok, run.env.eval_tasks("test", per_level * len(run.env.train_levels)))
    losses = [h["loss"] for h in run.history if since <= h["step"] < run.step and "loss" in h]
    demos, episodes = counts(run)
    state = run.driver_state
    loss = sum(losses) / len(losses) if losses else None
    return {"kind": kind, "step": run.step, "phase": "sft" if run.step <= run.cfg.sft.steps else "rl",
            "demonstrations": demos, "episodes": episodes, "loss": loss,
            "train_s": state["train_s"], "cpu_s": state["cpu_s"], "eval_s": time.perf_counter() - t,
            "per_level": per_level, "splits": splits, "nll": nll, "target_met": meets_target(splits),
            **({"rl": rl} if (rl := rl_diagnostics(run.history, since, run.step)) else {})}


def evaluate_and_save(run: T.Run, opts: CurveOptions) -> list[dict]:
    """The sample line, and the confirmation when the sample meets the target or the steps ran out; then the
    checkpoint, which holds them, so a resumed run starts after them."""
    state = run.driver_state
    since = state["lines"][-1]["step"] if state["lines"] else 0
    lines = [evaluation_line(run, "sample", opts.sample, since)]
    if lines[0]["target_met"] or run.step >= run.cfg.total_steps:
        lines.append(evaluation_line(run, "confirm", opts.confirm, since))
        state["done"] = lines[-1]["target_met"] or run.step >= run.cfg.total_steps
    state["lines"] += lines
    T.save(run)
    return lines


def open_run(opts: CurveOptions, argv: list[str]) -> T.Run:
    """A fresh run, a branch of another curve's run (``--branch-from``), or the folder's run resumed from its
    checkpoint (refused if its settings differ)."""
    cfg = curve_config(opts)
    folder = opts.folder()
    resume = (folder / "checkpoint.pt").exists()
    if not resume and opts.branch_from:
        run = branch(opts, cfg, argv)
    else:
        run = T.start_run(cfg.replace(resume=resume), phases=("sft", "rl"))
    if not resume and not opts.branch_from:
        run.driver_state = {"header": header(opts, cfg, argv), "lines": [], "train_s": 0.0, "cpu_s": 0.0}
    elif resume and "header" not in run.driver_state:
        raise ValueError(f"{folder} holds a training run but no curve (this script did not start it): pass "
                         "another --run-dir")
    elif resume:
        saved, now = run.driver_state["header"], settings(opts, cfg)
        diff = sorted(k for k in now if saved.get(k) != now[k])
        if diff:
            raise ValueError(f"{folder} holds a curve with other settings ({', '.join(diff)} differ): resume "
                             "it with the arguments in its curve.jsonl header, or pass another --run-dir")
    with (folder / "sessions.jsonl").open("a") as f:
        f.write(json.dumps({**machine_record(), "from_step": run.step, "pid": os.getpid()}) + "\n")
    return run


def branch(opts: CurveOptions, cfg: TrainConfig, argv: list[str]) -> T.Run:
    """A new curve that starts from another curve's checkpoint taken at the end of its SFT phase: the same
    cold start (weights, optimizer, counters, clocks), then this recipe's RL settings (for example RL without
    the candidate mask, training worlds drawn in other proportions, or a charge for invalid actions), or more
    SFT steps on a schedule of their own (``sft_steps`` past the source's, say with ``steps=0``: SFT alone for
    the seconds RL would take). Its
    first line evaluates the cold start as this curve decodes; the source's SFT lines stay in the source's
    curve, which the header names."""
    source = Path(opts.branch_from) / "checkpoint.pt"
    if not source.exists():
        raise ValueError(f"--branch-from {opts.branch_from}: no checkpoint.pt there; pass the run folder of a "
                         "crafting curve whose SFT phase has ended")
    run = T.start_run(cfg, phases=("sft", "rl"), init=source)
    parent = run.driver_state.get("header")
    # read the source's configuration as a saved one is read: settings added since take their defaults
    theirs = TrainConfig.from_dict(parent["config"]).to_dict() if parent else {}
    if parent is None or run.step != theirs["sft"]["steps"] or run.step > cfg.sft.steps:
        raise ValueError(f"--branch-from {opts.branch_from}: its checkpoint is at step {run.step}, not at the "
                         f"end of an SFT phase of at most {cfg.sft.steps} steps as a curve (branch once the "
                         "source's SFT phase has ended, with its sft_steps or more)")
    mine = cfg.to_dict()
    for c in (theirs, mine):  # options that only draw or pay RL's episodes do not change the cold start
        c["env_options"] = {k: v for k, v in c["env_options"].items() if k not in run.env.rl_options}
    # a branch that goes on with SFT past the source's end sets its own schedule for the steps it adds
    same = ("env", "env_options", "seed", "model") + (() if cfg.sft.steps > run.step else ("sft",))
    differs = [k for k in same if theirs.get(k) != mine.get(k)]
    if differs:
        raise ValueError(f"--branch-from {opts.branch_from}: the source trained another cold start "
                         f"({', '.join(differs)} differ); give this curve the source's seed, SFT, model and "
                         "environment settings")
    run.driver_state = {"header": {**header(opts, cfg, argv), "parent": parent}, "lines": [],
                        "train_s": run.driver_state["train_s"], "cpu_s": run.driver_state["cpu_s"]}
    line = evaluation_line(run, "sample", opts.sample, run.step)
    run.driver_state["lines"].append(line)
    print(summary(line), flush=True)
    T.save(run)
    return run


def write_curve(path: Path, state: dict) -> None:
    """The whole curve as the checkpoint holds it (a resumed run drops the lines after its checkpoint)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in [state["header"], *state["lines"]]))
    tmp.replace(path)


def run_curve(opts: CurveOptions, argv: list[str] | None = None) -> Path:
    """Train and evaluate until the curve is done (or the process is stopped); returns ``curve.jsonl``."""
    if min(opts.every_sft, opts.every_rl, opts.sample, opts.confirm, opts.threads) < 1:
        raise ValueError("--every-sft, --every-rl, --sample, --confirm and --threads must be at least 1")
    before = torch.get_num_threads()
    torch.set_num_threads(opts.threads)
    try:
        run = open_run(opts, argv or [])
        path = opts.folder() / "curve.jsonl"
        write_curve(path, run.driver_state)
        while not run.driver_state.get("done"):
            cfg = run.cfg
            end = next_stop(run.step, cfg.sft.steps, cfg.total_steps, opts.every_sft, opts.every_rl)
            train_until(run, end)
            for line in evaluate_and_save(run, opts):
                with path.open("a") as f:
                    f.write(json.dumps(line) + "\n")
                print(summary(line), flush=True)
        T.finish_run(run)
        return path
    finally:
        torch.set_num_threads(before)


def summary(line: dict) -> str:
    levels = "; ".join(f"{split} " + " / ".join(f"{r['success']:.2f}" for r in by.values())
                       for split, by in line["splits"].items())
    return (f"{line['kind']} step {line['step']} ({line['phase']}, {line['demonstrations']} demonstrations, "
            f"{line['episodes']} episodes, {line['train_s']:.0f} s): {levels}; target "
            f"{'met' if line['target_met'] else 'not met'}")


def parse_override(text: str) -> tuple[str, object]:
    """``key=value`` with a JSON value (a bare word is a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set takes key=value (a TrainConfig keyword), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    d = CurveOptions()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=d.recipe, help="a crafting recipe of agent_lab.recipes")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--run-dir", type=Path, default=None,
                   help="the run folder (default ~/runs/crafting_curve/<recipe>-seed<k>); "
                   "resumed if it holds a run")
    p.add_argument("--threads", type=int, default=d.threads, help="torch intra-op threads")
    p.add_argument("--every-sft", type=int, default=d.every_sft, help="SFT steps between evaluations")
    p.add_argument("--every-rl", type=int, default=d.every_rl, help="RL steps between evaluations")
    p.add_argument("--sample", type=int, default=d.sample, help="worlds per level along the curve")
    p.add_argument("--confirm", type=int, default=d.confirm, help="worlds per level of the confirmation")
    p.add_argument("--set", type=parse_override, action="append", default=[], metavar="KEY=VALUE",
                   help="a TrainConfig keyword on top of the recipe (repeatable), e.g. --set sft_lr=2e-3")
    p.add_argument("--branch-from", type=Path, default=None, metavar="RUN_DIR",
                   help="start from another curve's run folder at the end of its SFT phase (same recipe, SFT, "
                   "model and environment settings, but for options that only draw training worlds such as "
                   "level_weights; other RL settings, e.g. --set candidate_mask=false; or more SFT steps, "
                   "e.g. --set sft_steps=8000 --set sft_lr_decay_steps=2200 --set steps=0)")
    a = p.parse_args(argv)
    if not os.environ.get("PYTHONHASHSEED"):  # string hashing orders sets: a resumed process must hash alike
        p.error("set PYTHONHASHSEED (make crafting-curve sets 0), so that a resumed run hashes as it did")
    opts = CurveOptions(a.recipe, a.seed, a.run_dir, a.threads, a.every_sft, a.every_rl, a.sample, a.confirm,
                        dict(a.set), a.branch_from)
    try:
        print(f"curve: {run_curve(opts, argv)}")
    except ValueError as e:  # a bad recipe, setting or folder: said in one line, before any training
        p.error(str(e))


if __name__ == "__main__":
    main()
