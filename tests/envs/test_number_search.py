"""Number search: exact values from the DP, reference policies, the text protocol and its rules."""

from __future__ import annotations

import json
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_lab.envs import (
    NumberSearch,
    history_from_log,
    NumberSearchDP,
    make_env,
    median_policy,
    replay,
    sequential_policy,
    uniform_consistent_policy,
)


# ----- independent brute force: sets of targets, every guess 1..n, exact fractions ---------------
def brute_value(n: int, k: int, penalty: Fraction = Fraction(0)) -> Fraction:
    @lru_cache(maxsize=None)
    def v(cands: frozenset, t: int) -> Fraction:
        if t == k or not cands:
            return Fraction(0)
        best = Fraction(0)
        for a in range(1, n + 1):
            total = Fraction(1) - penalty * (t + 1) if a in cands else Fraction(0)
            low = frozenset(c for c in cands if c < a)
            high = frozenset(c for c in cands if c > a)
            q = (total + len(low) * v(low, t + 1) + len(high) * v(high, t + 1)) / len(cands)
            best = max(best, q)
        return best

    return v(frozenset(range(1, n + 1)), 0)


def uniform_policy_success_exact(n: int, k: int) -> Fraction:
    """Success of the uniform-consistent-guess policy by plain enumeration per target."""

    def run(target: int, lo: int, hi: int, t: int) -> Fraction:
        if t == k:
            return Fraction(0)
        total = Fraction(0)
        for a in range(lo, hi + 1):
            if a == target:
                total += 1
            elif a < target:
                total += run(target, a + 1, hi, t + 1)
            else:
                total += run(target, lo, a - 1, t + 1)
        return total / (hi - lo + 1)

    return sum(run(x, 1, n, 0) for x in range(1, n + 1)) / n


def test_optimal_success_on_1_to_16_with_4_guesses_is_15_over_16_not_1():
    # The lecture says binary search always succeeds; a guess must hit, so 4 guesses cover 2^4-1 = 15 targets.
    dp = NumberSearchDP(16, 4)
    assert dp.optimal_value() == pytest.approx(15 / 16, abs=1e-12)
    assert make_env("number-search").optimal_success(list(range(1, 17))) == pytest.approx(15 / 16)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), k=st.integers(1, 4))
def test_dp_value_equals_brute_force_over_target_sets_and_the_2_pow_k_bound(n, k):
    dp = NumberSearchDP(n, k)
    exact = brute_value(n, k)
    assert dp.optimal_value() == pytest.approx(float(exact), abs=1e-12)
    assert exact == Fraction(min(n, 2**k - 1), n)


@pytest.mark.parametrize("n,k", [(5, 2), (7, 3), (9, 3)])
def test_length_reward_values_equal_brute_force(n, k):
    dp = NumberSearchDP(n, k, reward="length", length_penalty=0.05)
    assert dp.optimal_value() == pytest.approx(float(brute_value(n, k, Fraction(1, 20))), abs=1e-12)


def test_reference_policies_exact_success_rates():
    dp = NumberSearchDP(16, 4)
    median = dp.evaluate_policy(median_policy(16))
    assert median.success == pytest.approx(15 / 16)
    # The lower median never finds 16; the upper median never finds 1.
    assert median.per_target_success[15] == 0 and median.per_target_success[:15].min() == 1
    upper = dp.evaluate_policy(median_policy(16, upper=True))
    assert upper.success == pytest.approx(15 / 16) and upper.per_target_success[0] == 0
    assert dp.evaluate_policy(sequential_policy(16)).success == pytest.approx(4 / 16)
    uniform = dp.evaluate_policy(uniform_consistent_policy(16))
    assert uniform.success == pytest.approx(float(uniform_policy_success_exact(16, 4)), abs=1e-12)
    assert 0.5 < uniform.success < 0.6


def test_length_reward_optimum_counts_targets_found_on_each_guess():
    # The optimal tree finds 1 target on guess 1, 2 on guess 2, 4 on guess 3 and 8 on guess 4.
    dp = NumberSearchDP(16, 4, reward="length", length_penalty=0.05)
    expected = (1 * 0.95 + 2 * 0.90 + 4 * 0.85 + 8 * 0.80) / 16
    assert dp.optimal_value() == pytest.approx(expected, abs=1e-12) == pytest.approx(0.784375)
    best = dp.evaluate_policy(dp.optimal_policy())
    assert best.expected_return == pytest.approx(expected) and best.success == pytest.approx(15 / 16)
    assert best.expected_guesses == pytest.approx((1 + 4 + 12 + 32 + 4) / 16)
    assert dp.evaluate_policy(sequential_policy(16)).expected_return == pytest.approx((0.95 + 0.9 + 0.85 + 0.8) / 16)
    env = make_env("number-search", reward="length")
    assert env.optimal_success(env.eval_tasks()) == pytest.approx(15 / 16)


