"""A throwaway vectorised environment that follows the environment contract (ARCHITECTURE.md), so the
trainer's tests do not depend on the real environments' details. Number search over 1..n with k guesses."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class StepBatch:
    observations: list
    rewards: list
    done: list
    truncated: list
    success: list
    info: list


class ToySearch:
    def __init__(self, n: int = 8, k: int = 3, max_action_words: int = 2):
        self.n, self.max_turns, self.max_action_words = n, k, max_action_words

    def vocabulary(self):
        return ["find", "a", "number", "from", "guess", "higher", "lower", "correct", "invalid"] + [
            str(i) for i in range(1, self.n + 1)
        ]

    def sample_tasks(self, seed_or_rng, n, split="train"):
        rng = seed_or_rng if isinstance(seed_or_rng, random.Random) else random.Random(seed_or_rng)
        return [{"target": rng.randint(1, self.n)} for _ in range(n)]

    def eval_tasks(self, split="test"):
        return [{"target": t} for t in range(1, self.n + 1)]

    def reset(self, tasks):
        self.tasks = list(tasks)
        self.turn = [0] * len(tasks)
        self.lo = [1] * len(tasks)
        self.hi = [self.n] * len(tasks)
        self.logs = [{"task": t, "turns": []} for t in self.tasks]
        self.over = [False] * len(tasks)
        return [f"find a number from 1 {self.n}" for _ in tasks]

    def episode_logs(self):
        return [{**log, "turns": list(log["turns"])} for log in self.logs]

    def allowed_actions(self):
        return [[f"guess {i}" for i in range(lo, hi + 1)] for lo, hi in zip(self.lo, self.hi)]

    def step(self, actions):
        obs, rew, done, trunc, succ, info = [], [], [], [], [], []
        for b, a in enumerate(actions):
            t = self.tasks[b]["target"]
            self.turn[b] += 1
            words = a.split()
            g = int(words[1]) if len(words) == 2 and words[0] == "guess" and words[1].isdigit() else None
            if g is None:
                o = "invalid"
            elif g == t:
                o = "correct"
            elif g < t:
                o, self.lo[b] = "higher", max(self.lo[b], g + 1)
            else:
                o, self.hi[b] = "lower", min(self.hi[b], g - 1)
            ok = o == "correct"
            if not self.over[b]:  # the sampler sends "" for episodes that are over; they are not logged
                self.logs[b]["turns"].append({"text": a, "observation": o})
                self.over[b] = ok or self.turn[b] >= self.max_turns
            obs.append(o)
            rew.append(1.0 if ok else 0.0)
            done.append(ok)
            trunc.append(not ok and self.turn[b] >= self.max_turns)
            succ.append(ok)
            info.append({"executed": f"guess {g}" if g is not None else None})
        return StepBatch(obs, rew, done, trunc, succ, info)

    def optimal_success(self, tasks):
        # binary search over n with k exact guesses finds at most 2^k - 1 numbers
        found = set()

        def rec(lo, hi, k):
            if lo > hi or k == 0:
                return
            m = (lo + hi) // 2
            found.add(m)
            rec(lo, m - 1, k - 1)
            rec(m + 1, hi, k - 1)

        rec(1, self.n, self.max_turns)
        return sum(t["target"] in found for t in tasks) / len(tasks)
