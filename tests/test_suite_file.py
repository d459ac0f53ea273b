"""The suite loader (:mod:`clbench.suite_file`): a suite file is read, checked and refused in one line naming the
file, the entry and the key, before any run.

Refused at load: duplicated YAML keys, values that depend on the scenario (memory and shards against the stream's
declared sizes, the scenarios' own arguments), settings that change nothing (dp's ``gamma`` with flat clipping,
``hook_trace``'s ``batches``), and a malformed file refused before any strategy or scenario module (or torch) is
imported, from the registries' index (tests/test_recorded.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Annotated

import pytest
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import names, suite_file, typecheck
from clbench.errors import ConfigError
from clbench.registry import SCENARIOS
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


def _parse(scenarios: list, strategies: list) -> None:
    suite_file.parse_suite({"suite": "s", "scenarios": scenarios, "strategies": strategies}, "s.yaml")


def _refused(scenarios: list, strategies: list) -> str:
    with pytest.raises(ConfigError) as info:
        _parse(scenarios, strategies)
    message = str(info.value)
    assert "\n" not in message and message.startswith("s.yaml: "), message
    return message


# ------------------------------------------------------------------------------------------------ duplicated keys
def _yaml_refusal(tmp_path, text: str) -> str:
    """``read_yaml``'s refusal of ``text`` written to ``s.yaml``, its folder left out of the message."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        suite_file.read_yaml(path)
    return str(info.value).replace(f"{tmp_path}/", "")


# ------------------------------------------------------------------------------- refused before the heavy imports
MALFORMED = {
    "duplicated key": "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: replay, args: {epochs: 1, "
                      "epochs: 3}}\n",
    "unknown key": "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: replay, lable: r}\n",
    "unknown strategy": "suite: x\nscenarios: [split_digits]\nstrategies: [replai]\n",
    "unknown scenario": "suite: x\nscenarios: [split_digitz]\nstrategies: [naive]\n",
    "unknown callback": "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, callbacks: [hook]}\n",
    "dp not a mapping": "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, dp: 3}\n",
    "entry twice": "suite: x\nscenarios: [split_digits]\nstrategies: [naive, naive]\n",
    "bad label": "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, label: a/b}\n",
    "bad seeds": "suite: x\nseeds: [-1]\nscenarios: [split_digits]\nstrategies: [naive]\n",
    "not yaml": "suite: [x\n",
    "deep": "suite: x\nscenarios: " + "[" * 60 + "]" * 60 + "\n",
}


def _refusals_in_a_fresh_process(paths: list[Path]) -> tuple[list, list[str]]:
    """``([exit code, stderr] per suite file, the heavy modules imported)`` of ``clbench --suite FILE`` run on each
    file in one fresh process: torch, Avalanche and the strategy, scenario and model modules count as heavy."""
    code = ("import contextlib, io, json, sys\nfrom clbench.cli import main\nout = []\n"
            "for path in sys.argv[1:]:\n    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        code = main(['--suite', path, '--out', path + '.out', '--quiet'])\n"
            "    out.append([code, err.getvalue()])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'avalanche') or "
            "m.startswith(('clbench.strategies.', 'clbench.scenarios.', 'clbench.models.')))\n"
            "print(json.dumps([out, heavy]))")
    done = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _written(tmp_path: Path, texts: dict[str, str]) -> list[Path]:
    paths = [tmp_path / f"{name.replace(' ', '_')}.yaml" for name in texts]
    for path, text in zip(paths, texts.values()):
        path.write_text(text)
    return paths


PRIVATE = ", ".join(sorted(name for module in json.loads((ROOT / "clbench" / "plugin_index.json").read_text())[
    "modules"].values() for name, found in module.get("records", {}).get("strategy", {}).items() if found["private"]))
"""The shipped strategies that may train with dp, as the index records them (the full check's list: the parametrized
test below compares the two lines)."""

