"""Rollout cost: the KV cache against full recomputation, and a rollout against one forward pass.

Prints, for crafting episodes of about 256 tokens played by an untrained default policy (it wanders until
the step budget runs out, so every episode is long):

* tokens per second with the KV cache and without it (recomputing the whole prefix at every step);
  both paths draw the same samples from the same generator, which the script checks. Target: >= 5x.
* the rollout time against one teacher-forced forward pass over the finished batch. Target: <= 3x.

Usage: ``python bench/bench_rollout.py [--batch 64] [--repeats 3] [--d-model 64] [--n-layers 2]``.
Timings are medians of ``--repeats`` runs; on a shared machine compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from _results import RESULTS, save_section

from agent_lab.envs import make_env
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts


def timed(fn, repeats: int):
    out, times = None, []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The figures, by the section of ``--results`` they were saved as."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--results", type=Path, default=RESULTS / "bench_rollout.json", help="where to write the figures")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = make_env("crafting", train_levels=[4])  # the deepest worlds: long budgets, ~250-token episodes
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(len(tok), args.d_model, args.n_layers, 4, max_len=512)).eval()
    tasks = env.sample_tasks(0, args.batch)

    def run(use_cache: bool):
        return collect_rollouts(model, tok, env, tasks, SamplingConfig(), torch.Generator().manual_seed(1),
                                use_cache=use_cache)

    fast, t_cache = timed(lambda: run(True), args.repeats)
    slow, t_full = timed(lambda: run(False), max(1, args.repeats - 2))
    same = torch.equal(fast.input_ids, slow.input_ids)
    with torch.no_grad():
        _, t_fwd = timed(lambda: model(fast.input_ids, fast.attention_mask), args.repeats)
    n_tok = int(fast.attention_mask.sum())
    L = fast.attention_mask.sum(1).float()
    res = {
        "episodes": args.batch, "mean_tokens": float(L.mean()), "max_tokens": int(L.max()),
        "policy_tokens": int(fast.action_mask.sum()), "cache_s": t_cache, "no_cache_s": t_full,
        "cache_tok_per_s": n_tok / t_cache, "no_cache_tok_per_s": n_tok / t_full,
        "speedup": t_full / t_cache, "forward_s": t_fwd, "rollout_over_forward": t_cache / t_fwd,
        "identical_samples": same,
    }
    print(f"crafting rollouts: {args.batch} episodes, {res['mean_tokens']:.0f} tokens on average "
          f"(max {res['max_tokens']}), {res['policy_tokens']} policy tokens; model d_model={args.d_model} "
          f"n_layers={args.n_layers}, {args.threads} thread(s)")
    print(f"  KV cache        {t_cache:8.3f} s  {res['cache_tok_per_s']:10.0f} tokens/s")
    print(f"  no cache        {t_full:8.3f} s  {res['no_cache_tok_per_s']:10.0f} tokens/s")
    print(f"  speed-up        {res['speedup']:8.1f} x   (target >= 5x; identical samples: {same})")
    print(f"  one forward     {t_fwd:8.3f} s  -> rollout / forward = {res['rollout_over_forward']:.1f} x (target <= 3x)")
    settings = {"batch": args.batch, "d_model": args.d_model, "n_layers": args.n_layers, "threads": args.threads}
    saved = [{**settings, **res}]
    save_section(args.results, "crafting", saved,
                 " ".join(["python bench/bench_rollout.py", *(sys.argv[1:] if argv is None else argv)]))
    return {"crafting": saved}


if __name__ == "__main__":
    main()
