"""The shared batched text-environment machinery: ``StepBatch``, the episode log, replay.

Every environment in :mod:`agent_lab.envs` steps ``B`` episodes at once and speaks plain text (words
separated by single spaces, lines by ``"\\n"``, no trailing newline). A subclass supplies a few small
pieces -- a fresh episode state for a task, the prompt, a parser from action text to an executed
action, a transition, and a text naming the state (which anchor-state groups compare) -- and this
module does the batching, the declared invalid-action rule, the episode log and exact replay. Book: book/part1/01_trajectories_and_support.md (histories, observations,
termination versus truncation).

Termination versus truncation (Gymnasium's convention): ``done`` marks every episode that is over.
``truncated`` marks only episodes cut by a limit *outside* the task, the optional ``turn_limit``
below the task's own budget. Running out of the task's own budget (four guesses, the crafting step
budget) is part of the task -- the prompt states the budget, the history reveals the turns left --
so the value after it is exactly zero and it is a termination, not a truncation; ``info`` still says
``"timeout": True`` so diagnostics can count time-outs.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["StepBatch", "TextEnv", "INVALID_RULES", "OPEN_ENDED", "ReplayMismatch", "replay", "replay_prefix",
           "tokens_of", "check_bool", "check_choice", "check_int"]

#: The declared rules for a malformed or impossible action (lecture notes section 3):
#: ``"spend_turn"`` answers ``invalid`` and uses up one turn; ``"end_episode"`` answers ``invalid``
#: and ends the episode with reward 0.
INVALID_RULES = ("spend_turn", "end_episode")

# Sampled texts longer than this are rejected before splitting (a runaway generation must not cost
# time proportional to its length in the parser).
MAX_ACTION_CHARS = 200

#: In an ``allowed_actions()`` set, a text ending in this marker allows its prefix followed by any words
#: (crafting's free-form ``think``); every other text is one whole allowed action.
OPEN_ENDED = " ..."


class ReplayMismatch(ValueError):
    """A replayed episode did not reproduce its log exactly."""


@dataclass
class StepBatch:
    """What one ``env.step`` returns for ``B`` episodes.

    observations: ``B`` texts (``""`` for an episode that was already over before this step).
    rewards: float ``[B]``, the reward of this step (shaped if the environment's shaping is on).
    done: bool ``[B]``, the episode is over (after this step or earlier).
    truncated: bool ``[B]``, the episode was cut by ``turn_limit``, a limit outside the task.
    success: bool ``[B]``, unshaped task success so far.
    info: ``B`` dicts; for an episode that acted in this step: ``text`` (sampled), ``action``
    (executed, ``None`` when invalid), ``error`` (why it was invalid, or ``None``), ``task_reward``
    (unshaped), ``turn`` (1-based), ``timeout``; for an already-finished episode: ``{"ignored": True}``.
    """

    observations: list[str]
    rewards: np.ndarray
    done: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    info: list[dict] = field(default_factory=list)


def tokens_of(text: Any, max_chars: int = MAX_ACTION_CHARS) -> list[str] | None:
    """Lower-cased words of an action text, tolerant of extra spaces, tabs and newlines.

    Returns ``None`` for anything that cannot be an action: not a string, or longer than ``max_chars``
    characters (an environment's ``max_action_chars``).
    """
    if not isinstance(text, str) or len(text) > max_chars:
        return None
    return text.lower().split()


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]``, or a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a ``ValueError`` naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_nonnegative(name: str, value: Any) -> float:
    """``value`` as a finite float ``>= 0``, or a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def as_rng(seed_or_rng: Any) -> np.random.Generator:
    """A numpy Generator from an int seed or an existing Generator."""
    if isinstance(seed_or_rng, np.random.Generator):
        return seed_or_rng
    if isinstance(seed_or_rng, (int, np.integer)) and not isinstance(seed_or_rng, bool) and seed_or_rng >= 0:
        return np.random.default_rng(int(seed_or_rng))
    raise ValueError(f"seed_or_rng must be a non-negative int or a numpy Generator, got {seed_or_rng!r}")


class TextEnv(ABC):
    """Base class of the batched text environments (see the module docstring for the contract).

    Subclasses set ``name``, ``max_turns``, ``max_action_words`` and ``splits`` and implement the
    abstract methods. Per-episode state is a small mutable object owned by the subclass; this class
    keeps the log and applies the invalid-action rule and ``turn_limit`` uniformly.
    """

    name: str = "text-env"
    max_turns: int = 1
    max_action_words: int = 1
    max_action_chars: int = MAX_ACTION_CHARS
    splits: tuple[str, ...] = ()
    #: Options that change only what RL trains on -- which training tasks are drawn and what an episode pays
    #: -- not the vocabulary, a prompt, a demonstration's text, an evaluation world or ``success``; SFT reads
    #: no reward, so a run may change them between its phases (a curve's RL branch may draw its worlds, or pay
    #: its episodes, otherwise than the SFT phase it starts from).
    rl_options: tuple[str, ...] = ()
    #: What an invalid action costs: subtracted from that turn's reward, never from ``task_reward``. 0 unless a
    #: subclass takes it as an option.
    invalid_penalty: float = 0.0

    def __init__(self, *, invalid_action: str = "spend_turn", turn_limit: int | None = None, **options: Any):
        self.invalid_action = check_choice("invalid_action", invalid_action, INVALID_RULES)
        self.turn_limit = None if turn_limit is None else check_int("turn_limit", turn_limit, 1)
        # The options (JSON values only) rebuild an identical environment in ``replay``; each is also an attribute.
        self.options: dict[str, Any] = {"invalid_action": invalid_action, "turn_limit": turn_limit, **options}
        for name, value in options.items():
            setattr(self, name, value)
        self._states: list[Any] = []
        self._logs: list[dict] = []

    @property
    def max_policy_tokens(self) -> int:
        """Most policy tokens one episode holds, ``max_turns * (max_action_words + 1)`` (each turn's words and
        newline): Dr.GRPO's constant normaliser. An environment where only one turn may be long overrides it."""
        return int(self.max_turns) * (int(self.max_action_words) + 1)

    # ----- what a subclass provides -------------------------------------------------------------
    @abstractmethod
    def _check_task(self, task: Any) -> Any:
        """Validate one task (``ValueError`` naming what is wrong); return it in canonical form."""

    @abstractmethod
    def _new_state(self, task: Any) -> Any:
        """A fresh per-episode state for a checked task."""

    @abstractmethod
    def _prompt(self, state: Any) -> str:
        """The initial observation of an episode."""

    @abstractmethod
    def _parse(self, words: list[str], state: Any) -> tuple[Any, str | None]:
        """``(executed action, None)`` for a valid action, or ``(None, reason)`` for an invalid one.

        ``words`` are the lower-cased words of the sampled text (see :func:`tokens_of`). The executed
        action must be JSON-serialisable (it goes into the log).
        """

    @abstractmethod
    def _execute(self, state: Any, action: Any) -> tuple[str, float, bool]:
        """Apply a valid action: ``(observation, unshaped reward, task solved)``; may end the episode."""

    @abstractmethod
    def _invalid_observation(self, state: Any) -> str:
        """The observation after an invalid action under the spend-a-turn rule."""

    @abstractmethod
    def _turns_left(self, state: Any) -> int:
        """Decisions left in the task's own budget after the turns taken so far."""

    @abstractmethod
    def _state_key(self, state: Any) -> str:
        """A text naming the environment state an action is taken in, apart from the episode's task: two
        episodes of one task with equal keys have the same future under any policy (same rewards, same
        observations). Logged before each turn as ``"state"``; anchor-state groups (GiGPO) compare it."""

    def _shaping(self, state_before: Any, state: Any, done: bool) -> float:
        """Shaping added to the reward of one step (0 unless a subclass shapes)."""
        return 0.0

    def _snapshot(self, state: Any) -> Any:
        """What ``_shaping`` needs of the state before a step (nothing by default)."""
        return None

    # ----- the public batched interface ---------------------------------------------------------
    def reset(self, tasks: Sequence[Any]) -> list[str]:
        """Start ``len(tasks)`` episodes; return each one's prompt (its initial observation)."""
        if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
            raise ValueError(f"tasks must be a list of tasks, got {type(tasks).__name__}")
        if len(tasks) == 0:
            raise ValueError("tasks must not be empty; pass at least one task")
        checked = [self._check_task(t) for t in tasks]
        self._states = [self._new_state(t) for t in checked]
        prompts = [self._prompt(s) for s in self._states]
        self._done = np.zeros(len(checked), dtype=bool)
        self._success = np.zeros(len(checked), dtype=bool)
        self._turns = np.zeros(len(checked), dtype=np.int64)
        self._logs = [
            {
                "env": self.name,
                "options": dict(self.options),
                "task": t,  # shared, not copied: tasks are read-only (worlds are large)
                "prompt": p,
                "turns": [],
                "done": False,
                "success": False,
                "truncated": False,
                "return": 0.0,
            }
            for t, p in zip(checked, prompts)
        ]
        return prompts

    @property
    def batch_size(self) -> int:
        """Number of episodes in the current batch (0 before ``reset``)."""
        return len(self._states)

    def step(self, action_texts: Sequence[str]) -> StepBatch:
        """Advance every unfinished episode by one decision; entries of finished episodes are ignored."""
        if not self._states:
            raise ValueError("step called before reset; call env.reset(tasks) first")
        if isinstance(action_texts, (str, bytes)) or len(action_texts) != len(self._states):
            got = "a single string" if isinstance(action_texts, (str, bytes)) else f"{len(action_texts)} texts"
            raise ValueError(f"action_texts must hold one text per episode ({len(self._states)}), got {got}")
        size = len(self._states)
        observations = [""] * size
        rewards = np.zeros(size, dtype=np.float64)
        truncated = np.zeros(size, dtype=bool)
        info: list[dict] = [{"ignored": True} for _ in range(size)]
        for i, text in enumerate(action_texts):
            if self._done[i]:
                continue
            state = self._states[i]
            before, key = self._snapshot(state), self._state_key(state)
            words = tokens_of(text, self.max_action_chars)
            if words is None:
                action, error = None, "not a string" if not isinstance(text, str) else "too long"
            else:
                action, error = self._parse(words, state)
            if action is None:
                obs, task_reward, solved = self._invalid_observation(state), 0.0, False
                ended = self.invalid_action == "end_episode"
            else:
                obs, task_reward, solved = self._execute(state, action)
                ended = solved
            self._turns[i] += 1
            timeout = not ended and self._turns_left(state) <= 0
            cut = not ended and not timeout and self.turn_limit is not None and self._turns[i] >= self.turn_limit
            done = ended or timeout or cut
            charge = self.invalid_penalty if action is None else 0.0
            reward = task_reward + self._shaping(before, state, done) - charge
            observations[i] = obs
            rewards[i] = reward
            truncated[i] = cut
            self._done[i] = done
            self._success[i] = solved
            info[i] = {
                "text": text,
                "action": action,
                "error": error,
                "task_reward": task_reward,
                "turn": int(self._turns[i]),
                "timeout": bool(timeout),
            }
            log = self._logs[i]
            log["turns"].append(
                {
                    # a non-string "text" is logged as None, which replays to the same "not a string" error
                    "text": text if isinstance(text, str) else None,
                    "state": key,  # the state the action was taken in
                    "action": action,  # a fresh object from the parser
                    "error": error,
                    "observation": obs,
                    "reward": float(reward),
                    "task_reward": float(task_reward),
                }
            )
            log["done"], log["success"], log["truncated"] = bool(done), bool(solved), bool(cut)
            log["return"] = float(log["return"] + reward)
        return StepBatch(observations, rewards, self._done.copy(), truncated, self._success.copy(), info)

    def truncate(self, indices: Sequence[int]) -> None:
        """End the unfinished episodes ``indices`` from outside, as truncated, with no further reward.

        For limits the environment cannot see, such as a policy whose context window is full. Their logs get
        ``done`` and ``truncated`` True and ``context_full`` True, which :func:`replay` reproduces.
        """
        for i in indices:
            if not 0 <= i < len(self._states):
                raise ValueError(f"episode index {i} is outside this batch of {len(self._states)} episodes")
            if not self._done[i]:
                self._done[i] = True
                self._logs[i].update(done=True, truncated=True, context_full=True)

    def episode_logs(self) -> list[dict]:
        """A JSON-serialisable copy of the current batch's logs (see :func:`replay`).

        Per episode: ``env``, ``options``, ``task``, ``prompt``, ``turns`` (per turn the sampled
        ``text``, the ``state`` it was taken in (:meth:`_state_key`), the executed ``action`` or ``None``, the
        parse ``error``, the ``observation``, the ``reward`` and the unshaped ``task_reward``), ``done``, ``success``, ``truncated``, ``return``.
        The log dicts and turn lists are new; the task and action objects inside are shared with the
        environment (copying a world per episode would dominate the cost), so treat them as read-only.
        """
        return [
            {**log, "options": dict(log["options"]), "turns": [dict(t) for t in log["turns"]]} for log in self._logs
        ]

    @property
    def done(self) -> np.ndarray:
        """bool ``[B]``: which episodes of the current batch are over."""
        return self._done.copy()


def _check_log(episode_log: Any) -> None:
    if not isinstance(episode_log, dict) or not {"env", "options", "task", "turns"} <= set(episode_log):
        raise ValueError("episode_log must be a dict from env.episode_logs() with env, options, task and turns")


def _replayed(episode_log: dict, turns: int | None, copies: int) -> TextEnv:
    """A fresh environment of the log's kind: ``copies`` episodes of its task fed its first ``turns`` texts."""
    from agent_lab.envs import make_env  # late import: the registry imports this module

    _check_log(episode_log)
    env = make_env(episode_log["env"], **episode_log["options"])
    env.reset([episode_log["task"]] * copies)
    for turn in episode_log["turns"][:turns]:
        if env.done[0]:
            raise ReplayMismatch("the replayed episode ended before the logged one")
        env.step([turn["text"]] * copies)
    return env


def _check_turns(logged: list, replayed: list) -> None:
    """Raise :class:`ReplayMismatch` naming the first turn whose logged fields differ (both JSON round-tripped).
    Only the fields the log holds are compared, so a log written before a field was added still replays."""
    for t, (a, b) in enumerate(zip(logged, replayed)):
        diff = {k: (a.get(k), b.get(k)) for k in a if a.get(k) != b.get(k)}
        if diff:
            raise ReplayMismatch(f"turn {t + 1} differs (logged, replayed): {diff}")


def _round_trip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def replay_prefix(episode_log: dict, turns: int, copies: int = 1) -> TextEnv:
    """The saved state before turn ``turns`` of a logged episode, as ``copies`` live episodes to continue.

    A fresh environment (``episode_log["env"]``, ``["options"]``) is reset ``copies`` times on the logged
    task and fed the first ``turns`` logged texts; the replayed turns must reproduce the logged ones exactly
    (observations, rewards, executed actions), else :class:`ReplayMismatch`. Every copy is then in the state
    the logged episode was in before its turn ``turns`` (0-based), hidden information included (number
    search's target, a crafting world): stepping them with fresh actions samples continuations from that
    state, which is what branching estimators need (book/part2/06_credit_assignment.md). ``ValueError`` if
    ``turns`` is outside ``0..len(episode_log["turns"])`` or the episode is already over by then.
    """
    _check_log(episode_log)
    turns = check_int("turns", turns, 0, len(episode_log["turns"]))
    copies = check_int("copies", copies, 1)
    env = _replayed(episode_log, turns, copies)
    _check_turns(_round_trip(episode_log["turns"][:turns]), _round_trip(env.episode_logs()[0]["turns"]))
    if bool(env.done.all()):
        raise ValueError(f"the episode is over after {turns} turns: there is no state to continue from")
    return env


def replay(episode_log: dict) -> dict:
    """Re-execute a logged episode from its sampled texts and check that it reproduces exactly.

    Rebuilds the environment from ``episode_log["env"]`` and ``["options"]``, resets it on the logged
    task, feeds the logged sampled texts one per turn, and compares the new log with the old one field
    by field (after a JSON round trip, so a log read back from disk compares equal). Returns the new log;
    raises :class:`ReplayMismatch` naming the first field that differs.
    """
    env = _replayed(episode_log, None, 1)
    if episode_log.get("context_full"):
        env.truncate([0])
    new = env.episode_logs()[0]
    old, new_rt = _round_trip(episode_log), _round_trip(new)
    for key in old:
        if key == "turns":
            _check_turns(old["turns"], new_rt["turns"])  # the logged fields of every turn both have
            same = len(old["turns"]) == len(new_rt["turns"])
        else:
            same = old[key] == new_rt.get(key)
        if not same:
            raise ReplayMismatch(f"field {key!r} differs: logged {old[key]!r}, replayed {new_rt.get(key)!r}")
    return new
