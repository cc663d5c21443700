"""Why a crafting policy's greedy episodes fail: the failed episodes of each split and level counted by their
first mistake (``agent_lab.envs.crafting.first_mistake``: an item off the goal's tree, a craft short of an
intermediate not crafted yet, of one crafted too few times or of a base item, another refusal, or none), for the
checkpoints of crafting-curve runs.

    python bench/crafting_failures.py [NAME=]RUN_DIR [...] --per-level 200 --no-mask \\
        --out bench/results/crafting_curve/failures.json

Each run folder's ``checkpoint.pt`` is decoded greedily on the same fixed worlds as the curve's evaluations
(the first ``--per-level`` worlds of each level of ``test`` and ``held_out_goals``), with the candidate mask or
without it (``--mask`` / ``--no-mask``: say which; the RL branches of a curve decode without it). Each record
is named ``NAME`` (the name of the run's curve in ``bench/results/crafting_curve/``, say) or else after the
folder, and merged into ``--out`` (written whole, then moved into place), so a later call adds runs without
touching the others. A record holds the checkpoint's step, the decoding and, per split and level, the
episodes, the successes and the failed episodes by first mistake, most common first (``"by": "first mistake"``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from _results import commit, machine  # noqa: E402

from agent_lab.checkpoints import load_checkpoint  # noqa: E402
from agent_lab.config import TrainConfig  # noqa: E402
from agent_lab.envs import make_env  # noqa: E402
from agent_lab.envs.crafting import first_mistake  # noqa: E402
from agent_lab.evaluation import evaluate  # noqa: E402

SPLITS = ("test", "held_out_goals")  # the curve's splits


def failures(folder: Path, per_level: int, mask: bool) -> dict:
    """One run folder's record: its checkpoint's step and, per split and level, how its episodes ended."""
    path = folder / "checkpoint.pt"
    if not path.exists():
        raise ValueError(f"{folder}: no checkpoint.pt there; pass the run folder of a crafting curve")
    policy, tok, saved = load_checkpoint(path, "cpu")
    cfg = TrainConfig.from_dict(saved["config"])
    if cfg.env != "crafting":
        raise ValueError(f"{folder} trained env {cfg.env!r}, not crafting")
    env = make_env("crafting", **cfg.env_options, **({"mask_actions": True} if mask else {}))
    splits = {}
    for split in SPLITS:
        tasks = env.eval_tasks(split, per_level * len(env.train_levels))  # levels in turn, as the curve's
        rep = evaluate(policy, env, split, "greedy", tasks=tasks, tokenizer=tok, seed=cfg.seed,
                       candidate_mask=mask, classify=first_mistake)
        splits[split] = {g: {"n": r["n"], "successes": round(r["success"] * r["n"]), "failures": r["failures"]}
                         for g, r in sorted(rep.by_group.items())}
    return {"step": saved["step"], "candidate_mask": mask, "per_level": per_level, "by": "first mistake",
            "splits": splits}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="[NAME=]RUN_DIR",
                   help="crafting-curve run folders (each holds checkpoint.pt), each optionally named")
    p.add_argument("--per-level", type=int, default=200, help="worlds per level and split")
    mask = p.add_mutually_exclusive_group(required=True)
    mask.add_argument("--mask", dest="mask", action="store_true", help="decode with the candidate mask")
    mask.add_argument("--no-mask", dest="mask", action="store_false", help="decode without it")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", type=Path, required=True, help="the JSON file the records are merged into")
    a = p.parse_args(argv)
    if a.per_level < 1 or a.threads < 1:
        p.error("--per-level and --threads must be at least 1")
    torch.set_num_threads(a.threads)
    try:
        named = [(name, Path(path)) for name, _, path in (r.rpartition("=") for r in a.runs)]
        records = {name or path.resolve().name: failures(path, a.per_level, a.mask) for name, path in named}
        old = json.loads(a.out.read_text()) if a.out.exists() else {}
    except (ValueError, json.JSONDecodeError) as e:  # a wrong folder or a damaged output: one line, nothing written
        p.error(str(e))
    measured = {**machine(), "commit": commit()}  # cores, CPU and its flags, platform, torch, device
    out = {**old, **{name: {**r, **measured} for name, r in records.items()}}
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(a.out)
    for name, r in records.items():
        for split, levels in r["splits"].items():
            for level, g in levels.items():
                print(f"{name} step {r['step']} {split} {level}: {g['successes']}/{g['n']} solved; failed by first "
                      f"mistake: {g['failures']}")


if __name__ == "__main__":
    main()
