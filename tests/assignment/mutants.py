"""Plausible wrong implementations of the assignment's graded functions (the mutation test's mutants).

Each mutant is the full source of one solution cell, as a student might write it, with one realistic bug.
The mutation test (``test_mutants.py``) runs the notebook's visible and hidden tests against every mutant
and requires that each loses points while the reference solution keeps full marks. The autograder's
sample submissions reuse some of them through :func:`submission_notebook`.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "assignments" / "source" / "policy_gradients" / "policy_gradients.ipynb"


@dataclass(frozen=True)
class Mutant:
    grade_id: str  # the solution cell it replaces
    bug: str  # what is wrong, in one line
    source: str  # the whole cell


_RTG = "def reward_to_go(rewards, gamma):\n"
_RL = "def reinforce_loss(logprobs, action_mask, coefficients):\n"
_ADV = "def dr_grpo_advantages(rewards, group_size):\n"
_DRL = "def dr_grpo_loss(logprobs, action_mask, advantages, max_tokens):\n"

MUTANTS: dict[str, Mutant] = {
    # ---------------------------------------------------------------- reward_to_go
    "rtg_forward_cumsum": Mutant("reward_to_go", "a forward (past) discounted cumulative sum instead of a reverse one", _RTG + """\
    out = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1]):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out
"""),
    "rtg_gamma_absolute_power": Mutant("reward_to_go", "gamma^k instead of gamma^(k - t)", _RTG + """\
    T = rewards.shape[-1]
    powers = gamma ** torch.arange(T, dtype=rewards.dtype)
    weighted = rewards * powers
    return weighted.flip(-1).cumsum(-1).flip(-1)
"""),
    "rtg_gamma_off_by_one": Mutant("reward_to_go", "gamma^(k - t + 1): the current reward is discounted too", _RTG + """\
    out = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = gamma * (rewards[..., t] + running)
        out[..., t] = running
    return out
"""),
    "rtg_total_return_everywhere": Mutant("reward_to_go", "past rewards included: the whole discounted return at every step", _RTG + """\
    T = rewards.shape[-1]
    powers = gamma ** torch.arange(T, dtype=rewards.dtype)
    total = (rewards * powers).sum(-1, keepdim=True)
    return total.expand_as(rewards).clone()
"""),
    "rtg_ignores_gamma": Mutant("reward_to_go", "no discounting: a plain reverse cumulative sum", _RTG + """\
    return rewards.flip(-1).cumsum(-1).flip(-1)
"""),
    "rtg_loops_over_first_axis": Mutant("reward_to_go", "iterates over the first axis, so a [B, T] batch is summed over episodes", _RTG + """\
    out = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out
"""),
    "rtg_float32_output": Mutant("reward_to_go", "right values, but always returns float32", _RTG + """\
    out = torch.zeros(rewards.shape)
    running = torch.zeros(rewards.shape[:-1])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out
"""),
    # ---------------------------------------------------------------- reinforce_loss
    "rl_missing_1_over_B": Mutant("reinforce_loss", "sums over the batch: the 1/B is missing", _RL + """\
    return -(action_mask * coefficients * logprobs).sum()
"""),
    "rl_token_mean": Mutant("reinforce_loss", "divides by the number of action tokens instead of B", _RL + """\
    return -(action_mask * coefficients * logprobs).sum() / action_mask.sum().clamp(min=1)
"""),
    "rl_mean_over_grid": Mutant("reinforce_loss", "mean over all B * L positions", _RL + """\
    return -(action_mask * coefficients * logprobs).mean()
"""),
    "rl_sign_error": Mutant("reinforce_loss", "sign error: ascends the loss", _RL + """\
    return (action_mask * coefficients * logprobs).sum() / logprobs.shape[0]
"""),
    "rl_unmasked": Mutant("reinforce_loss", "ignores the mask: prompt and observation tokens get credit", _RL + """\
    return -(coefficients * logprobs).sum() / logprobs.shape[0]
"""),
    "rl_no_gradient": Mutant("reinforce_loss", "right value, but rebuilt from .item(): no gradient", _RL + """\
    value = -(action_mask * coefficients * logprobs).sum().item() / logprobs.shape[0]
    return torch.tensor(value, dtype=logprobs.dtype)
"""),
    # ---------------------------------------------------------------- dr_grpo_advantages
    "adv_std_division": Mutant("dr_grpo_advantages", "GRPO's division by the group standard deviation", _ADV + """\
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, unbiased=False, keepdim=True) if group_size > 1 else torch.zeros_like(groups)
    return (centred / (std + 1e-6)).reshape(-1)
"""),
    "adv_interleaved_groups": Mutant("dr_grpo_advantages", "groups taken as interleaved (every G-th row) instead of contiguous", _ADV + """\
    groups = rewards.reshape(group_size, -1)
    return (groups - groups.mean(dim=0, keepdim=True)).reshape(-1)
"""),
    "adv_batch_mean": Mutant("dr_grpo_advantages", "subtracts the whole batch's mean, not each group's", _ADV + """\
    return rewards - rewards.mean()
"""),
    "adv_leave_one_out": Mutant("dr_grpo_advantages", "leave-one-out (RLOO) baseline instead of the group mean", _ADV + """\
    groups = rewards.reshape(-1, group_size)
    if group_size == 1:
        return torch.zeros_like(rewards)
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)
"""),
    # ---------------------------------------------------------------- dr_grpo_loss
    "drl_sequence_length_norm": Mutant("dr_grpo_loss", "GRPO's per-sequence length normalisation", _DRL + """\
    lengths = action_mask.sum(dim=1).clamp(min=1)
    per_sequence = (action_mask * logprobs).sum(dim=1) / lengths
    return -(advantages * per_sequence).mean()
