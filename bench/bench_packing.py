"""Sequence packing: one training step on padded rows against the same step on packed rows.

A crafting SFT batch mixes levels 1-3, so transcripts range from ~60 to ~210 tokens and about half of a
right-padded batch is padding. :func:`agent_lab.update.policy_logits` packs the transcripts into fewer
rows (:mod:`agent_lab.policy.packing`). Prints, for ``--batches`` demonstration batches, the share of real
tokens, rows before and after packing, the median seconds of forward + backward each way, their ratio,
and the largest logit difference (rounding only).

Usage: ``python bench/bench_packing.py [--batch 32] [--d-model 128] [--n-layers 4] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _results import RESULTS, save_section

from agent_lab.envs import make_env
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
from agent_lab.policy.packing import pack_rows, packed_logits
from agent_lab.rollout import demonstration_batch


def step_seconds(model, batch, packed: bool) -> float:
    t = time.perf_counter()
    ids, am = batch.input_ids, batch.attention_mask
    logits = packed_logits(model, ids, am) if packed else model(ids, am)
    logits[am].logsumexp(-1).mean().backward()  # a stand-in loss over the real tokens
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The figures, by the section of ``--results`` they were saved as."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", type=Path, default=RESULTS / "bench_packing.json", help="where to write the figures")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(len(tok), args.d_model, args.n_layers, 4, max_len=512))
    rng = np.random.default_rng(0)
    batches = [demonstration_batch(env, tok, env.sample_tasks(rng, args.batch)) for _ in range(args.batches)]
    real = sum(int(b.attention_mask.sum()) for b in batches) / sum(b.attention_mask.numel() for b in batches)
    rows = [len(pack_rows(b.attention_mask.sum(1).tolist(), b.input_ids.shape[1])) for b in batches]
    with torch.no_grad():
        b = batches[0]
        gap = float((packed_logits(model, b.input_ids, b.attention_mask) - model(b.input_ids, b.attention_mask))
                    [b.attention_mask].abs().max())
    padded_s, packed_s = [], []
    for b in batches:  # interleaved, so a change in the machine's load hits both alike
        padded_s.append(step_seconds(model, b, packed=False))
        packed_s.append(step_seconds(model, b, packed=True))
    res = {"real_token_share": real, "rows_padded": args.batch, "rows_packed": statistics.median(rows),
           "padded_s": statistics.median(padded_s), "packed_s": statistics.median(packed_s), "max_logit_gap": gap}
    res["speedup"] = res["padded_s"] / res["packed_s"]
    print(f"crafting demonstrations (levels 1-3), {args.batches} batches of {args.batch}; model d_model={args.d_model} "
          f"n_layers={args.n_layers}, {args.threads} thread(s)")
    print(f"  real tokens     {real:8.1%} of the padded batch")
    print(f"  rows            {args.batch} padded -> {res['rows_packed']:.0f} packed (median)")
    print(f"  forward+backward {res['padded_s']:7.3f} s padded, {res['packed_s']:.3f} s packed -> {res['speedup']:.2f}x")
    print(f"  largest logit difference {gap:.1e} (rounding)")
    settings = {"batch": args.batch, "batches": args.batches, "d_model": args.d_model, "n_layers": args.n_layers,
                "threads": args.threads}
    saved = [{**settings, **res}]
    save_section(args.results, "crafting-sft", saved,
                 " ".join(["python bench/bench_packing.py", *(sys.argv[1:] if argv is None else argv)]))
    return {"crafting-sft": saved}


if __name__ == "__main__":
    main()
