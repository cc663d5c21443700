"""Command line: ``agent-lab tour | train | recipes | eval | check``.

``agent-lab train`` with no options runs the default recipe for its environment (number search: an SFT cold
start, then Dr.GRPO, stopping at the planner's optimum; ``--env crafting``: the quick crafting recipe).
``--recipe NAME`` picks another (``agent-lab recipes`` lists them); every other flag overrides one setting of it.
``agent-lab check NOTEBOOK`` runs an assignment notebook's visible tests the way the grader does, from wherever
the notebook is.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def tour() -> None:
    """Print a short tour of the package: where each step of the data flow lives."""
    from agent_lab import training

    print("agent-lab: reinforcement learning for LLM agents (after CMU 11-768, Lecture 9)\n")
    print("The lecture's own API, agent_lab.training:")
    print("  reward_to_go([0.2, 1.0], gamma=0.9)          ->", training.reward_to_go([0.2, 1.0], gamma=0.9))
    print("  centered_group_advantages([1, 0, 0, 1])      ->", training.centered_group_advantages([1.0, 0.0, 0.0, 1.0]))
    print(
        "  degenerate_binary_group_probability(0.01, 8) ->",
        round(training.degenerate_binary_group_probability(0.01, group_size=8), 4),
    )
    print("\nWhere things live (data flows top to bottom):")
    for mod, what in [
        ("agent_lab.envs", "number search and crafting environments, exact planners"),
        ("agent_lab.policy", "tokenizer and the tiny transformer with a KV cache"),
        ("agent_lab.rollout", "batched multi-turn sampling with behaviour log-probabilities"),
        ("agent_lab.estimators", "returns, baselines, advantages, losses, aggregation, diagnostics"),
        ("agent_lab.algorithms", "REINFORCE, RLOO, GRPO, Dr.GRPO, GiGPO, ReST-EM, PPO, PPO+GAE, VinePPO, SFT"),
        ("agent_lab.update", "the loss of a batch, its statistics, micro-batched optimizer steps"),
        ("agent_lab.trainer", "the SFT and RL loops (train_sft, train_rl, train)"),
        ("agent_lab.evaluation", "frozen-checkpoint evaluation against the planner's optimum"),
    ]:
        print(f"  {mod:<22} {what}")
    print("\nNext: `agent-lab train` (train), `make book` (read), assignments/ (do), `make grade SUBMISSIONS=dir`.")


_GROUP_TITLES = {"model": "model", "sampling": "sampling (the behaviour policy)", "sft": "SFT cold start",
                 "algorithm": "algorithm (RL phase)", "optimizer": "optimizer", "evaluation": "evaluation",
                 "run": "run", "plugins": "the labs' experiments (agent_lab.plugins)"}


def _flag_help(key: str, s) -> str:
    """A flag's help, from its field's declaration (``agent_lab.config.Flat``); an algorithm's option names
    the algorithms that take it, and ``--algo`` lists the registered algorithms."""
    from agent_lab.algorithms import rl_algorithms

    what = s.help
    if key == "algo":
        what = f"{what}: {' | '.join(rl_algorithms())}"
    elif s.place == "options":
        what = f"{', '.join(s.owners)}: {what}"
    return f"{what} (TrainConfig default: {s.default})"


def _add_train_args(p: argparse.ArgumentParser) -> None:
    """``--recipe``, then one flag per flat setting (``--batch-size``), grouped by section, each generated from
    its declared field (``agent_lab.config.flat_keywords``). Only the flags given reach the configuration
    (argparse.SUPPRESS), so each overrides the recipe's value."""
    from agent_lab import algorithms, plugins  # noqa: F401  (their registries declare their options)
    from agent_lab.config import flat_keywords

    p.add_argument("--recipe", default=None, help="a named recipe (agent-lab recipes); default: the environment's")
    p.add_argument("--env", default=argparse.SUPPRESS, help="environment name (default: number-search)")
    p.add_argument("--env-option", dest="env_options", action="append", default=argparse.SUPPRESS,
                   metavar="KEY=VALUE", help="environment option, e.g. --env-option n=16 (repeatable; JSON values)")
    p.add_argument("--seed", type=int, default=argparse.SUPPRESS, help="the seed of every random stream")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for key, s in flat_keywords().items():
        section = "algorithm" if s.place == "options" else s.place
        group = groups.setdefault(section, p.add_argument_group(_GROUP_TITLES[section]))
        flag, what = "--" + key.replace("_", "-"), _flag_help(key, s)
        parse = {"action": argparse.BooleanOptionalAction} if s.type is bool else {"type": s.type}
        group.add_argument(flag, dest=key, default=argparse.SUPPRESS, help=what, **parse)


