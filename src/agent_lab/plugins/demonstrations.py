"""Demonstration sources for the SFT cold start (book/part3/01_crafting.md): which transcripts are imitated.

Plain demonstrations follow the planner from the start and never show a mistake. ``recovery_demonstrations``
puts one off-plan action (a slip) in some transcripts, followed by the planner's recovery; ``dagger`` starts
some from the policy's own sampled episode (Ross, Gordon and Bagnell 2011). In both, the actions the planner
did not choose stay in the transcript the policy reads but out of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agent_lab.config import setting
from agent_lab.plugins import DemonstrationSource, register
from agent_lab.plugins._checks import count, env_has, probability
from agent_lab.rollout import collect_rollouts
from agent_lab.streams import replay_choice_rng, sampling_generator


def _check_window(cfg, name: str, from_step: int) -> None:
    if cfg.sft.steps == 0:
        raise ValueError(f"{name} rewrites SFT demonstrations: set sft_steps >= 1 or turn {name} off")
    if from_step >= cfg.sft.steps:
        raise ValueError(f"{name}: from_step={from_step} has no effect: it must be fewer than the {cfg.sft.steps} "
                         f"SFT steps; lower it or add SFT steps")


@register
@dataclass
class RecoveryDemonstrations(DemonstrationSource):
    """With probability ``prob`` per task, one slip and the planner's recovery (``env.recovery_demonstrations``),
    from SFT step ``from_step`` on (0: from the start)."""

    prob: float = setting(0.5, "SFT: the share of transcripts with one off-plan action and the planner's "
                               "recovery (needs crafting)", flat="sft_slip_prob", off=0.0)
    from_step: int = setting(0, "SFT: the step from which recovery demonstrations start",
                             flat="sft_slip_from")

    name: ClassVar[str] = "recovery_demonstrations"

    def __post_init__(self):
        probability("recovery_demonstrations prob (sft_slip_prob)", self.prob)
        count("recovery_demonstrations from_step (sft_slip_from)", self.from_step)

    def check(self, cfg, world_size):
        env_has(cfg, "recovery_demonstrations", "recovery_demonstrations (sft_slip_prob)")
        _check_window(cfg, "recovery_demonstrations", self.from_step)

    def demonstrations(self, run, tasks, step, demos, trained, rng):
        if step < self.from_step or self.prob == 0:
            return demos, trained, {}
        demos, trained = run.env.recovery_demonstrations(tasks, rng, self.prob)
        return demos, trained, {}

    def describe(self, cfg):
        return (f"SFT recovery demonstrations: {self.prob:.0%} of transcripts contain one off-plan action (not "
                "imitated), then the planner's shortest plan from there"
                + (f"; from SFT step {self.from_step} on" if self.from_step else ""))


@register
@dataclass
class DAgger(DemonstrationSource):
    """With probability ``prob`` per task, the policy plays the task (sampled as the run declares, without
    gradients); its episode is replayed to a uniformly drawn turn and the planner finishes from there
    (``env.branched_demonstrations``); from SFT step ``from_step`` on."""

    prob: float = setting(0.5, "SFT: the share of tasks the policy plays, the planner finishing from a drawn "
                               "turn (DAgger; needs crafting)", flat="sft_dagger_prob", off=0.0)
    from_step: int = setting(0, "SFT: the step from which DAgger demonstrations start",
                             flat="sft_dagger_from")

    name: ClassVar[str] = "dagger"
    plays_policy: ClassVar[bool] = True

    def __post_init__(self):
        probability("dagger prob (sft_dagger_prob)", self.prob)
        count("dagger from_step (sft_dagger_from)", self.from_step)

    def check(self, cfg, world_size):
        env_has(cfg, "branched_demonstrations", "dagger (sft_dagger_prob)")
        _check_window(cfg, "dagger", self.from_step)

    def demonstrations(self, run, tasks, step, demos, trained, rng):
        if step < self.from_step or self.prob == 0:
            return demos, trained, {}
        cfg, rank = run.cfg, run.info.rank
        drawn = [k for k, u in enumerate(replay_choice_rng(cfg.seed, step, rank).random(len(tasks))) if u < self.prob]
        if not drawn:
            return demos, trained, {"dagger_episodes": 0}
        played = collect_rollouts(run.model, run.tok, run.env, [tasks[k] for k in drawn], cfg.sampling,
                                  sampling_generator(cfg.seed, step, rank, run.device), policy_version=step,
                                  autocast_dtype=run.amp_dtype)
        if demos is None:
            demos = run.env.demonstrations(tasks)
            trained = [[True] * len(d) for d in demos]
        acts = [[turn["text"] for turn in log["turns"]] for log in played.episode_logs]
        branched = run.env.branched_demonstrations([tasks[k] for k in drawn], acts, rng)
        for k, d, f in zip(drawn, *branched):
            demos[k], trained[k] = d, f
        return demos, trained, {"dagger_episodes": len(drawn), "dagger_success": float(played.success.float().mean())}

    def describe(self, cfg):
        return (f"SFT DAgger demonstrations: {self.prob:.0%} of transcripts replay the policy's own episode on the "
                "task (sampled as declared above, not imitated) to a uniformly drawn turn, then the planner's "
                "shortest plan from there" + (f"; from SFT step {self.from_step} on" if self.from_step else ""))
