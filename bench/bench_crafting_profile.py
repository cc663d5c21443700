"""Where crafting's time and memory go: phases, throughput against this CPU's matmul peak, and peak memory.

Each arm runs in a fresh process, alone, one after the other (``--repeats`` rounds, arms alternating), and
measures two pieces of the crafting recipe (``agent_lab.recipes``):

* **SFT**: ``--sft-steps`` supervised steps of recipe ``crafting-quick`` from random weights (its recovery
  demonstrations and learning-rate decay in the last quarter);
* **RL**: ``--rl-steps`` Dr.GRPO steps of recipe ``crafting-full`` from the committed policy of that recipe
  (``bench/results/crafting-full/``), so the transcripts are as long as late in a real run.

For each piece: its seconds, each phase's share (the trainer's ``time_<phase>_s``), tokens per second of the
forward and backward passes and of sampling, the GFLOP/s of the passes as a share of the matmul peak measured
in the same run in the dtype the arm computed in (float32, or bfloat16 under autocast), and the
resident-memory high-water mark (Linux ``VmHWM``, reset at the start of the piece). The arms: ``recipe`` (the
recipe as it is); ``keep-rows`` (the recipe before the sampler dropped finished episodes from its cache and
the RL update took micro-batches of 16: its rollouts run every row to the end, its micro-batches hold 32
episodes); ``whole-batch`` (the RL update on the whole batch of 128 episodes at once, and the C allocator's
freed memory never handed back: the recipe before it took micro-batches and the trainer trimmed the heap);
``bf16`` (the recipe with ``cpu_bf16``: bfloat16 autocast where the CPU has fast bf16, else float32, as the
arm records); ``sft-whole`` (the recipe's SFT step on its whole batch of demonstrations, not in micro-batches
of 16; its RL piece is the recipe's); ``bf16-sft-whole`` (both); ``prefix`` (the prompt shown once and read
both ways, ``prompt_attention="bidirectional"``, in place of the recipe's re-read prompt: SFT piece only, since
the committed policy has the other shape), ``prefix-bf16`` (with ``cpu_bf16`` too) and ``compile`` (the
teacher-forced pass of SFT and of the RL update through ``torch.compile`` with dynamic shapes; sampling's
cached steps stay eager) and ``ahead`` (each SFT step's demonstrations built on a second thread while the step
before it trains, ``prepare_ahead``: SFT piece only, since RL steps build no demonstrations). Each piece's
seconds include a compiled arm's first compilation; its median step does not. ``--threads N`` runs every arm
on N torch threads (default: the recipe's, torch's default).

Figures are printed and written to ``bench/results/bench_crafting_profile.json``, section ``profile`` (or
``--section``'s name, so that a short run beside the committed one keeps it).

``--tiny`` runs the same arms with a tiny policy, its RL piece from random weights rather than the committed
policy, into section ``tiny``: every code path in seconds (what the tests do).

Usage: ``python bench/bench_crafting_profile.py [--sft-steps 200] [--rl-steps 15] [--repeats 1] [--arms ...]
[--threads N] [--section NAME]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from _arms import add_child_options, run_fresh, write_result
from _profile import format_profile, matmul_peak, peak_memory, throughput, train_flops_per_token
from _results import RESULTS, save_section

from agent_lab.device import autocast_dtype, pick_device
from agent_lab.diagnostics import time_profile

POLICY = RESULTS / "crafting-full" / "checkpoint.pt"
ARMS = {"recipe": {}, "keep-rows": {"micro_batch_size": 32, "keep_finished_rows": True},
        "whole-batch": {"micro_batch_size": 0, "keep_finished_rows": True, "keep_freed_memory": True},
        "bf16": {"cpu_bf16": True}, "sft-whole": {"sft_whole_batch": True},
        "bf16-sft-whole": {"cpu_bf16": True, "sft_whole_batch": True},
        "prefix": {"prompt_attention": "bidirectional", "no_reread": True},
        "prefix-bf16": {"prompt_attention": "bidirectional", "no_reread": True, "cpu_bf16": True},
        "compile": {"compile_training_pass": True}, "ahead": {"prepare_ahead": True}}
#: Arm settings that change the policy's shape or its prompt, so the committed policy cannot start their RL piece,
#: or that change nothing in it (prepare_ahead).
SFT_ONLY = ("prompt_attention", "no_reread", "prepare_ahead")
TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "sft_batch_size": 4, "batch_size": 8, "group_size": 4}
TINY_EVAL_SIZE = 4  # evaluation worlds per level with --tiny


def _piece(name: str, run, sft: bool) -> dict:
    """Run ``run()`` (one training phase) under a fresh memory mark; its phase profile and peak."""
    with peak_memory() as mem:
        result = run()
    rows = [r for r in result.history if (r["phase"] == "sft") == sft]
    profile = time_profile(rows)
    cfg = result.config
    per_step = (cfg.sft.batch_size if sft else  # episodes through forward and backward, every epoch counted
                cfg.algorithm.batch_size * cfg.algorithm.build(max_tokens=1).epochs)
    context = profile["train_tokens"] / (per_step * len(rows)) / 2  # mean earlier tokens a token attends to
    # the dtype the run computed in, as the trainer chose it
    dtype, precision = autocast_dtype(pick_device(cfg.run.device), cfg.run.bf16, cfg.run.cpu_bf16)
    return {"piece": name, "peak_gb": mem["peak_gb"], "profile": profile, "precision": precision,
            "median_step_s": statistics.median(r["step_s"] for r in rows),
            "dtype": str(dtype or "torch.float32").removeprefix("torch."),
            "flops_per_token": train_flops_per_token(result.policy, context)}


def child(arm: str, sft_steps: int, rl_steps: int, out: Path, tiny: bool = False, threads: int = 0) -> None:
    """One arm, in its own process: the SFT piece, then the RL piece; figures to ``out``."""
    import agent_lab.rollout as rollout
    import agent_lab.trainer as trainer
    from agent_lab.recipes import recipe

    settings = {**ARMS[arm], **(TINY if tiny else {}), **({"cpu_threads": threads} if threads else {})}
    if settings.pop("keep_freed_memory", False):
        trainer.HeapTrimmer.__call__ = lambda self, step_s: False
    if settings.pop("compile_training_pass", False):  # sampling's cached steps stay eager
        import torch
        from agent_lab.policy.model import TinyTransformer
        TinyTransformer.hidden_states = torch.compile(TinyTransformer.hidden_states, dynamic=True)
    if settings.pop("keep_finished_rows", False):  # every row through every cached step, as before
        rollout._Rollout._step_running = lambda self, ids, valid, pos: self.policy.step(ids, valid, self.cache, pos)
    # micro_batch_size applies to SFT and RL steps alike: this arm turns it off for the SFT piece only
    sft_whole = {"micro_batch_size": 0} if settings.pop("sft_whole_batch", False) else {}
    sft_only = any(k in settings for k in SFT_ONLY)
    if settings.pop("no_reread", False):  # the prompt once: a bidirectional prompt reads it both ways instead
        settings["env_options"] = {**recipe("crafting-quick").env_options, "reread": False}
    decay = max(1, sft_steps // 4)
    sft_cfg = recipe("crafting-quick", sft_steps=sft_steps, sft_slip_from=sft_steps - decay,
                     sft_lr_decay_steps=decay, steps=1, **settings, **sft_whole)
    rl_cfg = recipe("crafting-full", steps=rl_steps, **settings)
    if tiny:  # a tiny policy has not the committed one's shape: its RL piece starts from random weights
        sft_cfg = sft_cfg.replace(env_options={**sft_cfg.env_options, "eval_size": TINY_EVAL_SIZE})
        rl_cfg = rl_cfg.replace(sft_steps=0, sft_slip_prob=0.0, sft_lr_decay_steps=0,
                                env_options={**rl_cfg.env_options, "eval_size": TINY_EVAL_SIZE})
    init = None if tiny else POLICY
    with tempfile.TemporaryDirectory() as tmp:
        pieces = [_piece("SFT", lambda: trainer.train_sft(sft_cfg, run_dir=f"{tmp}/sft", progress=False), True)]
        if not sft_only or tiny:
            pieces.append(_piece("RL", lambda: trainer.train_rl(rl_cfg, init=init, run_dir=f"{tmp}/rl",
                                                                progress=False), False))
    write_result(out, pieces)


def run_arm(arm: str, args: argparse.Namespace) -> list[dict]:
    """:func:`child` in a fresh process: the pieces of arm ``arm``."""
    (pieces,) = run_fresh(__file__, ["--child", arm, "--sft-steps", args.sft_steps, "--rl-steps", args.rl_steps,
                                     "--threads", args.threads, *["--tiny"] * args.tiny])
    return pieces


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The profile's rows, by the section of ``--results`` they were saved as (none from an arm's process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--rl-steps", type=int, default=15)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of every arm (0: the recipe's, torch's default)")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny policy: every code path in seconds (the tests)")
    add_child_options(p, choices=list(ARMS))
    p.add_argument("--results", type=Path, default=RESULTS / "bench_crafting_profile.json")
    p.add_argument("--section", help="the results' section to write (default: profile, or tiny with --tiny)")
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.sft_steps, args.rl_steps, args.out, args.tiny, args.threads)
        return {}
    import torch

    threads = args.threads or torch.get_num_threads()  # the recipe's cpu_threads=0: torch's default
    peaks = {f"{dtype}, {n} thread{'s' * (n > 1)}": matmul_peak(n, dtype)
             for dtype in ("float32", "bfloat16") for n in sorted({1, threads})}
    print("matmul peak (1024 x 1024), GFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()))
    rows = []
    for rep in range(args.repeats):
        for arm in args.arms:
            print(f"\n{arm} (round {rep + 1}):", flush=True)
            for piece in run_arm(arm, args):
                # the passes' share of the peak of the dtype they ran in (bfloat16 where the arm autocast)
                peak = peaks[f"{piece['dtype']}, {threads} thread{'s' * (threads > 1)}"]
                rates = throughput(piece["profile"], piece["flops_per_token"], peak)
                print(format_profile(piece["piece"], piece["profile"], rates, piece["dtype"]))
                print(f"    peak resident memory {piece['peak_gb']:.2f} GB; precision: {piece['precision']}")
                rows.append({"arm": arm, "round": rep + 1, "piece": piece["piece"], "peak_gb": piece["peak_gb"],
                             "steps": piece["profile"]["steps"], "seconds": piece["profile"]["seconds"],
                             "s_per_step": piece["profile"]["seconds"] / piece["profile"]["steps"],
                             "median_step_s": piece["median_step_s"],
                             "shares": piece["profile"]["shares"], "precision": piece["precision"],
                             "peak_dtype": piece["dtype"], **rates})
    _print_ratios(rows)
    saved = [{"matmul_peak_gflops": peaks, "threads": threads, "sft_steps": args.sft_steps,
              "rl_steps": args.rl_steps, "arms": rows}]
    section = args.section or ("tiny" if args.tiny else "profile")
    save_section(args.results, section, saved, " ".join(["python bench/bench_crafting_profile.py", *argv]))
    return {section: saved}


#: What _print_ratios compares, and its label.
RATIOS = {"peak_gb": "peak memory (GB)", "s_per_step": "seconds per step",
          "median_step_s": "median step (s)",
          "train_tokens_per_s": "tokens/s forward+backward", "rollout_tokens_per_s": "tokens/s sampled"}


def _print_ratios(rows: list[dict]) -> None:
    """The recipe against each other arm, per piece: peak memory, seconds per step and tokens per second of
    the passes and (RL) of sampling, each as recipe / arm (medians of rounds)."""
    for piece in ("SFT", "RL"):
        keys = [k for k in RATIOS if piece == "RL" or k != "rollout_tokens_per_s"]
        med = {arm: {k: statistics.median(r[k] for r in rows if r["arm"] == arm and r["piece"] == piece)
                     for k in keys}
               for arm in ARMS if any(r["arm"] == arm and r["piece"] == piece for r in rows)}
        a = med.get("recipe")
        for other, b in med.items():
            if a is not None and other != "recipe":
                print(f"{piece}: recipe / {other}: " + "; ".join(
                    f"{RATIOS[k]} {a[k]:.3g} / {b[k]:.3g} ({a[k] / b[k]:.2f}x)" for k in keys))


if __name__ == "__main__":
    main()
