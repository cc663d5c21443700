"""Auxiliary losses (book/part3/01_crafting.md): terms added to a phase's loss.

``observation_loss`` (SFT) also predicts the environment's own text in the demonstrations (prompt and
observations), the look-ups an action needs exercised on more tokens; ``reread_copy_loss`` (SFT, crafting with
``reread``) predicts only the prompt's re-read copies, each token of which repeats one the policy has already
read, so its whole signal trains looking back and copying, the step an action that names an item takes;
``planner_guidance`` (RL) adds the SFT loss of the planner's demonstrations of the tasks whose group no sample
solved (their centred advantages are all zero, so a group algorithm learns nothing from them);
``needed_items_loss`` (SFT, crafting) asks at every item the prompt names whether the goal's tree needs it, the
judgement a failed crafting episode most often gets wrong first (``agent_lab.envs.crafting.first_mistake``),
supervised directly instead of only through the actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from agent_lab.config import setting
from agent_lab.estimators.aggregation import aggregate, reduce_loss
from agent_lab.estimators.filtering import unsolved_groups
from agent_lab.plugins import AuxiliaryLoss, register
from agent_lab.plugins._checks import env_has, weight
from agent_lab.rollout import demonstration_batch
from agent_lab.update import batch_loss, policy_logits


def environment_targets(batch, bidirectional_prompt: bool = False) -> torch.Tensor:
    """``[B, L-1]``: real target tokens the environment wrote (prompt and observations), not the policy. An
    action a demonstration shows but does not imitate (a recovery demonstration's slip, the policy's own turns
    before a DAgger branch) is the policy's text, not the environment's: it carries a turn id and stays out,
    so the loss never learns to predict an off-plan action. With a bidirectional prompt
    (``prompt_attention="bidirectional"``) the prompt's own tokens are left out: every prompt position reads the
    whole prompt, the token it would predict included, so its loss would teach copying."""
    env = batch.attention_mask[:, 1:] & (batch.turn_ids < 0)
    if bidirectional_prompt:
        predicted = torch.arange(1, batch.attention_mask.shape[1], device=env.device)  # the token each target is
        env = env & (predicted[None, :] >= batch.prompt_lengths[:, None])
    return env


def targets_nll(logprobs: torch.Tensor, targets: torch.Tensor, whole_targets: torch.Tensor) -> torch.Tensor:
    """Mean NLL of a micro-batch's ``targets`` over the whole batch's count of them (``whole_targets``), so the
    micro-batches' terms add up to the whole batch's token mean."""
    num, _ = aggregate(logprobs, targets, "token_mean")
    return -reduce_loss(num, whole_targets.sum().float())


def reread_targets(batch, copies: int) -> torch.Tensor:
    """``[B, L-1]``: the targets that lie in the prompt's re-read copies (every copy after the first) when the
    prompt is ``copies`` copies of the same text, one after the other. Each row is ``<bos>``, the copies, each
    closed by a newline (the last by the one before the first action), so one copy with its newline is
    ``(prompt_length - 1) / copies`` tokens."""
    if copies < 2:
        raise ValueError(f"a re-read copy needs a prompt shown at least twice, got copies={copies}")
    start = 1 + (batch.prompt_lengths - 1) // copies  # the second copy's first token
    predicted = torch.arange(1, batch.attention_mask.shape[1], device=start.device)[None, :]
    inside = (predicted >= start[:, None]) & (predicted < batch.prompt_lengths[:, None])
    return environment_targets(batch) & inside


@register
@dataclass
class ObservationLoss(AuxiliaryLoss):
    """SFT loss += ``weight`` * token-mean NLL of the environment's tokens in the demonstrations."""

    weight: float = setting(1.0, "SFT loss += this * the NLL of the environment's tokens",
                            flat="sft_observation_weight", off=0.0)

    name: ClassVar[str] = "observation_loss"
    phase: ClassVar[str] = "sft"
    option: ClassVar[str] = "observation_loss weight (sft_observation_weight)"  # as errors name it
    logged: ClassVar[str] = "observation_nll"

    def __post_init__(self):
        weight(self.option, self.weight)

    def targets(self, run, batch) -> torch.Tensor:
        """``[B, L-1]``: the targets whose NLL the term averages."""
        return environment_targets(batch, run.cfg.model.prompt_attention == "bidirectional")

    def term(self, run, micro, logprobs, whole, last):
        nll = targets_nll(logprobs, self.targets(run, micro), self.targets(run, whole))
        return self.weight * nll, {self.logged: float(nll.detach())}

    def describe(self, cfg):
        prompt = ("observations; not the prompt, which the policy reads both ways"
                  if cfg.model.prompt_attention == "bidirectional" else "prompt and observations")
        return (f"SFT auxiliary loss: + {self.weight} * mean NLL of the environment's tokens ({prompt}) in the "
                "demonstrations")


