"""GPU benchmark: the rollout and trainer benchmarks with a 10-50M-parameter policy on one CUDA GPU.

Prints tokens per second and the share of the GPU's bf16 dense peak for

1. crafting rollouts (~250-token episodes) with the KV cache, against full recomputation on a smaller batch;
2. one teacher-forced training step (forward + backward) over the finished batch, bf16 autocast; the largest
   and mean gap between the sampler's recorded log-probs and the trainer's recomputation (theta = theta_old);
   the peak memory of one step for three micro-batch sizes;
3. number search end to end: SFT cold start then Dr.GRPO until the greedy policy reaches the planner's
   optimum (15/16), with the seconds it took;
4. the crafting recipe (``crafting-full``, bf16 autocast) until ``--crafting-limit`` seconds, then greedy success
   per level on the test and held-out-goal splits as a fraction of the planner's, and whether the crafting target
   (0.95 at depth 1-2, 0.80 at depth 3) holds.

On CUDA, section 2 also finds the largest micro-batch (in episodes, by doubling) whose step fits in memory.

FLOPs are counted as 2 N per token for a forward pass and 6 N for forward + backward (N = parameters;
attention's extra term is small at these lengths and is left out, so the shares are slight underestimates).
Designed to finish within 9 minutes on an H100/H200 (one device command): sections 1 and 2 are four rollouts and
two training steps, and the two training runs stop after the step that passes ``--time-limit`` (150 s) and
``--crafting-limit`` (240 s). Without CUDA it prints a message and exits 0; ``--tiny`` runs every code path on the
CPU with a tiny model (what the tests do). The figures are saved to ``bench/results/gpu_bench.json``, in a
section named after the device (``tiny`` for ``--tiny``).

Usage: ``python bench/gpu_bench.py [--tiny] [--d-model 512 --n-layers 8] [--batch 512]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from _results import RESULTS, save_section

from agent_lab.envs import make_env
from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts

#: Dense bf16 tensor-core peaks (FLOP/s) by device-name fragment, from the vendors' data sheets.
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12,
             "RTX 4090": 165e12, "V100": 125e12}


def peak_flops(name: str) -> float | None:
    for k, v in BF16_PEAK.items():
        if k in name:
            return v
    return None


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    """The figures, by the section of ``--results`` they were saved as (none where CUDA is missing and
    ``--tiny`` not given)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU, tiny model: exercise every code path quickly")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layers", type=int, default=8)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--no-cache-batch", type=int, default=64)
    p.add_argument("--train-steps", type=int, default=400, help="budget for the number-search run")
    p.add_argument("--time-limit", type=float, default=150.0,
                   help="seconds for the number-search run: it stops after the step that passes them, so the "
                        "whole script stays within its budget however slow the device")
    p.add_argument("--crafting-limit", type=float, default=240.0,
                   help="seconds for the crafting recipe: it stops after the step that passes them")
    p.add_argument("--results", type=Path, default=RESULTS / "gpu_bench.json",
                   help="where to write the figures")
    args = p.parse_args(argv)
    if args.tiny:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        args.d_model, args.n_layers, args.n_heads, args.batch, args.no_cache_batch = 32, 1, 2, 8, 4
        args.train_steps = 3
    elif not torch.cuda.is_available():
        print("gpu_bench: CUDA is not available on this machine; nothing to measure (use --tiny to exercise "
              "the code path on the CPU).")
        return {}
    else:
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
    res = measure(args, device)
    section = "tiny" if args.tiny else res["device"]
    save_section(args.results, section, [res], " ".join(["python bench/gpu_bench.py", *argv]))
    return {section: [res]}


