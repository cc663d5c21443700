"""bench/'s shared harness: arms in fresh processes through one helper (bench/_arms.py); every benchmark finds
its siblings and the package one way, and its main() returns the sections it saved through bench/_results.py."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import _arms
import pytest
from test_benches import _load

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted([*BENCH.glob("bench_*.py"), BENCH / "gpu_bench.py"])

#: An arm that says which process ran it; with ``--meet`` it waits until ``--arms`` arms have arrived there.
ARM = """
import argparse, os, sys, time
from pathlib import Path

from _arms import add_child_options, write_result

p = argparse.ArgumentParser()
add_child_options(p)
p.add_argument("--meet", type=Path)
p.add_argument("--arms", type=int, default=1)
a = p.parse_args()
if a.child == "fail":
    sys.exit(3)
if a.meet:
    (a.meet / a.child).touch()
    deadline = time.time() + 60
    while len(list(a.meet.iterdir())) < a.arms:
        if time.time() > deadline:
            sys.exit(4)
        time.sleep(0.02)
write_result(a.out, {"arm": a.child, "pid": os.getpid()})
"""


@pytest.fixture
def arm(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PYTHONPATH", str(BENCH))  # the arm script lives outside bench/
    (tmp_path / "meet").mkdir()
    script = tmp_path / "arm.py"
    script.write_text(ARM)
    return script


def test_each_arm_runs_in_a_process_of_its_own_and_returns_in_order(arm):
    got = _arms.run_fresh(arm, ["--child", "b"], ["--child", "a"])
    assert [g["arm"] for g in got] == ["b", "a"]
    pids = {g["pid"] for g in got}
    assert len(pids) == 2 and os.getpid() not in pids


def test_arms_run_together_are_all_running_at_once(arm):
    meet = arm.parent / "meet"
    got = _arms.run_fresh(arm, *(["--child", name, "--meet", meet, "--arms", 3] for name in "xyz"), together=True)
    assert [g["arm"] for g in got] == ["x", "y", "z"]


@pytest.mark.parametrize("together", [False, True])
def test_a_failed_arm_stops_the_benchmark_naming_the_arm(arm, together):
    meet = arm.parent / "meet"
    with pytest.raises(SystemExit, match=r"the arm `arm.py --child fail` failed \(exit 3\)"):
        _arms.run_fresh(arm, ["--child", "fail"], ["--child", "after", "--meet", meet], together=together)
    if not together:
        assert not (meet / "after").exists(), "one after the other, the arms after a failed one do not run"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_returns_its_sections_and_finds_its_siblings_one_way(script):
    source = script.read_text()
    tree = ast.parse(source)
    main = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main")
    assert main.returns is not None and ast.unparse(main.returns) == "dict[str, list[dict]]"
    assert [a.arg for a in main.args.args] == ["argv"], "main takes its arguments, so a test can pass them"
    assert ast.unparse(tree.body[-1]) == "if __name__ == '__main__':\n    main()"
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "_results" in imported and "save_section(" in source, "what it prints is saved as the others are"
    assert "subprocess" not in imported, "a fresh process per arm goes through bench/_arms.py"
    path_edits = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n) == "sys.path"]
    # Python runs a script with its folder first on the path, and the tests add bench/ (pyproject.toml);
    # only the grading benchmark reaches the checkout's root, for the grader, which is not installed.
    assert len(path_edits) == (script.name == "bench_grading.py")


def test_the_environment_bench_saves_what_it_prints(tmp_path, capsys):
    out = tmp_path / "e.json"
    saved = _load("bench_envs").main(["--batch", "4", "--repeats", "1", "--results", str(out)])
    printed = capsys.readouterr().out
    sections = json.loads(out.read_text())["sections"]
    assert list(saved) == list(sections) == ["number-search policies", "crafting planner", "steps per second"]
    for name, rows in saved.items():
        assert sections[name]["rows"] == rows
        assert sections[name]["command"] == f"python bench/bench_envs.py --batch 4 --repeats 1 --results {out}"
    optimal = saved["number-search policies"][0]
    assert optimal["policy"] == "optimal (DP)" and optimal["success_fraction"] == "15/16"
    assert "success 0.937500 = 15/16" in printed
    assert [r["level"] for r in saved["crafting planner"]] == [1, 2, 3, 4]
    assert all(r["success"] == 1.0 and r["plan_mean"] < r["budget_mean"] for r in saved["crafting planner"])
    steps = saved["steps per second"]
    assert len(steps) == 4 and all(r["min"] <= r["steps_per_s"] <= r["max"] and r["decisions"] > 0 for r in steps)
    assert f"{steps[0]['steps_per_s']:,.0f} steps/s" in printed
    assert list(_load("bench_envs").main(["--batch", "4", "--repeats", "1", "--no-figures", "--results",
                                          str(tmp_path / "n.json")])) == ["steps per second"]