@register
@dataclass
class RereadCopyLoss(ObservationLoss):
    """SFT loss += ``weight`` * token-mean NLL of the prompt's re-read copies in the demonstrations."""

    weight: float = setting(1.0, "SFT loss += this * the NLL of the prompt's re-read copies (crafting with reread)",
                            flat="sft_copy_weight", off=0.0)

    name: ClassVar[str] = "reread_copy_loss"
    option: ClassVar[str] = "reread_copy_loss weight (sft_copy_weight)"
    logged: ClassVar[str] = "copy_nll"

    def check(self, cfg, world_size):
        if not cfg.env_options.get("reread"):
            raise ValueError("reread_copy_loss (sft_copy_weight) trains on the prompt's re-read copies, and this "
                             "run shows its prompt once: set env_options reread (crafting) or turn the loss off")
        if cfg.model.prompt_attention == "bidirectional":
            # every prompt token then reads the token it would predict, so the loss would teach nothing
            raise ValueError("reread_copy_loss (sft_copy_weight) needs a causal prompt; with prompt_attention="
                             "'bidirectional' each copy token sees itself: use one or the other")

    def targets(self, run, batch) -> torch.Tensor:
        return reread_targets(batch, 1 + int(run.env.reread))

    def describe(self, cfg):
        return f"SFT auxiliary loss: + {self.weight} * mean NLL of the prompt's re-read copies in the demonstrations"


@register
@dataclass
class PlannerGuidance(AuxiliaryLoss):
    """RL loss += ``coef`` * SFT loss (token mean) on the planner's demonstration of each unsolved task."""

    coef: float = setting(0.05, "RL loss += this * the SFT loss on the planner's demonstration of each "
                                "unsolved task", flat="guide_coef", off=0.0)

    name: ClassVar[str] = "planner_guidance"
    phase: ClassVar[str] = "rl"

    def __post_init__(self):
        weight("planner_guidance coef (guide_coef)", self.coef)
        self._guide = None

    def check(self, cfg, world_size):
        algo = cfg.algorithm.build(max_tokens=1)
        if not (algo.needs_groups and algo.epochs == 1 and algo.minibatches == 1):
            raise ValueError(f"planner_guidance (guide_coef) adds demonstrations for task groups no sample solved, "
                             f"which needs a group algorithm with one update per rollout batch; algo "
                             f"{cfg.algorithm.name!r} is not one: choose rloo, grpo or dr_grpo, or turn it off")
        if world_size > 1:
            raise ValueError(f"planner_guidance (guide_coef) runs in one process (workers would disagree on how many "
                             f"demonstrations they add); got {world_size} workers: turn it off or run without torchrun")

    def prepare(self, run, batch):
        G = run.cfg.algorithm.group_size
        unsolved = unsolved_groups(batch.success.float(), G).nonzero().reshape(-1).tolist()
        self._guide = (demonstration_batch(run.env, run.tok, [batch.tasks[g * G] for g in unsolved], run.device)
                       if unsolved else None)
        return {"guided_groups": len(unsolved)}

    def term(self, run, micro, logprobs, whole, last):
        if not last or self._guide is None:
            return None, {}
        guide = self._guide
        g = batch_loss(run.ddp_model, guide, run.sft_algo.advantages(guide, None), run.sft_algo).loss
        return self.coef * g, {"guide_nll": float(g.detach())}

    def describe(self, cfg):
        return (f"planner guidance: loss += {self.coef} * SFT loss (token mean) on the planner's demonstration "
                "of each task whose group no sample solved")


