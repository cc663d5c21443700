"""Micro-batches: the peak memory of one training step falls with the micro-batch size; its gradient does not change.

For each of ``--sizes`` (0: the whole batch), a fresh process builds the policy and a batch of crafting
demonstrations, takes one token-mean gradient step (the SFT objective; ``agent_lab.update.gradient_step``) in
micro-batches of that many episodes, and reports how far its resident memory's high-water mark rose during the
step (Linux ``/proc/self/status``: VmHWM after the step minus VmRSS before it, with the mark reset first), and the
largest difference of its gradient from the whole batch's. On CUDA, ``gpu_bench.py`` reports the same per size.
Figures are printed and written to ``bench/results/bench_micro_batches.json``.

Usage: ``python bench/bench_micro_batches.py [--batch 64] [--d-model 256] [--n-layers 4] [--sizes 0 16 4]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _arms import add_child_options, run_fresh, write_result
from _profile import reset_peak, status_kib
from _results import RESULTS, save_section


def child(args: argparse.Namespace) -> None:
    """One measurement, in its own process so that no other size's allocations are in its memory."""
    import numpy as np
    import torch

    from agent_lab.algorithms import make_algorithm
    from agent_lab.envs import make_env
    from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
    from agent_lab.rollout import demonstration_batch
    from agent_lab.update import gradient_step

    torch.set_num_threads(1)
    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(len(tok), args.d_model, args.n_layers, 4, max_len=512))
    batch = demonstration_batch(env, tok, env.sample_tasks(np.random.default_rng(0), args.batch))
    algo = make_algorithm("sft", group_size=1, max_tokens=int(env.max_policy_tokens))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    reset_peak()  # the high-water mark starts at the current resident size
    before = status_kib("VmRSS")
    gradient_step(model, opt, batch, torch.ones(len(batch)), algo, grad_clip=1e9, micro_batch_size=args.child)
    peak = status_kib("VmHWM")
    torch.save(torch.cat([p.grad.reshape(-1) for p in model.parameters()]), args.gradient)
    write_result(args.out, {"micro_batch_size": args.child, "peak_step_mib": (peak - before) / 1024,
                            "tokens": int(batch.attention_mask.sum()), "params": model.num_parameters()})


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The sizes' rows, by the section of ``--results`` they were saved as (none from a size's process)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 16, 4])
    p.add_argument("--results", type=Path, default=RESULTS / "bench_micro_batches.json")
    add_child_options(p, type=int, default=None)
    p.add_argument("--gradient", type=Path, help=argparse.SUPPRESS)  # where a size's process leaves it
    args = p.parse_args(argv)
    if args.child is not None:
        child(args)
        return {}
    import torch

    rows, whole = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            gradient = Path(tmp) / f"grad_{size}.pt"
            (row,) = run_fresh(__file__, ["--child", size, "--gradient", gradient, "--batch", args.batch,
                                          "--d-model", args.d_model, "--n-layers", args.n_layers])
            grad = torch.load(gradient)
            whole = grad if whole is None else whole
            row["max_grad_difference"] = float((grad - whole).abs().max())
            rows.append(row)
            print(f"micro-batch {size or 'whole batch'}: peak memory of the step +{row['peak_step_mib']:.0f} MiB "
                  f"({row['tokens']} tokens, {row['params'] / 1e6:.1f}M parameters); largest gradient difference from "
                  f"the first size {row['max_grad_difference']:.1e}", flush=True)
    save_section(args.results, "cpu", rows, " ".join(["python bench/bench_micro_batches.py",
                                                     *(sys.argv[1:] if argv is None else argv)]))
    return {"cpu": rows}


if __name__ == "__main__":
    main()
