"""Continuations from saved states: K fresh episodes from the state before each turn of a batch's episodes,
played by the current policy (VinePPO, Kazemnejad et al. 2024; foundations chapter section 14, "Multi-turn credit
assignment"; book/part2/06_credit_assignment.md).

Each branch point ``(i, t)`` is episode ``i`` before its turn ``t``. A fresh environment of the episode's kind
is reset on its task and fed the episode's first ``t`` logged actions, so it holds the exact state, hidden
information included; the policy reads the same history it read in the episode (the prompt, then each action
and observation, one per line: the same tokens) and samples from there. What a continuation earns from its
first turn on is a draw of the return from that state, which ``estimators.branching_values`` averages into
:math:`\\hat V(h_{it})`.

A continuation stops where the episode itself would have: the environment counts the replayed turns against
its budget and ``turn_limit``, and the context window holds the same tokens. Its return is therefore a draw of
the value of the process the trainer actually runs, truncations included.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
from torch import Tensor

from agent_lab.envs.base import StepBatch

__all__ = ["branch_points", "history_text", "ResumedEpisodes", "continuation_returns"]


def branch_points(episode_logs: list[dict]) -> list[tuple[int, int]]:
    """``(episode, turn)`` for every real turn of every episode, in row-major order."""
    return [(i, t) for i, log in enumerate(episode_logs) for t in range(len(log["turns"]))]


def history_text(episode_log: dict, turns: int) -> str:
    """What the policy has read before turn ``turns``: the prompt, then each earlier action and observation,
    one per line (the rollout's transcript without ``<bos>``)."""
    lines = [episode_log["prompt"]]
    for turn in episode_log["turns"][:turns]:
        lines += [turn["text"], turn["observation"]]
    return "\n".join(lines)


class ResumedEpisodes:
    """Live episodes resumed from saved states, seen by the rollout as one batch of ``len(points) * k`` rows
    whose prompts are their histories (``k`` contiguous rows per point).

    One environment per distinct prefix length is reset on its rows' tasks and fed their logged actions, turn
    by turn; :meth:`step` and :meth:`allowed_actions` dispatch each row to its environment. ``ValueError`` if
    a replayed episode ends before its branch point (the log does not match its environment).
    """

    def __init__(self, episode_logs: list[dict], points: list[tuple[int, int]], k: int):
        from agent_lab.envs import make_env  # late import: the registry imports the environments

        by_turn: dict[int, list[int]] = defaultdict(list)
        rows = [(i, t) for i, t in points for _ in range(k)]
        for r, (_, t) in enumerate(rows):
            by_turn[t].append(r)
        self.envs, self.where = [], [(0, 0)] * len(rows)  # row -> (environment, its row there)
        for t, members in sorted(by_turn.items()):
            logs = [episode_logs[rows[r][0]] for r in members]
            env = make_env(logs[0]["env"], **logs[0]["options"])
            env.reset([log["task"] for log in logs])
            for j in range(t):
                if env.done.any():
                    raise ValueError(f"a replayed episode ended before its branch point (turn {t}); the episode "
                                     "logs do not match their environment")
                env.step([log["turns"][j]["text"] for log in logs])
            if env.done.any():
                raise ValueError(f"a replayed episode is over before its turn {t}: there is no state to branch from")
            for local, r in enumerate(members):
                self.where[r] = (len(self.envs), local)
            self.envs.append(env)
        self.max_turns = int(self.envs[0].max_turns)
        self.max_action_words = int(self.envs[0].max_action_words)
        self.prompts = [history_text(episode_logs[i], t) for i, t in rows]
        self.firsts = [episode_logs[i]["prompt"] for i, _ in rows]

    def __len__(self) -> int:
        return len(self.prompts)

    def reset(self, tasks) -> list[str]:
        """The histories (the environments are already in their saved states)."""
        if len(tasks) != len(self):
            raise ValueError(f"resumed episodes hold {len(self)} rows, got {len(tasks)} tasks")
        return list(self.prompts)

    def episode_prompts(self) -> list[str]:
        """Each row's episode prompt, the start of its history: a prefix-LM policy reads only that part as its
        prompt (``ModelConfig.prompt_attention``), as in the episode itself."""
        return list(self.firsts)

    def _split(self, values: list) -> list[list]:
        parts: list[list] = [[None] * e.batch_size for e in self.envs]
        for r, (e, local) in enumerate(self.where):
            parts[e][local] = values[r]
        return parts

    def step(self, action_texts: list[str]) -> StepBatch:
        results = [env.step(part) for env, part in zip(self.envs, self._split(list(action_texts)))]

        def gather(field: str) -> list:
            return [getattr(results[e], field)[local] for e, local in self.where]

        return StepBatch(gather("observations"), np.asarray(gather("rewards"), dtype=np.float64),
                         np.asarray(gather("done"), dtype=bool), np.asarray(gather("truncated"), dtype=bool),
                         np.asarray(gather("success"), dtype=bool), gather("info"))

    def allowed_actions(self):
        """Each row's candidate actions, or ``None`` when its environment has no candidate mask."""
        sets = [getattr(env, "allowed_actions", lambda: None)() for env in self.envs]
        if any(s is None for s in sets):
            return None
        return [sets[e][local] for e, local in self.where]

    def truncate(self, indices) -> None:
        for r in indices:
            e, local = self.where[r]
            self.envs[e].truncate([local])


@torch.no_grad()
def continuation_returns(policy, tokenizer, batch, k: int, sampling, generator: torch.Generator,
                         gamma: float = 1.0, autocast_dtype: torch.dtype | None = None,
                         rows_per_chunk: int | None = None) -> tuple[Tensor, dict]:
    r"""Returns of ``k`` continuations from the saved state before each real turn of ``batch``'s episodes.

    .. math:: G^{(k)}_{it} = \sum_{j \ge 0} \gamma^j r^{(k)}_{t+j}

    played by ``policy`` under ``sampling`` (the batch's own sampling settings), ``rows_per_chunk`` continuations
    at a time (default ``evaluation.eval_batch_size``: the sampler's cache stays bounded). Returns
    ``([B, T, k]`` returns, NaN at padded turns; ``figures``: ``branch_points``, ``branch_episodes`` (``k`` per
    point, count them in the episode budget), ``branch_turns`` and ``branch_tokens``).
    """
    from agent_lab.evaluation import eval_batch_size
    from agent_lab.rollout import collect_rollouts

    logs = batch.episode_logs
    if len(logs) != len(batch):
        raise ValueError(f"branching replays the batch's episode logs (env.episode_logs()); this batch has "
                         f"{len(logs)} for {len(batch)} episodes")
    points = branch_points(logs)
    chunk = max(1, (rows_per_chunk or eval_batch_size(policy)) // k)
    out = torch.full((*batch.rewards.shape, k), float("nan"))
    figures = {"branch_points": len(points), "branch_episodes": k * len(points), "branch_turns": 0,
               "branch_tokens": 0}
    for start in range(0, len(points), chunk):
        part = points[start:start + chunk]
        env = ResumedEpisodes(logs, part, k)
        cont = collect_rollouts(policy, tokenizer, env, [logs[i]["task"] for i, _ in part for _ in range(k)],
                                sampling, generator, autocast_dtype=autocast_dtype)
        discount = gamma ** torch.arange(cont.rewards.shape[1], dtype=torch.float32)
        returns = (cont.rewards.cpu() * cont.turn_mask.cpu() * discount).sum(-1).view(len(part), k)
        for (i, t), g in zip(part, returns):
            out[i, t] = g
        figures["branch_turns"] += int(cont.turn_mask.sum())
        figures["branch_tokens"] += int(cont.attention_mask.sum())
    return out.to(batch.rewards.device), figures
