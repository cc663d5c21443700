"""The crafting assignment's training budget: the reference solution trained exactly as the notebook's training
cell trains it, on several seeds, and what the grader gives each agent.

    .venv/bin/python bench/bench_crafting_assignment.py [--seeds 0 1 2] [--cpu-threads 0] [--install]

Per seed: DIR/seed_N/crafting_agent.pt and crafting_reference.json (the recipe's configuration, the seed, the
checkpoint's sha256, the training time, and the success on the notebook's public worlds and on the hidden test's
private worlds). The rows go to bench/results/crafting_assignment.json (the notebook's thresholds are set from
them). ``--install`` copies seed 0's checkpoint and record into autograder/samples/, where the sample submissions
take them from.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
import torch
from _results import RESULTS, save_section

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "assignments" / "source" / "crafting_agent" / "crafting_agent.ipynb"
SOLUTION = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[^\n]*\n?", re.M)


def reference_functions() -> dict:
    """The source notebook's solution cells, executed: ppo_loss, advantage_fn and the rest."""
    namespace: dict = {"torch": torch}
    for cell in nbformat.read(SOURCE, as_version=4).cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            exec(compile(SOLUTION.sub("", cell.source), "<solution>", "exec"), namespace)  # noqa: S102
    return namespace


def cell_constants() -> dict:
    """The worlds and thresholds of the notebook's agent tests, read from their sources."""
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source
             for c in nbformat.read(SOURCE, as_version=4).cells}
    public = re.search(r"PUBLIC_WORLDS = (\{.*?\})\n", cells["test_trained_agent_visible"], re.S).group(1)
    seed = int(re.search(r"PRIVATE_SEED = ([\d_]+)", cells["test_trained_agent_seen_goals_hidden"]).group(1))
    private = re.search(r"worlds = (\{.*?\})\n", cells["test_trained_agent_seen_goals_hidden"], re.S).group(1)
    return {"public": eval(public), "private": eval(private, {"PRIVATE_SEED": seed})}  # noqa: S307 - our notebook


def train_reference(seed: int, cpu_threads: int, out: Path) -> dict:
    """Train the reference on ``seed`` into ``out``; return its record (also written to out/crafting_reference.json)."""
    from agent_lab.checkpoints import save_checkpoint
    from agent_lab.grading.trained_agent import evaluate_checkpoint
    from agent_lab.recipes import recipe
    from agent_lab.trainer import train_rl, train_sft

    fns = reference_functions()
    config = recipe("crafting-assignment", seed=seed, run_dir=str(out / "crafting_run"), cpu_threads=cpu_threads)
    start, cpu0 = time.time(), time.process_time()
    cold = train_sft(config, progress=False)
    sft_s = time.time() - start
    result = train_rl(config, init=cold, advantage_fn=fns["advantage_fn"], loss_fn=fns["ppo_loss"], progress=False)
    train_s, cpu_s = time.time() - start, time.process_time() - cpu0
    path = save_checkpoint(out / "crafting_agent.pt", result.policy, result.tokenizer,
                           recipe="crafting-assignment", seed=seed)
    evaluation = {}
    for name, groups in cell_constants().items():
        for group, report in evaluate_checkpoint(path, "crafting-assignment", groups, references=()).items():
            evaluation[f"{name} {group}"] = {"success": report.success, "ci": [report.ci_low, report.ci_high],
                                             "n": report.n, "planner": report.optimum}
    record = {"seed": seed, "sft_seconds": round(sft_s, 1), "train_seconds": round(train_s, 1),
              "train_cpu_seconds": round(cpu_s, 1), "config": config.to_dict(),
              "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "evaluation": evaluation}
    (out / "crafting_reference.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The seeds' records, by the section of bench/results/crafting_assignment.json they were saved as."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cpu-threads", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "_out" / "crafting_assignment")
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--section", default="reference", help="the JSON section the rows go to")
    args = parser.parse_args(argv)
    rows = []
    for seed in args.seeds:
        record = train_reference(seed, args.cpu_threads, args.out / f"seed_{seed}")
        print(json.dumps({k: record[k] for k in ("seed", "sft_seconds", "train_seconds", "train_cpu_seconds",
                                                 "evaluation")}), flush=True)
        rows.append({k: v for k, v in record.items() if k != "config"})
    save_section(RESULTS / "crafting_assignment.json", args.section, rows,
                 "bench/bench_crafting_assignment.py " + " ".join(argv))
    if args.install:
        samples = REPO / "autograder" / "samples"
        shutil.copyfile(args.out / "seed_0" / "crafting_agent.pt", samples / "crafting_reference.pt")
        shutil.copyfile(args.out / "seed_0" / "crafting_reference.json", samples / "crafting_reference.json")
    return {args.section: rows}


if __name__ == "__main__":
    main()
