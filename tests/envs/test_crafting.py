"""Crafting: world generation, the exact planner against breadth-first search, protocol and rules."""

from __future__ import annotations

import collections
import copy
import json
import random

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent_lab.envs import make_env, replay
from agent_lab.envs.crafting import MISTAKES, PLANS, first_mistake
from agent_lab.envs.crafting_world import (
    HELD_OUT_GOALS,
    ITEM_NAMES,
    LEVELS,
    Level,
    apply_action,
    bfs_min_steps,
    check_world,
    generate_world,
    goal_tree,
    item_depths,
    on_demand_action,
    on_demand_plan,
    optimal_steps,
    shortest_next,
    shortest_plan,
)


def tiny_world(draw_ints: list[int], n_base: int, n_craft: int) -> dict:
    """A small random world: items ITEM_NAMES[:n_base] are base, the next n_craft are craftable in order."""
    it = iter(draw_ints)
    base = list(ITEM_NAMES[:n_base])
    craftable = list(ITEM_NAMES[n_base : n_base + n_craft])
    recipes = {}
    for j, x in enumerate(craftable):
        pool = base + craftable[:j]
        k = 1 + next(it) % min(3, len(pool))
        start = next(it) % len(pool)
        picks = [pool[(start + 2 * m) % len(pool)] for m in range(k)]
        recipes[x] = {"yield": 1 + next(it) % 3, "needs": {y: 1 + next(it) % 3 for y in dict.fromkeys(picks)}}
    goal = craftable[-1]
    return {"goal": goal, "base": base, "recipes": recipes, "shown": list(recipes), "budget": 99}


@settings(max_examples=40, deadline=None)
@given(
    ints=st.lists(st.integers(0, 1000), min_size=40, max_size=40),
    n_base=st.integers(1, 3),
    n_craft=st.integers(1, 3),
    max_get=st.integers(1, 3),
)
def test_planner_minimum_equals_breadth_first_search_on_small_worlds(ints, n_base, n_craft, max_get):
    world = tiny_world(ints, n_base, n_craft)
    steps = optimal_steps(world, max_get=max_get)
    assume(steps <= 7)  # keeps the exhaustive search fast; hypothesis draws another world instead
    assert bfs_min_steps(world, max_get=max_get, max_steps=steps) == steps
    assert bfs_min_steps(world, max_get=max_get, max_steps=steps - 1) is None
    assert len(shortest_plan(world, max_get=max_get)) == steps
    assert len(shortest_plan(world, max_get=max_get, full_stacks=True)) == steps
    assert len(on_demand_plan(world, max_get=max_get)) == steps


def partial_inventories(test):
    """30 hypothesis draws of ``ints`` and ``held`` for :func:`tiny_world_holding`."""
    return settings(max_examples=30, deadline=None)(given(
        ints=st.lists(st.integers(0, 1000), min_size=40, max_size=40),
        held=st.lists(st.integers(0, 3), min_size=6, max_size=6))(test))


def tiny_world_holding(ints: list[int], held: list[int]) -> tuple[dict, dict]:
    """A :func:`tiny_world` with 2 base and 3 craftable items, and ``held`` units of each but the goal."""
    world = tiny_world(ints, 2, 3)
    return world, {x: n for x, n in zip([*world["base"], *world["recipes"]], held) if n and x != world["goal"]}


@partial_inventories
def test_planner_from_a_partial_inventory_equals_breadth_first_search(ints, held):
    world, inventory = tiny_world_holding(ints, held)
    steps = optimal_steps(world, inventory, max_get=2)
    assume(steps <= 7)
    assert bfs_min_steps(world, max_get=2, max_steps=steps, inventory=inventory) == steps
    assert steps == 0 or bfs_min_steps(world, max_get=2, max_steps=steps - 1, inventory=inventory) is None
    if steps:  # the other planners are as short from any inventory
        assert len(on_demand_plan(world, inventory, max_get=2)) == steps
        assert len(shortest_plan(world, inventory, max_get=2, full_stacks=True)) == steps


@partial_inventories
def test_the_shortest_next_items_are_exactly_those_breadth_first_search_finds_one_step_closer(ints, held):
    world, inventory = tiny_world_holding(ints, held)
    steps = optimal_steps(world, inventory, max_get=2)
    assume(0 < steps <= 6)
    found = {"get": set(), "craft": set()}
    for b in world["base"]:
        after = apply_action(world, inventory, f"get {b} {min(2, 99 - inventory.get(b, 0))}")
        found["get"] |= {b} if bfs_min_steps(world, 2, steps - 1, after) == steps - 1 else set()
    for x, recipe in world["recipes"].items():
        if all(inventory.get(y, 0) >= n for y, n in recipe["needs"].items()):
            done = x == world["goal"] and steps == 1
            after = apply_action(world, inventory, f"craft {x}")
            found["craft"] |= {x} if done or (x != world["goal"] and bfs_min_steps(world, 2, steps - 1, after)
                                              == steps - 1) else set()
    assert shortest_next(world, inventory, max_get=2) == found
    for name, plan in PLANS.items():  # every full-stack plan's next action is one of them
        if name != "fetch_first":
            verb, item = plan(world, inventory, 2)[0].split()[:2]
            assert item in found[verb], name


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_on_demand_plans_are_shortest_solve_their_worlds_and_depend_only_on_the_inventory(level):
    env = make_env("crafting", plan="on_demand")  # level 4 is its deeper split
    tasks = [generate_world(seed, level) for seed in range(60)]
    assert env.optimal_success(tasks) == 1.0  # executed by the environment, which checks every action itself
    for task, demo in zip(tasks, env.demonstrations(tasks)):
        actions = [a for _, a in demo]
        assert len(actions) == optimal_steps(task) and actions == on_demand_plan(task)
        inventory = {}
        for action in actions:  # each action is a function of the recipes and the current inventory
            assert action == on_demand_action(task, inventory)
            inventory = apply_action(task, inventory, action)
        # gets fetch full stacks: no count is a tree total
        assert all(a.split()[2] == "8" for a in actions if a.startswith("get"))
    assert any(on_demand_plan(t) != shortest_plan(t) for t in tasks)
    with pytest.raises(ValueError, match="cannot run"):
        apply_action(tasks[0], {}, f"craft {tasks[0]['goal']}")


