"""GiGPO in the trainer: the environments name the state each turn acts in, the algorithm groups a group's turns
by it, and its advantage is the estimator library's (``estimators.anchor_state_advantages``), checked against
states worked out independently of the environment's keys (book/part2/06_credit_assignment.md)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAST, tiny_policy
from exact_batches import number_search_states

from agent_lab.algorithms import AlgoState, anchor_keys, make_algorithm
from agent_lab.envs import make_env, replay
from agent_lab.estimators.advantages import group_centered_advantages
from agent_lab.estimators.credit import anchor_state_advantages, anchor_state_ids
from agent_lab.policy import WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts
from agent_lab.trainer import TrainConfig, train

G = 8


def _states(env, tasks, plays):
    env.reset(tasks)
    for actions in plays:
        env.step(actions)
    return [[t["state"] for t in log["turns"]] for log in env.episode_logs()]


def test_number_search_names_the_interval_and_the_guesses_spent_not_the_way_there():
    env = make_env("number-search")
    a, b, c, d = _states(env, [10] * 4, [["guess 8", "guess 12", "guess 8", "guess 3"],
                                         ["guess 12", "guess 8", "guess 13", "guess 3"],
                                         ["guess 1", "guess 1", "guess 1", "banana"]])
    assert a[0] == b[0] == c[0] == d[0] == "1..16 after 0"
    assert a[2] == b[2] == "9..11 after 2"  # up then down, or down then up: one state
    assert c[2] == "9..12 after 2" and d[2] == "4..16 after 2"
    assert _states(env, [10], [["banana"], ["guess 1"]])[0][1] == "1..16 after 1"  # an invalid action spends a turn


def test_crafting_names_the_inventory_the_crafted_items_and_the_steps_spent():
    env = make_env("crafting")
    world = env.sample_tasks(0, 3)[2]
    first, second, craft = env.planner_plan(world)  # two different items to fetch, then the craft
    one, other = _states(env, [world, world], [[first, second], [second, first], [craft, craft]])
    assert one[2] == other[2] != one[1] != other[1]  # the same inventory in either order
    assert one[0] == "inventory empty; crafted nothing; steps 0"
    assert one[2].endswith("crafted nothing; steps 2")


def test_a_log_written_before_states_were_logged_still_replays():
    env = make_env("number-search")
    env.reset([10])
    for text in ("guess 8", "guess 12", "guess 10"):
        env.step([text])
    log = json.loads(json.dumps(env.episode_logs()[0]))
    for turn in log["turns"]:
        del turn["state"]
    assert replay(log)["turns"][1]["state"] == "9..16 after 1"
    log["turns"][1]["observation"] = "higher"
    with pytest.raises(ValueError, match="turn 2 differs"):
        replay(log)


@pytest.fixture(scope="module")
def batch():
    torch.set_num_threads(1)
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    tasks = [t for t in env.sample_tasks(0, 6) for _ in range(G)]
    b = collect_rollouts(tiny_policy(tok, seed=3), tok, env, tasks, SamplingConfig(candidate_mask=True),
                         torch.Generator().manual_seed(0))
    ids = anchor_state_ids(number_search_states(b.episode_logs, 16), b.rewards.shape[1])
    shared = ids[b.turn_mask][:, None] == ids[b.turn_mask][None, :]
    assert int(shared.sum()) > int(b.turn_mask.sum()), "need turns that share a state for a meaningful check"
    return b, ids


def test_gigpo_advantages_are_the_libraries_on_independently_computed_states(batch):
    b, ids = batch
    for omega in (1.0, 0.5):
        got = make_algorithm("gigpo", group_size=G, max_tokens=1, step_weight=omega).advantages(b, AlgoState())
        torch.testing.assert_close(got, anchor_state_advantages(b.rewards, ids, b.turn_mask, G, step_weight=omega))
    step = got - make_algorithm("gigpo", group_size=G, max_tokens=1, step_weight=0.0).advantages(b, AlgoState())
    assert float(step.abs().max()) > 0, "the step term must act on this batch"


def test_with_no_step_weight_gigpo_is_dr_grpo_on_every_turn(batch):
    b, _ = batch
    got = make_algorithm("gigpo", group_size=G, max_tokens=1, step_weight=0.0).advantages(b, AlgoState())
    want = group_centered_advantages(b.episode_return, G)[:, None] * b.turn_mask
    torch.testing.assert_close(got, want.to(got.dtype))


def test_history_anchors_group_only_turns_after_the_same_texts(batch):
    b, _ = batch
    keys = anchor_keys(b, "history")
    texts = [[t["text"] for t in log["turns"]] for log in b.episode_logs]
    assert all(k == "\n".join(row[:t]) for row, ks in zip(texts, keys) for t, k in enumerate(ks))
    got = make_algorithm("gigpo", group_size=G, max_tokens=1, anchor="history").advantages(b, AlgoState())
    want = anchor_state_advantages(b.rewards, anchor_state_ids(keys, b.rewards.shape[1]), b.turn_mask, G)
    torch.testing.assert_close(got, want)


def test_gigpo_refuses_bad_options_and_a_batch_without_logs(batch):
    b, _ = batch
    for options, message in [({"anchor": "observation"}, "anchor must be one of ('state', 'history')"),
                             ({"step_weight": -1.0}, "step_weight must be a finite number >= 0"),
                             ({"gamma": 0.0}, "gamma must be in (0, 1]")]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
            make_algorithm("gigpo", group_size=G, max_tokens=1, **options)
    empty = b.select(list(range(len(b))))
    empty.episode_logs = []
    with pytest.raises(ValueError, match="need the batch's episode logs"):
        make_algorithm("gigpo", group_size=G, max_tokens=1).advantages(empty, AlgoState())
    old = b.select(list(range(len(b))))
    old.episode_logs = [{**log, "turns": [{k: v for k, v in t.items() if k != "state"} for t in log["turns"]]}
                        for log in b.episode_logs]
    with pytest.raises(ValueError, match="record no 'state' per turn .* use anchor='history'"):
        make_algorithm("gigpo", group_size=G, max_tokens=1).advantages(old, AlgoState())
    make_algorithm("gigpo", group_size=G, max_tokens=1, anchor="history").advantages(old, AlgoState())


def test_gigpo_prints_its_loss_and_trains_from_flat_settings(tmp_path):
    cfg = TrainConfig(**{**FAST, "algo": "gigpo", "step_weight": 0.5, "anchor": "history", "run_dir": str(tmp_path)})
    assert cfg.algorithm.options == {"step_weight": 0.5, "anchor": "history"}
    r = train(cfg, progress=False)
    assert torch.isfinite(torch.tensor(r.history[-1]["loss"]))
    assert 0 <= r.history[-1]["anchor_shared_fraction"] <= 1  # logged every RL step (exact value: the test above)
    desc = (tmp_path / "loss.txt").read_text()
    assert "GiGPO: A_it = (R_i - mean_group R) + 0.5 * (G_it - b_it)" in desc and "same history" in desc
    with pytest.raises(ValueError, match="step_weight=0.5 is an option of algo 'gigpo', not of 'dr_grpo'"):
        TrainConfig(**{**FAST, "algo": "dr_grpo", "step_weight": 0.5})


def test_gigpo_logs_the_share_of_turns_that_share_their_state_with_another_turn_of_their_group(batch):
    b, ids = batch
    real = b.turn_mask
    shared = 0
    for i in range(len(b)):
        group = range(i // G * G, i // G * G + G)
        for t in range(int(real[i].sum())):
            shared += sum(int(ids[j, u] == ids[i, t]) for j in group for u in range(int(real[j].sum()))) >= 2
    stats = make_algorithm("gigpo", group_size=G, max_tokens=1).statistics(b)
    assert stats == {"anchor_shared_fraction": pytest.approx(shared / int(real.sum()), abs=1e-12)}
    assert 0 < shared < int(real.sum())
    assert make_algorithm("dr_grpo", group_size=G, max_tokens=1).statistics(b) == {}