def test_uniform_consistent_guess_succeeds_with_the_exact_fraction():
    assert uniform_policy_success_exact(16, 4) == Fraction(9752459, 16816800)


def test_transcript_example_after_8_higher_12_lower():
    # Candidates {9, 10, 11}, two guesses left: 10 always wins, 9 or 11 wins 2/3; uniform play gets 7/9.
    dp = NumberSearchDP(16, 4)
    env = make_env("number-search")
    env.reset([11])
    env.step(["guess 8"])
    env.step(["guess 12"])
    history = history_from_log(env.episode_logs()[0])
    assert history == ((8, "higher"), (12, "lower"))
    q = dp.q_values(history)
    assert q[10] == pytest.approx(1.0) and q[9] == pytest.approx(2 / 3) and q[11] == pytest.approx(2 / 3)
    assert dp.value(history) == pytest.approx(1.0)
    assert dp.optimal_actions(history) == [10]
    # Guessing outside the candidates wastes a turn: it is worth as much as an invalid action.
    assert q[3] == pytest.approx(q[None])


def test_value_is_max_of_q_over_all_guesses_and_first_guess_8_is_optimal():
    dp = NumberSearchDP(16, 4)
    q = dp.q_values(())
    assert max(q.values()) == pytest.approx(dp.value(()))
    assert 8 in dp.optimal_actions(()) and dp.optimal_action(()) == 8
    # A first guess of 16 loses all but 1 + 7 targets.
    assert q[16] == pytest.approx(8 / 16)


def test_evaluate_policy_accepts_text_actions_and_applies_the_invalid_rule():
    spend = NumberSearchDP(16, 4, invalid_action="spend_turn")
    end = NumberSearchDP(16, 4, invalid_action="end_episode")

    def sloppy(history):
        # half the time a malformed text on the first turn, then the median
        if not history:
            return {"guess 8": 0.5, "gues 8": 0.5}
        return f"guess {median_policy(16)(history)}"

    # After a wasted turn, 3 guesses find 7 of 16 targets.
    assert spend.evaluate_policy(sloppy).success == pytest.approx(0.5 * 15 / 16 + 0.5 * 7 / 16)
    assert end.evaluate_policy(sloppy).success == pytest.approx(0.5 * 15 / 16)


def test_bad_histories_and_arguments_raise_value_errors():
    dp = NumberSearchDP(16, 4)
    with pytest.raises(ValueError, match="inconsistent"):
        dp.value(((8, "higher"), (5, "lower")))
    with pytest.raises(ValueError, match="feedback"):
        dp.value(((8, "warmer"),))
    with pytest.raises(ValueError, match="guesses are spent"):
        dp.q_values(((1, "higher"), (2, "higher"), (3, "higher"), (4, "higher")))
    with pytest.raises(ValueError, match="length_penalty"):
        NumberSearchDP(16, 4, reward="length", length_penalty=0.3)
    with pytest.raises(ValueError, match="sum to 1"):
        dp.evaluate_policy(lambda h: {1: 0.3})
    with pytest.raises(ValueError, match="unknown environment"):
        make_env("chess")
    with pytest.raises(ValueError, match="guesses"):
        make_env("number-search", guesses=0)
    env = make_env("number-search")
    with pytest.raises(ValueError, match="task"):
        env.reset([17])
    with pytest.raises(ValueError, match="before reset"):
        NumberSearch().step(["guess 1"])
    env.reset([3, 4])
    with pytest.raises(ValueError, match="one text per episode"):
        env.step(["guess 1"])


# ----- the text protocol ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,executed",
    [
        ("guess 8", 8),
        ("  Guess   8  ", 8),
        ("GUESS 8\n", 8),
        ("guess\t8", 8),
        ("guess 08", 8),
        ("guess 0", None),
        ("guess 17", None),
        ("guess -3", None),
        ("guess 99999999999999999999", None),
        ("guess eight", None),
        ("guess 8 9", None),
        ("8", None),
        ("", None),
        ("   ", None),
        ("guess ８", None),  # a full-width digit is not an ASCII number
        ("guess 8 " + "x" * 500, None),
        (None, None),
    ],
)
def test_parser_tolerates_spaces_and_capitals_and_rejects_everything_else(text, executed):
    env = make_env("number-search")
    env.reset([8])
    step = env.step([text])
    assert step.info[0]["action"] == executed
    assert step.observations[0] == ("correct" if executed == 8 else "invalid")
    assert (step.info[0]["error"] is None) == (executed is not None)