@pytest.mark.parametrize("level", [1, 2, 3])
def test_planner_equals_bfs_on_generated_worlds_restricted_to_listed_recipes(level):
    for seed in range(6):
        world = generate_world(seed, level, max_get=3)
        # the listed recipes whose ingredients are listed too (a distractor may need an unlisted item)
        known = set(world["shown"]) | set(world["base"])
        listed = {x: world["recipes"][x] for x in world["shown"] if set(world["recipes"][x]["needs"]) <= known}
        bases = sorted({y for r in listed.values() for y in r["needs"] if y in world["base"]})
        sub = {**world, "base": bases, "recipes": listed}
        steps = optimal_steps(world, max_get=3)
        assert optimal_steps(sub, max_get=3) == steps
        # every plan, however long (up to 9 steps here): BFS finds none shorter and one this long
        assert bfs_min_steps(sub, max_get=3, max_steps=steps) == steps, (level, seed)
        assert bfs_min_steps(sub, max_get=3, max_steps=steps - 1) is None, (level, seed)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_generated_worlds_meet_the_specification(level):
    spec = LEVELS[level]
    for seed in range(15):
        world = generate_world(seed, level)
        check_world(world)
        items = set(world["base"]) | set(world["recipes"])
        assert 30 <= len(items) <= 60 and items <= set(ITEM_NAMES)
        assert all(" " not in x for x in items)
        assert item_depths(world)[world["goal"]] == spec.depth
        assert all(1 <= len(r["needs"]) <= 3 for r in world["recipes"].values())
        tree = goal_tree(world)
        distractors = [x for x in world["shown"] if x not in tree]
        assert len(distractors) == spec.distractors
        ingredients = tree - {world["goal"]}
        assert all(ingredients & set(world["recipes"][x]["needs"]) for x in distractors)
        assert set(world["shown"]) - set(distractors) == tree & set(world["recipes"])
        steps = optimal_steps(world)
        assert steps <= spec.max_plan and world["budget"] == steps + spec.slack
        assert world["goal"] not in HELD_OUT_GOALS
        assert generate_world(seed, level, "held_out")["goal"] in HELD_OUT_GOALS
        assert json.loads(json.dumps(world)) == world


def test_generation_is_deterministic_by_seed_and_splits_are_disjoint():
    assert generate_world(7, 2) == generate_world(7, 2)
    assert generate_world(7, 2) != generate_world(8, 2)
    env = make_env("crafting")
    assert env.sample_tasks(5, 8) == env.sample_tasks(np.random.default_rng(5), 8)
    assert env.eval_tasks("test") == make_env("crafting").eval_tasks("test")
    train = env.sample_tasks(0, 200)
    assert all(t["seed"] < 1_000_000 and t["level"] in (1, 2, 3) for t in train)
    assert all(t["goal"] not in HELD_OUT_GOALS for t in train)
    test = env.eval_tasks("test")
    assert all(1_000_000 <= t["seed"] < 2_000_000 for t in test) and {t["level"] for t in test} == {1, 2, 3}
    held = env.eval_tasks("held_out_goals", 30)
    assert all(t["goal"] in HELD_OUT_GOALS for t in held)
    deep = env.eval_tasks("deeper", 10)
    assert {t["level"] for t in deep} == {4}
    assert make_env("crafting", train_levels=[1]).eval_tasks("deeper", 3)[0]["level"] == 2


def test_planner_success_is_one_on_every_split_and_demonstrations_fit_the_budget():
    env = make_env("crafting")
    for split in env.splits:
        tasks = env.eval_tasks(split, 24)
        assert env.optimal_success(tasks) == 1.0
        for task, demo in zip(tasks, env.demonstrations(tasks)):
            assert len(demo) == optimal_steps(task) <= task["budget"] <= env.max_turns


def test_demonstrations_pair_each_action_with_the_observation_before_it():
    env = make_env("crafting")
    tasks = env.eval_tasks("test", 6)
    demos = env.demonstrations(tasks)
    prompts = env.reset(tasks)
    for i, demo in enumerate(demos):
        assert demo[0][0] == prompts[i]
    for turn in range(max(map(len, demos))):
        step = env.step([d[turn][1] if turn < len(d) else "" for d in demos])
        for i, d in enumerate(demos):
            if turn + 1 < len(d):
                assert d[turn + 1][0] == step.observations[i]
            elif turn + 1 == len(d):
                assert step.success[i] and step.rewards[i] == 1.0 and step.observations[i].startswith("success")


def test_depth_three_episodes_stay_within_about_256_word_tokens():
    env = make_env("crafting")
    tasks = env.eval_tasks("test", 60)
    for task, demo in zip(tasks, env.demonstrations(tasks)):
        text = "\n".join(f"{o}\n{a}" for o, a in demo)
        tokens = text.replace("\n", " \n ").split(" ")
        assert len(tokens) <= 256, (task["level"], len(tokens))


def small_env_and_world(**options):
    world = {
        "goal": "pot",
        "base": ["axe", "clay"],
        "recipes": {"plank": {"yield": 2, "needs": {"axe": 1}}, "pot": {"yield": 1, "needs": {"plank": 3, "clay": 1}}},
        "shown": ["pot", "plank"],
        "budget": 6,
    }
    return make_env("crafting", **options), world


@pytest.mark.parametrize(
    "text,action,error",
    [
        ("get axe 2", ["get", "axe", 2], None),
        ("  GET   Axe  2 \n", ["get", "axe", 2], None),
        ("get axe 0", None, "count out of range 1..8"),
        ("get axe 9", None, "count out of range 1..8"),
        ("get axe -1", None, "not a number"),
        ("get axe two", None, "not a number"),
        ("get plank 1", None, "not a base item"),
        ("get dragon 1", None, "unknown item"),
        ("get sword 1", None, "unknown item"),  # a real name, but not in this world
        ("craft axe", None, "base item"),
        ("craft pot", None, "missing ingredients"),
        ("craft", None, "expected 'get <item> <n>' or 'craft <item>'"),
        ("", None, "expected 'get <item> <n>' or 'craft <item>'"),
        ("get axe 2 please", None, "expected 'get <item> <n>' or 'craft <item>'"),
        ("craft " + "pot " * 100, None, "too long"),
    ],
)
def test_parser_edge_cases(text, action, error):
    env, world = small_env_and_world()
    env.reset([world])
    step = env.step([text])
    assert step.info[0]["action"] == action and step.info[0]["error"] == error
    assert step.observations[0].split("\n")[0] == ("ok" if action else "invalid")


