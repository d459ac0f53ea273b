"""The suite loader (:mod:`clbench.suite_file`): a suite file is read, checked and refused in one line naming the
file, the entry and the key, before any run."""
from __future__ import annotations

import sys
import time
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


DIGITS = {"suite": "s", "seeds": [0], "scenarios": [{"name": "split_digits"}],
          "strategies": [{"name": "naive", "preset": "cpu"}]}


# ---------------------------------------------------------------------------------------------- suite files
def test_a_binary_suite_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    assert run_suite(path, tmp_path / "out") == 2
    one_error_line(capsys, str(path), "not a text file")


def test_a_yaml_anchor_bomb_is_refused_quickly_in_one_short_line(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nsuite: s\nseeds: *a8\nscenarios: *a8\nstrategies: *a8\n")
    assert len(path.read_bytes()) < 2000
    start = time.monotonic()
    assert run_suite(path, tmp_path / "out") == 2
    assert time.monotonic() - start < 5
    one_error_line(capsys, "bomb.yaml", "anchors")


def test_a_huge_value_is_cut_in_the_error_message():
    data = yaml.safe_load(yaml.safe_dump(DIGITS))
    data["strategies"][0]["args"] = {"lr": "x" * 100_000}
    with pytest.raises(ConfigError, match=r"args\.lr: expected a float") as info:
        parse_suite(data, "s.yaml")
    assert len(str(info.value)) < 400


def test_an_oversized_suite_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("suite: s\ndescription: " + "x" * 2_000_000 + "\n")
    with pytest.raises(ConfigError, match="at most 1,000,000 bytes"):
        load_suite(path)


# ------------------------------------------------------------------------------------------- checked at load
@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["scenarios"][0].update(args={"n_experiences": 11}), "scenarios[0] (split_digits): args: 10 classes"),
    (lambda d: d.update(seeds=[2**32]), "from 0 to 2**32 - 1"),
    (lambda d: d.update(seeds=[0, 0]), "seed 0 appears twice"),
    (lambda d: d["strategies"][0].update(name="lora", args={"mem_size": 50}, dp={"epsilon": 3.0}),
     "dp with a rehearsal memory (mem_size 50)"),
    # found by tests/test_conformance.py: settings another setting makes unused (Adam has no momentum, cross-entropy no
    # alpha/kappa), which used to be accepted and change nothing
    (lambda d: d["strategies"][0].update(args={"momentum": 0.5}),
     "args.momentum is used only with optimizer: sgd (this entry's optimizer is 'adam')"),
    (lambda d: d["strategies"][0].update(name="nlft", args={"kappa": 5.0}),
     "args.kappa is used only with loss: mse (this entry's loss is 'ce')"),
])
def test_what_a_run_would_refuse_is_refused_when_the_suite_loads(mutate, message):
    data = yaml.safe_load(yaml.safe_dump(DIGITS))
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_suite(data, "s.yaml")
    assert str(info.value).startswith("s.yaml: ") and message in str(info.value), str(info.value)


def test_dp_without_opacus_is_refused_when_the_suite_loads(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    data = yaml.safe_load(yaml.safe_dump(DIGITS))
    data["strategies"][0]["dp"] = {"epsilon": 3.0}
    with pytest.raises(ConfigError, match=r"strategies\[0\] \(naive\): dp needs opacus .* pip install"):
        parse_suite(data, "s.yaml")
