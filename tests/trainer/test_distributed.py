"""Two CPU processes under torchrun (gloo): the DDP gradient equals the single-process gradient on the
concatenated batch, because the loss normaliser is summed over workers (book/part2/05_loss_normalisation.md);
also for a student ``loss_fn`` that returns ``(numerator, denominator)`` or a loss with a fixed per-sequence
normaliser, and for every objective split into uneven micro-batches on each worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import STUDENT_LOSSES, tiny_policy

from agent_lab.algorithms import make_algorithm
from agent_lab.envs import make_env
from agent_lab.estimators.aggregation import OBJECTIVES
from agent_lab.policy import WordTokenizer
from agent_lab.trainer import loss_and_stats, max_action_tokens


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["token_mean"])
def test_two_process_ddp_gradient_equals_single_process_gradient_on_concatenated_batch(tmp_path, objective):
    env_vars = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).parent / "ddp_worker.py"), str(tmp_path), objective]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env_vars)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = torch.load(tmp_path / "batch.pt", weights_only=False)
    batch, adv = saved["batch"], saved["adv"]
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=3)
    algo = make_algorithm("grpo", group_size=4, max_tokens=max_action_tokens(env), objective=objective)
    r0 = torch.load(tmp_path / "grads_rank0.pt")
    r1 = torch.load(tmp_path / "grads_rank1.pt")
    assert r0["tokens"] != r1["tokens"], "the shards should hold different token counts for this test to bite"
    # built-in objective, and a student loss_fn returning (numerator, denominator) or a fixed-normaliser loss
    for form, loss_fn in [("builtin", None), ("pair_token_mean", STUDENT_LOSSES["pair_token_mean"]),
                          ("scalar_constant", STUDENT_LOSSES["scalar_constant"])]:
        model.zero_grad(set_to_none=True)
        loss, _ = loss_and_stats(model, batch, adv, algo, loss_fn=loss_fn)
        loss.backward()
        for name, p in model.named_parameters():
            for r in (r0, r1):
                torch.testing.assert_close(r["grads"][form][name], p.grad, atol=1e-6, rtol=1e-5,
                                           msg=f"{form}: gradient of {name}")
    # every objective in uneven micro-batches on each worker (unequal token counts per worker)
    for objective_name in OBJECTIVES:
        algo_o = make_algorithm("grpo", group_size=4, max_tokens=max_action_tokens(env), objective=objective_name)
        model.zero_grad(set_to_none=True)
        loss, _ = loss_and_stats(model, batch, adv, algo_o)
        loss.backward()
        for name, p in model.named_parameters():
            for r in (r0, r1):
                torch.testing.assert_close(r["grads"][f"micro_{objective_name}"][name], p.grad, atol=1e-6, rtol=1e-5,
                                           msg=f"{objective_name} in micro-batches under DDP: gradient of {name}")
    # a token mean returned as one number is normalised per worker: DDP's average of the two local means
    # differs from the concatenated batch's gradient (the reason the pair form exists)
    model.zero_grad(set_to_none=True)
    loss, _ = loss_and_stats(model, batch, adv, algo, loss_fn=STUDENT_LOSSES["pair_token_mean"])
    loss.backward()
    gap = max(float((r0["grads"]["scalar_token_mean"][n] - p.grad).abs().max()) for n, p in model.named_parameters())
    assert gap > 1e-4, gap
    # locally normalised losses averaged by DDP would give a different gradient: check the test can tell
    w0 = r0["tokens"] / (r0["tokens"] + r1["tokens"])
    assert abs(w0 - 0.5) > 1e-3
    # the trainer ran under torchrun and both workers hold identical weights
    a = torch.load(tmp_path / "trained_rank0.pt")
    b = torch.load(tmp_path / "trained_rank1.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "run" / "metrics.jsonl").exists()