def test_playing_the_small_world_by_hand():
    env, world = small_env_and_world()
    prompt = env.reset([world])[0]
    assert prompt == "goal pot\nrecipes\npot 1 = plank 3 clay 1\nplank 2 = axe 1\nbase axe clay\nsteps 6"
    # pot needs 3 plank (2 crafts at yield 2, so 2 axe) and 1 clay: 2 gets + 3 crafts
    assert shortest_plan(world) == ["get axe 2", "get clay 1", "craft plank", "craft plank", "craft pot"]
    assert optimal_steps(world) == 5 == bfs_min_steps(world, max_steps=6)
    obs = [env.step([t]).observations[0] for t in ["get axe 2", "craft plank", "craft plank"]]
    assert obs[-1] == "ok\ninventory plank 4\nsteps 3"
    step = env.step(["craft pot"])
    assert step.observations[0] == "invalid\ninventory plank 4\nsteps 2" and not step.done[0]
    env.step(["get clay 1"])
    step = env.step(["craft pot"])
    assert step.done[0] and step.success[0] and step.rewards[0] == 1.0
    assert step.observations[0] == "success\ninventory plank 1 pot 1\nsteps 0"


def test_invalid_rules_and_running_out_of_steps():
    env, world = small_env_and_world(invalid_action="end_episode")
    env.reset([world, world])
    step = env.step(["craft pot", "get axe 2"])
    assert list(step.done) == [True, False] and step.rewards[0] == 0 and not step.truncated[0]
    env, world = small_env_and_world()
    env.reset([world])
    for _ in range(6):
        step = env.step(["get axe 1"])
    assert step.done[0] and not step.success[0] and step.info[0]["timeout"] and not step.truncated[0]
    env, world = small_env_and_world(turn_limit=2)
    env.reset([world])
    env.step(["get axe 1"])
    assert env.step(["get axe 1"]).truncated[0]


@pytest.mark.parametrize("rule", ["spend_turn", "end_episode"])
def test_invalid_penalty_charges_each_invalid_action_and_leaves_success_and_task_reward_alone(rule):
    env, world = small_env_and_world(invalid_penalty=0.25, invalid_action=rule)
    plan = ["get axe 2", "get clay 1", "craft plank", "craft plank", "craft pot"]
    texts = [plan, ["craft pot", "get plank 1", "get axe 2", "get clay 1", "craft plank", "craft plank"]]
    env.reset([world, world])
    for t in range(6):
        env.step([row[t] if t < len(row) else "" for row in texts])
    logs = env.episode_logs()
    assert [t["reward"] for t in logs[0]["turns"]] == [0, 0, 0, 0, 1.0] and logs[0]["success"]
    charged = [t["reward"] for t in logs[1]["turns"]]
    if rule == "spend_turn":  # two refusals, then the plan's first four steps before the budget runs out
        assert charged == [-0.25, -0.25, 0, 0, 0, 0] and logs[1]["return"] == -0.5 and not logs[1]["success"]
    else:
        assert charged == [-0.25] and logs[1]["done"]
    assert all(t["task_reward"] == 0 for t in logs[1]["turns"])
    assert [replay(e)["return"] for e in logs] == [e["return"] for e in logs]
    plain, _ = small_env_and_world()
    assert plain.invalid_penalty == 0.0
    for bad in (-0.1, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="invalid_penalty must be a finite number >= 0"):
            make_env("crafting", invalid_penalty=bad)


def test_one_bad_text_affects_only_its_episode():
    env = make_env("crafting")
    tasks = env.eval_tasks("test", 4)
    demos = env.demonstrations(tasks)
    env.reset(tasks)
    texts = [d[0][1] for d in demos]
    texts[1] = "\x00" * 10000
    step = env.step(texts)
    assert step.info[1]["error"] == "too long"
    assert all(step.info[i]["error"] is None for i in (0, 2, 3))


@pytest.mark.parametrize("shaping", ["first_craft", "distance"])
def test_shaping_is_potential_based_sums_to_a_constant_and_leaves_success_unshaped(shaping):
    env = make_env("crafting", shaping=shaping, shaping_scale=0.2)
    plain = make_env("crafting")
    tasks = env.eval_tasks("test", 12)
    rng = random.Random(1)
    for trial in range(3):
        env.reset(tasks)
        plain.reset(tasks)
        demos = env.demonstrations(tasks)
        turn = 0
        while not env.done.all():
            texts = []
            for i, d in enumerate(demos):
                texts.append(d[turn][1] if turn < len(d) and rng.random() < 0.7 + 0.15 * trial else rng.choice(["junk", d[0][1]]))
            a, b = env.step(texts), plain.step(texts)
            assert (a.success == b.success).all()
            turn += 1
        for log, base in zip(env.episode_logs(), plain.episode_logs()):
            extra = log["return"] - base["return"]
            # Phi = 0 at the end, so the shaping sums to -Phi(s_0): 0 for first_craft, +scale for distance
            expected = 0.2 if shaping == "distance" else 0.0
            assert extra == pytest.approx(expected, abs=1e-9)
            if shaping == "first_craft" and log["success"]:
                needed = len(goal_tree(log["task"]) & set(log["task"]["recipes"])) - 1
                last = log["turns"][-1]
                assert last["task_reward"] == 1.0 and last["reward"] == pytest.approx(1.0 - 0.2 * (needed > 0))


def test_first_craft_bonus_is_paid_on_the_first_craft_of_a_needed_intermediate():
    env, world = small_env_and_world(shaping="first_craft", shaping_scale=0.5)
    env.reset([world])
    assert env.step(["get axe 2"]).rewards[0] == 0
    assert env.step(["craft plank"]).rewards[0] == pytest.approx(0.5)
    assert env.step(["craft plank"]).rewards[0] == 0
    env.step(["get clay 1"])
    final = env.step(["craft pot"])  # the terminal step pays the collected bonus back (Phi = 0 at the end)
    assert final.success[0] and final.rewards[0] == pytest.approx(1.0 - 0.5)


def test_distance_shaping_rewards_each_planner_step_and_penalises_wasted_ones():
    env, world = small_env_and_world(shaping="distance", shaping_scale=0.5)
    env.reset([world])  # 5 planner steps: each one that shortens the plan earns 0.5 / 5
    assert env.step(["get axe 2"]).rewards[0] == pytest.approx(0.1)
    assert env.step(["get clay 5"]).rewards[0] == pytest.approx(0.1)
    assert env.step(["nonsense"]).rewards[0] == pytest.approx(0.0)
    assert env.step(["craft plank"]).rewards[0] == pytest.approx(0.1)


