"""The suite loader (:mod:`clbench.suite_file`): a suite file is read, checked and refused in one line naming the
file, the entry and the key, before any run."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import names
from clbench.errors import ConfigError
from clbench.suite_file import load_suite, parse_suite
from tests._cli import one_error_line, run_suite

GOOD = {"suite": "s", "seeds": [0], "scenarios": [{"name": "synthetic"}],
        "strategies": [{"name": "replay", "preset": "cpu", "args": {"mem_size": 50, "model": "mlp"}}]}


# ----------------------------------------------------------------------------------------------- load-time types
STRATEGY = "strategies[0] (replay): "


# --------------------------------------------------------------------------------------------------- path names
@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["strategies"][0].update(label="a/b"), "label"),
    (lambda d: d["strategies"][0].update(label="../../x"), "label"),
    (lambda d: d["scenarios"][0].update(label="x/../y"), "label"),
    (lambda d: d["strategies"][0].update(label="a__b"), "label"),     # '__' separates the parts of a run id
    (lambda d: d.update(suite="../escape"), "suite"),
    (lambda d: d.update(suite=""), "suite"),
])
def test_names_used_in_paths_are_checked_when_the_suite_loads(mutate, key):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(data)
    with pytest.raises(ConfigError, match=rf"bad\.yaml: .*'{key}'.*may contain only"):
        parse_suite(data, "bad.yaml")


def test_a_label_that_escapes_runs_is_refused_before_any_run(tiny_suite, tmp_path, capsys):
    suite = tiny_suite([{"name": "test_increasing_logits", "label": "../../x"}])
    assert run_suite(suite, tmp_path / "a" / "b" / "out") == 2
    assert "'label'" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["strategies"][0]["args"].update(lr="fast"), STRATEGY + "args.lr: expected a float, got 'fast'"),
    (lambda d: d["strategies"][0]["args"].update(epochs=1.5), STRATEGY + "args.epochs: expected an int, got 1.5"),
    (lambda d: d["strategies"][0]["args"].update(batch_size=0.5), STRATEGY + "args.batch_size: expected an int"),
    (lambda d: d["strategies"][0]["args"].update(mem_size=-5), STRATEGY + "args.mem_size: -5 is out of range"),
    (lambda d: d["strategies"][0]["args"].update(epochs=0), STRATEGY + "args.epochs: 0 is out of range"),
    (lambda d: d["strategies"][0]["args"].update(lr=-0.1), STRATEGY + "args.lr: -0.1 is out of range"),
    (lambda d: d["strategies"][0]["args"].update(momentum=True),
     STRATEGY + "args.momentum: expected a float, got True"),
    (lambda d: d["strategies"][0]["args"].update(model_args={"hiden": [8]}),
     STRATEGY + "args.model_args: unknown key 'hiden'. Did you mean 'hidden'"),
    (lambda d: d["strategies"][0]["args"].update(model_args={"hidden": "wide"}),
     STRATEGY + "args.model_args.hidden: expected a tuple"),
    (lambda d: d["strategies"][0]["args"].update(model="mlpp"), STRATEGY + "args.model: unknown model 'mlpp'"),
    (lambda d: d["strategies"][0]["args"].update(head="fancy"), STRATEGY + "args.head: unknown head 'fancy'"),
    (lambda d: d["strategies"][0]["args"].update(optimizer=3), STRATEGY + "args.optimizer: expected a str, got 3"),
    (lambda d: d.update(seeds=[True]), "'seeds' must be a non-empty list of integers"),
    (lambda d: d["scenarios"][0].update(args={"n_experiences": "three"}),
     "scenarios[0] (synthetic): args.n_experiences: expected an int, got 'three'"),
])
def test_wrong_types_and_values_are_errors_naming_file_entry_and_key(mutate, match):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(data)
    with pytest.raises(ConfigError) as err:
        parse_suite(data, "bad.yaml")
    assert str(err.value).startswith("bad.yaml: " + match), str(err.value)


def test_yaml_1_1_strings_that_mean_a_number_are_read_as_that_number():
    data = yaml.safe_load("{suite: s, scenarios: [{name: synthetic, args: {separation: 3}}], "
                          "strategies: [{name: replay, args: {lr: 1e-3}}]}")
    assert data["strategies"][0]["args"]["lr"] == "1e-3"              # what YAML 1.1 gives
    suite = parse_suite(data, "ok.yaml")
    assert suite.strategies[0].args["lr"] == 0.001
    assert suite.scenarios[0].args["separation"] == 3.0 and isinstance(suite.scenarios[0].args["separation"], float)
    assert suite.run_specs()[0].identity()["strategy"]["resolved"]["lr"] == 0.001


ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ one line, no traceback
def test_a_deeply_nested_suite_file_is_one_line_naming_the_limit(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("suite: deep\nscenarios: " + "[" * 3000 + "]" * 3000 + "\n")
    assert run_suite(path, tmp_path / "out") == 2
    one_error_line(capsys, str(path), "more than 50 levels")


def test_a_label_longer_than_a_file_name_may_be_is_refused_at_load_naming_the_limit(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"suite": "s", "scenarios": [{"name": "synthetic", "label": "x" * 300}],
                                    "strategies": [{"name": "naive"}]}))
    with pytest.raises(ConfigError, match=f"300 characters long; at most {names.MAX_NAME}"):
        load_suite(path)


def test_the_missing_opacus_hint_names_an_extra_that_exists():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("opacus") for d in extras["dp"])
    for module in ("clbench/suite_file.py", "clbench/privacy/accountant.py"):
        hinted = {part.split("]")[0] for part in (ROOT / module).read_text().split("clbench[")[1:]}
        assert hinted <= set(extras), (module, hinted)
