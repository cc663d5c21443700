"""Frozen-checkpoint evaluation: Wilson interval, planner optimum on the same tasks, gap, no side effects."""

from __future__ import annotations

import collections

import pytest
import torch
from conftest import tiny_policy

from agent_lab.envs import make_env
from agent_lab.envs.crafting import first_mistake
from agent_lab.evaluation import NO_REFUSAL, evaluate, first_refusal, save_checkpoint, wilson_interval
from agent_lab.policy import WordTokenizer
from agent_lab.rollout import SamplingConfig, collect_rollouts


@pytest.mark.parametrize(("k", "n", "lo", "hi"), [(0, 10, 0.0, 0.27753), (5, 10, 0.23659, 0.76341),
                                                   (15, 16, 0.71671, 0.98888), (16, 16, 0.80639, 1.0)])
def test_wilson_interval_matches_closed_form_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)
    assert got[0] <= k / n <= got[1]


@pytest.mark.parametrize("n", [1, 7, 60, 150, 1000, 4096])
def test_wilson_interval_contains_the_observed_proportion_at_both_ends(n):
    assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    for k in (0, 1, n // 2, n - 1, n):
        lo, hi = wilson_interval(k, n)
        assert lo <= k / n <= hi


def test_wilson_interval_rejects_impossible_counts():
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="n must be"):
        wilson_interval(0, 0)


def test_evaluate_reports_gap_to_planner_on_the_same_tasks_and_leaves_weights_untouched(tmp_path):
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rep = evaluate(m, env, "test", "sampled", tokenizer=tok, samples_per_task=4, seed=1, candidate_mask=True)
    assert rep.n == 64 and rep.optimum == pytest.approx(15 / 16)
    assert rep.gap == pytest.approx(rep.optimum - rep.success)
    assert rep.ci_low <= rep.success <= rep.ci_high
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in m.parameters())
    # planner on a subset: targets 1..4 hold one the optimal search cannot reach within 4 guesses
    sub = evaluate(m, env, tasks=[1, 2, 3, 4], tokenizer=tok)
    assert sub.optimum == pytest.approx(env.optimal_success([1, 2, 3, 4]))
    # a saved checkpoint evaluates exactly like the policy object (greedy is deterministic)
    path = save_checkpoint(tmp_path / "c.pt", m, tok)
    a = evaluate(m, env, "test", "greedy", tokenizer=tok)
    b = evaluate(path, env, "test", "greedy")
    assert (a.successes, a.mean_turns) == (b.successes, b.mean_turns)


def test_evaluate_needs_a_tokenizer_for_a_policy_object():
    env = make_env("number-search")
    tok = WordTokenizer.from_env(env)
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate(tiny_policy(tok), env)


def test_evaluate_reports_each_level_with_its_own_interval():
    env = make_env("crafting", mask_actions=True, eval_size=6)
    tok = WordTokenizer.from_env(env)
    rep = evaluate(tiny_policy(tok), env, "test", "sampled", tokenizer=tok, samples_per_task=2, candidate_mask=True)
    assert sorted(rep.by_group) == ["level 1", "level 2", "level 3"]
    assert sum(g["n"] for g in rep.by_group.values()) == rep.n
    for g in rep.by_group.values():
        k = round(g["success"] * g["n"])
        assert (g["ci_low"], g["ci_high"]) == wilson_interval(k, g["n"]) and g["ci_low"] <= g["success"] <= g["ci_high"]
    assert str(rep).count("[") == 1 + len(rep.by_group)  # the whole split's interval, then one per level


def test_first_refusal_names_the_first_refused_action_or_none():
    turns = [{"error": None}, {"error": "missing ingredients"}, {"error": "unknown item"}]
    assert first_refusal({"turns": turns}) == "missing ingredients"
    assert first_refusal({"turns": turns[:1]}) == NO_REFUSAL == first_refusal({"turns": []})


def test_evaluate_counts_each_failed_episode_once_by_its_first_refusal_per_level():
    env = make_env("crafting", eval_size=6)  # no mask: a random policy's actions are mostly refused
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    rep = evaluate(m, env, "test", "greedy", tokenizer=tok, batch_size=4)
    tasks = env.eval_tasks("test")
    logs = collect_rollouts(m, tok, env, tasks, SamplingConfig(decoding="greedy"), torch.Generator()).episode_logs
    expected = {}
    for task, log in zip(tasks, logs):
        if not log["success"]:
            errors = [t["error"] for t in log["turns"] if t["error"]]
            per_level = expected.setdefault(f"level {task['level']}", collections.Counter())
            per_level[errors[0] if errors else NO_REFUSAL] += 1
    assert expected, "the random policy fails some episodes"
    for level, g in rep.by_group.items():
        assert g["failures"] == dict(expected.get(level, {}))
        assert sum(g["failures"].values()) == g["n"] - round(g["success"] * g["n"])
        assert list(g["failures"].values()) == sorted(g["failures"].values(), reverse=True)
    assert rep.failures == dict(sum(expected.values(), collections.Counter()))


def test_eval_batches_hold_at_most_the_cache_budget_and_give_the_same_report(monkeypatch):
    from agent_lab import evaluation
    from agent_lab.policy import ModelConfig, TinyTransformer

    # 2 (keys, values) * 4 layers * 128 dims * 4 bytes a slot, 2 * 512 slots: 4 MiB of cache a row
    crafting_sized = TinyTransformer(ModelConfig(vocab_size=50, d_model=128, n_layers=4, max_len=512))
    assert evaluation.eval_batch_size(crafting_sized) == int(512e6 // 2**22) == 122
    assert evaluation.eval_batch_size(crafting_sized, cache_bytes=2**22 * 10 - 1) == 9
    assert evaluation.eval_batch_size(crafting_sized, cache_bytes=1) == 1
    assert evaluation.eval_batch_size(TinyTransformer(ModelConfig(vocab_size=50, max_len=128))) == 1024  # the cap
    env = make_env("number-search", mask_actions=True)
    tok = WordTokenizer.from_env(env)
    m = tiny_policy(tok)
    sizes = []
    real = evaluation.collect_rollouts
    monkeypatch.setattr(evaluation, "collect_rollouts", lambda p, t, e, tasks, *a: sizes.append(len(tasks)) or
                        real(p, t, e, tasks, *a))
    whole = evaluate(m, env, tokenizer=tok, candidate_mask=True, batch_size=16)
    monkeypatch.setattr(evaluation, "eval_batch_size", lambda policy: 5)
    split = evaluate(m, env, tokenizer=tok, candidate_mask=True)
    assert sizes == [16, 5, 5, 5, 1]
    assert (split.successes, split.mean_return, split.mean_turns) == (whole.successes, whole.mean_return,
                                                                      whole.mean_turns)


def test_evaluate_counts_failed_crafting_episodes_by_first_mistake_when_told():
    env = make_env("crafting", eval_size=6)
    tok = WordTokenizer.from_env(env)
    policy = tiny_policy(tok)
    rep = evaluate(policy, env, "test", "greedy", tokenizer=tok, classify=first_mistake)
    logs = collect_rollouts(policy, tok, env, env.eval_tasks("test"), SamplingConfig(decoding="greedy"),
                            torch.Generator()).episode_logs
    expected = collections.Counter(first_mistake(log) for log in logs if not log["success"])
    assert expected and rep.failures == dict(expected)