def test_bad_worlds_and_options_raise_clear_errors():
    env, world = small_env_and_world()
    cases = [
        ({"base": ["axe", "clay", "dragon"]}, "unknown item name 'dragon'"),
        ({"recipes": {**world["recipes"], "pot": {"yield": 1, "needs": {"sword": 1}}}}, "unknown item 'sword'"),
        ({"recipes": {**world["recipes"], "pot": {"yield": 1, "needs": {"plank": 0}}}}, "count of 'plank'"),
        ({"recipes": {**world["recipes"], "pot": {"yield": 0, "needs": {"plank": 1}}}}, "yield"),
        ({"recipes": {"plank": {"yield": 1, "needs": {"pot": 1}}, "pot": {"yield": 1, "needs": {"plank": 1}}}}, "cycle"),
        ({"goal": "axe"}, "goal 'axe' must be a craftable"),
        ({"budget": 3}, "shorter than the optimal plan"),
        ({"budget": 500}, "max_turns"),
        ({"base": ["axe", "clay", "plank"]}, "base items cannot have recipes"),
        ({"recipes": {**world["recipes"], "pot": {"yield": 1, "needs": {"plank": 99}}}}, "more than 99"),
    ]
    for change, message in cases:
        bad = {**copy.deepcopy(world), **change}
        with pytest.raises(ValueError, match=message):
            env.reset([bad])
    with pytest.raises(ValueError, match="missing keys"):
        env.reset([{"goal": "pot"}])
    with pytest.raises(ValueError, match="level"):
        generate_world(0, 9)
    # a depth-3 goal needs at least 3 crafts and a get: no world fits a 2-step plan
    with pytest.raises(ValueError, match="no world"):
        generate_world(0, 3, spec=Level(depth=3, distractors=1, max_count=1, max_ingredients=1, max_yield=1, max_plan=2, slack=0))
    with pytest.raises(ValueError, match="spec.max_ingredients"):
        generate_world(0, 1, spec=Level(depth=1, distractors=1, max_count=1, max_ingredients=4, max_yield=1, max_plan=4, slack=0))
    custom = generate_world(0, 1, spec=Level(depth=2, distractors=0, max_count=1, max_ingredients=1, max_yield=1, max_plan=9, slack=1))
    assert item_depths(custom)[custom["goal"]] == 2 and custom["budget"] == optimal_steps(custom) + 1
    with pytest.raises(ValueError, match="train_levels"):
        make_env("crafting", train_levels=[0])
    with pytest.raises(ValueError, match="plan"):
        make_env("crafting", plan="fastest")
    with pytest.raises(ValueError, match="deeper_level"):
        make_env("crafting", train_levels=[2, 3], deeper_level=3)
    top = make_env("crafting", train_levels=[3, 4])
    assert top.splits == ("test", "held_out_goals")
    with pytest.raises(ValueError, match="split"):
        top.eval_tasks("deeper")
    with pytest.raises(ValueError, match="shaping"):
        make_env("crafting", shaping="bonus")
    with pytest.raises(ValueError, match="max_get"):
        make_env("crafting", max_get=0)
    for bad in ([1, 2], [1, -1, 1], [0, 0, 0], "123", [1, float("nan"), 1], ["a", 1, 1], 3):
        with pytest.raises(ValueError, match=r"level_weights must give one weight >= 0 per training level \[1, 2, 3\]"):
            make_env("crafting", level_weights=bad)


def test_level_weights_shape_the_training_draw_and_leave_evaluation_alone():
    counts = lambda tasks: np.bincount([t["level"] for t in tasks], minlength=4)[1:]  # noqa: E731
    uniform, weighted = make_env("crafting"), make_env("crafting", level_weights=[1, 2, 5])
    got = counts(weighted.sample_tasks(0, 4000))
    assert np.allclose(got / 4000, [1 / 8, 2 / 8, 5 / 8], atol=0.03), got
    assert np.allclose(counts(uniform.sample_tasks(0, 4000)) / 4000, 1 / 3, atol=0.03)
    assert counts(make_env("crafting", level_weights=[0, 0, 1]).sample_tasks(1, 50)).tolist() == [0, 0, 50]
    assert weighted.eval_tasks("test") == uniform.eval_tasks("test")
    assert weighted.sample_tasks(3, 5, split="deeper") == uniform.sample_tasks(3, 5, split="deeper")


def test_train_distractors_change_training_worlds_only():
    def distractors(world):
        return [x for x in world["shown"] if x not in goal_tree(world)]

    plain, more = make_env("crafting"), make_env("crafting", train_distractors=4)
    drawn = more.sample_tasks(0, 60)
    assert all(len(distractors(w)) == 4 for w in drawn)
    assert sorted({len(distractors(w)) for w in plain.sample_tasks(0, 60)}) == [1, 2]  # the levels' own
    for split in plain.splits:
        assert more.eval_tasks(split) == plain.eval_tasks(split)
    assert all(not distractors(w) for w in make_env("crafting", train_distractors=0).sample_tasks(1, 20))
    with pytest.raises(ValueError, match="train_distractors"):
        make_env("crafting", train_distractors=-1)


def test_action_mask_lists_exactly_the_executable_actions():
    assert make_env("crafting").allowed_actions() is None
    env, world = small_env_and_world(mask_actions=True, max_get=2)
    env.reset([world])
    assert env.allowed_actions()[0] == {"get axe 1", "get axe 2", "get clay 1", "get clay 2"}
    env.step(["get axe 1"])
    assert "craft plank" in env.allowed_actions()[0] and "craft pot" not in env.allowed_actions()[0]


def test_vocabulary_covers_all_text_and_actions_fit_max_action_words():
    env = make_env("crafting")
    vocab = set(env.vocabulary())
    tasks = env.eval_tasks("deeper", 10) + env.eval_tasks("held_out_goals", 10)
    words = set()
    for demo in env.demonstrations(tasks):
        for obs, action in demo:
            words |= set(obs.split()) | set(action.split())
            assert len(action.split()) <= env.max_action_words
    assert words <= vocab