def needed_labels(batch, tok, needed_of) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions [B, L] bool, labels [B, L] bool)``: every prompt token that names an item of the row's task, and
    whether the goal needs that item (``needed_of(task)``, the goal's tree). A label belongs to the item, so each
    mention of it in the prompt, as a recipe line's head or as an ingredient, carries the same one."""
    B, L = batch.input_ids.shape
    lookup = torch.full((B, len(tok)), -1, dtype=torch.long)  # per row and word: -1 not an item, 1 needed, 0 not
    for b, task in enumerate(batch.tasks):
        needed = needed_of(task)
        for x in set(task["recipes"]) | set(task["base"]):
            if x in tok.index:
                lookup[b, tok.index[x]] = int(x in needed)
    said = lookup.to(batch.input_ids.device).gather(1, batch.input_ids)
    in_prompt = torch.arange(L, device=said.device)[None, :] < batch.prompt_lengths[:, None]
    return (said >= 0) & in_prompt, said == 1


@register
@dataclass
class NeededItemsLoss(AuxiliaryLoss):
    """SFT loss += ``weight`` * mean logistic loss of "is this item on the goal's tree", read at each prompt token
    that names an item, from the logits of two fixed words (``ok``: needed, ``invalid``: not)."""

    weight: float = setting(1.0, "SFT loss += this * the loss of telling, at each item named in the prompt, "
                                 "whether the goal needs it (crafting, bidirectional prompt)",
                            flat="sft_needed_weight", off=0.0)

    name: ClassVar[str] = "needed_items_loss"
    phase: ClassVar[str] = "sft"

    def __post_init__(self):
        weight("needed_items_loss weight (sft_needed_weight)", self.weight)

    def check(self, cfg, world_size):
        env_has(cfg, "needed_items", "needed_items_loss (sft_needed_weight)")
        if cfg.model.prompt_attention != "bidirectional":
            # a causal prompt token cannot see a later line that makes its item needed; and the logits it would
            # use predict the next prompt token, which a bidirectional prompt never trains
            raise ValueError("needed_items_loss (sft_needed_weight) reads labels at prompt tokens, which needs "
                             "prompt_attention='bidirectional'; set it or turn the loss off")

    def term(self, run, micro, logprobs, whole, last):
        where, labels = needed_labels(micro, run.tok, run.env.needed_items)
        total = max(int(needed_labels(whole, run.tok, run.env.needed_items)[0].sum()), 1)
        where, labels = where[:, :-1], labels[:, :-1]  # never the last token, which has no logits of its own
        logits = policy_logits(run.ddp_model, micro, 1.0)  # [b, L-1, V]: position j's logits; all allowed there
        pair = logits[..., [run.tok.index["ok"], run.tok.index["invalid"]]]
        target = (~labels).long()  # 0: "ok" (needed), 1: "invalid" (not needed)
        nll = torch.nn.functional.cross_entropy(pair[where], target[where], reduction="sum") / total
        with torch.no_grad():
            right = (pair[where].argmax(-1) == target[where]).float().sum()
        return self.weight * nll, {"needed_nll": float(nll.detach()), "needed_accuracy": float(right) / total}

    def describe(self, cfg):
        return (f"SFT auxiliary loss: + {self.weight} * mean logistic loss of whether the goal needs each item "
                "named in the prompt")
