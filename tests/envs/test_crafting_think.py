"""Crafting's ``think`` option: one free thought before the first step, and the demonstrator's thought."""

from __future__ import annotations

import pytest
import torch

from agent_lab.envs import make_env
from agent_lab.envs.base import OPEN_ENDED
from agent_lab.envs.crafting_world import (
    apply_action,
    goal_tree,
    optimal_steps,
    recipe_line,
    thought,
    thought_plan,
    tree_order,
)


def small_world() -> dict:
    # goal pot needs plank (needs axe) and clay; the distractor bowl is shown but not needed
    return {
        "goal": "pot",
        "base": ["axe", "clay"],
        "recipes": {
            "plank": {"yield": 2, "needs": {"axe": 1}},
            "pot": {"yield": 1, "needs": {"plank": 3, "clay": 1}},
            "bowl": {"yield": 1, "needs": {"clay": 2}},
        },
        "shown": ["bowl", "plank", "pot"],
        "budget": 6,
    }


def test_the_thought_copies_the_goal_trees_recipe_lines_depth_first():
    world = small_world()
    assert thought(world) == "think pot 1 = plank 3 clay 1 ; plank 2 = axe 1"
    env = make_env("crafting", think=True)
    for task in env.eval_tasks("deeper", 30) + env.eval_tasks("test", 30):
        lines = thought(task)[len("think "):].split(" ; ")
        heads = [line.split()[0] for line in lines]
        assert heads[0] == task["goal"] and len(set(heads)) == len(heads)
        assert set(heads) == {x for x in goal_tree(task) if x in task["recipes"]}  # the tree's recipes, no distractor
        assert lines == [recipe_line(task, x) for x in heads]
        for i, head in enumerate(heads[1:], 1):  # pre-order: each line's item is named by an earlier line
            assert any(head in line.split()[3:] for line in lines[:i])


def test_a_thought_is_free_once_before_the_first_step_and_invalid_otherwise():
    env = make_env("crafting", think=True)
    world = small_world()
    env.reset([world])
    step = env.step(["think whatever i like 3 4"])
    assert step.info[0]["action"] == ["think"] and step.info[0]["error"] is None
    assert step.observations[0] == "ok\ninventory empty\nsteps 6"  # no step of the budget spent
    step = env.step(["think again"])
    assert step.info[0]["error"] == "think only once, before the first step"
    assert step.observations[0].endswith("steps 5")  # an invalid action spends a step
    env.reset([world])
    env.step(["get axe 2"])
    assert env.step(["think"]).info[0]["error"] == "think only once, before the first step"
    plain = make_env("crafting")
    plain.reset([world])
    assert plain.step(["think pot"]).info[0]["error"] == "expected 'get <item> <n>' or 'craft <item>'"
    assert "think" not in plain.vocabulary() and {"think", ";"} <= set(env.vocabulary())


def test_think_plans_solve_every_split_and_fit_the_action_limits():
    env = make_env("crafting", think=True, plan="fetch_full")
    plain = make_env("crafting", plan="fetch_full")
    vocab = set(env.vocabulary())
    for split in env.splits:
        tasks = env.eval_tasks(split, 30)
        assert env.optimal_success(tasks) == 1.0
        for task, demo, ref in zip(tasks, env.demonstrations(tasks), plain.demonstrations(tasks)):
            assert demo[0][1] == thought(task) and [a for _, a in demo[1:]] == [a for _, a in ref]
            for obs, action in demo:
                assert set(obs.split()) | set(action.split()) <= vocab
                assert len(action.split()) <= env.max_action_words and len(action) <= env.max_action_chars
    assert env.max_turns == plain.max_turns + 1  # the thought's turn
    assert env.max_policy_tokens == (plain.max_turns * 4) + env.max_action_words + 1
    from agent_lab.trainer import max_action_tokens  # Dr.GRPO's constant normaliser follows the declared bound

    assert max_action_tokens(env) == env.max_policy_tokens and max_action_tokens(plain) == plain.max_turns * 4


def test_a_tagged_thought_copies_the_tagged_lines_and_fits_the_action_limits():
    env = make_env("crafting", think=True, plan="fetch_full", tag_ingredients=True, train_levels=[1, 2, 3])
    for task, demo in zip(tasks := env.eval_tasks("test", 30), env.demonstrations(tasks)):
        prompt_lines = set(demo[0][0].splitlines())
        lines = demo[0][1].removeprefix("think ").split(" ; ")
        assert demo[0][1] == thought(task, tagged=True) and set(lines) <= prompt_lines
        assert len(demo[0][1].split()) <= env.max_action_words and len(demo[0][1]) <= env.max_action_chars
    assert env.optimal_success(tasks) == 1.0