def test_random_play_logs_replay_exactly():
    env = make_env("crafting", shaping="distance")
    tasks = env.sample_tasks(3, 24)
    env.reset(tasks)
    rng = random.Random(3)
    while not env.done.all():
        texts = []
        for task in tasks:
            texts.append(
                rng.choice(
                    [
                        f"get {rng.choice(task['base'])} {rng.randint(0, 9)}",
                        f"craft {rng.choice(list(task['recipes']))}",
                        "Craft  " + task["goal"].upper(),
                        "nonsense words",
                    ]
                )
            )
        env.step(texts)
    for log in json.loads(json.dumps(env.episode_logs())):
        assert json.loads(json.dumps(replay(log))) == log


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_full_stack_plans_are_fetch_first_plans_with_every_get_a_full_stack(level):
    env = make_env("crafting", plan="fetch_full")
    tasks = [generate_world(seed, level) for seed in range(60)]
    assert env.optimal_success(tasks) == 1.0  # executed by the environment, which checks every action itself
    for task, demo in zip(tasks, env.demonstrations(tasks)):
        full, exact = [a for _, a in demo], shortest_plan(task)
        assert len(full) == len(exact) == optimal_steps(task)
        for a, b in zip(full, exact):  # same actions in the same order; only get counts differ
            assert a.split()[:2] == b.split()[:2]
            assert a == b or (a.startswith("get") and int(a.split()[2]) == 8 > int(b.split()[2]))
    assert any(shortest_plan(t, full_stacks=True) != shortest_plan(t) for t in tasks)


@pytest.mark.parametrize("level", [2, 3, 4])
def test_the_listed_plan_crafts_items_of_equal_depth_in_the_order_the_prompt_lists_their_recipes(level):
    env = make_env("crafting", plan="fetch_full_listed", train_levels=[level])
    tasks = [generate_world(seed, level) for seed in range(60)]
    assert env.optimal_success(tasks) == 1.0
    reordered = 0
    for task, demo in zip(tasks, env.demonstrations(tasks)):
        listed, named = [a for _, a in demo], shortest_plan(task, full_stacks=True)
        assert sorted(listed) == sorted(named)  # the same actions: only the order of equal-depth crafts differs
        depths, shown = item_depths(task, [task["goal"]]), task["shown"]
        crafted = list(dict.fromkeys(a.split()[1] for a in listed if a.startswith("craft")))
        assert [(depths[x], shown.index(x)) for x in crafted] == sorted((depths[x], shown.index(x)) for x in crafted)
        reordered += listed != named
    assert reordered  # on some worlds the prompt's order is not the alphabetical one
    with pytest.raises(ValueError, match=r"ties must be one of \['name', 'listed'\], got 'shown'"):
        shortest_plan(tasks[0], ties="shown")


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_the_ready_first_plan_crafts_the_first_listed_recipe_still_needed_whose_ingredients_are_held(level):
    env = make_env("crafting", plan="ready_first", train_levels=[level])
    tasks = [generate_world(seed, level) for seed in range(60)]
    assert env.optimal_success(tasks) == 1.0
    reordered = 0
    for task, demo in zip(tasks, env.demonstrations(tasks)):
        ready, deep = [a for _, a in demo], shortest_plan(task, full_stacks=True)
        assert sorted(ready) == sorted(deep) and len(ready) == optimal_steps(task)
        crafts = [a for a in ready if a.startswith("craft")]
        assert ready[: len(ready) - len(crafts)] == deep[: len(deep) - len(crafts)]  # the same gets, first
        inv, left = {}, collections.Counter(a.split()[1] for a in crafts)
        for a in ready[: len(ready) - len(crafts)]:
            inv = apply_action(task, inv, a)
        for a in crafts:  # no recipe listed before the one crafted was both still needed and ready
            item = a.split()[1]
            for x in task["shown"][: task["shown"].index(item)]:
                assert not left[x] or any(inv.get(y, 0) < n for y, n in task["recipes"][x]["needs"].items())
            inv, left[item] = apply_action(task, inv, a), left[item] - 1
        reordered += ready != deep
    assert reordered or level == 1  # on deeper worlds a ready craft is often listed before a shallower one


@pytest.mark.parametrize("plan", ["shuffled", "ready_first"])
def test_the_shuffled_plan_breaks_every_tie_at_random_once_per_world(plan):
    env = make_env("crafting", plan=plan, train_levels=[3])
    tasks = [generate_world(seed, 3) for seed in range(200)]
    assert env.optimal_success(tasks) == 1.0
    first_get_rank, first_craft_rank = collections.Counter(), collections.Counter()
    for task, demo in zip(tasks, env.demonstrations(tasks)):
        actions = [a for _, a in demo]
        assert actions == env.planner_plan(dict(task)) and len(actions) == optimal_steps(task)  # fixed per world
        assert sorted(actions) == sorted(shortest_plan(task, full_stacks=True))
        inv = {}
        for a in actions:  # every craft is ready when it is made
            if a.startswith("craft"):
                assert all(inv.get(y, 0) >= n for y, n in task["recipes"][a.split()[1]]["needs"].items())
            inv = apply_action(task, inv, a)
        gets = sorted({a.split()[1] for a in actions if a.startswith("get")})
        first_get_rank[gets.index(actions[0].split()[1])] += 1
        inv = {}
        for a in actions:
            if a.startswith("craft"):  # the first craft, among the crafts ready then, in the prompt's order
                ready = [x for x in task["shown"] if x in {c.split()[1] for c in actions if c.startswith("craft")}
                         and all(inv.get(y, 0) >= n for y, n in task["recipes"][x]["needs"].items())]
                first_craft_rank[ready.index(a.split()[1])] += 1
                break
            inv = apply_action(task, inv, a)
    # ready_first takes the alphabetically first get and the first listed ready craft, always; the shuffled plan
    # takes each of the first three ranks on at least a tenth of the worlds
    if plan == "ready_first":
        assert set(first_get_rank) == set(first_craft_rank) == {0}
    else:
        assert all(first_get_rank[r] >= 20 for r in range(3)), first_get_rank
        assert first_craft_rank[0] < 180 and first_craft_rank[1] >= 20, first_craft_rank


