"""scripts/mutation_report.py: the score per module and the explanation of every live mutant."""

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("mutation_report", ROOT / "scripts" / "mutation_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

RESULTS = """
    agent_lab.update.x_micro_batches__mutmut_4: survived
    agent_lab.update.x_micro_batches__mutmut_5: killed
    agent_lab.algorithms.xǁVinePPOǁstatistics__mutmut_13: survived
    agent_lab.algorithms.xǁVinePPOǁstatistics__mutmut_14: timeout
    agent_lab.critic.x_fit_critic__mutmut_1: no tests
"""


def test_statuses_are_read_with_class_methods_and_every_status():
    assert report.parse(RESULTS) == {
        "agent_lab.update.x_micro_batches__mutmut_4": "survived",
        "agent_lab.update.x_micro_batches__mutmut_5": "killed",
        "agent_lab.algorithms.xǁVinePPOǁstatistics__mutmut_13": "survived",
        "agent_lab.algorithms.xǁVinePPOǁstatistics__mutmut_14": "timeout",
        "agent_lab.critic.x_fit_critic__mutmut_1": "no tests",
    }


def test_the_score_counts_timeouts_as_killed_and_untested_mutants_against_it():
    rows = report.score_rows(report.parse(RESULTS))
    assert rows == [
        {"module": "agent_lab.algorithms", "mutants": 2, "killed": 1, "score": 0.5, "other": "survived 1"},
        {"module": "agent_lab.critic", "mutants": 1, "killed": 0, "score": 0.0, "other": "no tests 1"},
        {"module": "agent_lab.update", "mutants": 2, "killed": 1, "score": 0.5, "other": "survived 1"},
        {"module": "all", "mutants": 5, "killed": 2, "score": 0.4, "other": "no tests 1, survived 2"},
    ]


def test_live_mutants_carry_their_explanation_and_explanations_of_killed_or_gone_mutants_are_stale():
    reasons = {"agent_lab.update.x_micro_batches__mutmut_4": "same slices",
               "agent_lab.update.x_micro_batches__mutmut_5": "was equivalent once",
               "agent_lab.update.x_gone__mutmut_1": "renamed"}
    alive, stale = report.not_killed(report.parse(RESULTS), reasons)
    assert [(a["mutant"].rsplit(".", 1)[1], a["reason"]) for a in alive] == [
        ("x_micro_batches__mutmut_4", "same slices"), ("xǁVinePPOǁstatistics__mutmut_13", None),
        ("x_fit_critic__mutmut_1", None)]
    assert stale == ["agent_lab.update.x_gone__mutmut_1", "agent_lab.update.x_micro_batches__mutmut_5"]


def test_the_committed_explanations_parse_and_name_mutants_of_the_mutated_modules():
    reasons = tomllib.loads((ROOT / "tests" / "mutation_equivalent.toml").read_text())["equivalent"]
    assert reasons and all(report.LINE.match(f"  {m}: survived") for m in reasons)
    assert all(isinstance(r, str) and len(r) > 20 for r in reasons.values())
