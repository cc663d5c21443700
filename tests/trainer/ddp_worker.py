"""Run under ``torchrun --nproc_per_node 2``: DDP gradients on two shards (whole and in micro-batches), then two
DDP training steps.

Every rank collects the same full batch (same seed), trains on its contiguous half through DDP with the
trainer's loss (``estimators.reduce_loss`` all-reduces the normaliser) and with the student ``loss_fn`` forms of
``conftest.STUDENT_LOSSES``, and writes each averaged gradient.
Rank 0 also saves the full batch so the test can compute the single-process gradient on it.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).parent))
from conftest import FAST, STUDENT_LOSSES, tiny_policy  # noqa: E402

from agent_lab import distributed as D  # noqa: E402
from agent_lab.algorithms import AlgoState, make_algorithm  # noqa: E402
from agent_lab.envs import make_env  # noqa: E402
from agent_lab.policy import WordTokenizer  # noqa: E402
from agent_lab.rollout import SamplingConfig, collect_rollouts  # noqa: E402
from agent_lab.estimators.aggregation import OBJECTIVES  # noqa: E402
from agent_lab.trainer import TrainConfig, loss_and_stats, max_action_tokens, train  # noqa: E402
from agent_lab.update import gradient_step  # noqa: E402


def main(out: Path, objective: str) -> None:
    torch.set_num_threads(1)
    info = D.setup("cpu")
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    model = tiny_policy(tok, seed=3)
    tasks = [t for t in env.sample_tasks(5, 6) for _ in range(4)]
    batch = collect_rollouts(model, tok, env, tasks, SamplingConfig(candidate_mask=True), torch.Generator().manual_seed(9))
    algo = make_algorithm("grpo", group_size=4, max_tokens=max_action_tokens(env), objective=objective)
    adv = algo.advantages(batch, AlgoState())
    rows = torch.arange(len(batch))[D.shard(len(batch), info)]
    shard = batch.select(rows)
    ddp = DDP(model)
    grads = {}
    for name, loss_fn in [("builtin", None), *STUDENT_LOSSES.items()]:
        model.zero_grad(set_to_none=True)
        loss, _ = loss_and_stats(ddp, shard, adv[rows], algo, loss_fn=loss_fn)
        loss.backward()
        grads[name] = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    # every objective, split into uneven micro-batches (5, 5, 2 episodes) on each worker: gradients accumulate
    # locally (no_sync) and are averaged once; the normaliser is the whole step's over both workers
    for objective_name in OBJECTIVES:
        algo_o = make_algorithm("grpo", group_size=4, max_tokens=max_action_tokens(env), objective=objective_name)
        gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), shard, adv[rows], algo_o, grad_clip=1e9,
                      micro_batch_size=5, ddp=ddp)
        grads[f"micro_{objective_name}"] = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    torch.save({"grads": grads, "tokens": int(shard.action_mask.sum())}, out / f"grads_rank{info.rank}.pt")
    if info.rank == 0:
        torch.save({"batch": batch, "adv": adv}, out / "batch.pt")
    dist.barrier()
    # the trainer itself under torchrun: two DDP steps end to end, with dynamic sampling (workers may draw a
    # different number of rounds; the update must still stay in step)
    r = train(TrainConfig(**{**FAST, "algo": "dr_grpo", "steps": 2, "candidate_mask": True, "resample_rounds": 1,
                             "run_dir": str(out / "run")}), progress=False)
    torch.save({k: v.clone() for k, v in r.policy.state_dict().items()}, out / f"trained_rank{info.rank}.pt")
    D.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