def test_full_stacks_stop_at_the_stack_limit():
    world = {"goal": "axe", "base": ["anvil"], "recipes": {"axe": {"yield": 1, "needs": {"anvil": 99}}},
             "shown": ["axe"], "budget": 99}
    assert shortest_plan(world, {"anvil": 95}, full_stacks=True) == ["get anvil 4", "craft axe"]
    assert shortest_plan(world, {"anvil": 85}, full_stacks=True) == ["get anvil 8", "get anvil 6", "craft axe"]
    assert shortest_plan(world, {"anvil": 85}) == ["get anvil 8", "get anvil 6", "craft axe"]


def test_item_names_are_unique_single_words_distinct_from_protocol_words():
    from agent_lab.envs.crafting import _KEYWORDS

    assert len(set(ITEM_NAMES)) == len(ITEM_NAMES) >= 60 + len(HELD_OUT_GOALS)
    assert not set(ITEM_NAMES) & set(_KEYWORDS)
    assert all(name.isalpha() and name.islower() for name in ITEM_NAMES)


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_recovery_demonstrations_slip_once_then_follow_the_planner_to_success(plan):
    env = make_env("crafting", plan=plan)
    tasks = env.sample_tasks(3, 30)
    demos, trained = env.recovery_demonstrations(tasks, 0, slip_prob=1.0)
    plain = env.demonstrations(tasks)
    slipped = 0
    for task, demo, keep, ref in zip(tasks, demos, trained, plain):
        assert len(keep) == len(demo) and len(demo) <= task["budget"]
        if all(keep):  # no room to recover: the plain plan is kept
            assert demo == ref
            continue
        slipped += 1
        at = keep.index(False)
        assert keep.count(False) == 1 and demo[:at] == ref[:at] and demo[at][1] != ref[at][1]
        twin = make_env("crafting")
        twin.reset([task])
        for _, a in demo[: at + 1]:
            twin.step([a])
        # after the slip every action is the planner's shortest plan from the state the slip left ...
        assert [a for _, a in demo[at + 1 :]] == PLANS[plan](task, twin._states[0].inventory, env.max_get)
        for _, a in demo[at + 1 :]:
            twin.step([a])
        assert bool(twin.step([""]).success[0])  # ... and the whole transcript, slip included, solves the task
    assert slipped >= 20
    assert env.recovery_demonstrations(tasks, 0, slip_prob=0.0) == (plain, [[True] * len(d) for d in plain])
    with pytest.raises(ValueError, match="slip_prob must lie in"):
        env.recovery_demonstrations(tasks, 0, slip_prob=2.0)


def test_demonstration_batch_keeps_slips_in_the_transcript_but_out_of_the_action_mask():
    from agent_lab.policy import WordTokenizer
    from agent_lab.rollout import demonstration_batch

    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    tasks = env.sample_tasks(4, 12)
    demos, trained = env.recovery_demonstrations(tasks, np.random.default_rng(5), 1.0)
    batch = demonstration_batch(env, tok, tasks, demos=demos, trained=trained)
    assert bool(batch.success.all())
    for i, (demo, keep) in enumerate(zip(demos, trained)):
        imitated = [t for (_, a), k in zip(demo, keep) if k for t in tok.encode(a) + [tok.nl_id]]
        assert batch.input_ids[i, 1:][batch.action_mask[i]].tolist() == imitated
        for _, a in demo:  # the slip is still in the transcript the policy reads
            assert a in batch.texts[i].replace("<nl>", "\n")



def test_the_observation_loss_predicts_the_environment_text_of_a_recovery_demonstration_not_its_slip(tmp_path):
    from agent_lab.trainer import TrainConfig, train
    from agent_lab.plugins.losses import environment_targets
    from agent_lab.policy import WordTokenizer
    from agent_lab.rollout import demonstration_batch

    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    tasks = env.sample_tasks(4, 12)
    demos, trained = env.recovery_demonstrations(tasks, np.random.default_rng(5), 1.0)
    assert not all(all(k) for k in trained), "need at least one slip"
    batch = demonstration_batch(env, tok, tasks, demos=demos, trained=trained)
    env_targets = environment_targets(batch)
    targets = batch.input_ids[:, 1:]
    for i, (demo, keep) in enumerate(zip(demos, trained)):
        # the environment's text, token for token: the prompt and every observation, each with its newline
        text = [t for obs, _ in demo for t in tok.encode(obs) + [tok.nl_id]]
        assert targets[i][env_targets[i]].tolist() == text
        for t, k in enumerate(keep):  # an action, imitated or not, is the policy's text of its turn
            action = tok.encode(demo[t][1]) + [tok.nl_id]
            assert targets[i][batch.turn_ids[i] == t].tolist() == action
            assert bool(batch.action_mask[i][batch.turn_ids[i] == t].all()) == k
    # and a run may combine the two
    cfg = TrainConfig(env="crafting", algo="sft", steps=1, batch_size=4, group_size=1, sft_slip_prob=1.0,
                      sft_observation_weight=1.0, d_model=16, n_layers=1, n_heads=2)
    assert "observation_nll" in train(cfg, run_dir=str(tmp_path), progress=False).history[0]


@pytest.mark.parametrize("reread", [1, 2])
def test_the_copy_loss_predicts_exactly_the_prompt_copies_after_the_first(reread, tmp_path):
    from agent_lab.plugins.losses import reread_targets
    from agent_lab.policy import WordTokenizer
    from agent_lab.rollout import demonstration_batch
    from agent_lab.trainer import TrainConfig, train

    env = make_env("crafting", reread=reread)
    tok = WordTokenizer.from_env(env)
    tasks = env.sample_tasks(6, 10)
    batch = demonstration_batch(env, tok, tasks)
    copy = reread_targets(batch, 1 + reread)
    shown_once = make_env("crafting")
    for i, task in enumerate(tasks):
        once = tok.encode(shown_once._prompt(shown_once._new_state(task)))
        # the re-read copies, each closed by its newline (the last by the one before the first action)
        assert batch.input_ids[i, 1:][copy[i]].tolist() == (once + [tok.nl_id]) * reread
        first = int(copy[i].nonzero()[0])  # column j predicts token j + 1: the second copy's first word
        assert first + 1 == 1 + len(once) + 1 and tok.vocab[int(batch.input_ids[i, first + 1])] == "goal"
    cfg = dict(env="crafting", algo="sft", steps=1, batch_size=4, group_size=1, sft_copy_weight=1.0, d_model=16,
               n_layers=1, n_heads=2, max_len=512)
    row = train(TrainConfig(**cfg, env_options={"reread": reread}), run_dir=str(tmp_path / "r"),
                progress=False).history[0]
    assert row["copy_nll"] > 0
    with pytest.raises(ValueError, match="shows its prompt once"):
        train(TrainConfig(**cfg), run_dir=str(tmp_path / "once"), progress=False)
    with pytest.raises(ValueError, match="needs a causal prompt"):
        train(TrainConfig(**cfg, env_options={"reread": reread}, prompt_attention="bidirectional"),
              run_dir=str(tmp_path / "both"), progress=False)