def test_spend_turn_rule_answers_invalid_and_uses_a_guess():
    env = make_env("number-search", invalid_action="spend_turn")
    env.reset([5])
    for turn in range(3):
        step = env.step(["nonsense"])
        assert step.observations == ["invalid"] and not step.done[0] and step.rewards[0] == 0
    step = env.step(["guess 5"])  # the fourth guess still counts
    assert step.done[0] and step.success[0] and step.rewards[0] == 1.0
    env.reset([5])
    for _ in range(4):
        step = env.step(["nonsense"])
    assert step.done[0] and not step.success[0] and step.info[0]["timeout"] and not step.truncated[0]


def test_end_episode_rule_stops_with_reward_zero_and_only_that_episode():
    env = make_env("number-search", invalid_action="end_episode")
    env.reset([5, 5])
    step = env.step(["guess 99", "guess 3"])
    assert step.observations == ["invalid", "higher"]
    assert list(step.done) == [True, False] and step.rewards[0] == 0
    step = env.step(["guess 5", "guess 5"])  # the finished episode's text is ignored
    assert step.info[0] == {"ignored": True} and step.observations[0] == ""
    assert step.success[1] and not step.success[0]


def test_rewards_binary_and_length_dependent():
    for reward, expected in [("binary", 1.0), ("length", 1 - 0.05 * 3)]:
        env = make_env("number-search", reward=reward)
        env.reset([11])
        for text in ["guess 8", "guess 12"]:
            assert env.step([text]).rewards[0] == 0
        step = env.step(["guess 11"])
        assert step.rewards[0] == pytest.approx(expected) and step.success[0] and step.done[0]


def test_running_out_of_guesses_gives_zero_and_turn_limit_truncates():
    env = make_env("number-search")
    env.reset([16])
    for text in ["guess 1", "guess 2", "guess 3", "guess 4"]:
        step = env.step([text])
    assert step.done[0] and not step.success[0] and step.rewards[0] == 0 and not step.truncated[0]
    env = make_env("number-search", turn_limit=2)
    env.reset([16])
    env.step(["guess 1"])
    step = env.step(["guess 2"])
    assert step.done[0] and step.truncated[0] and not step.info[0]["timeout"]


def test_hidden_number_never_appears_in_prompt_or_observations():
    env = make_env("number-search", n=16)
    for target in range(1, 17):
        prompt = env.reset([target])[0]
        texts = [prompt]
        for demo_obs, action in env.demonstrations([target])[0]:
            step = env.step([action])
            texts.append(step.observations[0])
        # only the fixed words and the range/budget numbers 1, 16 and 4 appear
        words = set(" ".join(texts).split())
        assert words <= {"find", "the", "number", "from", "1", "to", "16", "in", "4", "guesses", "higher", "lower", "correct"}


def test_demonstrations_replay_to_the_planner_success_and_match_observations():
    env = make_env("number-search")
    tasks = env.eval_tasks("test")
    demos = env.demonstrations(tasks)
    prompts = env.reset(tasks)
    for i, demo in enumerate(demos):
        assert demo[0][0] == prompts[i]
    solved = np.zeros(len(tasks), dtype=bool)
    for turn in range(env.max_turns):
        texts = [d[turn][1] if turn < len(d) else "" for d in demos]
        step = env.step(texts)
        for i, d in enumerate(demos):
            if turn + 1 < len(d):
                assert d[turn + 1][0] == step.observations[i]  # observation before the next action
        solved |= step.success
    assert solved.mean() == pytest.approx(env.optimal_success(tasks)) == pytest.approx(15 / 16)


def test_action_mask_is_the_candidate_interval_and_off_by_default():
    assert make_env("number-search").allowed_actions() is None
    env = make_env("number-search", mask_actions=True)
    env.reset([11, 2])
    assert env.allowed_actions()[0] == frozenset(f"guess {a}" for a in range(1, 17))
    env.step(["guess 8", "guess 2"])
    allowed = env.allowed_actions()
    assert allowed[0] == frozenset(f"guess {a}" for a in range(9, 17)) and allowed[1] == frozenset()


def test_vocabulary_covers_every_prompt_observation_and_valid_action():
    env = make_env("number-search", n=20, guesses=5)
    vocab = set(env.vocabulary())
    texts = [env.reset([7])[0]] + ["higher", "lower", "correct", "invalid"]
    texts += [f"guess {a}" for a in range(1, 21)]
    assert {w for t in texts for w in t.split()} <= vocab
    assert max(len(f"guess {a}".split()) for a in range(1, 21)) == env.max_action_words