"""),
    "drl_token_mean": Mutant("dr_grpo_loss", "divides by the batch's action-token count instead of B * max_tokens", _DRL + """\
    per_token = advantages[:, None] * action_mask * logprobs
    return -per_token.sum() / action_mask.sum().clamp(min=1)
"""),
    "drl_padded_length": Mutant("dr_grpo_loss", "divides by B * L (the padded length) instead of B * max_tokens", _DRL + """\
    B, L = logprobs.shape
    return -(advantages[:, None] * action_mask * logprobs).sum() / (B * L)
"""),
    "drl_unmasked": Mutant("dr_grpo_loss", "ignores the mask: observation and padding tokens get the advantage", _DRL + """\
    B = logprobs.shape[0]
    return -(advantages[:, None] * logprobs).sum() / (B * max_tokens)
"""),
    "drl_sign_error": Mutant("dr_grpo_loss", "sign error", _DRL + """\
    B = logprobs.shape[0]
    return (advantages[:, None] * action_mask * logprobs).sum() / (B * max_tokens)
"""),
    "drl_missing_B": Mutant("dr_grpo_loss", "divides by max_tokens only (the 1/B is missing)", _DRL + """\
    return -(advantages[:, None] * action_mask * logprobs).sum() / max_tokens
"""),
}

# Right values on every visible example, wrong in general: only the hidden tests can catch these.
# (Writing into the caller's tensors is not among them: the grader cannot see the kernel's copy of an argument,
# so the assignment does not grade it.)
VISIBLE_PASSING: dict[str, Mutant] = {
    "rtg_float32_inside": Mutant("reward_to_go", "computes in float32 whatever the input dtype: float64 returns "
                                 "lose precision", _RTG + """\
    r = rewards.to(torch.float32)
    out = torch.empty_like(r)
    running = torch.zeros_like(r[..., 0])
    for t in range(r.shape[-1] - 1, -1, -1):
        running = r[..., t] + gamma * running
        out[..., t] = running
    return out.to(rewards.dtype)
"""),
    "rl_rows_with_actions": Mutant("reinforce_loss", "divides by the number of rows that have an action token, "
                                   "not by B", _RL + """\
    rows = (action_mask.sum(dim=1) > 0).sum().clamp(min=1)
    return -(action_mask * coefficients * logprobs).sum() / rows
"""),
    "adv_float32_inside": Mutant("dr_grpo_advantages", "centres in float32 whatever the input dtype: float64 "
                                 "advantages lose precision", _ADV + """\
    groups = rewards.to(torch.float32).reshape(-1, group_size)
    return (groups - groups.mean(dim=1, keepdim=True)).reshape(-1).to(rewards.dtype)
"""),
    "drl_float64_denominator": Mutant("dr_grpo_loss", "the constant as a float64 tensor: float32 losses come "
                                      "back as float64", _DRL + """\
    total = (advantages * (action_mask * logprobs).sum(dim=1)).sum()
    return -total / torch.tensor(logprobs.shape[0] * max_tokens, dtype=torch.float64)
"""),
}

# A submission that calls the library instead of implementing: must fail, because the grading kernel has no
# agent_lab but its checks.
CALLS_REFERENCE: dict[str, str] = {
    "reward_to_go": "import agent_lab.estimators\n\n" + _RTG
                    + "    return agent_lab.estimators.reward_to_go(rewards, gamma)\n",
    "reinforce_loss": "from agent_lab.estimators import aggregate, reinforce_surrogate\n\n" + _RL + """\
    numerator, denominator = aggregate(reinforce_surrogate(logprobs, coefficients), action_mask, "constant", max_tokens=1)
    return -numerator / denominator
""",
    "dr_grpo_advantages": "from agent_lab.training import centered_group_advantages\n\n" + _ADV + """\
    rows = rewards.tolist()
    out = [a for g in range(0, len(rows), group_size) for a in centered_group_advantages(rows[g:g + group_size])]
    return torch.tensor(out, dtype=rewards.dtype)
""",
    "dr_grpo_loss": "from agent_lab.estimators import aggregate as _agg, reinforce_surrogate as _surr\n\n" + _DRL + """\
    numerator, denominator = _agg(_surr(logprobs, advantages), action_mask, "constant", max_tokens=max_tokens)
    return -numerator / denominator
""",
}

# A submission that returns the visible examples' answers and nothing else: must score under half.
HARD_CODED: dict[str, str] = {
    "reward_to_go": _RTG + """\
    answers = {(2, 0.9): [1.1, 1.0], (4, 1.0): [1.0, 1.0, 1.0, 1.0], (3, 0.0): [1.0, 2.0, 3.0],
               (6, 0.5): [[1.5, 1.0, 2.0], [0.875, 0.75, 0.5]]}
    return torch.tensor(answers[(rewards.numel(), gamma)], dtype=rewards.dtype)
""",
    "reinforce_loss": _RL + """\
    value = 1.425 if logprobs.shape == (2, 3) else 2.0
    return (logprobs * 0).sum() + value
""",
    "dr_grpo_advantages": _ADV + """\
    answers = {8: [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25], 6: [0.0] * 6, 2: [-1.0, 1.0]}
    return torch.tensor(answers[rewards.numel()], dtype=rewards.dtype)
""",
    "dr_grpo_loss": _DRL + """\
    return (logprobs * 0).sum() + 0.09375
""",
}


def solution_source(grade_id: str, notebook: nbformat.NotebookNode | None = None) -> str:
    """The reference solution of one cell as a student would have written it (nbgrader markers removed)."""
    notebook = notebook or nbformat.read(SOURCE, as_version=4)
    for cell in notebook.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            return re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", "", cell.source, flags=re.M)
    raise ValueError(f"no cell with grade_id {grade_id!r} in {SOURCE}")