def _replay(task, actions):
    twin = make_env("crafting")
    twin.reset([task])
    for a in actions:
        twin.step([a])
    return twin


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_branched_demonstrations_replay_the_policy_then_follow_the_planner_to_success(plan):
    env = make_env("crafting", plan=plan)
    tasks = env.sample_tasks(5, 40)
    plain = env.demonstrations(tasks)
    # a policy that wastes its first step on a listed base item, then plays the plan: every prefix of its
    # episode is a state the planner can finish from (the budget has slack), none of them on the plan's path
    episodes = [[f"get {t['base'][0]} 1"] + [a for _, a in d] for t, d in zip(tasks, plain)]
    demos, trained = env.branched_demonstrations(tasks, episodes, np.random.default_rng(0))
    turns = []
    for task, episode, demo, keep in zip(tasks, episodes, demos, trained):
        at = keep.index(True)  # the policy's actions come first and are not imitated, the planner's all are
        turns.append(at)
        assert keep == [False] * at + [True] * (len(demo) - at) and len(demo) <= task["budget"]
        assert [a for _, a in demo[:at]] == episode[:at]
        if at:  # the planner's shortest plan from the state the policy's actions left
            inventory = dict(_replay(task, episode[:at])._states[0].inventory)
            assert [a for _, a in demo[at:]] == env.planner_plan(task, inventory)
        else:
            assert demo == env.demonstrations([task])[0]
        assert bool(_replay(task, [a for _, a in demo])._success[0]), "the branched transcript must solve the task"
    assert len(set(turns)) >= 4, f"the branch turn must be drawn, got {turns}"
    # the policy's own episode, if it is the plan, gives the plain demonstration wherever it branches
    assert env.branched_demonstrations(tasks, [[a for _, a in d] for d in plain], 1)[0] == plain


def test_branched_demonstrations_step_back_to_a_state_the_planner_can_finish_from():
    env = make_env("crafting")
    task = env.sample_tasks(2, 1)[0]
    waste = [f"get {task['base'][0]} 1"] * task["budget"]  # uses up every step: only an early branch can recover
    demos, trained = env.branched_demonstrations([task] * 30, [waste] * 30, np.random.default_rng(3))
    slack = task["budget"] - env.optimal_steps(task)
    for demo, keep in zip(demos, trained):
        at = keep.index(True)
        assert at <= slack and bool(_replay(task, [a for _, a in demo])._success[0])
    assert max(keep.index(True) for keep in trained) == slack, "the latest turn that can still finish is kept"
    with pytest.raises(ValueError, match="one episode per task"):
        env.branched_demonstrations([task], [], 0)
    with pytest.raises(ValueError, match="list of action texts"):
        env.branched_demonstrations([task], ["get oak 1"], 0)


