"""bench/_results.py reads back what it writes, as the book's results page shows it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
spec = importlib.util.spec_from_file_location("_results", BENCH / "_results.py")
results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results)


def test_a_saved_section_comes_back_with_its_provenance(tmp_path):
    rows = [{"recipe": "a", "median_s": float("inf"), "runs": [{"seed": 0}]}]
    results.save_section(tmp_path / "b.json", "part", rows, "python bench/b.py --x")
    section = results.load("b.json", tmp_path)["part"]
    assert section["rows"] == [{"recipe": "a", "median_s": None, "runs": [{"seed": 0}]}]  # inf -> null
    line = results.provenance(section)
    assert line.startswith("`python bench/b.py --x` on ") and f"{section['machine']['cores']} cores" in line
    assert results.load("missing.json", tmp_path) is None


def test_markdown_table_reaches_into_nested_dicts_and_formats_each_figure():
    rows = [{"name": "x|y", "turn": {"mse": 0.12345}, "n": 3, "ok": True, "s": None, "tiny": 1e-5, "big": 12345.6,
             "skipped": [1, 2]}]
    text = results.markdown_table(rows, ["name", "turn.mse", "n", "ok", "s", "tiny", "big"],
                                  ["name", "MSE", "n", "ok", "s", "tiny", "big"])
    assert text.splitlines() == ["| name | MSE | n | ok | s | tiny | big |", "|---|---|---|---|---|---|---|",
                                 "| x\\|y | 0.123 | 3 | yes | – | 1e-05 | 1.23e+04 |"]


def test_markdown_table_names_a_column_no_row_has():
    with pytest.raises(ValueError, match=r"no row has the column\(s\) \['mse'\]; the rows have \['turn.mse'\]"):
        results.markdown_table([{"turn": {"mse": 1.0}}], ["mse"])
    with pytest.raises(ValueError, match="1 headers for 2 columns"):
        results.markdown_table([{"a": 1, "b": 2}], ["a", "b"], ["a"])


def test_a_section_names_the_processor_it_ran_on(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\n"
                    "model name\t: AMD EPYC\n")
    assert results.cpu_model(info) == "AMD EPYC"
    assert results.cpu_model(tmp_path / "absent") == (results.platform.processor() or None)
    section = {"command": "c", "date": "d", "commit": "x",
               "machine": {"cores": 2, "cpu": "AMD EPYC", "device": "cpu", "torch": "2.13.0+cpu"}}
    assert "2 cores (AMD EPYC), device cpu, torch 2.13.0+cpu" in results.provenance(section)
    section["machine"].pop("cpu")  # sections written before the processor was recorded
    assert "2 cores, device cpu" in results.provenance(section)


def test_a_section_records_the_cpus_matmul_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: X\nflags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16 amx_tile\n")
    assert results.cpu_flags(info) == {"avx2": True, "avx512": True, "amx": False}  # amx needs amx_bf16 too
    info.write_text("model name\t: X\nflags\t\t: fpu sse avx2 amx_tile amx_bf16\n")
    assert results.cpu_flags(info) == {"avx2": True, "avx512": False, "amx": True}
    info.write_text("model name\t: X\n")
    assert results.cpu_flags(info) is None and results.cpu_flags(tmp_path / "absent") is None
    assert "cpu_flags" in results.machine()


def test_the_machine_line_names_the_cpu_and_its_flags_and_a_change_of_machine():
    old = {"cores": 2, "platform": "Linux-a", "device": "cpu"}  # written before the CPU was recorded
    new = {"cores": 2, "cpu": "AMD EPYC", "cpu_flags": {"avx2": True, "avx512": False, "amx": False},
           "platform": "Linux-b", "device": "cpu"}
    line = results.machine_line({"machine": new})
    assert line == "Measured on 2 cores, AMD EPYC (AVX2 yes, AVX512 no, AMX no), Linux-b, device cpu."
    assert "CPU model not recorded (flags not recorded)" in results.machine_line({"machine": old})
    # a field only one record has tells nothing; the platform differs
    assert results.machine_line({"machine": new}, old).endswith(
        "A different machine from the section above: the records differ in platform.")
    assert results.machine_line({"machine": new}, dict(old, platform="Linux-b")).endswith(
        "Its record shows no difference from the machine of the section above.")
    # only the cores to compare: a curve's header names the CPU, an old record the platform
    assert results.machine_line({"machine": {"cores": 2, "cpu": "X"}}, old).endswith(
        "is not known: the two records share no CPU model or platform.")


def test_curves_are_read_by_file_and_an_unreadable_one_is_named_not_fatal(tmp_path):
    assert results.load_curves(tmp_path / "absent") == ({}, [])
    (tmp_path / "a-seed0.jsonl").write_text('{"kind": "header", "seed": 0}\n\n{"kind": "sample", "step": 5}\n')
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    (tmp_path / "headless.jsonl").write_text('{"kind": "sample"}\n')
    (tmp_path / "notes.txt").write_text("ignored")
    curves, problems = results.load_curves(tmp_path)
    assert curves == {"a-seed0": [{"kind": "header", "seed": 0}, {"kind": "sample", "step": 5}]}
    assert len(problems) == 2
    assert problems[0].startswith("broken.jsonl is not readable as JSON lines") and "copy" in problems[0]
    assert problems[1] == ("headless.jsonl does not start with the curve's header line: "
                           "copy the whole curve.jsonl")


def test_a_folded_table_becomes_a_dropdown_and_refuses_a_fence_inside():
    assert results.folded("Table", "| a |\n|---|\n| 1 |") == ":::{dropdown} Table\n| a |\n|---|\n| 1 |\n:::\n"
    with pytest.raises(ValueError, match="cannot hold ':::'"):
        results.folded("Table", "x\n:::\ny")
