"""bench/bench_credit.py runs end to end at a tiny size and saves its figures with their provenance."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from _results import _finite_or_null

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_credit.py"


@pytest.mark.slow
def test_the_credit_bench_saves_every_policy_and_estimator(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("bench_credit", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "bench_credit.json")
    got = bench.main(["--replicates", "3", "--sft-steps", "2", "--critic-episodes", "128"])
    section = json.loads((tmp_path / "bench_credit.json").read_text())["sections"]["quick"]
    assert list(got) == ["quick"] and json.loads(json.dumps(_finite_or_null(got["quick"]))) == section["rows"]
    assert section["command"] == "python bench/bench_credit.py --replicates 3 --sft-steps 2 --critic-episodes 128"
    assert {"date", "machine", "commit", "rows"} <= set(section)
    policies = [row["policy"] for row in section["rows"]]
    assert policies == ["uniform", "partly trained (SFT 2 steps)", "optimal"]
    names = set(section["rows"][0]["estimators"])
    assert "branching K=2" in names and "episode (Dr.GRPO)" in names and len(names) == 8
    assert "grad_gain" in section["rows"][0]["estimators"]["branching K=2"]
    assert "grad_gain" not in section["rows"][2]["estimators"]["branching K=2"]  # the optimum: g* = 0
    assert "critic EV vs exact V" in capsys.readouterr().out