VALUES = {      # a wrong value that only the strategy's Config or the scenario's sizes know: (file, its refusal)
    "epochs -1": ("suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: replay, args: {epochs: -1}}\n",
                  "strategies[0] (replay): args.epochs: -1 is out of range: epochs must be >= 1"),
    "mem_size above the stream": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: replay, args: {mem_size: 100000}}\n",
        "strategies[0] (replay): args.mem_size 100,000 is more than the 1,257 training samples in the whole stream "
        "of scenarios[0] (split_digits); set mem_size to at most 1,257 (every strategy of a suite runs on every "
        "scenario: put the entries in separate suites to use other values)."),
    "batch_size above the stream": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: replay, args: {batch_size: 1000000000000}}\n",
        "strategies[0] (replay): args.batch_size 1,000,000,000,000 is more than the 1,257 training samples in the "
        "whole stream of scenarios[0] (split_digits); set batch_size to at most 1,257 (every strategy of a suite runs "
        "on every scenario: put the entries in separate suites to use other values)."),
    "unknown optimizer": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: replay, args: {optimizer: sgdd}}\n",
        "strategies[0] (replay): args.optimizer: unknown optimizer 'sgdd'. Did you mean 'sgd'? Choose one of: adam, "
        "adamw, sgd."),
    "preset with model_args": (     # the preset's model_args are left to the full check, the rest checked here
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: adapter_par, preset: full, args: {epochs: -1}}\n",
        "strategies[0] (adapter_par): args.epochs: -1 is out of range: epochs must be >= 1"),
    # a scenario's or a callback's argument: checked against the factory's keyword parameters the index records
    "scenario: unknown argument": (
        "suite: x\nscenarios: [{name: split_cifar100, args: {n_experience: 5}}]\nstrategies: [naive]\n",
        "scenarios[0] (split_cifar100): args: unknown key 'n_experience'. Did you mean 'n_experiences'? Allowed keys: "
        "n_experiences, initial_classes, class_order, classes, max_per_class, default_model, data_root, holdout, "
        "valid_fraction."),
    "scenario: argument of the wrong type": (
        "suite: x\nscenarios: [{name: split_mnist, args: {n_experiences: five}}]\nstrategies: [naive]\n",
        "scenarios[0] (split_mnist): args.n_experiences: expected an int, got 'five'"),
    "scenario: argument out of range": (
        "suite: x\nscenarios: [{name: split_cifar100, args: {valid_fraction: 1.5}}]\nstrategies: [naive]\n",
        "scenarios[0] (split_cifar100): args.valid_fraction: 1.5 is out of range: valid_fraction must be in (0, 1)"),
    "dp: unknown key": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, dp: {epsilon: 3.0, clip_norm: 1.0}}\n",
        "strategies[0] (naive).dp[0].args (callback 'dp'): unknown key 'clip_norm'. Did you mean 'clip' or "
        "'clipping'? Allowed keys: epsilon, delta, clip, clipping, noise_multiplier, gamma."),
    "dp: wrong type": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, dp: {epsilon: three}}\n",
        "strategies[0] (naive).dp[0].args.epsilon: expected float or None, got 'three'"),
    "dp: gamma without automatic clipping": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, dp: {epsilon: 3.0, gamma: 0.5}}\n",
        "strategies[0] (naive).dp[0].args.gamma is used only with clipping: automatic (this entry's clipping is "
        "'flat'), so it would change nothing; remove it or set clipping."),
    "callback: argument out of range": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n"
        "  - {name: naive, callbacks: [{name: hook_trace, args: {batches: 0}}]}\n",
        "strategies[0] (naive).callbacks[0].args.batches: 0 is out of range: batches must be >= 1"),
    "dp: clip 0": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, dp: {epsilon: 3.0, clip: 0}}\n",
        "strategies[0] (naive): dp: clip (the clipping norm R) must be > 0, got 0.0."),
    "dp: epsilon and noise_multiplier": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n"
        "  - {name: naive, dp: {epsilon: 3.0, noise_multiplier: 1.0}}\n",
        "strategies[0] (naive): dp: give exactly one of epsilon (a target budget; the noise is calibrated) or "
        "noise_multiplier (sigma; epsilon is then reported)."),
    "dp: epsilon no noise reaches": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: naive, dp: {epsilon: 0.01, delta: 1e-5}}\n",
        "strategies[0] (naive): dp: no noise multiplier reaches epsilon=0.01 at delta=1e-05: the RDP accountant's "
        "epsilon there is above 0.1029 however much noise is added; set epsilon above 0.1029, or raise delta."),
    "dp: epsilon no noise reaches at the delta of a later scenario": (     # n from the index's recorded sizes
        "suite: x\nscenarios: [synthetic, {name: split_digits, label: d2}]\nstrategies:\n"
        "  - {name: naive, dp: {epsilon: 0.02}}\n",
        "strategies[0] (naive): dp: no noise multiplier reaches epsilon=0.02 at delta=1/n=0.000796 (1,257 training "
        "samples in scenarios[1] (d2)): the RDP accountant's epsilon there is above 0.03228 however much noise is "
        "added; set epsilon above 0.03228, or raise delta."),
    "dp: a strategy that cannot train privately": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n  - {name: replay, dp: {epsilon: 3.0}}\n",
        f"strategies[0] (replay): dp: strategy 'replay' is not known to use each sample in one training call only, so "
        f"its epsilon cannot be accounted; private strategies: {PRIVATE}."),
    "dp: a private strategy with a rehearsal memory": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n"
        "  - {name: adapter_par, preset: cpu, args: {mem_size: 10}, callbacks: [{name: dp, args: {epsilon: 3.0}}]}\n",
        "strategies[0] (adapter_par): dp with a rehearsal memory (mem_size 10) is refused: replayed samples are "
        "trained on in several experiences, so the per-experience epsilon would understate theirs; set mem_size: 0."),
    "vit: heads": (
        "suite: x\nscenarios: [split_digits]\nstrategies:\n"
        "  - {name: naive, args: {model: vit, model_args: {num_heads: 5}}}\n",
        "strategies[0] (naive): model_args: num_heads 5 does not divide embed_dim 64 (each head takes embed_dim / "
        "num_heads dimensions); set num_heads to a divisor of 64."),
    "vit: patch": (
        "suite: x\nscenarios: [split_cifar100]\nstrategies:\n"
        "  - {name: naive, args: {model: vit, model_args: {patch_size: 5}}}\n",
        "strategies[0] (naive): model_args: patch_size 5 does not divide the image height 32 of scenarios[0] "
        "(split_cifar100) (the image is cut into patch_size x patch_size patches); set patch_size to a divisor of "
        "32."),
    "vit: patch on the second scenario": (
        "suite: x\nscenarios: [split_digits, split_mnist]\nstrategies:\n"
        "  - {name: naive, args: {model: vit, model_args: {patch_size: 8}}}\n",
        "strategies[0] (naive): model_args: patch_size 8 does not divide the image height 28 of scenarios[1] "
        "(split_mnist) (the image is cut into patch_size x patch_size patches); set patch_size to a divisor of 28."),
}


def factory_with_a_dependent_argument(*, a: Annotated[int, typecheck.Declared(only_with=typecheck.only_with("b", 1))]
                                      = 0, **others) -> None:
    """``a`` is used only with ``b: 1``, which is not a parameter (it arrives through ``**others``)."""