def test_demonstration_batch_keeps_the_policy_actions_in_the_transcript_but_out_of_the_action_mask():
    from agent_lab.policy import WordTokenizer
    from agent_lab.rollout import demonstration_batch

    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    tasks = env.sample_tasks(6, 8)
    episodes = [[f"craft {t['goal']}", f"get {t['base'][-1]} 2"] for t in tasks]  # a policy's wrong first moves
    acts = [e if k % 2 else None for k, e in enumerate(episodes)]  # every other task branches from its episode
    branched, keeps = env.branched_demonstrations(tasks[1::2], episodes[1::2], np.random.default_rng(1))
    plain = env.demonstrations(tasks)
    demos = [branched[i // 2] if a is not None else plain[i] for i, a in enumerate(acts)]
    trained = [keeps[i // 2] if a is not None else [True] * len(plain[i]) for i, a in enumerate(acts)]
    batch = demonstration_batch(env, tok, tasks, demos=demos, trained=trained)
    assert bool(batch.success.all())
    for i in range(len(tasks)):
        demo, keep = (branched[i // 2], keeps[i // 2]) if i % 2 else (plain[i], [True] * len(plain[i]))
        imitated = [t for (_, a), k in zip(demo, keep) if k for t in tok.encode(a) + [tok.nl_id]]
        assert batch.input_ids[i, 1:][batch.action_mask[i]].tolist() == imitated
        for _, a in demo:  # the policy's actions are still in the transcript the policy reads
            assert a in batch.texts[i].replace("<nl>", "\n")
    assert any(not all(k) for k in keeps), "some branches keep policy actions"
    with pytest.raises(ValueError, match="one entry per task"):
        demonstration_batch(env, tok, tasks, demos=demos[:2], trained=trained[:2])


def test_reread_shows_the_prompt_twice_and_changes_nothing_else():
    plain, twice = make_env("crafting", plan="fetch_full"), make_env("crafting", plan="fetch_full", reread=True)
    tasks = plain.sample_tasks(7, 12)
    d1, d2 = plain.demonstrations(tasks), twice.demonstrations(tasks)
    for a, b in zip(d1, d2):
        assert b[0][0] == a[0][0] + "\n" + a[0][0]  # the prompt, then the same prompt again
        assert b[1:] == a[1:]  # the same plan and the same observations after it
    assert twice.optimal_success(tasks) == 1.0
    thrice = make_env("crafting", plan="fetch_full", reread=2)
    for a, c in zip(d1, thrice.demonstrations(tasks)):
        assert c[0][0] == "\n".join([a[0][0]] * 3) and c[1:] == a[1:]
    assert make_env("crafting", reread=1)._prompt(twice._new_state(tasks[0])) == d2[0][0][0]  # 1 is True
    for bad in ("yes", 4, -1, 1.0):
        with pytest.raises(ValueError, match="reread"):
            make_env("crafting", reread=bad)


def test_tagged_ingredients_name_the_line_item_before_each_ingredient_and_change_nothing_else():
    plain = make_env("crafting", plan="fetch_full")
    tagged = make_env("crafting", plan="fetch_full", tag_ingredients=True)
    tasks = plain.sample_tasks(3, 12)
    for task, a, b in zip(tasks, plain.demonstrations(tasks), tagged.demonstrations(tasks)):
        lines = {line.split()[0]: line for line in b[0][0].splitlines()[2:-2]}
        assert set(lines) == set(task["shown"])
        for item, line in lines.items():
            needs = task["recipes"][item]["needs"]
            want = f"{item} {task['recipes'][item]['yield']} = " + " ".join(f"{item} {y} {n}" for y, n in needs.items())
            assert line == want
        assert [x.split()[0] for x in b[0][0].splitlines()] == [x.split()[0] for x in a[0][0].splitlines()]
        assert b[1:] == a[1:]  # the same plan and the same observations after the prompt
    assert tagged.optimal_success(tasks) == 1.0 and tagged.vocabulary() == plain.vocabulary()
    with pytest.raises(ValueError, match="tag_ingredients"):
        make_env("crafting", tag_ingredients=1)


def test_private_worlds_come_from_seeds_outside_every_named_split():
    from agent_lab.envs.crafting_world import HELD_OUT_GOALS

    env = make_env("crafting", train_levels=[1])
    seeds = [5_000_000 + i for i in range(20)]
    worlds = env.private_worlds(seeds, 1, "held_out")
    assert worlds == env.private_worlds(seeds, 1, "held_out"), "the same seeds give the same worlds"
    assert all(w["level"] == 1 and w["goal"] in HELD_OUT_GOALS for w in worlds)
    seen = env.private_worlds(seeds, 1, "train")
    assert all(w["goal"] not in HELD_OUT_GOALS for w in seen) and seen != worlds
    assert env.optimal_success(worlds) == 1.0
    with pytest.raises(ValueError, match="private world seeds must be ints >= 4000000"):
        env.private_worlds([1_000_003], 1)  # a test-split world
    with pytest.raises(ValueError, match="goals must be one of"):
        env.private_worlds(seeds, 1, "test")


def _mistake_world() -> dict:
    """goal <- 2 mid + 1 b, mid <- 2 a; a distractor <- c, off the goal's tree."""
    a, b, c, mid, goal, other = ITEM_NAMES[:6]
    recipes = {mid: {"yield": 1, "needs": {a: 2}}, goal: {"yield": 1, "needs": {mid: 2, b: 1}},
               other: {"yield": 1, "needs": {c: 1}}}
    return {"goal": goal, "base": [a, b, c], "recipes": recipes, "shown": [other, goal, mid], "budget": 6}


@pytest.mark.parametrize("script, kind", [
    (["get {c} 8", "get {a} 8", "craft x"], MISTAKES["off_tree"]),  # c is only the distractor's
    (["get {a} 8", "craft {other}"], MISTAKES["off_tree"]),  # refused or not, another recipe's item counts first
    (["get {a} 8", "get {b} 8", "craft {goal}"], MISTAKES["order"]),
    (["get {a} 8", "get {b} 8", "craft {mid}", "craft {goal}"], MISTAKES["few_crafted"]),
    (["get {a} 1", "craft {mid}"], MISTAKES["few_fetched"]),
    (["get {b} 8", "craft {goal}"], MISTAKES["order"]),  # short of mid only: b is there
    (["get {mid} 1"], "not a base item"),
    (["get {a} 1"] * 6, MISTAKES["none"]),
    (["think {goal} 1 = {mid} 2 {b} 1 ; {mid} 1 = {a} 2", "get {a} 1"] + ["get {a} 1"] * 5, MISTAKES["none"]),
    (["think {goal} 1 = {mid} 2 {b} 1", "get {a} 8"] + ["get {b} 1"] * 5, MISTAKES["thought"]),  # mid's left out
    (["think {goal} 1 = {mid} 2 {b} 1 ; {mid} 1 = {a} 2 ; {other} 1 = {c} 1", "get {c} 1"] + ["get {a} 1"] * 5,
     MISTAKES["thought"]),  # a recipe off the tree added: it counts before the off-tree get
])
def test_first_mistake_names_where_a_failed_episode_first_left_the_goals_plans(script, kind):
    world = _mistake_world()
    names = dict(zip(["a", "b", "c", "mid", "goal", "other"], ITEM_NAMES))
    env = make_env("crafting", train_levels=[2], think=any(s.startswith("think") for s in script))
    env.reset([world])
    for text in script:
        if env.step([text.format(**names)]).done[0]:
            break
    log = env.episode_logs()[0]
    assert not log["success"]
    assert first_mistake(log) == kind



def test_the_needed_items_loss_labels_every_item_mention_in_the_prompt_by_the_goal_tree(tmp_path):
    from agent_lab.envs.crafting_world import goal_tree
    from agent_lab.plugins.losses import needed_labels
    from agent_lab.policy import WordTokenizer
    from agent_lab.rollout import demonstration_batch
    from agent_lab.trainer import TrainConfig, train

    env = make_env("crafting")
    tok = WordTokenizer.from_env(env)
    tasks = env.sample_tasks(3, 8)
    batch = demonstration_batch(env, tok, tasks)
    where, labels = needed_labels(batch, tok, env.needed_items)
    for i, task in enumerate(tasks):
        prompt = tok.encode(env._prompt(env._new_state(task)))
        start = 1  # after <bos>
        words = [tok.vocab[t] for t in prompt]
        items = set(task["recipes"]) | set(task["base"])
        expected = [w in items for w in words]
        assert where[i, start:start + len(words)].tolist() == expected
        assert not where[i, start + len(words):].any(), "only the prompt is labelled"
        tree = goal_tree(task)
        assert [bool(labels[i, start + j]) for j, w in enumerate(words) if w in items] == \
            [w in tree for w in words if w in items]
        assert any(w in items and w not in tree for w in words), "a distractor line names an unneeded item"
    cfg = TrainConfig(env="crafting", algo="sft", steps=1, batch_size=4, group_size=1, sft_needed_weight=1.0,
                      d_model=16, n_layers=1, n_heads=2, prompt_attention="bidirectional")
    row = train(cfg, run_dir=str(tmp_path), progress=False).history[0]
    assert 0 <= row["needed_accuracy"] <= 1 and row["needed_nll"] > 0
    with pytest.raises(ValueError, match="prompt_attention='bidirectional'"):
        train(TrainConfig(env="crafting", algo="sft", steps=1, batch_size=4, group_size=1, sft_needed_weight=1.0,
                          d_model=16, n_layers=1, n_heads=2), run_dir=str(tmp_path / "c"), progress=False)