def measure(args: argparse.Namespace, device: torch.device) -> dict:
    """Sections 1-4 on ``device`` with the sizes of ``args``: the figures, by name."""
    amp = torch.bfloat16 if device.type == "cuda" else None
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    peak = peak_flops(name)
    env = make_env("crafting", train_levels=[4])
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(len(tok), args.d_model, args.n_layers, args.n_heads, max_len=512)).to(device)
    n_params = model.num_parameters()
    print(f"gpu_bench on {name}: policy d_model={args.d_model} n_layers={args.n_layers} ({n_params / 1e6:.1f}M "
          f"parameters), bf16 autocast={amp is not None}, bf16 peak={peak / 1e12 if peak else 'unknown'} TFLOP/s")
    res: dict = {"device": name, "params": n_params}

    def share(flops_per_s):
        return f"{100 * flops_per_s / peak:.2f}% of bf16 peak" if peak else "peak unknown"

    # 1. rollouts with and without the cache
    tasks = env.sample_tasks(0, args.batch)
    gen = lambda: torch.Generator(device=device).manual_seed(1)  # noqa: E731
    collect_rollouts(model, tok, env, tasks[: min(8, args.batch)], SamplingConfig(), gen(), autocast_dtype=amp)  # warm-up
    batch, t_roll = timed(lambda: collect_rollouts(model, tok, env, tasks, SamplingConfig(), gen(), autocast_dtype=amp), device)
    n_tok = int(batch.attention_mask.sum())
    res["rollout_tok_per_s"] = n_tok / t_roll
    print(f"1. rollouts: {args.batch} crafting episodes, {n_tok / args.batch:.0f} tokens each on average: "
          f"{t_roll:.2f} s, {n_tok / t_roll:,.0f} tokens/s with the KV cache ({share(2 * n_params * n_tok / t_roll)})")
    small = tasks[: args.no_cache_batch]
    b1, t1 = timed(lambda: collect_rollouts(model, tok, env, small, SamplingConfig(), gen(), autocast_dtype=amp), device)
    _, t2 = timed(lambda: collect_rollouts(model, tok, env, small, SamplingConfig(), gen(), use_cache=False,
                                           autocast_dtype=amp), device)
    res["cache_speedup"] = t2 / t1
    print(f"   {args.no_cache_batch} episodes: KV cache {t1:.2f} s, full recompute {t2:.2f} s -> {t2 / t1:.1f}x")
    # the sampler's log-probs against the trainer's, before any update, both under bf16 autocast
    gap = sampler_trainer_gap(model, batch, env, amp)
    res.update(gap)
    print(f"   sampler vs trainer log-probs before any update (bf16 autocast={amp is not None}): largest "
          f"|log mu - log pi| {gap['logprob_gap_max']:.2e}, mean {gap['logprob_gap_mean']:.2e}")
    # 2. one training step over the finished batch
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def train_step():
        with torch.autocast(device.type, dtype=amp) if amp is not None else torch.enable_grad():
            logits = model(batch.input_ids, batch.attention_mask)[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        loss = -(lp * batch.action_mask).sum() / batch.action_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    train_step()
    _, t_fwd = timed(lambda: _forward(model, batch, amp), device)
    _, t_tr = timed(train_step, device)
    res["train_tok_per_s"] = n_tok / t_tr
    print(f"2. training step (forward + backward + Adam) on {n_tok:,} tokens: {t_tr:.3f} s, {n_tok / t_tr:,.0f} "
          f"tokens/s ({share(6 * n_params * n_tok / t_tr)}); forward only {t_fwd:.3f} s; rollout / forward = "
          f"{t_roll / t_fwd:.1f}x")
    # peak memory of one step by micro-batch size (the gradient is the same for every size)
    if device.type == "cuda":
        for size in (0, max(1, args.batch // 4), max(1, args.batch // 16)):
            res[f"peak_mib_micro_{size}"] = peak_step_memory(model, batch, env, amp, size)
        print("   peak memory of one SFT-objective step by micro-batch size (0: the whole batch): "
              + ", ".join(f"{k.rsplit('_', 1)[1]}: {v:,.0f} MiB" for k, v in res.items() if k.startswith("peak_mib")))
        res["largest_micro_batch"] = largest_micro_batch(model, batch, env, amp)
        print(f"   the largest micro-batch whose step fits: {res['largest_micro_batch']} episodes")
    # 3. number search end to end with the same model size
    from agent_lab.trainer import TrainConfig, train

    t = time.perf_counter()
    r = train(TrainConfig(env="number-search", algo="dr_grpo", sft_steps=min(100, args.train_steps),
                          steps=args.train_steps, d_model=args.d_model, n_layers=args.n_layers,
                          n_heads=args.n_heads, lr=3e-4 if not args.tiny else 3e-3, eval_every=5,
                          stop_at_optimum=True, device=device.type, batch_size=256 if not args.tiny else 16,
                          group_size=8 if not args.tiny else 4, sft_batch_size=64 if not args.tiny else 8,
                          time_limit_s=args.time_limit),
              progress=False)
    reached = r.reached_optimum_at
    res["number_search_s"], res["number_search_steps"] = time.perf_counter() - t, len(r.history)
    print(f"3. number search, SFT then Dr.GRPO: greedy success {r.final_eval.success:.3f} (planner "
          f"{r.final_eval.optimum:.3f}); optimum reached: "
          + (f"step {reached['step']}, {reached['seconds']:.1f} s, {reached['episodes']} episodes" if reached
             else f"no, within {args.train_steps} steps and {args.time_limit:.0f} s")
          + f"; {res['number_search_s']:.1f} s in all")
    res.update(crafting_to_target(device, args.crafting_limit, tiny=args.tiny))
    return res


#: The crafting target: greedy success at least these fractions of the planner's, by level (depth) of the goal.
CRAFTING_TARGET = {1: 0.95, 2: 0.95, 3: 0.80}


def crafting_to_target(device: torch.device, limit_s: float, tiny: bool = False) -> dict:
    """4. The crafting recipe (``crafting-full``) on ``device`` with bf16 autocast, stopped after the step that passes
    ``limit_s``; then greedy, masked success per level on the test and held-out-goal splits against the planner."""
    from agent_lab.evaluation import evaluate
    from agent_lab.recipes import recipe
    from agent_lab.trainer import train

    over = dict(sft_steps=2, sft_slip_from=1, sft_lr_decay_steps=1, steps=1, d_model=16, n_layers=1, n_heads=2,
                batch_size=8, group_size=4, sft_batch_size=4, micro_batch_size=0) if tiny else {}
    t = time.perf_counter()
    r = train(recipe("crafting-full", device=device.type, time_limit_s=limit_s, **over), progress=False)
    seconds = time.perf_counter() - t
    env = make_env("crafting", **r.config.env_options, mask_actions=True, eval_size=8 if tiny else 200)
    ratios, met = {}, True
    for split in ("test", "held_out_goals"):
        rep = evaluate(r.policy, env, split, "greedy", tokenizer=r.tokenizer, candidate_mask=True)
        for level, g in sorted(rep.by_group.items()):
            depth = int(str(level).split()[-1])
            ratio = g["success"] / g["optimum"] if g.get("optimum") else float("nan")
            ratios[f"{split} {level}"] = ratio
            met &= depth not in CRAFTING_TARGET or ratio >= CRAFTING_TARGET[depth]
    print(f"4. crafting, recipe crafting-full (SFT then Dr.GRPO), "
          f"{len(r.history)} steps in {seconds:.0f} s (limit {limit_s:.0f} s): greedy success / planner "
          + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()) + f"; target {'met' if met else 'not met'}")
    return {"crafting_s": seconds, "crafting_steps": len(r.history), "crafting_ratios": ratios,
            "crafting_target_met": met}


def largest_micro_batch(model, batch, env, amp, limit: int = 1 << 16) -> int:
    """The most episodes one micro-batch step holds before CUDA runs out of memory: the batch is repeated to
    twice, four times... its size and stepped whole (``peak_step_memory``) until an allocation fails."""
    from agent_lab.rollout import RolloutBatch

    fits, size = 0, len(batch)
    while size <= limit:
        big = RolloutBatch.concat([batch] * (size // len(batch)))
        try:
            peak_step_memory(model, big, env, amp, 0)
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            del big
            torch.cuda.empty_cache()
        fits, size = size, size * 2
    return fits


def sampler_trainer_gap(model, batch, env, amp) -> dict:
    """Largest and mean |recorded - recomputed| log-prob over the batch's policy tokens (agent_lab.update)."""
    from agent_lab.algorithms import make_algorithm
    from agent_lab.update import batch_loss, logprob_gap

    algo = make_algorithm("dr_grpo", group_size=1, max_tokens=int(env.max_policy_tokens))
    with torch.no_grad(), (torch.autocast("cuda", dtype=amp) if amp is not None else torch.enable_grad()):
        f = batch_loss(model, batch, torch.zeros(len(batch), device=batch.input_ids.device), algo, sampler_view=True)
    return logprob_gap(batch, f.sampler_logprobs)


def peak_step_memory(model, batch, env, amp, micro_batch_size: int) -> float:
    """Peak CUDA memory (MiB) of one token-mean gradient step over ``batch`` in micro-batches of that size."""
    from contextlib import nullcontext

    from agent_lab.algorithms import make_algorithm
    from agent_lab.update import gradient_step

    algo = make_algorithm("sft", group_size=1, max_tokens=int(env.max_policy_tokens))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    gradient_step(model, opt, batch, torch.ones(len(batch), device=batch.input_ids.device), algo, grad_clip=1e9,
                  micro_batch_size=micro_batch_size, amp=torch.autocast("cuda", dtype=amp) if amp else nullcontext())
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def _forward(model, batch, amp):
    """One forward pass over the finished batch, no gradients (bf16 autocast on CUDA)."""
    with torch.no_grad():
        if amp is None:
            return model(batch.input_ids, batch.attention_mask)
        with torch.autocast("cuda", dtype=amp):
            return model(batch.input_ids, batch.attention_mask)


if __name__ == "__main__":
    main()
