"""Crafting worlds: generation from a seed, validation, difficulty levels and the exact planner.

A world (also the crafting task, a JSON dict) has a goal item, base items that can be fetched with
``get <item> <n>``, and one recipe per craftable item, ``item y = a n_a b n_b ...`` (one craft consumes
``n_a`` of ``a`` and ``n_b`` of ``b`` and yields ``y`` of ``item``). Modelled on TextCraft (ADaPT,
Prasad et al. 2023), scaled down for a tiny language model trained from scratch: 30-60 single-word
items, recipe depth 1-4, 1-3 ingredients, and a few *distractor* recipes that reuse the goal's
ingredients but are not needed.

Exact planner. Let ``c(x)`` be how often ``x`` is crafted and ``D(x) = sum_p c(p) n_p(x)`` the units of
``x`` consumed by crafting its parents ``p``. With the goal crafted once and inventory ``I``,

.. math:: c(\\text{goal}) = 1,\\qquad c(x) = \\Big\\lceil \\frac{\\max(0, D(x) - I(x))}{y(x)} \\Big\\rceil,
          \\qquad g(b) = \\Big\\lceil \\frac{\\max(0, D(b) - I(b))}{G} \\Big\\rceil

for craftable ``x`` and base ``b`` (``G``: the most one ``get`` fetches), evaluated parents-first. Every
plan must craft ``x`` at least ``c(x)`` times (units of ``x`` come only from the inventory or from
crafting, ``y(x)`` per craft; by induction from the goal down), and fetch ``b`` in at least ``g(b)``
gets, so ``sum c + sum g`` steps is a lower bound; fetching first and then crafting children before
parents attains it. Tests check it against breadth-first search over inventory states.
Book: book/part3/01_crafting.md (and the crafting example of book/part1/01_trajectories_and_support.md).
"""

from __future__ import annotations

import math
import random
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agent_lab.envs.base import check_choice, check_int

__all__ = [
    "ITEM_NAMES",
    "HELD_OUT_GOALS",
    "Level",
    "LEVELS",
    "MAX_STACK",
    "generate_world",
    "check_world",
    "item_depths",
    "craft_counts",
    "optimal_steps",
    "plan_length",
    "shortest_plan",
    "ready_first_plan",
    "shuffled_plan",
    "shortest_next",
    "thought_plan",
    "on_demand_action",
    "on_demand_plan",
    "apply_action",
    "bfs_min_steps",
    "goal_tree",
    "recipe_line",
    "thought",
    "tree_order",
]

# Single-word item names. Every world draws its 30-60 items from this pool.
ITEM_NAMES: tuple[str, ...] = tuple(
    """
    anvil arrow axe bandage banner barrel basket beacon bed bell boat bone book bottle bow bowl bread brick
    bucket cake candle carpet cart chain chair charcoal chest clay clock cloth coal compass copper cord
    crown dagger dye emerald feather fence flint flour furnace gear glass glove gold granite gravel hammer
    helmet hinge hoe honey hook iron jar kelp ladder lamp lantern lead leather lens lever log loom map
    marble mortar nail net oar paper pick pipe plank pot quartz rail resin rod rope ruby saddle salt sand
    saw scroll shears shield sign silk slab sled soap spear spool stick stone string sugar sword tar tile
    torch trap wagon wax wheel wheat wire wool
    """.split()
)
# Goal items held out of training: never a training goal, always the goal of the held-out split.
HELD_OUT_GOALS: frozenset[str] = frozenset(ITEM_NAMES[i] for i in range(0, len(ITEM_NAMES), 6))
_NAME_SET = frozenset(ITEM_NAMES)
_WORD = re.compile(r"^[a-z]+$")

#: The most units of one item the inventory holds (a ``get`` beyond it is invalid).
MAX_STACK = 99


@dataclass(frozen=True)
class Level:
    """A difficulty level: goal depth, distractor recipes, ingredient counts, yields, plan length, slack."""

    depth: int
    distractors: int
    max_count: int
    max_ingredients: int
    max_yield: int
    max_plan: int
    slack: int