def test_recovery_demonstrations_keep_the_thought_and_never_think_twice():
    env = make_env("crafting", think=True)
    tasks = env.sample_tasks(2, 30)
    demos, trained = env.recovery_demonstrations(tasks, 0, slip_prob=1.0)
    assert sum(not all(k) for k in trained) >= 20
    for task, demo, keep in zip(tasks, demos, trained):
        assert demo[0][1] == thought(task) and keep[0]
        assert sum(a.startswith("think") for _, a in demo) == 1
        twin = make_env("crafting", think=True)
        twin.reset([task])
        steps = [twin.step([a]) for _, a in demo]
        assert bool(steps[-1].success[0])


def test_the_candidate_mask_allows_any_words_after_think_only_at_the_start():
    from agent_lab.policy import ModelConfig, TinyTransformer, WordTokenizer
    from agent_lab.rollout import SamplingConfig, collect_rollouts

    env = make_env("crafting", think=True, mask_actions=True)
    env.reset([small_world()])
    assert "think" + OPEN_ENDED in env.allowed_actions()[0]
    env.step(["think"])
    assert not any(a.startswith("think") for a in env.allowed_actions()[0])
    tok = WordTokenizer.from_env(env)
    torch.manual_seed(0)
    model = TinyTransformer(ModelConfig(vocab_size=len(tok), d_model=32, n_layers=1, n_heads=2, max_len=640))
    tasks = env.eval_tasks("test", 48)
    batch = collect_rollouts(model, tok, env, tasks, SamplingConfig(candidate_mask=True), torch.Generator().manual_seed(1))
    firsts = [log["turns"][0] for log in batch.episode_logs]
    thoughts = [t for t in firsts if t["text"].startswith("think")]
    assert 5 <= len(thoughts) < len(firsts)  # think competes with the get/craft candidates
    assert all(t["error"] is None for t in firsts)  # every masked first action executes
    # after "think" the words are free: random weights write item names and numbers the mask would forbid
    assert any(len(t["text"].split()) > 3 for t in thoughts)
    later = [t for log in batch.episode_logs for t in log["turns"][1:]]
    assert later and not any(t["text"].startswith("think") for t in later)
    assert all(t["error"] is None for t in later)


def test_think_rejects_a_non_bool():
    with pytest.raises(ValueError, match="think"):
        make_env("crafting", think="yes")


def shared_world() -> dict:
    # goal gate needs bolt and arm; arm needs bolt too, so depth-first pre-order lists bolt before arm
    return {
        "goal": "gate",
        "base": ["iron"],
        "recipes": {
            "bolt": {"yield": 1, "needs": {"iron": 2}},
            "arm": {"yield": 1, "needs": {"bolt": 1}},
            "gate": {"yield": 1, "needs": {"bolt": 1, "arm": 1}},
        },
        "shown": ["arm", "bolt", "gate"],
        "budget": 6,
    }


def test_parents_first_puts_a_shared_ingredient_after_every_recipe_that_needs_it():
    world = shared_world()
    assert thought(world) == "think gate 1 = bolt 1 arm 1 ; bolt 1 = iron 2 ; arm 1 = bolt 1"  # arm after bolt
    assert thought(world, parents_first=True) == "think gate 1 = bolt 1 arm 1 ; arm 1 = bolt 1 ; bolt 1 = iron 2"
    assert tree_order(world) == ["gate", "arm", "bolt", "iron"]
    assert thought(small_world(), parents_first=True) == thought(small_world())  # no shared ingredient: the same
    env = make_env("crafting", think=True, train_levels=[1, 2, 3])
    for task in env.eval_tasks("test", 100) + env.eval_tasks("deeper", 50):
        order = tree_order(task)
        assert set(order) == goal_tree(task) and order[0] == task["goal"]
        for i, x in enumerate(order):  # every recipe that needs x comes before it
            assert all(order.index(p) < i for p in order if x in task["recipes"].get(p, {"needs": {}})["needs"])


def test_the_thought_following_plan_reads_the_thought_forward_for_gets_and_backward_for_crafts():
    assert thought_plan(small_world()) == ["get clay 8", "get axe 8", "craft plank", "craft plank", "craft pot"]
    assert thought_plan(shared_world()) == ["get iron 8", "craft bolt", "craft bolt", "craft arm", "craft gate"]
    env = make_env("crafting", think=True, plan="follow_thought", train_levels=[1, 2, 3])
    for task in env.eval_tasks("test", 100) + env.eval_tasks("held_out_goals", 50):
        plan = env.planner_plan(task)
        assert plan[0] == thought(task, parents_first=True) and len(plan) - 1 == optimal_steps(task)
        inv: dict[str, int] = {}
        for action in plan[1:]:
            inv = apply_action(task, inv, action)
        assert inv.get(task["goal"], 0) >= 1
        lines = [line.split()[0] for line in plan[0][len("think "):].split(" ; ")]
        crafts = list(dict.fromkeys(a.split()[1] for a in plan[1:] if a.startswith("craft")))
        assert crafts == lines[::-1]  # each needed recipe at least once, in the thought's reverse order
    assert env.optimal_success(env.eval_tasks("test", 60)) == 1.0