def _parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _env_options(items: list[str]) -> dict:
    """``--env-option KEY=VALUE`` flags as a dict, each value parsed as JSON where it parses."""
    opts = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--env-option must look like KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        opts[k] = _parse_value(v)
    return opts


def train_config(args: argparse.Namespace):
    """The run's configuration: the recipe (given, or the environment's default), then each given flag."""
    from agent_lab.recipes import default_recipe, recipe

    given = {k: v for k, v in vars(args).items() if k not in ("command", "recipe", "quiet")}
    name = args.recipe or default_recipe(given.get("env", "number-search"))
    if "env_options" in given:
        given["env_options"] = {**recipe(name).env_options, **_env_options(given["env_options"])}
    return name, recipe(name, **given)


def _train(args: argparse.Namespace) -> int:
    from agent_lab.diagnostics import next_steps, summary_table, time_summary
    from agent_lab.trainer import train

    name, cfg = train_config(args)
    result = train(cfg, progress=not args.quiet)
    rep, reached = result.final_eval, result.reached_optimum_at
    row = {
        "recipe": name, "env": cfg.env, "algo": cfg.algorithm.name if cfg.algorithm.steps else "sft",
        "seed": cfg.seed, "steps": len(result.history), "episodes": result.episodes,
        "seconds": round(result.seconds, 1),
        "greedy success": f"{rep.success:.3f} [{rep.ci_low:.3f}, {rep.ci_high:.3f}]",
        "planner": f"{rep.optimum:.3f}", "gap": f"{rep.gap:+.3f}",
        "optimum reached": f"step {reached['step']} ({reached['seconds']:.1f} s)" if reached else "no",
    }
    print()
    print(summary_table([row], list(row)))
    for line in next_steps(result, name):
        print(line)
    spent = time_summary(result.history)
    if spent:
        print(spent)
    print(f"run directory: {result.run_dir}  (config.json, loss.txt, metrics.jsonl/csv, curves.png, "
          "checkpoint.pt, final_eval.json)")
    return 0


def _recipes(args: argparse.Namespace) -> int:
    from agent_lab.recipes import DEFAULT_FOR_ENV, RECIPES, RESULTS_ENV, measured, results_dir

    seen = measured()
    if results_dir() is None:
        print(f"(no bench/results here or above; to show make bench's figures, run this inside the course's "
              f"checkout or set {RESULTS_ENV} to its bench/results)\n")
    defaults = {v: k for k, v in DEFAULT_FOR_ENV.items()}
    for r in RECIPES.values():
        mark = f"  (default for --env {defaults[r.name]})" if r.name in defaults else ""
        print(f"{r.name}{mark}\n    {r.purpose}")
        m = seen.get(r.name)
        if m is not None:
            print(f"    measured by make bench ({m.get('date')}, {m.get('machine')}): {m.get('summary')}")
        elif r.bench:
            print("    not measured on this machine yet: run make bench")
    print("\nagent-lab train --recipe NAME [flags]: every flag overrides one setting of the recipe")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from agent_lab.config import TrainConfig
    from agent_lab.envs import make_env
    from agent_lab.evaluation import evaluate, load_checkpoint

    policy, tok, state = load_checkpoint(args.checkpoint, "cpu")
    saved = TrainConfig.from_dict(state["config"]) if state.get("config") else None
    env_name = args.env or (saved.env if saved else None)
    if env_name is None:
        raise ValueError("--env is required: the checkpoint does not record its environment")
    same_env = saved is not None and env_name == saved.env
    # the checkpoint's environment and mask unless told otherwise: a policy is evaluated as it was trained
    opts = {**(saved.env_options if same_env else {}), **_env_options(args.env_options)}
    masked = args.mask if args.mask is not None else bool(same_env and saved.sampling.candidate_mask)
    if masked:
        opts["mask_actions"] = True
    env = make_env(env_name, **opts)
    rep = evaluate(policy, env, args.split, args.decoding, tokenizer=tok, temperature=args.temperature,
                   seed=args.seed, samples_per_task=args.samples_per_task, candidate_mask=masked)
    print(rep)
    return 0