def test_non_string_actions_are_invalid_and_replay():
    env = make_env("number-search")
    env.reset([4, 4])
    step = env.step([None, 8])
    assert [i["error"] for i in step.info] == ["not a string", "not a string"]
    for log in json.loads(json.dumps(env.episode_logs())):
        assert log["turns"][0]["text"] is None and replay(log)["turns"] == log["turns"]


def test_single_guess_prompt_is_in_the_vocabulary():
    env = make_env("number-search", n=3, guesses=1)
    assert env.reset([2]) == ["find the number from 1 to 3 in 1 guess"]
    assert set(env.reset([2])[0].split()) <= set(env.vocabulary())


def test_sample_tasks_are_reproducible_by_seed_and_json_serialisable():
    env = make_env("number-search")
    a, b = env.sample_tasks(3, 50), env.sample_tasks(np.random.default_rng(3), 50)
    assert a == b and json.loads(json.dumps(a)) == a
    assert a != env.sample_tasks(4, 50)
    assert set(a) <= set(range(1, 17))
    assert env.eval_tasks("test") == list(range(1, 17))
    with pytest.raises(ValueError, match="split"):
        env.eval_tasks("valid")


def test_episode_logs_round_trip_json_and_replay_exactly_and_detect_tampering():
    env = make_env("number-search", invalid_action="spend_turn", reward="length")
    assert env.episode_logs() == []  # no batch yet: no logs, not an error
    rng = np.random.default_rng(0)
    tasks = env.sample_tasks(rng, 32)
    env.reset(tasks)
    while not env.done.all():
        env.step([rng.choice(["guess 8", f"guess {rng.integers(0, 18)}", "oops", " GUESS 4 "]) for _ in tasks])
    logs = json.loads(json.dumps(env.episode_logs()))
    for log in logs:
        assert replay(log)["turns"] == log["turns"]
    tampered = json.loads(json.dumps(logs[0]))
    tampered["turns"][0]["observation"] = "correct" if tampered["turns"][0]["observation"] != "correct" else "lower"
    with pytest.raises(ValueError, match="differs"):
        replay(tampered)


def test_batch_step_matches_one_episode_at_a_time():
    texts = ["guess 8", "guess 4", "bad", "guess 12"]
    batch = make_env("number-search")
    batch.reset([3, 9, 16])
    single = [make_env("number-search") for _ in range(3)]
    for env, t in zip(single, [3, 9, 16]):
        env.reset([t])
    for turn in range(4):
        row = [texts[(turn + i) % 4] for i in range(3)]
        out = batch.step(row)
        for i, env in enumerate(single):
            if env.done[0]:
                continue
            one = env.step([row[i]])
            assert one.observations[0] == out.observations[i] and one.rewards[0] == out.rewards[i]
    assert batch.episode_logs() == [e.episode_logs()[0] for e in single]


def play_in_env(policy, env_options=None, n=16, k=4):
    """Play a deterministic history -> action policy on every target in the environment."""
    env = make_env("number-search", n=n, guesses=k, **(env_options or {}))
    targets = list(range(1, n + 1))
    env.reset(targets)
    histories = [() for _ in targets]
    returns = np.zeros(n)
    while not env.done.all():
        actions = [policy(h) for h in histories]
        texts = [a if isinstance(a, str) else f"guess {a}" for a in actions]
        step = env.step(texts)
        for i, info in enumerate(step.info):
            if info.get("ignored"):
                continue
            histories[i] = histories[i] + ((info["action"], step.observations[i]),)
            returns[i] += step.rewards[i]
    return env.episode_logs(), returns


@settings(max_examples=30, deadline=None)
@given(table=st.lists(st.integers(0, 20), min_size=64, max_size=64), reward=st.sampled_from(["binary", "length"]))
def test_environment_play_matches_the_dp_evaluation_of_arbitrary_deterministic_policies(table, reward):
    # A deterministic policy defined by a random lookup table over histories, including out-of-range
    # numbers (invalid under the spend-a-turn rule) and guesses outside the candidate set.
    def policy(history):
        key = sum((i + 1) * (7 * (a or 0) + len(o)) for i, (a, o) in enumerate(history)) % len(table)
        return f"guess {table[key]}"

    dp = NumberSearchDP(16, 4, reward=reward)
    evaluation = dp.evaluate_policy(policy)
    logs, returns = play_in_env(policy, {"reward": reward})
    success = np.array([log["success"] for log in logs], dtype=float)
    assert np.array_equal(success, evaluation.per_target_success)
    assert np.allclose(returns, evaluation.per_target_return)
