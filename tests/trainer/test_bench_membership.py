"""bench/crafting_membership.py: the needed-items probe's score and its record."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("crafting_membership", BENCH / "crafting_membership.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_balanced_accuracy_averages_the_two_kinds_of_mention(probe):
    logit = torch.tensor([[2.0, -1.0, 0.5, -3.0, 9.0, 1.0]])
    labels = torch.tensor([[True, True, True, False, False, False]])
    where = torch.tensor([[True, True, True, True, True, False]])  # the last one is not a mention
    got = probe.balanced_accuracy(logit, labels, where)
    assert got == {"needed_called_needed": 2 / 3, "others_called_not": 1 / 2, "balanced": (2 / 3 + 1 / 2) / 2}
    # calling every mention needed scores one half, however many mentions are needed
    assert probe.balanced_accuracy(torch.ones(1, 6), labels, where)["balanced"] == 0.5


def test_a_tiny_probe_writes_each_arm_as_it_goes(probe, tmp_path):
    out = tmp_path / "m.json"
    probe.main(["--steps", "2", "--every", "1", "--worlds", "1", "--out", str(out),
                "--arm", "tiny:d_model=16,n_layers=1,n_heads=2", "--arm", "lines:d_model=16,n_layers=1,n_heads=2,"
                "line_positions=true"])
    record = json.loads(out.read_text())
    assert record["steps"] == 2 and list(record["arms"]) == ["tiny", "lines"]
    assert record["arms"]["lines"]["fields"]["line_positions"] is True
    for arm in record["arms"].values():
        assert [r["step"] for r in arm["rows"]] == [0, 1, 2]
        assert [r["worlds_seen"] for r in arm["rows"]] == [0, 32, 64]
        assert all(0 <= r["balanced"] <= 1 for r in arm["rows"])
    assert record["machine"]["cores"] and record["command"].startswith("python bench/crafting_membership.py")


def test_an_arm_without_values_is_refused_with_the_form_to_write(probe):
    with pytest.raises(ValueError, match="NAME:field=value"):
        probe.parse_arm("deep:n_layers")
    assert probe.parse_arm("deep:n_layers=8,line_positions=true") == ("deep", {"n_layers": 8, "line_positions": True})


def test_an_arm_may_set_the_optimisation_and_the_training_worlds(probe, tmp_path):
    assert probe.parse_arm("mix:level_weights=[1,1,2],lr=3e-4,n_layers=2") == (
        "mix", {"level_weights": [1, 1, 2], "lr": 3e-4, "n_layers": 2})  # a list's commas stay in the list
    out = tmp_path / "m.json"
    probe.main(["--steps", "2", "--every", "1", "--worlds", "1", "--out", str(out), "--arm",
                "t:d_model=16,n_layers=1,n_heads=2,batch=4,lr=3e-3,warmup=2,level1_steps=1,weight_decay=0.1,"
                "train_distractors=3"])
    rows = json.loads(out.read_text())["arms"]["t"]["rows"]
    assert [r["worlds_seen"] for r in rows] == [0, 4, 8]
    with pytest.raises(TypeError):  # a field that is none of the three kinds reaches ModelConfig, which refuses it
        probe.main(["--steps", "1", "--worlds", "1", "--out", str(out), "--arm", "bad:not_a_field=1"])