#: Levels 1-3 are trained by default; level 4 is the "deeper" evaluation split.
LEVELS: dict[int, Level] = {
    1: Level(depth=1, distractors=1, max_count=1, max_ingredients=2, max_yield=1, max_plan=4, slack=2),
    2: Level(depth=2, distractors=2, max_count=2, max_ingredients=3, max_yield=2, max_plan=7, slack=2),
    3: Level(depth=3, distractors=2, max_count=2, max_ingredients=3, max_yield=2, max_plan=9, slack=3),
    4: Level(depth=4, distractors=3, max_count=2, max_ingredients=3, max_yield=2, max_plan=14, slack=3),
}


# ----- validation --------------------------------------------------------------------------------
def check_world(world: Any, max_get: int = 8) -> dict:
    """Validate a world dict and return it; ``ValueError`` names the first problem.

    Required keys: ``goal`` (str), ``base`` (list of item names), ``recipes`` ({item: {"yield": int,
    "needs": {ingredient: count}}}), ``shown`` (recipe items listed in the prompt, in order), ``budget``
    (int turns). Checks: names from :data:`ITEM_NAMES`, known ingredients, counts and yields >= 1, no
    recipe for a base item, no cycle, the goal craftable, every needed amount within :data:`MAX_STACK`
    and the budget no shorter than the optimal plan.
    """
    if not isinstance(world, Mapping):
        raise ValueError(f"a crafting task must be a dict (a world), got {type(world).__name__}")
    missing = {"goal", "base", "recipes", "shown", "budget"} - set(world)
    if missing:
        raise ValueError(f"crafting task is missing keys {sorted(missing)}")
    base, recipes = world["base"], world["recipes"]
    if not isinstance(base, list) or not base:
        raise ValueError(f"world['base'] must be a non-empty list of item names, got {base!r}")
    if not isinstance(recipes, Mapping) or not recipes:
        raise ValueError("world['recipes'] must be a non-empty dict {item: {'yield': n, 'needs': {...}}}")
    for name in list(base) + list(recipes):
        _check_name(name)
    if len(set(base)) != len(base):
        raise ValueError(f"world['base'] lists an item twice: {base!r}")
    both = set(base) & set(recipes)
    if both:
        raise ValueError(f"base items cannot have recipes, got recipes for {sorted(both)}")
    known = set(base) | set(recipes)
    for item, recipe in recipes.items():
        if not isinstance(recipe, Mapping) or set(recipe) != {"yield", "needs"}:
            raise ValueError(f"recipe of {item!r} must be {{'yield': n, 'needs': {{item: count}}}}, got {recipe!r}")
        check_int(f"yield of {item!r}", recipe["yield"], 1, MAX_STACK)
        needs = recipe["needs"]
        if not isinstance(needs, Mapping) or not needs:
            raise ValueError(f"recipe of {item!r} needs at least one ingredient, got {needs!r}")
        for ingredient, count in needs.items():
            if ingredient not in known:
                raise ValueError(f"recipe of {item!r} uses unknown item {ingredient!r}; known items: {sorted(known)}")
            check_int(f"count of {ingredient!r} in the recipe of {item!r}", count, 1, MAX_STACK)
    depths = item_depths(world)  # raises on a cycle
    goal = world["goal"]
    if goal not in recipes:
        raise ValueError(f"goal {goal!r} must be a craftable item (one with a recipe)")
    shown = world["shown"]
    if not isinstance(shown, list) or any(s not in recipes for s in shown):
        raise ValueError(f"world['shown'] must list items with recipes, got {shown!r}")
    budget = check_int("world['budget']", world["budget"], 1, 999)
    crafts, fetch = craft_counts(world, {}, depths)
    too_many = {x: n for x, n in {**fetch, **{x: c * recipes[x]["yield"] for x, c in crafts.items()}}.items()
                if n > MAX_STACK}
    if too_many:
        raise ValueError(f"the goal needs more than {MAX_STACK} units of {sorted(too_many)}: cannot be built")
    steps = plan_length(crafts, fetch, max_get)
    if budget < steps:
        raise ValueError(f"world['budget'] = {budget} is shorter than the optimal plan ({steps} steps)")
    return world


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not _WORD.match(name):
        raise ValueError(f"item names must be single lower-case words, got {name!r}")
    if name not in _NAME_SET:
        raise ValueError(f"unknown item name {name!r}: names must come from crafting_world.ITEM_NAMES")