def release_from_copy(nb: Any) -> Any:
    """The released notebook, rebuilt from a student's copy of it.

    nbgrader locks the release's test and read-only cells and records each locked cell's checksum in its
    metadata; a copy carries those cells verbatim, so the copy itself can stand in for the release once every
    locked cell still matches its checksum. That needs no repository and no release folder, and it checks
    exactly the tests the student was given (the grader always uses its own release). A locked cell that was
    edited is refused, naming the cell, instead of silently running a changed test.
    """
    from nbgrader.utils import compute_checksum, is_locked

    changed, tests = [], 0
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta or not is_locked(cell):
            continue
        tests += bool(meta.get("grade")) and not meta.get("solution")
        if "checksum" not in meta or compute_checksum(cell) != meta["checksum"]:
            changed.append(meta.get("grade_id", f"a {cell.cell_type} cell"))
    if changed:
        raise ValueError(f"locked cell(s) {changed} differ from the release (their nbgrader checksums do not "
                         "match): restore them from the released notebook, or pass --release RELEASED.ipynb")
    if not tests:
        raise ValueError("this notebook has no nbgrader test cells: is it an assignment notebook as released?")
    return nb


def _check(args: argparse.Namespace) -> int:
    import math
    import time
    from pathlib import Path

    import nbformat

    from agent_lab.grading.check import check_notebook

    path = Path(args.notebook)
    if not path.is_file():
        raise ValueError(f"{path} is not a file (give the notebook's path, e.g. policy_gradients.ipynb)")
    source = Path(args.release) if args.release else path
    try:
        release = nbformat.read(source, as_version=4)
    except Exception as exc:  # noqa: BLE001 -- nbformat raises several kinds for a file that is no notebook
        raise ValueError(f"{source} is not a readable notebook ({exc})") from None
    if not args.release:
        release = release_from_copy(release)
    start = time.monotonic()
    skip = tuple(args.skip) + (TRAINING if args.skip_training else ())
    skipped = tuple(c.metadata["nbgrader"]["grade_id"] for c in release.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(skip)) if skip else ()
    lines, notes = check_notebook(path, release, skip=skipped)
    for note in notes:
        print("note:", note)
    width = max(len(line.grade_id) for line in lines)
    for line in lines:
        shown = "  --" if math.isnan(line.score) else f"{line.score:4g}"
        print(f"{line.grade_id:<{width}}  {shown} / {line.points:g}  {line.message}")
    ran = [line for line in lines if not math.isnan(line.score)]
    print(f"\nvisible tests: {sum(x.score for x in ran):g} / {sum(x.points for x in ran):g} points "
          f"({time.monotonic() - start:.0f} s)")
    return 1 if any(x.score < x.points for x in ran) else 0


#: ``--skip-training`` skips the tests named so: the assignments' agent tests (they train or evaluate one).
TRAINING = ("test_train",)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tour", help="print a short tour of the package")
    pt = sub.add_parser("train", help="train a policy from scratch (default: the environment's recipe)")
    _add_train_args(pt)
    pt.add_argument("--quiet", action="store_true", help="no progress or loss description")
    sub.add_parser("recipes", help="list the named recipes, their purpose and their measured results")
    pe = sub.add_parser("eval", help="evaluate a frozen checkpoint on held-out tasks")
    pe.add_argument("checkpoint", help="checkpoint.pt or the run directory holding it")
    pe.add_argument("--env", default=None, help="environment (default: the one the checkpoint was trained on)")
    pe.add_argument("--split", default="test")
    pe.add_argument("--decoding", choices=("greedy", "sampled"), default="greedy")
    pe.add_argument("--temperature", type=float, default=1.0)
    pe.add_argument("--samples-per-task", type=int, default=1)
    pe.add_argument("--seed", type=int, default=0)
    pe.add_argument("--env-option", dest="env_options", action="append", default=[], metavar="KEY=VALUE",
                    help="override an environment option of the checkpoint, e.g. --env-option eval_size=600")
    pe.add_argument("--mask", action=argparse.BooleanOptionalAction, default=None,
                    help="decode with the candidate mask (default: as the checkpoint was trained)")
    pc = sub.add_parser("check", help="run an assignment notebook's visible tests the way the grader does")
    pc.add_argument("notebook", help="your notebook, e.g. policy_gradients.ipynb")
    pc.add_argument("--skip-training", action="store_true",
                    help="skip the agent tests (names starting with test_train: they train or evaluate an "
                         "agent, under a minute each on two CPU cores)")
    pc.add_argument("--skip", action="append", default=[], metavar="GRADE_ID",
                    help="skip the tests whose name starts with GRADE_ID (repeatable)")
    pc.add_argument("--release", default=None,
                    help="the released notebook to take the tests from (default: the locked cells of NOTEBOOK, "
                         "verified against their nbgrader checksums)")
    args = parser.parse_args(argv)
    if args.command == "tour":
        tour()
        return 0
    try:
        return {"train": _train, "recipes": _recipes, "eval": _eval, "check": _check}[args.command](args)
    except ValueError as e:  # bad configuration: one clear line, no traceback
        print(f"agent-lab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
