"""Number search, the lecture's running example, as a batched text environment.

A hidden integer is uniform on ``1..N`` (default 16); the agent has ``K`` guesses (default 4). Text
protocol (one line per turn)::

    find the number from 1 to 16 in 4 guesses      <- prompt
    guess 8                                        <- action
    higher                                         <- observation: the number is higher than 8
    guess 12
    correct                                        <- reward 1, episode over

``correct`` ends the episode with reward 1 (or ``1 - 0.05 T`` for success on guess ``T`` with
``reward="length"``, lecture notes section 2); spending all guesses ends it with reward 0. The hidden number
never appears in the text the policy sees. Actions are ``guess <k>``; the parser ignores extra spaces
and capitals. Anything else (empty text, another word, a number outside 1..N, text over 200
characters) is invalid and handled by the declared rule ``invalid_action``: ``"spend_turn"``
(default: answer ``invalid``, use up the turn) or ``"end_episode"`` (answer ``invalid``, reward 0).
The log records both the sampled text and the executed guess (lecture notes section 3).

With ``mask_actions=True``, :meth:`NumberSearch.allowed_actions` gives each episode's guesses inside
the current candidate interval (lecture notes section 1): no optimal action is removed, since guesses
outside the interval are dominated. The mask is advisory (for the sampler); the environment still
executes any in-range guess.

Exact figures for N=16, K=4 (from the dynamic programme, asserted in tests/envs): the optimum is
15/16, not the lecture's "always within four guesses" (a guess must hit the number, so four guesses
find at most 2^4 - 1 = 15 numbers); the median (binary-search) reference attains 15/16, guessing
1, 2, 3, 4 gets 4/16, and a uniform guess among the consistent candidates 9752459/16816800 = 0.5799.
Under ``reward="length"`` the optimum is (0.95 + 2(0.90) + 4(0.85) + 8(0.80))/16 = 0.784375.
Exact values and the optimal planner come from
:class:`~agent_lab.envs.number_search_dp.NumberSearchDP`. Book: book/part1/00_demonstrations_vs_reward.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_lab.envs.base import TextEnv, as_rng, check_bool, check_choice, check_int
from agent_lab.envs.number_search_dp import REWARD_KINDS, NumberSearchDP, parse_guess

__all__ = ["NumberSearch"]


@dataclass
class _Episode:
    target: int
    lo: int
    hi: int
    turns: int = 0


class NumberSearch(TextEnv):
    """Batched number search (see the module docstring). Tasks are the hidden integers (``int``)."""

    name = "number-search"
    max_action_words = 2
    splits = ("test",)

    def __init__(
        self,
        n: int = 16,
        guesses: int = 4,
        reward: str = "binary",
        length_penalty: float = 0.05,
        mask_actions: bool = False,
        invalid_action: str = "spend_turn",
        turn_limit: int | None = None,
    ):
        n = check_int("n", n, 1, 999)
        guesses = check_int("guesses", guesses, 1, 64)
        check_choice("reward", reward, REWARD_KINDS)
        check_bool("mask_actions", mask_actions)
        super().__init__(
            invalid_action=invalid_action,
            turn_limit=turn_limit,
            n=n,
            guesses=guesses,
            reward=reward,
            length_penalty=float(length_penalty),
            mask_actions=mask_actions,
        )
        self.max_turns = guesses
        # The DP validates length_penalty and is reused for every planner query.
        self.dp = NumberSearchDP(n, guesses, reward, length_penalty, invalid_action)
        self.length_penalty = self.dp.length_penalty
        self._prompt_text = f"find the number from 1 to {n} in {guesses} {'guess' if guesses == 1 else 'guesses'}"
        self._guess_texts = [f"guess {a}" for a in range(n + 1)]
        self._planner_hits = None

    # ----- tasks ---------------------------------------------------------------------------------
    def vocabulary(self) -> list[str]:
        """Every word of prompts, observations and valid actions."""
        words = ["find", "the", "number", "from", "to", "in", "guesses", "guess"]
        words += ["higher", "lower", "correct", "invalid"]
        words += [str(i) for i in range(1, max(self.n, self.guesses) + 1)]
        return words

    def sample_tasks(self, seed_or_rng: Any, n: int, split: str = "train") -> list[int]:
        """``n`` hidden numbers uniform on 1..N (every split has the same distribution)."""
        check_choice("split", split, ("train", *self.splits))
        n = check_int("n", n, 1)
        return [int(x) for x in as_rng(seed_or_rng).integers(1, self.n + 1, size=n)]

    def eval_tasks(self, split: str = "test", n: int | None = None) -> list[int]:
        """Every target 1..N once (the first ``n`` of them if ``n`` is given)."""
        check_choice("split", split, self.splits)
        tasks = list(range(1, self.n + 1))
        return tasks if n is None else tasks[: check_int("n", n, 1, self.n)]

    def _check_task(self, task: Any) -> int:
        return check_int("task (the hidden number)", task, 1, self.n)

    # ----- the dynamics --------------------------------------------------------------------------
    def _new_state(self, task: int) -> _Episode:
        return _Episode(task, 1, self.n)

    def _prompt(self, state: _Episode) -> str:
        return self._prompt_text

    def _state_key(self, state: _Episode) -> str:
        return f"{state.lo}..{state.hi} after {state.turns}"  # candidates left and guesses spent

    def _parse(self, words: list[str], state: _Episode) -> tuple[int | None, str | None]:
        return parse_guess(words, self.n)

    def _execute(self, state: _Episode, guess: int) -> tuple[str, float, bool]:
        state.turns += 1
        if guess == state.target:
            return "correct", self.dp.success_reward(state.turns), True
        if state.target > guess:
            state.lo = max(state.lo, guess + 1)
            return "higher", 0.0, False
        state.hi = min(state.hi, guess - 1)
        return "lower", 0.0, False

    def _invalid_observation(self, state: _Episode) -> str:
        state.turns += 1
        return "invalid"

    def _turns_left(self, state: _Episode) -> int:
        return self.guesses - state.turns

    def allowed_actions(self) -> list[frozenset[str]] | None:
        """Per episode, the guesses inside its candidate interval (empty once over); ``None`` if masking is off."""
        if not self.mask_actions:
            return None
        return [
            frozenset() if done else frozenset(self._guess_texts[s.lo : s.hi + 1])
            for s, done in zip(self._states, self._done)
        ]

    # ----- the exact planner ---------------------------------------------------------------------
    def optimal_success(self, tasks: Sequence[int]) -> float:
        """The planner's success rate averaged over ``tasks`` (15/16 over all targets for N=16, K=4)."""
        if self._planner_hits is None:
            self._planner_hits = self.dp.evaluate_policy(self.dp.optimal_policy()).per_target_success
        hits = self._planner_hits
        checked = [self._check_task(t) for t in tasks]
        if not checked:
            raise ValueError("tasks must not be empty")
        return float(sum(hits[t - 1] for t in checked) / len(checked))

    def demonstrations(self, tasks: Sequence[int]) -> list[list[tuple[str, str]]]:
        """Per task, the planner's ``[(observation before the action, action text), ...]``."""
        demos = []
        for task in tasks:
            target = self._check_task(task)
            history: tuple[tuple[int | None, str], ...] = ()
            observation, pairs = self._prompt_text, []
            for _ in range(self.guesses):
                guess = self.dp.optimal_action(history)
                pairs.append((observation, f"guess {guess}"))
                if guess == target:
                    break
                observation = "higher" if target > guess else "lower"
                history += ((guess, observation),)
            demos.append(pairs)
        return demos
