"""Every setting is declared once, as a field with its help on the dataclass that owns it: a new algorithm
written in one file, with one option, reaches the flat keywords, the command line, config.json and the recipes
with no other edit; and agent_lab.config stays plain data that imports nothing of the package."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

import agent_lab.trainer as trainer_mod
from agent_lab.cli import main as cli_main
from agent_lab.config import TrainConfig, declared, flat_keywords
from agent_lab.preflight import check_config
from agent_lab.recipes import Recipe, recipe

#: The whole of a new algorithm: one file, one class, one option.
TOY_SOURCE = '''
from dataclasses import dataclass
from typing import ClassVar

from agent_lab.algorithms import DrGRPO, register
from agent_lab.config import setting


@register
@dataclass
class Toy(DrGRPO):
    """Dr.GRPO's advantages times a constant."""

    toy_scale: float = setting(1.0, "multiplies Dr.GRPO's advantages (a toy option)")

    name: ClassVar[str] = "toy"

    def __post_init__(self):
        super().__post_init__()
        if not self.toy_scale >= 0:
            raise ValueError(f"toy_scale must be >= 0, got {self.toy_scale}")

    def advantages(self, batch, state, features=None):
        return self.toy_scale * super().advantages(batch, state, features)
'''


@pytest.fixture
def toy(tmp_path):
    """Import the toy algorithm's file (registering it); afterwards remove it from the registry again."""
    path = tmp_path / "toy_algorithm.py"
    path.write_text(textwrap.dedent(TOY_SOURCE))
    spec = importlib.util.spec_from_file_location("toy_algorithm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module.Toy
    declared("algorithm").pop("toy")


def test_a_new_algorithms_option_becomes_a_flat_keyword_with_its_declared_default_and_help(toy):
    s = flat_keywords()["toy_scale"]
    assert (s.place, s.name, s.default, s.type, s.owners) == ("options", "toy_scale", 1.0, float, ("toy",))
    assert s.help == "multiplies Dr.GRPO's advantages (a toy option)"
    cfg = TrainConfig(algo="toy", toy_scale=0.5)
    assert cfg.algorithm.name == "toy" and cfg.algorithm.options == {"toy_scale": 0.5}
    check_config(cfg)  # the run can be prepared: the algorithm builds with its option
    assert cfg.algorithm.build(max_tokens=1).toy_scale == 0.5
    with pytest.raises(ValueError, match="toy_scale must be >= 0, got -1"):
        check_config(TrainConfig(algo="toy", toy_scale=-1.0))
    with pytest.raises(ValueError, match="toy_scale=0.5 is an option of algo 'toy', not of 'dr_grpo'"):
        TrainConfig(algo="dr_grpo", toy_scale=0.5)


def test_a_new_algorithm_is_on_the_command_line_with_its_help(toy, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    want = "--toy-scale TOY_SCALE toy: multiplies Dr.GRPO's advantages (a toy option) (TrainConfig default: 1.0)"
    assert want in out
    assert "| vineppo | toy (TrainConfig default: dr_grpo)" in out  # --algo lists the registered algorithms
    seen = []

    def fake_train(cfg, progress=True, **kw):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(trainer_mod, "train", fake_train)
    with pytest.raises(SystemExit):
        cli_main(["train", "--recipe", "number-search", "--algo", "toy", "--toy-scale", "0.25"])
    assert seen[-1].algorithm.options == {"toy_scale": 0.25}
    assert seen[-1] == recipe("number-search", algo="toy", toy_scale=0.25)


def test_a_new_algorithms_setting_round_trips_through_config_json_and_recipes(toy):
    cfg = recipe("number-search", algo="toy", toy_scale=0.25)
    saved = json.loads(json.dumps(cfg.to_dict()))  # what config.json holds
    assert saved["algorithm"]["name"] == "toy" and saved["algorithm"]["options"] == {"toy_scale": 0.25}
    assert TrainConfig.from_dict(saved) == cfg
    own = Recipe("toy", "a recipe of the toy algorithm", dict(env="number-search", algo="toy", toy_scale=0.0))
    assert own.config().algorithm.options == {"toy_scale": 0.0}
    assert own.config(toy_scale=2.0).algorithm.options == {"toy_scale": 2.0}


def test_every_flat_keyword_is_generated_from_a_declared_field_with_help():
    keys = flat_keywords()
    assert {"batch_size", "sft_steps", "algo", "ppo_epochs", "gae_gamma", "sft_slip_prob"} <= set(keys)
    assert keys["ppo_epochs"].owners == ("ppo", "ppo_gae", "vineppo")  # an inherited option, one keyword
    slip = keys["sft_slip_prob"]
    assert slip.switch and slip.default == 0.0  # the value that leaves the plug-in off
    for key, s in keys.items():
        assert s.help.strip(), f"flat keyword {key} has no help"
    # a default is the declared field's, never a copy: change the field and the keyword follows
    algo = declared("algorithm")["ppo"]
    epochs = next(f for f in dataclasses.fields(algo) if f.name == "epochs")
    assert keys["ppo_epochs"].default == epochs.default == 4


def test_every_field_of_every_section_and_registered_class_is_declared_with_help():
    from agent_lab.config import SECTIONS

    classes = [*SECTIONS.values(), *declared("algorithm").values(), *declared("plugin").values()]
    constructor = {"group_size", "max_tokens", "objective"}  # an algorithm's arguments from its section
    missing = [f"{cls.__name__}.{f.name}" for cls in classes for f in dataclasses.fields(cls)
               if "help" not in f.metadata and f.name not in constructor]
    assert missing == [], f"fields declared without setting(default, help): {missing}"


def test_a_plug_in_with_flat_keywords_needs_exactly_one_switch():
    from agent_lab.config import setting

    @dataclasses.dataclass
    class NoSwitch:
        level: float = setting(0.5, "a tuning knob", flat="no_switch_level")

    declared("plugin")["no_switch"] = NoSwitch
    try:
        with pytest.raises(TypeError, match="plug-in 'no_switch' has flat keywords but not one switch"):
            flat_keywords()
    finally:
        declared("plugin").pop("no_switch")


def test_two_declarations_of_one_flat_keyword_are_refused(toy):
    @dataclasses.dataclass
    class Clash(toy):
        other: float = dataclasses.field(default=0.0, metadata={"help": "clashes", "flat": "toy_scale"})
        name = "clash"

    declared("algorithm")["clash"] = Clash
    try:
        with pytest.raises(TypeError, match="flat keyword 'toy_scale' is declared by"):
            flat_keywords()
    finally:
        declared("algorithm").pop("clash")


def test_config_is_plain_data_that_imports_nothing_of_the_package_nor_torch():
    code = ("import sys, agent_lab.config; print(sorted(m for m in sys.modules "
            "if m.startswith('agent_lab.') or m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['agent_lab.config']"