LAUGHS = "".join(f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcde", "bcdef"))


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(("text", "expected"), [
    ("suite: a\nsuite: b\n", "s.yaml: suite is given twice (lines 1 and 2)"),
    ("suite: x\nscenarios: [split_digits]\nstrategies:\n  - name: replay\n    args: {epochs: 1, epochs: 3}\n",
     "s.yaml: strategies[0].args.epochs is given twice (lines 5 and 5)"),
    ("suite: x\nscenarios:\n  - name: synthetic\n    args:\n      n_classes: 4\n      n_classes: 6\n",
     "s.yaml: scenarios[0].args.n_classes is given twice (lines 5 and 6)"),
])
def test_a_key_given_twice_is_refused_naming_the_entry_and_the_key(tmp_path, text, expected):
    message = _yaml_refusal(tmp_path, text)
    assert message.startswith(expected), message
    assert "keep one" in message


def test_of_several_keys_given_twice_the_first_in_the_document_is_named_and_an_anchor_where_it_stands(tmp_path):
    """The walk goes in document order: of two mappings with a key given twice the first one is named, and a
    mapping reused through aliases is named at its anchor (the aliases that follow are the same node)."""
    assert _yaml_refusal(tmp_path, "a: {k: 1, k: 2}\nb: {j: 1, j: 2}\n").startswith(
        "s.yaml: a.k is given twice (lines 1 and 1)")
    assert _yaml_refusal(tmp_path, "x: &x {a: 1, a: 2}\ny: [*x, *x]\n").startswith(
        "s.yaml: x.a is given twice (lines 1 and 1)")


def test_the_duplicate_key_walk_reads_each_node_once_so_it_ends_on_its_own():
    """Without the expansion check before it, an alias to itself or a wide fan of aliases must not make the walk
    loop or expand: each node's children are read once (a walk that followed aliases would never end on
    ``a: &a [*a]`` and would read ``x`` 1,001 times below)."""
    import yaml

    class Counted(yaml.SequenceNode):
        reads = 0

        @property
        def value(self):
            Counted.reads += 1
            assert Counted.reads <= 10, "the walk reads nodes again: it follows aliases"
            return self._value

        @value.setter
        def value(self, value):
            self._value = value

    seq = "tag:yaml.org,2002:seq"
    itself = Counted(seq, [])
    itself.value.append(itself)
    Counted.reads = 0
    suite_file._check_duplicate_keys(Path("s.yaml"), itself)
    assert Counted.reads == 1
    x = Counted(seq, [yaml.ScalarNode("tag:yaml.org,2002:int", "1")] * 50)
    root = Counted(seq, [x, Counted(seq, [x] * 1000)])
    Counted.reads = 0
    suite_file._check_duplicate_keys(Path("s.yaml"), root)
    assert Counted.reads == 3


def test_the_same_key_in_sibling_mappings_and_a_merge_key_are_not_duplicates(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("base: &b {epochs: 1}\nstrategies:\n  - {name: a, args: {epochs: 2}}\n"
                    "  - {name: b, args: {<<: *b, lr: 0.1}}\n")
    assert suite_file.read_yaml(path)["strategies"][1]["args"] == {"epochs": 1, "lr": 0.1}


# ---------------------------------------------------------------------------------- values against the scenario
def test_mem_size_is_at_most_the_training_samples_of_the_stream():
    """split_digits (test_fraction 0.2) trains on 1,437 samples: 1437 is every sample, 1438 or the issue's 100000
    would be the same run under another number."""
    digits = [{"name": "split_digits", "args": {"test_fraction": 0.2}}]
    _parse(digits, [{"name": "replay", "args": {"mem_size": 1437}}])
    message = _refused(digits, [{"name": "replay", "args": {"mem_size": 1438}}])
    assert message == ("s.yaml: strategies[0] (replay): args.mem_size 1,438 is more than the 1,437 training samples "
                       "in the whole stream of scenarios[0] (split_digits); set mem_size to at most 1,437 (every "
                       "strategy of a suite runs on every scenario: put the entries in separate suites to use other "
                       "values).")
    assert "100,000 is more than" in _refused(digits, [{"name": "replay", "args": {"mem_size": 100000}}])


def test_a_size_above_what_any_scenario_arguments_give_is_refused_before_the_imports():
    """`batch_size: 10^12` on split_digits with arguments no shipped suite gives (their sizes are not in the index)
    was refused only after the imports: the scenario's recorded limit (no arguments give more than 1,787 training
    samples) refuses it from the index, in one line."""
    from clbench import recorded
    from clbench.plugins import record

    digits = [{"name": "split_digits", "args": {"n_experiences": 2, "test_fraction": 0.25}}]
    assert recorded.recorded_sizes(record("scenario", "split_digits"), digits[0]["args"]) is None
    with pytest.raises(ConfigError) as refused:
        suite_file._check_recorded_values("s.yaml", digits, [{"name": "naive", "args": {"batch_size": 10 ** 12}}])
    assert str(refused.value) == (
        "s.yaml: strategies[0] (naive): args.batch_size 1,000,000,000,000 is more than the 1,787 training samples in "
        "the whole stream that scenarios[0] (split_digits) can have with any arguments; set batch_size to at most "
        "its stream's size.")
    suite_file._check_recorded_values("s.yaml", digits, [{"name": "naive", "args": {"batch_size": 1787}}])
    assert "more than the 1,347 training samples in the whole stream of scenarios[0]" in _refused(
        digits, [{"name": "naive", "args": {"batch_size": 1787}}])         # the exact size, after the imports


def test_every_scenario_of_the_suite_bounds_the_memory():
    synthetic = {"name": "synthetic", "label": "syn", "args": {"train_per_class": 10}}     # 60 samples
    message = _refused(["split_digits", synthetic], [{"name": "replay", "args": {"mem_size": 61}}])
    assert "60 training samples in the whole stream of scenarios[1] (syn)" in message
    _parse(["split_digits", synthetic], [{"name": "replay", "args": {"mem_size": 60}}, "naive"])


def test_shards_are_at_most_the_samples_of_the_smallest_experience():
    synthetic = [{"name": "synthetic", "args": {"train_per_class": 10, "n_classes": 6, "n_experiences": 3}}]
    _parse(synthetic, [{"name": "taft_shards", "preset": "cpu", "args": {"n_shards": 20}}])
    message = _refused(synthetic, [{"name": "taft_shards", "preset": "cpu", "args": {"n_shards": 21}}])
    assert "args.n_shards 21 is more than the 20 training samples in its smallest experience" in message
    assert "n_shards 2,000 is more than the 248" in _refused(
        ["split_digits"], [{"name": "taft_shards", "preset": "cpu", "args": {"n_shards": 2000}}])


def test_every_declared_size_bound_names_a_known_size():
    assert set(typecheck.SIZE_BOUNDS.values()) <= set(typecheck.SCENARIO_SIZES)
    for name in SCENARIOS.names():
        sizes = getattr(SCENARIOS.get(name), "sizes", None)
        if sizes is not None:
            assert set(sizes()) <= set(typecheck.SCENARIO_SIZES), name


@pytest.mark.parametrize(("scenario", "expected"), [
    ({"name": "split_digits", "args": {"test_fraction": 1.5}}, "args.test_fraction: 1.5 is out of range: "
                                                                "test_fraction must be in (0, 1)"),
    ({"name": "split_digits", "args": {"test_fraction": 0.0}}, "test_fraction must be in (0, 1)"),
    ({"name": "synthetic", "args": {"n_experiences": 100000}}, "6 classes cannot be split into 100000 experiences"),
    ({"name": "split_mnist", "args": {"n_experiences": 100000}}, "10 classes cannot be split into 100000"),
    ({"name": "split_fmnist", "args": {"n_experiences": 3}}, "10 classes cannot be split into 3"),
    ({"name": "games_seqrec", "args": {"n_experiences": 2}}, "games_seqrec has one experience only"),
    ({"name": "movielens_seqrec", "args": {"holdout": "train"}}, "holdout must be one of ('test', 'valid')"),
    ({"name": "movielens1m_seqrec", "args": {"windows": "first"}}, "windows one of ('all', 'last')"),
    ({"name": "movielens_seqrec", "args": {"n_experiences": 100000}},
     "n_experiences 100000: 100,000 interactions make at most 50,000 time periods"),
    ({"name": "movielens1m_seqrec", "args": {"n_experiences": 600000}}, "1,000,209 interactions make at most"),
    ({"name": "movielens_seqrec", "args": {"max_len": 0}}, "n_experiences and max_len must be positive"),
    ({"name": "games_seqrec", "args": {"max_len": 0}}, "n_experiences and max_len must be positive"),
])
def test_a_scenario_argument_it_would_refuse_when_built_is_refused_at_load(scenario, expected):
    strategy = "seqrec" if "seqrec" in scenario["name"] else "naive"
    message = _refused([scenario], [strategy])
    assert message.startswith(f"s.yaml: scenarios[0] ({scenario['name']}): args") and expected in message, message


# ------------------------------------------------------------------------------------ settings that change nothing
def test_dp_gamma_is_refused_unless_clipping_is_automatic():
    message = _refused(["split_digits"], [{"name": "naive", "dp": {"epsilon": 3.0, "clip": 1.0, "gamma": 0.5}}])
    assert message == ("s.yaml: strategies[0] (naive).dp[0].args.gamma is used only with clipping: automatic (this "
                       "entry's clipping is 'flat'), so it would change nothing; remove it or set clipping.")
    assert "this entry's clipping is 'flat'" in _refused(
        ["split_digits"], [{"name": "naive", "dp": {"epsilon": 3.0, "clipping": "flat", "gamma": 0.5}}])
    _parse(["split_digits"], [{"name": "naive", "dp": {"epsilon": 3.0, "clipping": "automatic", "gamma": 0.5}}])


@pytest.mark.parametrize("batches", [-1, 0])
def test_hook_trace_batches_below_one_are_refused(batches):
    message = _refused(["split_digits"], [{"name": "naive", "callbacks": [{"name": "hook_trace",
                                                                          "args": {"batches": batches}}]}])
    assert message == (f"s.yaml: strategies[0] (naive).callbacks[0].args.batches: {batches} is out of range: batches "
                       f"must be >= 1")
    _parse(["split_digits"], [{"name": "naive", "callbacks": [{"name": "hook_trace", "args": {"batches": 1}}]}])


def test_a_malformed_suite_is_refused_without_importing_torch_avalanche_or_a_plugin_module(tmp_path):
    """Each malformed file: one error line, exit code 2, and neither torch, Avalanche nor a strategy or scenario
    module imported (the refusal costs no import; benchmarks/refusal_time.py measures it)."""
    paths = _written(tmp_path, MALFORMED)
    results, heavy = _refusals_in_a_fresh_process(paths)
    for path, (code, err) in zip(paths, results):
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}"), (path.name, err)
    assert heavy == [], heavy


def test_a_wrong_value_is_refused_from_the_index_without_importing_torch_avalanche_or_the_strategy(tmp_path):
    """A value out of the Config's range, a choice the Config does not offer and a memory larger than the stream:
    the full check's line, from what the registries' index records (clbench.recorded), with no heavy import."""
    paths = _written(tmp_path, {name: text for name, (text, _) in VALUES.items()})
    results, heavy = _refusals_in_a_fresh_process(paths)
    for path, (_, line), (code, err) in zip(paths, VALUES.values(), results):
        assert (code, err) == (2, f"error: {path}: {line}\n")
    assert heavy == [], heavy


@pytest.mark.parametrize(("scenarios", "strategies"), [
    (["split_digits"], [{"name": "replay", "args": {"epochs": -1}}]),
    (["split_digits"], ["naive", {"name": "replay", "args": {"mem_sise": 10}}]),
    (["split_digits"], [{"name": "ewc", "args": {"lr": "fast"}}]),
    (["split_digits"], [{"name": "ewc", "args": {"mode": "offline"}}]),
    (["split_digits"], [{"name": "ewc", "args": {"mode": "online", "decay_factor": 0}}]),
    (["split_digits"], [{"name": "ewc", "args": {"decay_factor": 0.5}}]),
    (["split_digits"], [{"name": "replay", "args": {"optimizer": "sgdd"}}]),
    (["split_digits"], [{"name": "replay", "args": {"model": "mlpp"}}]),
    (["split_digits"], [{"name": "replay", "preset": "cpuu"}]),
    (["split_digits"], [{"name": "replay", "preset": "cpu", "args": {"momentum": 0.5}}]),
    (["split_digits"], [{"name": "seqrec", "args": {"sigma_dp": 1.0}}]),
    (["split_digits"], [{"name": "replay", "args": {"mem_size": 1258}}]),
    (["split_digits"], [{"name": "taft_shards", "preset": "cpu", "args": {"n_shards": 249}}]),
    (["split_digits"], [{"name": "lora", "preset": "full", "args": {"lr": 0}}]),
    ([{"name": "split_mnist", "args": {"max_per_class": 200, "n_experiences": 5}}],
     [{"name": "der_dark", "args": {"mem_size": 2001}}]),
    # an entry the index leaves to the full check (model_args) before a labelled one it refuses, named by its label
    (["split_digits"], [{"name": "replay", "args": {"model_args": {}}},
                        {"name": "replay", "label": "big", "args": {"mem_size": 1258}}]),
    # the size refusal names a labelled scenario by its label
    ([{"name": "split_digits", "label": "digits"}], [{"name": "replay", "args": {"mem_size": 1258}}]),
    # a preset carrying model_args: those are left to the full check, the preset's other values checked here
    (["split_digits"], [{"name": "adapter_par", "preset": "full", "args": {"epochs": -1}}]),
    # a model factory's divisibility rules, between its arguments and against a later scenario's input shape
    (["split_digits"], [{"name": "naive", "args": {"model": "vit", "model_args": {"num_heads": 5}}}]),
    (["split_digits", {"name": "split_mnist", "label": "m"}],
     [{"name": "naive", "args": {"model": "vit", "model_args": {"patch_size": 8}}}]),
    # dp: a budget's values in the budget's own words (before its declared ranges and choices), in the dp: key and
    # as a callback; an epsilon no noise reaches at the scenario's delta
    (["split_digits"], [{"name": "naive", "dp": {"epsilon": 0.0}}]),
    (["split_digits"], [{"name": "naive", "dp": {"epsilon": 3.0, "delta": 1.0}}]),
    (["split_digits"], [{"name": "naive", "callbacks": [{"name": "dp", "args": {"epsilon": 3.0, "clip": -1}}]}]),
    (["split_digits"], [{"name": "naive", "dp": {"epsilon": 3.0, "clipping": "adaptive"}}]),
    (["split_digits"], [{"name": "naive", "dp": {"epsilon": 0.02}}]),
    (["split_digits"], [{"name": "naive", "dp": {"epsilon": 3.0, "clipp": 1.0}}]),
    # another callback's argument out of its declared range
    (["split_digits"], [{"name": "naive", "callbacks": [{"name": "hook_trace", "args": {"batches": 0}}]}]),
    # dp: a strategy not declared private (the list of those that are), a private one failing its private_needs
    (["split_digits"], [{"name": "replay", "dp": {"epsilon": 3.0}}]),
    (["split_digits"], [{"name": "adapter_par", "preset": "cpu", "args": {"mem_size": 10}, "dp": {"epsilon": 3.0}}]),
    (["split_digits"], [{"name": "adapter_par", "preset": "cpu", "args": {"mem_size": 10},
                         "callbacks": [{"name": "dp", "args": {"epsilon": 3.0}}]}]),
])
def test_the_index_refuses_a_value_with_the_line_of_the_full_check(monkeypatch, scenarios, strategies):
    """Each value refused before any import (from the index's records) is refused in the same words by the full
    check (the index disabled)."""
    monkeypatch.setattr(suite_file, "only_shipped", lambda: True)   # this process has test plugins registered
    entries = [[{"name": e} if isinstance(e, str) else e for e in entries] for entries in (scenarios, strategies)]
    with pytest.raises(ConfigError) as early:
        suite_file._check_recorded_values("s.yaml", *entries)
    monkeypatch.setattr(suite_file, "record", lambda kind, name: None)
    assert str(early.value) == _refused(scenarios, strategies)


def test_the_index_leaves_to_the_full_check_what_it_does_not_record(monkeypatch):
    """Sizes for arguments no shipped suite gives, ``model_args`` in args, an ``only_with`` that is a function, and
    a model registered outside clbench (computed choices are then the full check's) are not refused early."""
    from clbench import plugins, registry

    monkeypatch.setattr(registry, "OUTSIDE", set())
    monkeypatch.setattr(plugins, "only_shipped", lambda: True)     # no outside plugin module known
    monkeypatch.setattr(suite_file, "only_shipped", registry.only_shipped)
    digits, outside_net = [{"name": "split_digits"}], [{"name": "replay", "args": {"model": "outside_net"}}]
    suite_file._check_recorded_values("s.yaml", [{"name": "split_digits", "args": {"test_fraction": 0.2}}],
                                      [{"name": "replay", "args": {"mem_size": 1438}}])
    suite_file._check_recorded_values("s.yaml", digits,
                                      [{"name": "replay", "args": {"epochs": -1, "model_args": {}}},
                                       {"name": "dytox", "args": {"warmup_epochs": 0, "warmup_lr": 0.1}}])
    with pytest.raises(ConfigError, match="unknown model 'outside_net'"):
        suite_file._check_recorded_values("s.yaml", digits, outside_net)
    monkeypatch.setattr(registry.MODELS, "_entries", {**registry.MODELS._entries})
    monkeypatch.setattr(registry.MODELS, "origins", {**registry.MODELS.origins})
    registry.MODELS.register("outside_net")(object)
    suite_file._check_recorded_values("s.yaml", digits, outside_net)


def test_a_yaml_error_is_cut_to_300_characters(tmp_path):
    """PyYAML's message (here naming a 400-character alias) is kept to its first 300 characters."""
    message = "found undefined alias '" + "a" * 400
    assert _yaml_refusal(tmp_path, "suite: *" + "a" * 400 + "\n") == "s.yaml: not valid YAML: " + message[:300]


def test_an_argument_used_only_with_one_that_is_not_given_is_refused():
    signature = suite_file.Signature.of(factory_with_a_dependent_argument)
    with pytest.raises(ConfigError) as info:
        signature.check_used("w", {"a": 1})
    assert str(info.value) == ("w.args.a is used only with b: 1 (this entry's b is None), so it would change nothing; "
                               "remove it or set b.")
    signature.check_used("w", {"a": 1, "b": 1})
    signature.check_used("w", {"b": 2})


def test_installed_looks_a_module_up_without_importing_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "clbench_test_blocked", None)
    assert not suite_file._installed("clbench_test_blocked")
    assert suite_file._installed("json") and suite_file._installed("yaml")
    assert not suite_file._installed("clbench_no_such_module")
    assert not suite_file._installed("clbench_no_such_module.child")     # find_spec raises: its parent is missing
    assert "clbench_no_such_module" not in sys.modules


