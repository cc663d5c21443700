"""Crafting, a small text-only Minecraft-like task (after TextCraft), as a batched text environment.

A task is a world dict from :func:`~agent_lab.envs.crafting_world.generate_world` (goal, base items,
recipes, the recipes shown, the step budget). Text protocol::

    goal wire                        <- prompt: goal, the listed recipes (needed ones and distractors),
    recipes                             "item yield = ingredient count ...", the base items, the budget
    hinge 1 = scroll 2
    wire 1 = mortar 1 hinge 1
    mortar 2 = oar 2
    copper 1 = scroll 1
    base oar scroll
    steps 7
    get scroll 2                     <- action
    ok                               <- observation: result, inventory, steps left
    inventory scroll 2
    steps 6

Actions: ``get <item> <n>`` (a base item, ``1 <= n <= max_get``) and ``craft <item>`` (consumes the
recipe's ingredients, adds its yield). Crafting the goal ends the episode with reward 1 and result
``success``. Anything else -- unparseable text, an unknown item, a count out of range, getting a
craftable item, crafting a base item or without the ingredients -- is invalid and handled by the
declared rule ``invalid_action`` (``"spend_turn"``: answer ``invalid``, use the step; ``"end_episode"``:
answer ``invalid``, reward 0). Running out of steps ends the episode with reward 0.

Demonstrations (``plan``) follow one of these shortest plans: ``"fetch_first"`` fetches every base item
in exactly the units the whole tree needs, then crafts children before parents; ``"fetch_full"`` is the
same plan with every ``get`` a full ``max_get`` stack, so no count is a tree total; ``"fetch_full_listed"`` is
``"fetch_full"`` with crafts of equal depth in the order the prompt lists their recipes rather than alphabetical
order (a rank of the item words that no prompt shows, learnt only pair by pair); ``"on_demand"`` asks
at every step what the goal's recipe is short of and descends until it can ``get`` a full stack or
``craft`` (:func:`~agent_lab.envs.crafting_world.on_demand_action`), a function of the recipes and the
current inventory alone, with no counts to multiply out; ``"follow_thought"`` fetches full stacks in the order
the thought names the base items and crafts in the reverse order of its lines
(:func:`~agent_lab.envs.crafting_world.thought_plan`), and with ``think`` the thought lists parents before
children, so every action after it is the next entry of a list the policy has just written; ``"ready_first"``
fetches as ``"fetch_full"`` does, then always crafts the first listed recipe the goal still needs whose ingredients
are held (:func:`~agent_lab.envs.crafting_world.ready_first_plan`), read off the prompt and the inventory;
``"shuffled"`` is ``"ready_first"`` with a random ranking of the items, fixed per world, in place of the prompt's
order (:func:`~agent_lab.envs.crafting_world.shuffled_plan`), so no rank of item words decides which of several
actions that keep the plan shortest a demonstration shows, and no order of items is left to learn.

Thinking (``think=True``, after ReAct's free-text thoughts): the first action may be ``think <any words>``;
the environment answers ``ok`` without reading the words or spending a step of the budget, and a second
thought, or one after the first step, is invalid. Demonstrations then open with
:func:`~agent_lab.envs.crafting_world.thought`, the goal tree's recipe lines copied depth-first, so a
policy that imitates them reads the tree one hop at a time in its own context instead of in a single
forward pass. The candidate mask allows ``think`` followed by any words (``envs.base.OPEN_ENDED``); the
thought's words are policy tokens like any others, so RL trains them too.

Optional shaping (``shaping``), always potential-based, ``F = gamma * Phi(s') - Phi(s)`` with
``gamma = shaping_gamma`` (set it to the trainer's discount) and ``Phi = 0`` at terminal states -- the
convention of :func:`agent_lab.estimators.potential_based_shaping` -- so a whole episode's shaping
telescopes to ``-Phi(s_0)``, an action-independent constant, and the optimal policies are unchanged
(Ng, Harada and Russell 1999). ``"first_craft"``: ``Phi = scale * (needed intermediates crafted at
least once) / (needed intermediates)``, so the first craft of each of the ``m`` intermediates the
goal needs earns ``scale / m`` at once, and the episode's last step pays the collected bonus back
(``Phi(s_0) = 0``: net shaping 0). ``"distance"``: ``Phi = -scale * (planner steps to go) / (planner
steps at the start)`` (net shaping ``+scale``). The potentials depend on the inventory and on which
items were crafted, both visible in the history. ``StepBatch.success`` and the log's ``task_reward``
are always unshaped.

A charge for invalid actions (``invalid_penalty = c``): each invalid action's reward is ``-c``. It is not
potential-based, so it can change which policies are optimal -- but only by ranking those that solve the
task without an invalid action above those that solve it with some: under ``"spend_turn"`` a refused action
leaves the inventory as it was and spends a step, so it never helps, and a shortest plan never needs one.
Unlike success, the charge differs between two failed episodes (or two solved ones), so it gives group
baselines a signal in groups whose episodes all fail or all succeed.

Evaluation splits, fixed by seed ranges: ``"test"`` new worlds at the trained levels, ``"held_out_goals"``
goals from :data:`~agent_lab.envs.crafting_world.HELD_OUT_GOALS` (never a training goal), ``"deeper"``
worlds one level deeper than trained. Training worlds draw their level uniformly from ``train_levels``, or in
the proportions ``level_weights`` gives (one weight per sorted level; a curriculum knob, evaluation unchanged).
``train_distractors`` gives training worlds that many distractor recipes instead of their level's (evaluation
worlds keep their level's): more lines that share an ingredient with the goal's tree, so a policy that picks
ingredients by what stands beside a fetched item in some line, not by whether the goal needs them, is corrected
more often.

Re-reading (``reread=True``, or a count ``k`` of extra copies): the prompt is shown twice (``1 + k`` times), one
copy after the other. The recipe lines come shuffled and a causal policy reads them in order, so at a line above
the goal's nothing yet says whether its item is needed; every token of the second copy can attend to the whole
first copy, the goal's line included. Whether an item is needed is a chain of look-ups as long as the tree is
deep (the goal's line, then its ingredient's line, ...), and a line of each copy can attend to whatever the lines
of the copy before it worked out, so each further copy can take the chain one more link in the prompt itself.
A policy with ``prompt_attention="bidirectional"`` (``agent_lab.config.ModelConfig``) reads the prompt in both
directions at once, so it needs no second copy.

Tagged ingredients (``tag_ingredients=True``): each recipe line names its item again before every ingredient,
``wire 1 = wire mortar 1 wire hinge 1``. Which line an ingredient belongs to is then the token just before it,
which one attention head reading the previous token passes on; in the plain line it lies a varying number of
tokens back, at the line's start.

Book: book/part3/01_crafting.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from agent_lab.envs.base import OPEN_ENDED, TextEnv, as_rng, check_bool, check_choice, check_int, check_nonnegative
from agent_lab.envs.crafting_world import (
    ITEM_NAMES,
    LEVELS,
    MAX_STACK,
    apply_action,
    goal_tree,
    check_world,
    craft_counts,
    generate_world,
    item_depths,
    on_demand_plan,
    optimal_steps,
    plan_length,
    ready_first_plan,
    recipe_line,
    shortest_plan,
    shuffled_plan,
    thought,
    thought_plan,
)

__all__ = ["Crafting", "SHAPINGS", "PLANS", "MISTAKES", "ACTION_ROLES", "ITEM_ROLES", "first_mistake"]

SHAPINGS = ("none", "first_craft", "distance")
# The demonstrator's plan: all are shortest; see shortest_plan and on_demand_plan.
PLANS = {
    "fetch_first": shortest_plan,
    "fetch_full": partial(shortest_plan, full_stacks=True),
    "fetch_full_listed": partial(shortest_plan, full_stacks=True, ties="listed"),
    "on_demand": on_demand_plan,
    "follow_thought": thought_plan,
    "ready_first": ready_first_plan,
    "shuffled": shuffled_plan,
}
# Seed offsets of the splits: training worlds use seeds below 1e6, each evaluation split its own range.
_SPLIT_SEEDS = {"train": 0, "test": 1_000_000, "held_out_goals": 2_000_000, "deeper": 3_000_000}
_KEYWORDS = ["goal", "recipes", "=", "base", "steps", "get", "craft", "ok", "invalid", "success", "inventory", "empty"]
_THINK_WORDS = ["think", ";"]  # added to the vocabulary only with think=True (other runs keep their vocabulary)
#: What :func:`first_mistake` calls the first departure of a failed episode from the goal's plans.
#: What each token of an action does (``bench/_action_nll.py`` scores the imitation loss by them, the results page
#: draws them), in the order a figure lists them; a craft's item is the episode's first craft or a later one.
ACTION_ROLES = ("verb", "get item", "get count", "craft item, first", "craft item, later", "thought", "end", "other")
#: The roles whose token names an item: which base item to fetch, which item to craft.
ITEM_ROLES = ("get item", "craft item, first", "craft item, later")
MISTAKES = {
    "off_tree": "off the goal's tree",  # names an item the goal does not need: another recipe read
    "order": "an intermediate not crafted yet",  # a craft before one of its crafted ingredients
    "few_crafted": "an intermediate crafted too few times",  # crafted, but short of it: counts and yields
    "few_fetched": "too few of a base item",  # short of a fetched ingredient: counts and yields
    "none": "no refusal, on the tree",  # every action valid and needed: the budget ran out
    "thought": "a thought without the goal tree's recipes",  # think=True: a tree recipe left out or another added
}


def first_mistake(log: dict) -> str:
    """Where a failed crafting episode (``env.episode_logs()`` entry) first went wrong, one of :data:`MISTAKES`'
    values or another refusal's error: a thought (``think=True``) whose recipe lines are not the goal tree's (the
    items heading its ``;``-separated lines, as a set); else its first action that names an item outside the
    goal's tree; else its first refused action, a ``missing ingredients`` refusal named by what was short (a base
    item, an intermediate crafted before, or one not crafted yet); else no mistake before the budget ran out.
    Replays the logged actions on the logged world, so it needs no environment."""
    world = log["task"]
    tree, inv, crafted = goal_tree(world), {}, set()
    for turn in log["turns"]:
        words = (turn["text"] or "").split()
        if words[:1] == ["think"]:
            heads = {line.split()[0] for line in " ".join(words[1:]).split(";") if line.split()}
            if heads != {x for x in tree if x in world["recipes"]}:
                return MISTAKES["thought"]
            continue
        if len(words) >= 2 and words[0] in ("get", "craft") and words[1] not in tree:
            return MISTAKES["off_tree"]
        if turn["error"] == "missing ingredients":
            needs = world["recipes"][words[1]]["needs"]
            short = [y for y, n in needs.items() if inv.get(y, 0) < n]
            if any(y not in world["recipes"] for y in short):
                return MISTAKES["few_fetched"]
            return MISTAKES["few_crafted"] if crafted & set(short) else MISTAKES["order"]
        if turn["error"]:
            return turn["error"]
        inv = apply_action(world, inv, " ".join(words))
        crafted.update(words[1:] if words[0] == "craft" else [])
    return MISTAKES["none"]


@dataclass
class _Episode:
    world: dict
    inventory: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    crafted: set[str] = field(default_factory=set)
    needed: frozenset[str] = frozenset()
    depths: dict[str, int] = field(default_factory=dict)
    start_steps: int = 1
    solved: bool = False
    thought: bool = False


class Crafting(TextEnv):
    """Batched crafting (see the module docstring). Tasks are world dicts."""

    name = "crafting"
    max_action_words = 3
    splits = ("test", "held_out_goals", "deeper")
    rl_options = ("level_weights", "invalid_penalty", "shaping", "shaping_scale", "shaping_gamma")

    def __init__(
        self,
        train_levels: Sequence[int] = (1, 2, 3),
        deeper_level: int | None = None,  # default: one above the highest trained level, if there is one
        max_get: int = 8,
        shaping: str = "none",
        shaping_scale: float = 0.1,
        shaping_gamma: float = 1.0,
        mask_actions: bool = False,
        eval_size: int = 60,
        invalid_action: str = "spend_turn",
        invalid_penalty: float = 0.0,  # subtracted from the reward of each invalid action (task_reward unchanged)
        turn_limit: int | None = None,
        plan: str = "fetch_first",
        level_weights: Sequence[float] | None = None,  # training draws: one weight per sorted train level
        think: bool = False,  # allow one free "think <words>" before the first step; demonstrations think
        train_distractors: int | None = None,  # distractor recipes per training world; None: each level's own
        reread: bool | int = False,  # True (or k): the prompt shown twice (1 + k times), each copy after the last
        tag_ingredients: bool = False,  # recipe lines name their item before each ingredient
    ):
        if isinstance(train_levels, (str, bytes)) or not isinstance(train_levels, Sequence) or not train_levels:
            raise ValueError(f"train_levels must be a non-empty list of levels {sorted(LEVELS)}, got {train_levels!r}")
        levels = sorted({check_int("train_levels entry", lv, min(LEVELS), max(LEVELS)) for lv in train_levels})
        if deeper_level is None and max(levels) < max(LEVELS):
            deeper_level = max(levels) + 1
        if deeper_level is not None:
            deeper_level = check_int("deeper_level", deeper_level, max(levels) + 1, max(LEVELS))
        max_get = check_int("max_get", max_get, 1, MAX_STACK)
        check_choice("shaping", shaping, SHAPINGS)
        check_bool("mask_actions", mask_actions)
        check_bool("think", think)
        check_bool("tag_ingredients", tag_ingredients)
        if not isinstance(reread, bool):  # True / False as before; else a count of extra copies
            check_int("reread", reread, 0, 3)
        check_choice("plan", plan, tuple(PLANS))
        if level_weights is not None:
            listed = isinstance(level_weights, Sequence) and not isinstance(level_weights, (str, bytes))
            try:
                w = [float(x) for x in level_weights] if listed else []
            except (TypeError, ValueError):  # an entry that is not a number
                w = []
            if len(w) != len(levels) or not all(math.isfinite(x) and x >= 0 for x in w) or not sum(w) > 0:
                raise ValueError(f"level_weights must give one weight >= 0 per training level {levels} (sorted), not "
                                 f"all zero, got {level_weights!r}")
            level_weights = [x / sum(w) for x in w]
        if train_distractors is not None:
            train_distractors = check_int("train_distractors", train_distractors, 0, 10)
        shaping_gamma = float(shaping_gamma)
        if not 0.0 < shaping_gamma <= 1.0:
            raise ValueError(f"shaping_gamma must lie in (0, 1], got {shaping_gamma}")
        super().__init__(
            invalid_action=invalid_action,
            turn_limit=turn_limit,
            invalid_penalty=check_nonnegative("invalid_penalty", invalid_penalty),
            train_levels=levels,
            deeper_level=deeper_level,
            max_get=max_get,
            shaping=shaping,
            shaping_scale=float(shaping_scale),
            shaping_gamma=shaping_gamma,
            mask_actions=mask_actions,
            eval_size=check_int("eval_size", eval_size, 1),
            plan=plan,
            level_weights=level_weights,
            think=think,
            train_distractors=train_distractors,
            reread=reread,
            tag_ingredients=tag_ingredients,
        )
        # An upper bound on any episode's length: the longest plan a level admits plus its slack.
        used = levels if deeper_level is None else [*levels, deeper_level]
        self.max_turns = max(LEVELS[lv].max_plan + LEVELS[lv].slack for lv in used)
        if think:
            # A thought lists at most max_plan - 1 recipes (each needed recipe is crafted at least once, and a
            # plan has at least one get), each at most 3 + 2 * max_ingredients words (3 * with tag_ingredients)
            # plus its ";".
            self.max_action_words = 1 + max(
                (LEVELS[lv].max_plan - 1) * (4 + (2 + tag_ingredients) * LEVELS[lv].max_ingredients) for lv in used
            )
            self.max_action_chars = self.max_action_words * (1 + max(map(len, ITEM_NAMES)))
            self.max_turns += 1  # the thought is a turn, though not a step of the budget
        # Training on the top level leaves no deeper level to evaluate on.
        self.splits = Crafting.splits if deeper_level is not None else ("test", "held_out_goals")
        self._eval_cache: dict[tuple[str, int], list[dict]] = {}

    # ----- tasks ---------------------------------------------------------------------------------
    def vocabulary(self) -> list[str]:
        """Item names, the protocol's keywords and the numbers 0..99."""
        numbers = [str(i) for i in range(max(MAX_STACK, self.max_turns) + 1)]
        return list(ITEM_NAMES) + _KEYWORDS + numbers + (_THINK_WORDS if self.think else [])

    @property
    def max_policy_tokens(self) -> int:
        """Most policy tokens an episode holds: each turn's words and newline, the long thought's only once."""
        thought_tokens = self.max_action_words + 1 if self.think else 0
        return (self.max_turns - self.think) * (Crafting.max_action_words + 1) + thought_tokens

    def _levels_of(self, split: str) -> list[int]:
        return [self.deeper_level] if split == "deeper" else self.train_levels

    def _world(self, seed: int, level: int, split: str) -> dict:
        pool = "held_out" if split == "held_out_goals" else "train"
        spec = None
        if split == "train" and self.train_distractors is not None:
            spec = replace(LEVELS[level], distractors=self.train_distractors)
        return generate_world(_SPLIT_SEEDS[split] + seed, level, pool, self.max_get, spec)

    def sample_tasks(self, seed_or_rng: Any, n: int, split: str = "train") -> list[dict]:
        """``n`` worlds with random seeds of ``split``'s range (training seeds: 0..999999); training levels are
        drawn uniformly or, given ``level_weights``, in those proportions (evaluation splits are unaffected)."""
        check_choice("split", split, ("train", *self.splits))
        n = check_int("n", n, 1)
        rng = as_rng(seed_or_rng)
        levels = self._levels_of(split)
        seeds = rng.integers(0, 1_000_000, size=n)
        if split == "train" and self.level_weights is not None:
            picks = rng.choice(len(levels), size=n, p=self.level_weights)
        else:
            picks = rng.integers(0, len(levels), size=n)
        return [self._world(int(s), levels[int(p)], split) for s, p in zip(seeds, picks)]

    def eval_tasks(self, split: str = "test", n: int | None = None) -> list[dict]:
        """The fixed evaluation worlds of ``split``: seeds 0..n-1 of its range, levels in turn."""
        check_choice("split", split, self.splits)
        n = self.eval_size if n is None else check_int("n", n, 1)
        levels = self._levels_of(split)
        key = (split, n)
        if key not in self._eval_cache:  # evaluation reuses the same worlds many times
            self._eval_cache[key] = [self._world(i, levels[i % len(levels)], split) for i in range(n)]
        return list(self._eval_cache[key])

    def private_worlds(self, seeds: Sequence[int], level: int, goals: str = "train") -> list[dict]:
        """Worlds of ``level`` from explicit ``seeds`` outside every named split's range (a grader's secret
        split, say), with goals from the training pool (``"train"``, like ``test``) or the held-out pool."""
        check_choice("goals", goals, ("train", "held_out"))
        check_int("level", level, min(LEVELS), max(LEVELS))
        floor = max(_SPLIT_SEEDS.values()) + 1_000_000
        bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or s < floor]
        if bad:
            raise ValueError(f"private world seeds must be ints >= {floor} (lower seeds are the named splits' "
                             f"worlds), got {bad[0]!r}")
        return [generate_world(int(s), level, goals, self.max_get) for s in seeds]

    def _check_task(self, task: Any) -> dict:
        world = check_world(task, self.max_get)
        if world["budget"] > self.max_turns:
            raise ValueError(f"world['budget'] = {world['budget']} exceeds this environment's max_turns {self.max_turns}")
        return world

    # ----- the dynamics --------------------------------------------------------------------------
    def _new_state(self, world: dict) -> _Episode:
        needed = frozenset(x for x in goal_tree(world) if x in world["recipes"] and x != world["goal"])
        state = _Episode(world, needed=needed, depths=item_depths(world, [world["goal"]]))
        state.start_steps = max(1, self._steps_to_go(state))
        return state

    def _steps_to_go(self, state: _Episode) -> int:
        crafts, fetch = craft_counts(state.world, state.inventory, state.depths)
        return plan_length(crafts, fetch, self.max_get)

    def _prompt(self, state: _Episode) -> str:
        world = state.world
        lines = [f"goal {world['goal']}", "recipes"]
        shown_base = set()
        for item in world["shown"]:
            lines.append(recipe_line(world, item, self.tag_ingredients))
            shown_base.update(y for y in world["recipes"][item]["needs"] if y not in world["recipes"])
        lines.append("base " + " ".join(sorted(shown_base)))
        lines.append(f"steps {world['budget']}")
        return "\n".join(lines * (1 + self.reread))

    @staticmethod
    def _inventory_text(inv: dict[str, int]) -> str:
        return " ".join(f"{x} {inv[x]}" for x in sorted(inv)) if inv else "empty"

    def _observation(self, result: str, state: _Episode) -> str:
        items = self._inventory_text(state.inventory)
        return f"{result}\ninventory {items}\nsteps {state.world['budget'] - state.turns}"

    def _state_key(self, state: _Episode) -> str:
        # the inventory and the steps spent decide what follows; the crafted set decides the first_craft shaping
        crafted = " ".join(sorted(state.crafted)) or "nothing"
        return (f"inventory {self._inventory_text(state.inventory)}; crafted {crafted}; steps {state.turns}"
                + ("; thought" if state.thought else ""))

    def _parse(self, words: list[str], state: _Episode) -> tuple[list | None, str | None]:
        if self.think and words and words[0] == "think":
            action = ["think"]
        elif len(words) == 3 and words[0] == "get":
            digits = words[2]
            if (words[1] in state.world["base"] and words[1] not in state.world["recipes"]
                    and not (digits.isascii() and digits.isdigit() and len(digits) <= 6)):
                return None, "not a number"
            action = ["get", words[1], int(digits) if digits.isascii() and digits.isdigit() else 0]
        elif len(words) == 2 and words[0] == "craft":
            action = ["craft", words[1]]
        else:
            think = " or 'think <words>' (first)" if self.think else ""
            return None, f"expected 'get <item> <n>' or 'craft <item>'{think}"
        refusal = self._refusal(state, action)
        return (None, refusal) if refusal else (action, None)

    def _refusal(self, state: _Episode, action: list) -> str | None:
        """Why a well-formed action (``["get", item, n]``, ``["craft", item]``, ``["think"]``) cannot execute now,
        or ``None``: the one statement of the rules, which the parser and the candidate mask both apply."""
        if action[0] == "think":
            return "think only once, before the first step" if state.thought or state.turns > 0 else None
        if action[0] == "get":
            return self._get_refusal(state.world, state.inventory, action[1], action[2])
        return self._craft_refusal(state.world, state.inventory, action[1])

    def _get_refusal(self, world: dict, inv: dict, item: str, count: int) -> str | None:
        if item not in world["recipes"] and item not in world["base"]:
            return "unknown item"
        if item in world["recipes"]:
            return "not a base item"
        if not 1 <= count <= self.max_get:
            return f"count out of range 1..{self.max_get}"
        return "inventory full" if inv.get(item, 0) + count > MAX_STACK else None

    @staticmethod
    def _craft_refusal(world: dict, inv: dict, item: str) -> str | None:
        if item not in world["recipes"]:
            return "unknown item" if item not in world["base"] else "base item"
        recipe = world["recipes"][item]
        if any(inv.get(y, 0) < n for y, n in recipe["needs"].items()):
            return "missing ingredients"
        return "inventory full" if inv.get(item, 0) + recipe["yield"] > MAX_STACK else None

    def _execute(self, state: _Episode, action: list) -> tuple[str, float, bool]:
        if action[0] == "think":  # free: the budget counts steps that change the inventory
            state.thought = True
            return self._observation("ok", state), 0.0, False
        state.turns += 1
        state.inventory = apply_action(state.world, state.inventory, " ".join(map(str, action)))
        if action[0] == "get":
            return self._observation("ok", state), 0.0, False
        item = action[1]
        state.crafted.add(item)
        if item == state.world["goal"]:
            state.solved = True
            return self._observation("success", state), 1.0, True
        return self._observation("ok", state), 0.0, False

    def _invalid_observation(self, state: _Episode) -> str:
        state.turns += 1
        return self._observation("invalid", state)

    def _turns_left(self, state: _Episode) -> int:
        return state.world["budget"] - state.turns

    # ----- shaping (potential-based) -------------------------------------------------------------
    def _potential(self, state: _Episode, done: bool) -> float:
        """``Phi(s)`` of the chosen shaping; 0 at terminal states."""
        if done:
            return 0.0
        if self.shaping == "first_craft":
            return self.shaping_scale * len(state.crafted & state.needed) / max(1, len(state.needed))
        return -self.shaping_scale * self._steps_to_go(state) / state.start_steps

    def _snapshot(self, state: _Episode) -> float | None:
        return None if self.shaping == "none" else self._potential(state, False)

    def _shaping(self, before: float | None, state: _Episode, done: bool) -> float:
        if before is None:
            return 0.0
        # F(s, s') = gamma * Phi(s') - Phi(s)  (Ng, Harada and Russell 1999)
        return self.shaping_gamma * self._potential(state, done) - before

    def allowed_actions(self) -> list[frozenset[str]] | None:
        """Per episode, every action text that would execute (empty once over); ``None`` if masking is off."""
        if not self.mask_actions:
            return None
        out = []
        for state, done in zip(self._states, self._done):
            if done:
                out.append(frozenset())
                continue
            world, inv, counts = state.world, state.inventory, range(1, self.max_get + 1)
            texts = [f"get {b} {n}" for b in world["base"] for n in counts
                     if self._get_refusal(world, inv, b, n) is None]
            texts += [f"craft {x}" for x in world["recipes"] if self._craft_refusal(world, inv, x) is None]
            if self.think and self._refusal(state, ["think"]) is None:
                texts.append("think" + OPEN_ENDED)
            out.append(frozenset(texts))
        return out

    # ----- the exact planner ---------------------------------------------------------------------
    def optimal_steps(self, task: dict) -> int:
        """The planner's minimal number of steps for ``task`` from an empty inventory."""
        return optimal_steps(self._check_task(task), max_get=self.max_get)

    def _play_plans(self, tasks: Sequence[dict]) -> tuple[list[list[tuple[str, str]]], list[bool]]:
        """Run the planner's plans in a private copy of this environment (the current batch is untouched)."""
        if isinstance(tasks, (str, bytes, dict)) or len(tasks) == 0:
            raise ValueError("tasks must be a non-empty list of crafting worlds")
        twin = Crafting(**self.options)
        prompts = twin.reset(list(tasks))
        plans = [self.planner_plan(s.world) for s in twin._states]
        demos: list[list[tuple[str, str]]] = [[] for _ in plans]
        last = list(prompts)
        for turn in range(max(len(p) for p in plans)):
            texts = [p[turn] if turn < len(p) else "" for p in plans]
            for i, p in enumerate(plans):
                if turn < len(p):
                    demos[i].append((last[i], p[turn]))
            last = twin.step(texts).observations
        return demos, [bool(s) for s in twin._success]

    def planner_plan(self, world: dict, inventory: dict[str, int] | None = None) -> list[str]:
        """A shortest plan from ``inventory`` in the style chosen by ``plan`` (the demonstrations' actions);
        with ``think``, a plan from the start (``inventory=None``) opens with :func:`thought`."""
        plan = PLANS[self.plan](world, inventory, self.max_get)
        if not self.think or inventory is not None:
            return plan
        return [thought(world, self.tag_ingredients, parents_first=self.plan == "follow_thought"), *plan]

    def optimal_success(self, tasks: Sequence[dict]) -> float:
        """The planner's success rate over ``tasks``, found by executing its plans (1.0 on valid worlds)."""
        _, solved = self._play_plans(tasks)
        return sum(solved) / len(solved)

    def demonstrations(self, tasks: Sequence[dict]) -> list[list[tuple[str, str]]]:
        """Per task, the shortest plan as ``[(observation before the action, action text), ...]``."""
        return self._play_plans(tasks)[0]

    def recovery_demonstrations(
        self, tasks: Sequence[dict], seed_or_rng: Any, slip_prob: float
    ) -> tuple[list[list[tuple[str, str]]], list[list[bool]]]:
        """Demonstrations in which, with probability ``slip_prob`` per task, one action is a *slip* (not the
        planner's) and the planner then finishes from the state the slip left; plus, per action, whether
        it is the planner's (train on those only).

        Plain demonstrations never show a mistake, so a cloned policy that errs has never seen how to
        recover: greedy, it repeats the same invalid action until the budget runs out (the failure
        observed in the crafting benchmark). A slip is drawn uniformly from the actions a reader of the
        prompt might confuse: ``get`` a listed base item (1 to ``max_get``) or ``craft`` a listed recipe,
        other than the planner's next action, at a uniformly drawn turn; it is kept only if the planner
        can still finish within the budget (otherwise the task keeps its plain demonstration).
        """
        if not 0.0 <= float(slip_prob) <= 1.0:
            raise ValueError(f"slip_prob must lie in [0, 1], got {slip_prob!r}")
        rng = as_rng(seed_or_rng)
        demos = self._play_plans(tasks)[0]
        out, flags = [], []
        for task, demo in zip(tasks, demos):
            world = self._check_task(task)
            if rng.random() >= slip_prob:
                out.append(demo), flags.append([True] * len(demo))
                continue
            at = int(rng.integers(int(self.think), len(demo)))  # the thought itself is never replaced
            bases = sorted({y for x in world["shown"] for y in world["recipes"][x]["needs"] if y not in world["recipes"]})
            options = [f"get {b} {n}" for b in bases for n in range(1, self.max_get + 1)]
            options += [f"craft {x}" for x in world["shown"]]
            options = [a for a in options if a != demo[at][1]]
            slip = options[int(rng.integers(0, len(options)))]
            pairs = self._planner_finish(world, [a for _, a in demo[:at]] + [slip])
            if pairs is None:  # no room to recover: keep the plain plan
                out.append(demo), flags.append([True] * len(demo))
                continue
            out.append(pairs), flags.append([t != at for t in range(len(pairs))])
        return out, flags

    def branched_demonstrations(
        self, tasks: Sequence[dict], actions: Sequence[Sequence[str]], seed_or_rng: Any
    ) -> tuple[list[list[tuple[str, str]]], list[list[bool]]]:
        """DAgger's demonstrations (Ross, Gordon and Bagnell 2011): states the *trained policy* visits, labelled
        by the planner. Per task, ``actions[k]`` (the policy's own episode on it) is replayed up to a turn drawn
        uniformly from ``0..len(actions[k])``, and the planner's shortest plan finishes from the state it
        reached; plus, per action, whether it is the planner's (train on those only). A turn after which the
        planner can no longer finish within the budget (or the episode is over) is replaced by the latest
        earlier one that can; turn 0, the start, always can.

        Plain and slip demonstrations show only states near the planner's own path; a cloned policy that errs
        otherwise lands where no demonstration has been (the repeated ``get`` or ``craft`` of the crafting
        benchmark's failures). Here the states come from the policy itself, so the imitation covers exactly
        the states it reaches, its own mistakes included.
        """
        if len(actions) != len(tasks):
            raise ValueError(f"actions must hold one episode per task: {len(actions)} for {len(tasks)} tasks")
        rng = as_rng(seed_or_rng)
        out, flags = [], []
        for task, acts in zip(tasks, actions):
            world = self._check_task(task)
            if isinstance(acts, (str, bytes)) or not all(isinstance(a, str) for a in acts):
                raise ValueError(f"each episode in actions must be a list of action texts, got {acts!r}")
            at = int(rng.integers(0, len(acts) + 1))
            while (pairs := self._planner_finish(world, list(acts[:at]))) is None:
                at -= 1
            out.append(pairs), flags.append([t >= at for t in range(len(pairs))])
        return out, flags

    def _planner_finish(self, world: dict, prefix: list[str]) -> list[tuple[str, str]] | None:
        """``prefix`` played from the start in a private copy of this environment, then the planner's shortest
        plan from the state it leaves, as ``(observation before the action, action)`` pairs; ``None`` if the
        prefix ends the episode or the plan would overrun the budget."""
        if not prefix:
            return self._play_plans([world])[0][0]
        twin = Crafting(**self.options)
        obs = twin.reset([world])[0]
        pairs = []
        for action in prefix:
            pairs.append((obs, action))
            step = twin.step([action])
            if step.done[0]:
                return None
            obs = step.observations[0]
        state = twin._states[0]
        rest = self.planner_plan(world, dict(state.inventory))  # a dict, never None: no second thought
        if state.turns + len(rest) > world["budget"]:
            return None
        for action in rest:
            pairs.append((obs, action))
            obs = twin.step([action]).observations[0]
        if not twin._success[0]:
            raise AssertionError(f"the planner failed to finish after {prefix!r} in world seed {world.get('seed')}")
        return pairs

    def item_depths(self, task: dict) -> dict[str, int]:
        """Depth of every item of ``task`` (0 for base items)."""
        return item_depths(self._check_task(task))

    def needed_items(self, task: dict) -> set[str]:
        """The goal and every item its recipe needs, transitively (the goal's tree), base items included."""
        return goal_tree(self._check_task(task))