def item_depths(world: Mapping, roots: Iterable[str] | None = None) -> dict[str, int]:
    """Depth of every item: 0 for base items, ``1 + max depth of its ingredients`` otherwise.

    Only the items reachable from ``roots`` (default: every recipe) get a computed depth, so
    ``roots=[goal]`` is the cheap form used by the planner. Raises ``ValueError`` on a cycle.
    """
    recipes = world["recipes"]
    depth: dict[str, int] = {b: 0 for b in world["base"]}
    visiting: set[str] = set()

    def visit(item: str) -> int:
        if item in depth:
            return depth[item]
        if item in visiting:
            raise ValueError(f"the recipes contain a cycle through {item!r}")
        visiting.add(item)
        d = 1 + max(visit(i) for i in recipes[item]["needs"])
        visiting.discard(item)
        depth[item] = d
        return d

    for item in recipes if roots is None else roots:
        visit(item)
    return depth


# ----- the exact planner --------------------------------------------------------------------------
def craft_counts(
    world: Mapping, inventory: Mapping[str, int], depths: Mapping[str, int] | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """``(c, f)``: minimal crafts ``c(x)`` per craftable item and units ``f(b)`` to fetch per base item.

    Demand flows from the goal (crafted once) to ingredients, parents before children (decreasing
    depth), net of the inventory; see the module docstring. Items with zero counts are left out.
    """
    recipes = world["recipes"]
    depths = depths if depths is not None else item_depths(world, [world["goal"]])
    demand: dict[str, int] = {}
    crafts: dict[str, int] = {}
    fetch: dict[str, int] = {}
    for item in sorted(goal_tree(world), key=lambda x: -depths[x]):
        if item == world["goal"]:
            count = 1
        else:
            short = max(0, demand.get(item, 0) - int(inventory.get(item, 0)))
            if item not in recipes:
                if short:
                    fetch[item] = short
                continue
            count = -(-short // recipes[item]["yield"])
        if count:
            crafts[item] = count
            for ingredient, n in recipes[item]["needs"].items():
                demand[ingredient] = demand.get(ingredient, 0) + count * n
    return crafts, fetch


def plan_length(crafts: Mapping[str, int], fetch: Mapping[str, int], max_get: int) -> int:
    """``sum_x c(x) + sum_b ceil(f(b) / max_get)``: the steps of the plan given by :func:`craft_counts`."""
    return sum(crafts.values()) + sum(math.ceil(n / max_get) for n in fetch.values())


def optimal_steps(world: Mapping, inventory: Mapping[str, int] | None = None, max_get: int = 8) -> int:
    """The minimal number of steps that craft the goal from ``inventory`` (empty by default)."""
    crafts, fetch = craft_counts(world, inventory or {})
    return plan_length(crafts, fetch, max_get)


def shortest_next(world: Mapping, inventory: Mapping[str, int] | None = None, max_get: int = 8) -> dict[str, set[str]]:
    """Per verb, the items whose action keeps a plan shortest from ``inventory``: ``{"get": bases, "craft":
    recipes}``, each a full-stack ``get`` (``max_get``, less where the stack would pass :data:`MAX_STACK`) or a
    ``craft`` whose ingredients are held, after which :func:`optimal_steps` is one less (crafting the goal ends
    the task). Every full-stack shortest plan's next action is among them, whatever order it breaks ties in.
    """
    inv = dict(inventory or {})
    now, out = optimal_steps(world, inv, max_get), {"get": set(), "craft": set()}
    for b in world["base"]:
        n = min(max_get, MAX_STACK - int(inv.get(b, 0)))
        if n > 0 and optimal_steps(world, apply_action(world, inv, f"get {b} {n}"), max_get) == now - 1:
            out["get"].add(b)
    for x, recipe in world["recipes"].items():
        if all(inv.get(y, 0) >= n for y, n in recipe["needs"].items()) and (
                now == 1 if x == world["goal"] else optimal_steps(world, apply_action(world, inv, f"craft {x}"),
                                                                  max_get) == now - 1):
            out["craft"].add(x)
    return out


def shortest_plan(
    world: Mapping, inventory: Mapping[str, int] | None = None, max_get: int = 8, full_stacks: bool = False,
    ties: str = "name",
) -> list[str]:
    """A shortest plan as action texts: every ``get`` first (base items in alphabetical order, the order of the
    prompt's ``base`` line), then crafts children before parents (by :func:`item_depths`).

    Base item ``b`` is fetched in ``ceil(f(b) / G)`` gets either way. By default they fetch exactly
    ``f(b)`` units, a tree total the policy must multiply out; with ``full_stacks`` every ``get`` asks
    for a full ``G`` (less only where the stack would pass :data:`MAX_STACK`), so the count is a constant
    and the surplus is harmless (nothing in the task penalises leftovers). Crafts of equal depth come in
    alphabetical order (``ties="name"``), a rank of the item words the prompt never shows, or in the order
    the prompt lists their recipe lines (``ties="listed"``, ``world["shown"]``), which a policy can read.
    """
    check_choice("ties", ties, ("name", "listed"))
    depths = item_depths(world, [world["goal"]])
    crafts, fetch = craft_counts(world, inventory or {}, depths)
    plan = _gets(fetch, sorted(fetch), inventory or {}, max_get, full_stacks)
    listed = {x: i for i, x in enumerate(world["shown"])}
    for item in sorted(crafts, key=lambda x: (depths[x], x if ties == "name" else listed[x])):
        plan += [f"craft {item}"] * crafts[item]
    return plan


def _gets(
    fetch: Mapping[str, int], order: Iterable[str], inventory: Mapping[str, int], max_get: int, full_stacks: bool
) -> list[str]:
    """The ``get`` actions that fetch ``fetch[b]`` units of each base item, items in ``order``: ``ceil(f(b) / G)``
    gets of ``min(left, G)`` units, or with ``full_stacks`` of a full ``G`` (less where the stack would pass
    :data:`MAX_STACK`)."""
    plan = []
    for item in order:
        left, held = fetch[item], int(inventory.get(item, 0))
        while left > 0:
            n = min(max_get, MAX_STACK - held) if full_stacks else min(left, max_get)
            plan.append(f"get {item} {n}")
            left, held = left - max_get, held + n
    return plan


def thought_plan(world: Mapping, inventory: Mapping[str, int] | None = None, max_get: int = 8) -> list[str]:
    """A shortest plan that reads :func:`thought` (``parents_first=True``) as a list: full-stack ``get`` s of the
    base items in the order the thought first names them, then the crafts in the reverse of its lines' order.

    The thought's lines run parents before children (:func:`tree_order`), so read from the last line back every
    recipe comes after its ingredients' and each next action is the next entry of a list already written, not a
    depth or an alphabetical rank to work out. Counts are :func:`craft_counts`', as in :func:`shortest_plan`.
    """
    order = tree_order(world)
    crafts, fetch = craft_counts(world, inventory or {})
    named = [y for x in order if x in world["recipes"] for y in world["recipes"][x]["needs"]]
    plan = _gets(fetch, [b for b in dict.fromkeys(named) if b in fetch], inventory or {}, max_get, True)
    for item in reversed(order):
        plan += [f"craft {item}"] * crafts.get(item, 0)
    return plan


def on_demand_action(world: Mapping, inventory: Mapping[str, int], max_get: int = 8) -> str:
    """The on-demand planner's next action: a function of the recipes and the current inventory alone.

    Walk down from the goal: take the recipe's first ingredient (in the order the prompt lists it) that
    the inventory is short of; if it is a base item, ``get`` a full ``max_get``, otherwise descend into
    its recipe; when nothing is short, ``craft`` the item reached. Every craft of ``x`` answers a
    shortage of ``x`` for a craft that is itself needed, and leftovers are used before crafting again,
    so ``x`` is crafted ``ceil((D(x) - I(x)) / y(x))`` times; a full-stack ``get`` happens only while
    short, so ``b`` is fetched in ``ceil((D(b) - I(b)) / G)`` gets. The plan is therefore as short as
    :func:`shortest_plan`'s, with no arithmetic beyond comparing two small counts (fetch-first ``get``
    counts are tree totals) but a chain of recipe look-ups at every step.
    """
    recipes = world["recipes"]
    item = world["goal"]
    while True:
        short = next((y for y, n in recipes[item]["needs"].items() if inventory.get(y, 0) < n), None)
        if short is None:
            return f"craft {item}"
        if short not in recipes:
            return f"get {short} {max(1, min(max_get, MAX_STACK - inventory.get(short, 0)))}"
        item = short


def apply_action(world: Mapping, inventory: Mapping[str, int], action: str) -> dict[str, int]:
    """The inventory after a valid ``get <item> <n>`` or ``craft <item>`` (``ValueError`` if it cannot run)."""
    words, inv = action.split(), dict(inventory)
    if len(words) == 3 and words[0] == "get" and words[1] not in world["recipes"]:
        inv[words[1]] = inv.get(words[1], 0) + int(words[2])
        return inv
    recipe = world["recipes"].get(words[-1]) if words[0] == "craft" else None
    if recipe is None or any(inv.get(y, 0) < n for y, n in recipe["needs"].items()):
        raise ValueError(f"action {action!r} cannot run with inventory {dict(inventory)}")
    for y, n in recipe["needs"].items():
        inv[y] -= n
        if not inv[y]:
            del inv[y]
    inv[words[1]] = inv.get(words[1], 0) + recipe["yield"]
    return inv


def on_demand_plan(world: Mapping, inventory: Mapping[str, int] | None = None, max_get: int = 8) -> list[str]:
    """A shortest plan made of :func:`on_demand_action` steps, ending with the goal's craft."""
    inv, plan = dict(inventory or {}), []
    while not plan or plan[-1] != f"craft {world['goal']}":
        plan.append(on_demand_action(world, inv, max_get))
        inv = apply_action(world, inv, plan[-1])
    return plan


def ready_first_plan(world: Mapping, inventory: Mapping[str, int] | None = None, max_get: int = 8) -> list[str]:
    """A shortest plan whose every craft is the first recipe line of the prompt (``world["shown"]``) that the
    goal still needs and whose ingredients the inventory already holds; full-stack ``get`` s first, as in
    ``shortest_plan(full_stacks=True)``.

    The crafts and their counts are :func:`craft_counts`'; only their order differs from the depth order. Some
    remaining craft is always ready: an ingredient short for a remaining craft still has crafts of its own left,
    since production covers demand, and following shortages down ends at an item whose ingredients are held.
    So the next craft reads off the prompt's lines and the inventory, with no depth or tree rank to work out.
    """
    return _ready_plan(world, inventory, max_get, sorted(world["base"]), [*world["shown"]])


def shuffled_plan(world: Mapping, inventory: Mapping[str, int] | None = None, max_get: int = 8) -> list[str]:
    """:func:`ready_first_plan` with the prompt's order replaced by a random ranking of the world's items, drawn
    from a generator seeded by the world itself (its ``seed`` and goal), so a world always gets the same plan.

    Full-stack ``get`` s of the needed base items come first, in that ranking's order, then each craft is the
    best-ranked recipe the goal still needs whose ingredients are held. Across worlds no rank of item words
    decides a tie: where several actions keep the plan shortest (:func:`shortest_next`), the first of them is
    demonstrated equally often across worlds, so what is left to imitate is which items the goal needs and which
    crafts are ready, not an order of them.
    """
    items = sorted({*world["base"], *world["recipes"]})
    random.Random(f"{world.get('seed')}/{world['goal']}").shuffle(items)
    return _ready_plan(world, inventory, max_get, items, items)


def _ready_plan(
    world: Mapping, inventory: Mapping[str, int] | None, max_get: int, gets_order: list[str], crafts_order: list[str]
) -> list[str]:
    """Full-stack gets of what :func:`craft_counts` fetches, in ``gets_order``, then crafts, each the first of
    ``crafts_order`` still needed whose ingredients are held."""
    inv = dict(inventory or {})
    crafts, fetch = craft_counts(world, inv)
    plan = _gets(fetch, [b for b in gets_order if b in fetch], inv, max_get, True)
    for action in plan:
        inv = apply_action(world, inv, action)
    recipes, left = world["recipes"], dict(crafts)
    order = [*crafts_order, *sorted(set(crafts) - set(crafts_order))]  # a hand-made world may list fewer
    while left:
        item = next(x for x in order if left.get(x)
                    and all(inv.get(y, 0) >= n for y, n in recipes[x]["needs"].items()))
        plan.append(f"craft {item}")
        inv, left[item] = apply_action(world, inv, plan[-1]), left[item] - 1
        if not left[item]:
            del left[item]
    return plan


def bfs_min_steps(
    world: Mapping, max_get: int = 8, max_steps: int = 12, inventory: Mapping[str, int] | None = None
) -> int | None:
    """Breadth-first search over inventory states for the fewest steps that craft the goal.

    Exhaustive over every ``get b n`` (``1 <= n <= max_get``, stack at most :data:`MAX_STACK`) and every
    craftable ``craft x``, from ``inventory`` (empty by default); exponential, for checking the planner
    on small worlds only. ``None`` if the goal is not reached within ``max_steps``.
    """
    recipes, base, goal = world["recipes"], list(world["base"]), world["goal"]
    items = sorted(set(base) | set(recipes))
    index = {x: i for i, x in enumerate(items)}
    needs = {x: [(index[i], n) for i, n in r["needs"].items()] for x, r in recipes.items()}
    start = tuple(int((inventory or {}).get(x, 0)) for x in items)
    frontier, seen = deque([(start, 0)]), {start}
    while frontier:
        state, steps = frontier.popleft()
        if steps >= max_steps:
            continue
        successors = []
        for b in base:
            i = index[b]
            for n in range(1, max_get + 1):
                if state[i] + n <= MAX_STACK:
                    successors.append((i, n, ()))
        for x, need in needs.items():
            if all(state[i] >= n for i, n in need):
                if x == goal:
                    return steps + 1
                successors.append((index[x], recipes[x]["yield"], need))
        for i, gain, need in successors:
            nxt = list(state)
            for j, n in need:
                nxt[j] -= n
            nxt[i] = min(MAX_STACK, nxt[i] + gain)
            key = tuple(nxt)
            if key not in seen:
                seen.add(key)
                frontier.append((key, steps + 1))
    return None


# ----- generation ---------------------------------------------------------------------------------
def generate_world(
    seed: int, level: int = 1, goal_pool: str = "train", max_get: int = 8, spec: Level | None = None
) -> dict:
    """A world from ``seed`` at ``level`` (see :data:`LEVELS`), as a JSON-serialisable task dict.

    ``goal_pool="train"`` draws the goal from names outside :data:`HELD_OUT_GOALS`, ``"held_out"`` from
    inside. ``spec`` replaces the level's parameters (for experiments; ``level`` still seeds the draw).
    The draw is retried (with the next stream of the same seed) until enough distractors exist and the
    optimal plan fits ``max_plan``; parameters that admit no such world raise ``ValueError``. The
    budget is the optimal plan plus the slack.
    """
    seed = check_int("seed", seed, 0)
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
    check_choice("goal_pool", goal_pool, ("train", "held_out"))
    max_get = check_int("max_get", max_get, 1, MAX_STACK)
    spec = LEVELS[level] if spec is None else _check_level(spec)
    for attempt in range(256):
        # Python's Random (an int seed is used as is, the same on every run and platform) is several times
        # faster than numpy for these many small draws.
        stream = ((seed * 8 + level) * 2 + (goal_pool == "held_out")) * 256 + attempt
        world = _draw_world(random.Random(stream), spec, goal_pool)
        if world is None:
            continue
        steps = optimal_steps(world, max_get=max_get)
        if steps <= spec.max_plan:
            world.update(seed=seed, level=level, budget=steps + spec.slack)
            return world
    raise ValueError(f"no world with the parameters of level {level} ({asdict(spec)}) was found for seed {seed}")


def _check_level(spec: Any) -> Level:
    if not isinstance(spec, Level):
        raise ValueError(f"spec must be a crafting_world.Level, got {type(spec).__name__}")
    check_int("spec.depth", spec.depth, 1, 6)
    check_int("spec.distractors", spec.distractors, 0, 10)
    check_int("spec.max_count", spec.max_count, 1, 9)
    check_int("spec.max_ingredients", spec.max_ingredients, 1, 3)
    check_int("spec.max_yield", spec.max_yield, 1, 9)
    check_int("spec.max_plan", spec.max_plan, 1, 99)
    check_int("spec.slack", spec.slack, 0, 99)
    return spec


def _randint(rng: random.Random, low: int, high: int) -> int:
    """Uniform on ``low..high`` from one ``rng.random()`` call (``Random.randint`` costs several)."""
    return low + int(rng.random() * (high - low + 1))


def _pick(rng: random.Random, seq: Sequence[str]) -> str:
    """A uniform element of ``seq``."""
    return seq[int(rng.random() * len(seq))]


def _draw_world(rng: random.Random, spec: Level, goal_pool: str) -> dict | None:
    goals = sorted(HELD_OUT_GOALS) if goal_pool == "held_out" else [x for x in ITEM_NAMES if x not in HELD_OUT_GOALS]
    goal = _pick(rng, goals)
    others = [x for x in ITEM_NAMES if x != goal]
    n_items = _randint(rng, 30, 60)
    names = [goal] + rng.sample(others, n_items - 1)
    n_base = _randint(rng, 4, 8)
    base = names[1 : 1 + n_base]
    craftable = names[1 + n_base :]
    # Depths 1..depth for the other craftable items (each depth at least once), the goal at the top.
    top = max(spec.depth, 2)
    layer = {x: 0 for x in base}
    for i, x in enumerate(craftable):
        layer[x] = 1 + i % top if i < top else _randint(rng, 1, top)
    layer[goal] = spec.depth
    by_layer: dict[int, list[str]] = {}
    for x, d in layer.items():
        by_layer.setdefault(d, []).append(x)
    below = {d: [y for y in layer if layer[y] < d] for d in range(1, top + 1)}
    recipes: dict[str, dict] = {}
    for x in [goal] + craftable:
        d = layer[x]
        lower = below[d]
        k = min(_randint(rng, 1, spec.max_ingredients), len(lower))
        picks = [_pick(rng, by_layer[d - 1])]  # x itself is on layer d, never on d - 1
        while len(picks) < k:
            y = _pick(rng, lower)
            if y not in picks:
                picks.append(y)
        recipes[x] = {
            "yield": _randint(rng, 1, spec.max_yield),
            "needs": {y: _randint(rng, 1, spec.max_count) for y in picks},
        }
    recipes[goal]["yield"] = 1
    world = {"goal": goal, "base": sorted(base), "recipes": recipes}
    tree = goal_tree(world)
    ingredients = tree - {goal}
    # Distractors: recipes outside the goal's tree that reuse its ingredients. With 20+ craftable items
    # outside the tree there are nearly always enough; otherwise the caller draws again.
    natural = [x for x in craftable if x not in tree and ingredients & set(recipes[x]["needs"])]
    if len(natural) < spec.distractors:
        return None
    rng.shuffle(natural)
    distractors = natural[: spec.distractors]
    # The goal's depth is the level's by construction: every item on layer d needs one on layer d - 1.
    shown = sorted(tree & set(recipes)) + distractors
    rng.shuffle(shown)
    world["shown"] = shown
    return world


def recipe_line(world: Mapping, item: str, tagged: bool = False) -> str:
    """``item`` 's recipe as the prompt lists it: ``"item y = a n_a b n_b ..."``, or with ``tagged`` each
    ingredient after the line's item, ``"item y = item a n_a item b n_b ..."``."""
    recipe = world["recipes"][item]
    tag = f"{item} " if tagged else ""
    return f"{item} {recipe['yield']} = " + " ".join(f"{tag}{y} {n}" for y, n in recipe["needs"].items())


def thought(world: Mapping, tagged: bool = False, parents_first: bool = False) -> str:
    """The demonstrator's ``think`` action: the goal tree's recipe lines, copied from the prompt in
    depth-first pre-order (the goal's first, then each ingredient's before the next ingredient's),
    joined by ``;``; with ``parents_first``, in :func:`tree_order`, which is the same on a tree and
    puts an ingredient two recipes share after both.

    Reading the tree in one forward pass is a ``depth``-hop lookup; written out, each line is one hop
    from a name already in the context, and the base items to fetch are the listed ingredients with no
    line of their own.
    """
    order = tree_order(world) if parents_first else _tree_preorder(world)
    return "think " + " ; ".join(recipe_line(world, x, tagged) for x in order if x in world["recipes"])


def _tree_preorder(world: Mapping) -> list[str]:
    """The goal and every item its recipe needs, transitively, each once, in depth-first pre-order."""
    recipes, order, seen, stack = world["recipes"], [], set(), [world["goal"]]
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        order.append(item)
        stack.extend(reversed(list(recipes.get(item, {"needs": {}})["needs"])))
    return order


def tree_order(world: Mapping) -> list[str]:
    """The goal and every item it needs, each once, every item after all the tree's items whose recipes
    need it: the reverse of a depth-first post-order that visits ingredients last to first. Where no
    ingredient is shared this is the depth-first pre-order (ingredients first to last) that :func:`thought`
    lists by default."""
    recipes, post, seen = world["recipes"], [], set()

    def visit(item: str) -> None:
        seen.add(item)
        for y in reversed(list(recipes.get(item, {"needs": {}})["needs"])):
            if y not in seen:
                visit(y)
        post.append(item)

    visit(world["goal"])
    return post[::-1]


def goal_tree(world: Mapping) -> set[str]:
    """The goal and every item its recipe needs, transitively."""
    return set(_tree_preorder(world))
