"""replay_prefix: the saved state before a turn of a logged episode, in copies that continue exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent_lab.envs import ReplayMismatch, make_env, replay_prefix


def logged_episodes(name: str, seed: int = 0, **options):
    env = make_env(name, **options)
    tasks = env.sample_tasks(seed, 6)
    env.reset(tasks)
    demos = env.demonstrations(tasks)
    rng = np.random.default_rng(seed)
    t = 0
    while not env.done.all():
        # the planner's action, or now and then another text (a wrong guess, an invalid action)
        texts = [d[t][1] if t < len(d) and rng.random() < 0.7 else str(rng.choice(["guess 3", "oops", "guess 15"]))
                 for d in demos]
        env.step(texts)
        t += 1
    return json.loads(json.dumps(env.episode_logs()))


@pytest.mark.parametrize("name, options", [("number-search", {}), ("crafting", {"train_levels": [2]}),
                                           ("number-search", {"invalid_action": "end_episode"})])
def test_each_copy_continues_exactly_as_the_logged_episode_did(name, options):
    for log in logged_episodes(name, **options):
        for t in range(len(log["turns"])):
            env = replay_prefix(log, t, copies=3)
            assert env.batch_size == 3 and not env.done.any()
            for turn in log["turns"][t:]:
                step = env.step([turn["text"]] * 3)
                assert step.observations == [turn["observation"]] * 3
                assert step.rewards.tolist() == [turn["reward"]] * 3
            assert env.done.all() and env.episode_logs()[0]["turns"] == log["turns"]


def test_copies_of_a_saved_state_take_different_actions_independently():
    log = {**logged_episodes("number-search")[0]}
    env = replay_prefix(log, 0, copies=2)
    target = log["task"]
    other = 1 if target != 1 else 2
    step = env.step([f"guess {target}", f"guess {other}"])
    assert step.observations[0] == "correct" and step.observations[1] in ("higher", "lower")
    assert step.done.tolist() == [True, False]


def test_a_tampered_prefix_an_ended_episode_and_bad_arguments_are_refused():
    log = logged_episodes("number-search")[0]
    tampered = json.loads(json.dumps(log))
    tampered["turns"][0]["observation"] = "nonsense"
    if len(log["turns"]) > 1:
        with pytest.raises(ReplayMismatch, match="turn 1 differs"):
            replay_prefix(tampered, 1)
    replay_prefix(tampered, 0)  # the empty prefix reads no logged turn
    with pytest.raises(ValueError, match="over after"):
        replay_prefix(log, len(log["turns"]))
    with pytest.raises(ValueError, match=r"turns must be in \[0, "):
        replay_prefix(log, len(log["turns"]) + 1)
    with pytest.raises(ValueError, match="copies must be >= 1"):
        replay_prefix(log, 0, copies=0)
    with pytest.raises(ValueError, match="episode_log must be a dict"):
        replay_prefix({"turns": []}, 0)
