"""bench/bench_no_mask.py: the exact references it prints beside the runs, its probes on logs whose answers are
known, and a tiny end-to-end run that writes its section where it is told."""

from __future__ import annotations

import importlib.util
import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_no_mask.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_no_mask", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _play(texts_of, targets):
    """Episodes of number search where ``texts_of(i, turn)`` gives episode i's text at each turn."""
    from agent_lab.envs import make_env

    env = make_env("number-search")
    env.reset(targets)
    for turn in range(4):
        env.step([texts_of(i, turn) for i in range(len(targets))])
    return env.episode_logs()


def test_the_blind_references_are_exact(bench):
    fixed, uniform = bench.blind_optimum()
    assert fixed == Fraction(4, 16)  # 'guessing 1, 2, 3, 4 gets 4/16' (envs/number_search.py)
    assert uniform == 1 - Fraction(15, 16) ** 4
    assert bench.blind_optimum(n=3, k=2) == (Fraction(2, 3), 1 - Fraction(2, 3) ** 2)
    # n = 2: after a miss the answer names the other number; a blind guess goes there half the time
    assert bench.blind_follows(2) == Fraction(1, 2)


def test_follows_answers_of_uniform_blind_guessing_is_the_exact_share(bench):
    rng = random.Random(0)
    logs = _play(lambda i, t: f"guess {rng.randint(1, 16)}", [1 + i % 16 for i in range(4000)])
    got = bench.follows_answers(logs)
    assert abs(got - 31 / 48) < 0.02 and float(bench.blind_follows()) == 31 / 48


def test_the_probes_on_binary_search_and_on_a_repeated_guess(bench):
    from agent_lab.envs import make_env

    targets = list(range(1, 17))
    demos = make_env("number-search").demonstrations(targets)
    searched = _play(lambda i, t: demos[i][t][1] if t < len(demos[i]) else "", targets)
    assert bench.follows_answers(searched) == 1.0 and bench.repeats(searched) == 0.0
    stuck = _play(lambda i, t: "guess 12", targets)  # the greedy no-mask policy's pattern
    assert bench.repeats(stuck) == 45 / 61  # 4 guesses, 3 of them repeats, in 15 episodes; 12 is found at once
    assert bench.follows_answers(stuck) == 0.0
    refused = _play(lambda i, t: "guess 12" if t % 2 else "hello", targets)
    assert bench.repeats(refused) == 15 / 31  # executed guesses: 2 per episode but 12's 1
    assert bench.follows_answers([]) is None and bench.repeats([]) is None


def test_a_tiny_run_writes_its_section_where_told(bench, tmp_path):
    out = tmp_path / "r.json"
    saved = bench.main(["--tiny", "--results", str(out)])
    section = json.loads(out.read_text())["sections"]["tiny"]
    assert list(saved) == ["tiny"] and json.loads(json.dumps(saved["tiny"])) == section["rows"]
    got = saved["tiny"][0]
    assert section["command"] == "python bench/bench_no_mask.py --tiny"
    assert [r["recipe"] for r in got["runs"]] == list(bench.ARMS)
    for r in got["runs"]:
        assert 0.0 <= r["sampled_rejected_share"] <= 1.0 and r["steps"] >= 1
    masked = got["runs"][list(bench.ARMS).index("number-search/dr_grpo")]
    # probed as trained: under the candidate mask nothing sampled is refused, even by a barely trained policy
    assert masked["sampled_rejected_share"] == 0.0 and masked["greedy_rejected_share"] == 0.0
    planner = section["rows"][0]["references"][0]
    assert planner == {"policy": "planner (binary search)", "success": 15 / 16, "follows_answers": 1.0}
