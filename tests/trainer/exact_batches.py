"""Small batches whose statistics are known exactly: one action token per episode over a vocabulary of three,
a "policy" whose logits are a parameter, and behaviour log-probs chosen so that the episodes enumerate the
behaviour distribution mu exactly (token x appears in a share mu(x) of the rows). A sample mean over such a
batch *is* the expectation under mu (tests/trainer/test_statistics.py, tests/trainer/test_ppo_exact.py)."""

from __future__ import annotations

import math

import torch

from agent_lab.rollout import RolloutBatch
from agent_lab.update import gradient_step

MU = [0.5, 0.25, 0.25]  # behaviour distribution, enumerated by 4 rows: tokens 0, 0, 1, 2
TOKENS = [0, 0, 1, 2]


class FixedLogits(torch.nn.Module):
    """A policy whose teacher-forced logits are one parameter ``[B, L, V]`` (the input is ignored)."""

    def __init__(self, probs: list[list[float]], length: int = 2):
        super().__init__()
        z = torch.log(torch.tensor(probs, dtype=torch.float64))[:, None, :].expand(-1, length, -1)
        self.z = torch.nn.Parameter(z.clone())

    def forward(self, input_ids, attention_mask=None, segment_ids=None):
        return self.z


def one_token_batch(tokens, old_probs, rewards=None, top_p=1.0) -> RolloutBatch:
    """``B`` episodes of one action token each (target ``tokens[b]`` at position 1); ``old_probs[b]`` the
    behaviour probability recorded for it."""
    B, V = len(tokens), 3
    ids = torch.tensor([[0, t] for t in tokens])
    r = torch.tensor(rewards if rewards is not None else [1.0] * B, dtype=torch.float64)
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones(B, 2, dtype=torch.bool),
        action_mask=torch.ones(B, 1, dtype=torch.bool),
        old_logprobs=torch.log(torch.tensor(old_probs, dtype=torch.float64))[:, None],
        turn_ids=torch.zeros(B, 1, dtype=torch.long), allowed_tokens=torch.ones(B, 1, V, dtype=torch.bool),
        rewards=r[:, None], turn_mask=torch.ones(B, 1, dtype=torch.bool), success=r > 0, episode_return=r,
        num_turns=torch.ones(B, dtype=torch.long), truncated=torch.zeros(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long), top_p=top_p)


def step(model, batch, algo, adv, grad_clip=1e9, ref=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    return gradient_step(model, opt, batch, adv, algo, grad_clip=grad_clip, ref_logprobs=ref, sampler_view=True)


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def number_search_states(logs: list[dict], n: int) -> list[list[tuple[int, int, int]]]:
    """The state ``(lo, hi, guesses spent)`` before each turn of logged number-search episodes, worked out from
    the logged guesses and answers alone (not from the environment's own ``state`` keys)."""
    out = []
    for log in logs:
        lo, hi, row = 1, n, []
        for t, turn in enumerate(log["turns"]):
            row.append((lo, hi, t))
            guess, answer = turn["action"], turn["observation"]
            if answer == "higher":
                lo = max(lo, guess + 1)
            elif answer == "lower":
                hi = min(hi, guess - 1)
        out.append(row)
    return out