@pytest.mark.parametrize(("text", "expected"), [
    ("a: &a [*a]\n", "s.yaml: an anchor contains an alias to itself; a suite is a finite tree."),
    ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + LAUGHS, "s.yaml: expands to more than 100,000 values through its "
                                                          "anchors and aliases"),
])
def test_anchors_that_expand_into_themselves_or_past_the_limit_are_refused(tmp_path, text, expected):
    message = _yaml_refusal(tmp_path, text)
    assert message.startswith(expected), message


def test_an_anchor_used_several_times_within_the_limit_reads_as_written(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("x: &x [1, 2, 3]\ny: [*x, *x, *x]\nz: &z {k: *x}\nw: [*z, *z]\n")
    assert suite_file.read_yaml(path) == {"x": [1, 2, 3], "y": [[1, 2, 3]] * 3, "z": {"k": [1, 2, 3]},
                                          "w": [{"k": [1, 2, 3]}] * 2}


def test_read_yaml_refuses_what_is_not_a_suite_file_in_one_line_naming_it(tmp_path):
    def refusal(path: Path) -> str:
        with pytest.raises(ConfigError) as info:
            suite_file.read_yaml(path)
        return str(info.value)

    limit = suite_file.MAX_SUITE_BYTES
    path = tmp_path / "s.yaml"
    path.write_text("#" * (limit - 1) + "\n")                     # a comment of exactly the limit: no document
    assert suite_file.read_yaml(path) is None
    path.write_text("#" * limit + "\n")
    assert refusal(path) == (f"{path}: {limit + 1:,} bytes; a suite file is at most {limit:,} bytes (is it a suite "
                             f".yaml?).")
    path.write_bytes(b"suite: \xff\n")
    assert refusal(path) == f"{path}: not a text file (byte 7 is not UTF-8); pass a suite .yaml file."
    assert refusal(tmp_path) == f"{tmp_path}: cannot be read (Is a directory)."
    path.write_text("suite: " + "[" * 51 + "]" * 51 + "\n")
    assert refusal(path) == f"{path}: nested more than 50 levels deep (line 1); a suite nests a few levels."
    path.write_text("? [a, b]\n: 1\n")                                 # a key that is a list: not a suite's
    assert refusal(path).startswith(f"{path}: not valid YAML: while constructing a mapping")
    path.write_text("")
    assert suite_file.read_yaml(path) is None


# ------------------------------------------------------------------------------ the loader's refusals, word for word
def test_a_setting_used_only_with_another_value_is_refused_naming_both():
    assert _refused(["split_digits"], [{"name": "der", "args": {"momentum": 0.5, "optimizer": "adam"}}]) == (
        "s.yaml: strategies[0] (der): args.momentum is used only with optimizer: sgd (this entry's optimizer is "
        "'adam'), so it would change nothing; remove it or set optimizer.")
    _parse(["split_digits"], [{"name": "der", "args": {"momentum": 0.5, "optimizer": "sgd"}}])
    from clbench.config import build_config

    with pytest.raises(ConfigError, match=r"^strategy 'der': args.momentum is used only with optimizer: sgd"):
        build_config("der", None, {"momentum": 0.5, "optimizer": "adam"})


def test_a_strategy_crossed_with_a_scenario_of_another_kind_is_refused():
    assert _refused(["synthetic", "split_digits"], ["naive", "seqrec"]) == (
        "s.yaml: strategies[1] (seqrec): it serves next_item scenarios, and scenarios[0] (synthetic) is a "
        "classification scenario; every strategy of a suite runs on every scenario, so put them in separate suites.")


def test_dp_refuses_a_rehearsal_memory_and_a_missing_opacus(monkeypatch):
    lora = {"name": "lora", "preset": "cpu", "dp": {"epsilon": 3.0}}
    _parse(["split_digits"], [lora])                                    # the entry's config reaches the check
    assert _refused(["split_digits"], [{**lora, "args": {"mem_size": 10}}]) == (
        "s.yaml: strategies[0] (lora): dp with a rehearsal memory (mem_size 10) is refused: replayed samples are "
        "trained on in several experiences, so the per-experience epsilon would understate theirs; set mem_size: 0.")
    monkeypatch.setattr(suite_file, "_installed", lambda module: module != "opacus")
    assert _refused(["split_digits"], [lora]) == (
        "s.yaml: strategies[0] (lora): dp needs opacus (its accountant calibrates the noise), which is not "
        "installed: pip install 'clbench[dp]', or remove the dp entry.")


def test_parse_callbacks_names_where_the_list_came_from():
    with pytest.raises(ConfigError) as info:
        suite_file.parse_callbacks("--callbacks", 3)
    assert str(info.value).startswith("--callbacks: expected a list of entries")
    with pytest.raises(ConfigError) as info:
        suite_file.parse_callbacks("--callbacks", ["hook_trace", "hook_trac"])
    assert str(info.value).startswith("--callbacks[1]: unknown callback 'hook_trac'. Did you mean 'hook_trace'?")
    assert suite_file.parse_callbacks("--callbacks", [{"name": "hook_trace", "args": {"batches": "2"}}]) == (
        {"name": "hook_trace", "args": {"batches": 2}},)


@pytest.mark.parametrize(("text", "line"), [
    ("a: 1\nb: " + _nested(suite_file.MAX_SUITE_DEPTH), 2),                  # the mapping + 50 lists
    ("a: [[[1]]]\nb:\n  - [[1], " + _nested(suite_file.MAX_SUITE_DEPTH - 2) + "]\n", 3),   # after closed siblings
])
def test_nesting_past_the_limit_is_refused_at_its_line_and_the_limit_itself_is_read(tmp_path, text, line):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        suite_file.read_yaml(path)
    assert str(info.value) == (f"{path}: nested more than {suite_file.MAX_SUITE_DEPTH} levels deep (line {line}); a "
                               f"suite nests a few levels.")
    path.write_text("a: 1\nb: " + _nested(suite_file.MAX_SUITE_DEPTH - 1) + "\nc: [[1], [2], [[3]]]\n")
    assert suite_file.read_yaml(path)["c"] == [[1], [2], [[3]]]


def test_entry_lists_are_non_empty_and_their_names_short_strings():
    assert _refused([], ["naive"]) == ("s.yaml: scenarios: expected a non-empty list of entries, each a mapping with "
                                       "keys ('name', 'args', 'label').")
    assert _refused(["split_digits"], [{"name": 3}]) == (
        "s.yaml: strategies[0].name: expected a registered name (a string of at most 100 characters), got 3.")
    long = "x" * (suite_file.MAX_NAME + 1)
    assert _refused([long], ["naive"]).startswith("s.yaml: scenarios[0].name: expected a registered name (a string "
                                                  "of at most 100 characters), got 'xxxx")
    assert _refused(["x" * suite_file.MAX_NAME], ["naive"]).startswith("s.yaml: scenarios[0]: unknown scenario")


def test_a_strategy_serving_several_kinds_names_them_all(monkeypatch):
    from clbench.registry import STRATEGIES

    monkeypatch.setattr(STRATEGIES.get("seqrec"), "scenario_kinds", ("next_item", "ranking"))
    assert "(seqrec): it serves next_item or ranking scenarios, and scenarios[0] (split_digits) is a classification" \
        in _refused(["split_digits"], ["seqrec"])


@pytest.mark.parametrize(("leaves", "refused"), [(96, False), (97, True)])
def test_the_expansion_limit_counts_every_node_once_per_use(tmp_path, leaves, refused):
    """x: 99 leaves (100 nodes); the document: 1 + (1 + 100) + (1 + (1 + 998 * 100 + leaves)) nodes, which is
    exactly MAX_SUITE_NODES (100,000) with 96 leaves: accepted; one more is refused."""
    path = tmp_path / "s.yaml"
    path.write_text("x: &x [" + ", ".join(["1"] * 99) + "]\ny: [" + ", ".join(["*x"] * 998 + ["1"] * leaves) + "]\n")
    if refused:
        with pytest.raises(ConfigError, match="expands to more than 100,000 values"):
            suite_file.read_yaml(path)
    else:
        assert len(suite_file.read_yaml(path)["y"]) == 998 + leaves


@pytest.mark.parametrize("plugins", ["my_plugin", [""], [1], ["ok", None]], ids=["string", "empty", "number", "none"])
def test_plugins_that_are_not_a_list_of_non_empty_names_are_refused_with_the_exact_line(plugins):
    with pytest.raises(ConfigError) as info:
        suite_file._load_plugins("s.yaml", plugins)
    assert str(info.value) == f"s.yaml: 'plugins' must be a list of module names or .py files, got {plugins!r}."


def test_a_scenario_without_check_args_loads_on_its_declarations_alone():
    """``check_args`` is optional (split_imagenet_subset learns its class counts from its folder, when built): a
    scenario without it is checked on its parameters' declarations and loads."""
    assert not hasattr(SCENARIOS.get("split_imagenet_subset"), "check_args")
    spec = suite_file.parse_suite({"suite": "x", "scenarios": [{"name": "split_imagenet_subset",
                                                                 "args": {"n_experiences": 2}}],
                                   "strategies": ["naive"]})
    assert spec.scenarios[0].args == {"n_experiences": 2}


def test_a_plugin_file_is_found_beside_the_suite_file_not_in_the_working_directory(tmp_path, monkeypatch):
    """``plugins: [x.py]`` is relative to the suite file (a suite and its plugin travel together), whatever the
    working directory."""
    from clbench import plugins

    folder, elsewhere = tmp_path / "suite", tmp_path / "cwd"
    folder.mkdir(), elsewhere.mkdir()
    (folder / "beside_suite_plugin_37.py").write_text("LOADED = True\n")
    (folder / "s.yaml").write_text("suite: s\nplugins: [beside_suite_plugin_37.py]\nscenarios: [split_digits]\n"
                                   "strategies: [naive]\n")
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv(plugins.ENV, "")
    monkeypatch.setattr(plugins, "_loaded_specs", {})
    monkeypatch.delitem(sys.modules, "beside_suite_plugin_37", raising=False)
    suite_file.load_suite(folder / "s.yaml")
    assert sys.modules["beside_suite_plugin_37"].LOADED
    sys.modules.pop("beside_suite_plugin_37")


def test_a_strategy_entry_s_callback_names_are_checked_before_its_values(monkeypatch):
    """An unknown callback name in a strategy entry is named first, before the entry's values are checked (names are
    read from the registries' index; values need the strategy's Config)."""
    message = _refused(["split_digits"], [{"name": "replay", "args": {"epochs": -1}, "callbacks": ["no_such_cb"]}])
    assert message.startswith("s.yaml: strategies[0] (replay).callbacks[0]: unknown callback 'no_such_cb'.")


def test_a_plugin_that_fails_to_load_is_refused_naming_the_suite_and_the_plugin():
    with pytest.raises(ConfigError) as info:
        suite_file.parse_suite({"suite": "s", "scenarios": ["split_digits"], "strategies": ["naive"],
                                "plugins": ["no_such_plugin_module"]}, "s.yaml")
    assert str(info.value) == ("s.yaml: plugin 'no_such_plugin_module' failed to load: ModuleNotFoundError: No "
                               "module named 'no_such_plugin_module'")


@pytest.mark.parametrize(("text", "expected"), [
    ("suite: mine\nseeds: [0]\n", "mine"),                 # the rest of the file is not read
    ("seeds: [0]\n", None),                                 # no suite: key
    ("suite: ../up\n", None),                               # a name that leaves results/
    ("- suite\n", None),                                    # not a mapping
    ("suite: [a\n", None),                                  # not YAML
])
def test_suite_name_reads_only_the_name_and_gives_none_for_what_load_suite_refuses(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert suite_file.suite_name(path) == expected
    assert suite_file.suite_name(str(path)) == expected


def test_suite_name_of_a_shipped_suite_and_of_a_missing_file():
    assert suite_file.suite_name("quick") == "quick"
    assert suite_file.suite_name("no_such_suite") is None
    assert suite_file.suite_name("missing/s.yaml") is None


def test_check_without_imports_refuses_a_file_as_load_suite_does_and_passes_a_good_one(tmp_path):
    """A value the index refuses, read from a file path (str or Path) or a shipped name: the same line as
    load_suite's; a good file and a shipped suite pass."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(GOOD))
    bad.write_text(yaml.safe_dump({**GOOD, "strategies": [{"name": "replay", "args": {"epochs": -1}}]}))
    assert suite_file.check_without_imports(good) is None and suite_file.check_without_imports("quick") is None
    with pytest.raises(ConfigError) as loaded:
        load_suite(bad)
    for suite in (bad, str(bad)):
        with pytest.raises(ConfigError) as early:
            suite_file.check_without_imports(suite)
        assert str(early.value) == str(loaded.value)
        assert str(early.value).startswith(f"{bad}: strategies[0] (replay): ")


@pytest.mark.parametrize("name", list(VALUES))
def test_each_value_the_index_knows_is_refused_in_process_before_the_imports(tmp_path, monkeypatch, name):
    """The cases of the fresh-process test above, in this process (where the checks of the index phase can be
    followed): check_without_imports refuses each with its exact line, from the records alone."""
    monkeypatch.setattr(suite_file, "only_shipped", lambda: True)   # this process has test plugins registered
    text, line = VALUES[name]
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as early:
        suite_file.check_without_imports(path)
    assert str(early.value) == f"{path}: {line}"


def test_a_recorded_signature_skips_only_the_only_with_rules_whose_other_setting_it_does_not_record():
    """A signature read from the index knows the types of some parameters only: a rule whose other setting has no
    recorded type is left to the full check, and the rules after it are still checked."""
    declared = {"a": typecheck.Declared(only_with=typecheck.only_with("c", 1)),
                "b": typecheck.Declared(only_with=typecheck.only_with("d", 1))}
    signature = suite_file.Signature(("a", "b", "c", "d"), False, {"a": int, "b": int, "d": int}, declared, {"d": 0},
                                     complete=False)
    with pytest.raises(ConfigError) as refused:
        signature.check_used("w", {"a": 5, "b": 5})
    assert str(refused.value) == ("w.args.b is used only with d: 1 (this entry's d is 0), so it would change nothing; "
                                  "remove it or set d.")
    signature.check_used("w", {"a": 5, "b": 5, "d": 1})


# --------------------------------------------------------------- dp on a plugin strategy, from the plugin index cache
def _source(origin: str = "installed", imported: bool = False, dynamic: frozenset = frozenset(), **declared):
    """A stand-in for a :class:`clbench.plugins.Source`: the strategy names its module declares (``declared``)."""
    from types import SimpleNamespace

    return SimpleNamespace(origin=origin, imported=imported, dynamic=set(dynamic),
                           declared={"strategy": dict.fromkeys(declared.get("strategies", ()), "")}
                           if "strategies" in declared else {"scenario": {"s": ""}})


@pytest.fixture
def private_world(monkeypatch):
    """Strategies already imported (``a`` private, ``b`` not, ``c`` without the attribute), the index's records of
    shipped strategies and the plugin index cache's flags, each set by the test through the returned setter."""
    from types import SimpleNamespace

    from clbench import plugins
    from clbench.registry import STRATEGIES

    monkeypatch.setattr(STRATEGIES, "_entries", {"a": SimpleNamespace(private=True), "b": SimpleNamespace(
        private=False), "c": SimpleNamespace()})
    world = SimpleNamespace(sources=[], records={}, flags={})
    monkeypatch.setattr(plugins, "sources", lambda: world.sources)
    monkeypatch.setattr(suite_file, "record", lambda kind, name: world.records.get(name) if kind == "strategy"
                        else None)
    monkeypatch.setattr(suite_file, "private_flag", lambda name: world.flags.get(name))
    return world


def test_the_private_strategies_are_listed_without_imports_only_when_every_flag_is_known(private_world):
    """``_private_names``: the imported strategies that declare ``private = True``, the shipped modules' from the
    index's records and the installed plugins' from their cache; an imported module's declarations are not read
    again, a module declaring no strategy is skipped; None (the full check lists them) as soon as one flag is not
    known: a shipped strategy the index does not record or records without ``private``, a plugin strategy its cache
    does not record, or a module that registers strategies under computed names."""
    w = private_world
    w.sources = [_source("shipped", imported=True, dynamic=frozenset({"strategy"}), strategies=["x"]),
                 _source("shipped", strategies=["s1", "s2"]), _source(), _source(strategies=["p1", "p2"])]
    w.records = {"s1": {"private": True}, "s2": {"private": False}}
    w.flags = {"p1": (True, "c.json"), "p2": (False, "c.json")}
    assert suite_file._private_names() == ["a", "p1", "s1"]
    for unknown in ({"records": {"s1": {"private": True}}}, {"records": {**w.records, "s2": {}}},
                    {"flags": {"p1": w.flags["p1"]}}):
        saved = {"records": w.records, "flags": w.flags}
        for key, value in unknown.items():
            setattr(w, key, value)
        assert suite_file._private_names() is None, unknown
        w.records, w.flags = saved["records"], saved["flags"]
    w.sources.append(_source(dynamic=frozenset({"strategy"})))
    assert suite_file._private_names() is None


def test_dp_on_a_plugin_strategy_whose_flag_says_not_private_is_refused_naming_the_file(private_world):
    """``_check_cached_private``: refused in the full check's words plus the file the flag was read from when the
    plugin's flag (from its cache or code) says not private and every other flag is known; passed when it says
    private, is not known, or another flag is not known (the full check decides after the imports)."""
    w = private_world
    w.sources = [_source(strategies=["p1", "p2"])]
    w.flags = {"p1": (True, "the code of /p/pkg.py"), "p2": (False, "the code of /p/pkg.py")}
    with pytest.raises(ConfigError) as info:
        suite_file._check_cached_private("s.yaml: strategies[0] (p2)", "p2")
    assert str(info.value) == (
        "s.yaml: strategies[0] (p2): dp: strategy 'p2' is not known to use each sample in one training call only, so "
        "its epsilon cannot be accounted; private strategies: a, p1. (`private` read from the code of /p/pkg.py)")
    suite_file._check_cached_private("w", "p1")
    suite_file._check_cached_private("w", "unrecorded")
    w.sources.append(_source(strategies=["p3"]))                            # p3's flag unknown: the full check lists
    suite_file._check_cached_private("w", "p2")
