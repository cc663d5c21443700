"""environment.yml (conda) and pyproject.toml (pip) must declare the same dependencies and pins."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$")


def _parse(spec: str) -> tuple[str, str]:
    m = REQ.match(spec)
    assert m, f"cannot parse requirement {spec!r}"
    name = m.group(1).lower().replace("_", "-")
    pins = ",".join(sorted(p.strip().replace(" ", "") for p in m.group(2).split(",") if p.strip()))
    return name, pins


#: Extras installed on demand, never in the conda environment: a peer's trainer for a side-by-side benchmark.
ON_DEMAND = {"trl"}


def pyproject_requirements(extras: str = "environment") -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    specs = list(data["project"]["dependencies"])
    for name, extra in data["project"].get("optional-dependencies", {}).items():
        if (name in ON_DEMAND) == (extras == "on demand"):
            specs += extra
    return dict(_parse(s) for s in specs)


def conda_requirements() -> tuple[dict[str, str], str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    out: dict[str, str] = {}
    python = ""
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for spec in dep["pip"]:
                if not spec.startswith("-e"):
                    out.update([_parse(spec)])
        elif dep.startswith("python="):
            python = dep.split("=", 1)[1]
        elif dep != "pip":
            out.update([_parse(dep)])
    return out, python


def test_environment_yml_declares_same_dependencies_and_pins_as_pyproject():
    pip_reqs = pyproject_requirements()
    conda_reqs, _ = conda_requirements()
    only_pip = {k: v for k, v in pip_reqs.items() if conda_reqs.get(k) != v}
    only_conda = {k: v for k, v in conda_reqs.items() if pip_reqs.get(k) != v}
    assert not only_pip and not only_conda, (
        f"pyproject.toml and environment.yml disagree.\n  pyproject only/different: {only_pip}\n"
        f"  environment.yml only/different: {only_conda}"
    )


def test_environment_yml_python_matches_requires_python():
    _, python = conda_requirements()
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python == "3.11" and ">=3.11" in requires, (python, requires)


def test_environment_yml_installs_the_package_itself():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*-e\s+\.\s*$", text, re.M), "environment.yml must pip-install the package (-e .)"


def test_torch_is_pinned_exactly():
    assert pyproject_requirements()["torch"] == "==2.13.0"


def test_the_on_demand_extras_stay_out_of_the_conda_environment():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert ON_DEMAND <= set(data["project"]["optional-dependencies"])
    conda_reqs, _ = conda_requirements()
    on_demand = set(pyproject_requirements("on demand")) - set(pyproject_requirements())
    assert on_demand and not on_demand & set(conda_reqs), on_demand & set(conda_reqs)
