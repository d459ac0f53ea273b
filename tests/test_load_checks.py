"""Issue #37's probes of suite loading: duplicated YAML keys, values that depend on the scenario (memory and shards
against the stream's declared sizes, the scenarios' own arguments), settings that change nothing (dp's ``gamma`` with
flat clipping, ``hook_trace``'s ``batches``), and a malformed file refused before any strategy or scenario module
(or torch) is imported. Each was accepted, or refused only after the imports, before the fix."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Annotated, Literal

import pytest

from clbench import suite_file, typecheck
from clbench.errors import ConfigError
from clbench.registry import CALLBACKS, SCENARIOS, STRATEGIES

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("args", [{}, {"test_fraction": 0.2, "n_experiences": 2}, {"n_experiences": 10},
                                  {"class_order": "random", "n_experiences": 5}])
def test_split_digits_declares_the_sizes_it_builds(args):
    """The sizes computed from the labels alone are those of the built stream (the smallest experience: for
    every class order when the order is random)."""
    factory = SCENARIOS.get("split_digits")
    sizes = factory.sizes(**args)
    smallest = []
    for seed in range(4):
        stream = factory(seed=seed, **args).train_stream
        lengths = [len(e.dataset) for e in stream]
        assert sizes["train_samples"] == sum(lengths)
        smallest.append(min(lengths))
    if args.get("class_order") == "random":
        assert sizes["experience_samples"] <= min(smallest)
    else:
        assert sizes["experience_samples"] == min(smallest)


@pytest.mark.parametrize(("name", "args"), [("split_mnist", {}), ("split_fmnist", {"max_per_class": 700,
                                                                                  "n_experiences": 2})])
def test_split_mnist_and_fmnist_declare_the_sizes_they_build(name, args):
    from clbench.data.errors import DatasetNotFound

    try:
        stream = SCENARIOS.get(name)(seed=0, **args).train_stream
    except DatasetNotFound:
        pytest.skip(f"{name}: its data are not here ($CLBENCH_DATA)")
    lengths = [len(e.dataset) for e in stream]
    assert SCENARIOS.get(name).sizes(**args) == {"train_samples": sum(lengths), "experience_samples": min(lengths)}


def test_synthetic_declares_the_sizes_it_builds():
    args = {"n_classes": 6, "n_experiences": 2, "train_per_class": 7}
    lengths = [len(e.dataset) for e in SCENARIOS.get("synthetic")(seed=0, **args).train_stream]
    assert SCENARIOS.get("synthetic").sizes(**args) == {"train_samples": sum(lengths),
                                                        "experience_samples": min(lengths)}


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


def test_the_sequence_scenarios_refuse_in_python_what_the_loader_refuses():
    from clbench.scenarios.movielens import check_sequence_args

    for args in ({"n_experiences": 50_001}, {"holdout": "train"}, {"max_len": 0}):
        with pytest.raises(ValueError):
            SCENARIOS.get("movielens_seqrec")(**args)
        with pytest.raises(ValueError):
            check_sequence_args(interactions=100_000, **args)
    check_sequence_args(interactions=100_000, n_experiences=50_000)
    with pytest.raises(ValueError, match="one experience only"):
        SCENARIOS.get("games_seqrec")(n_experiences=2)


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


def test_parameter_declarations_read_annotated_ranges_and_declarations():
    def factory(*, a: Annotated[int, typecheck.AT_LEAST_1] = 1, b: int = 0,
                c: Annotated[str, typecheck.Declared(choices=("x", "y"))] = "x") -> None: ...

    declared = typecheck.parameter_declarations(factory)
    assert declared == {"a": typecheck.Declared(within=typecheck.AT_LEAST_1),
                        "c": typecheck.Declared(choices=("x", "y"))}
    with pytest.raises(typecheck.TypeMismatch, match="c: unknown c 'z'"):
        typecheck.check_values({"c": "z"}, {"c": str}, declared=declared)
    assert typecheck.check_values({"b": -3}, {"b": int}, declared=declared) == {"b": -3}   # generic rule only


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


def test_a_malformed_suite_is_refused_without_importing_torch_avalanche_or_a_plugin_module(tmp_path):
    """Each malformed file: one error line, exit code 2, and neither torch, Avalanche nor a strategy or scenario
    module imported (the refusal costs no import; benchmarks/refusal_time.py measures it)."""
    paths = _written(tmp_path, MALFORMED)
    results, heavy = _refusals_in_a_fresh_process(paths)
    for path, (code, err) in zip(paths, results):
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}"), (path.name, err)
    assert heavy == [], heavy


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


def test_every_shipped_strategy_scenario_and_callback_is_recorded_in_the_index():
    """Shipped: registered by clbench's own modules (a test module imported earlier in the session, such as
    tests._fakes, registers names the index rightly does not hold). Every scenario and callback has its keyword
    parameters recorded; sizes only where the scenario declares them."""
    from clbench.plugins import INDEX_FILE

    def shipped(registry) -> set[str]:
        return {n for n in registry.names() if registry.module_of(n).split(".")[0] == "clbench"}

    modules = json.loads(INDEX_FILE.read_text())["modules"].values()
    recorded = {kind: set().union(*(m.get("records", {}).get(kind, {}) for m in modules))
                for kind in ("strategy", "scenario", "callback")}
    assert recorded["strategy"] == shipped(STRATEGIES)
    assert recorded["scenario"] == shipped(SCENARIOS) and recorded["callback"] == shipped(CALLBACKS)
    sized = {n for m in modules for n, r in m.get("records", {}).get("scenario", {}).items() if "sizes" in r}
    assert sized == {n for n in shipped(SCENARIOS) if getattr(SCENARIOS.get(n), "sizes", None)}


def test_a_yaml_error_is_cut_to_300_characters(tmp_path):
    """PyYAML's message (here naming a 400-character alias) is kept to its first 300 characters."""
    message = "found undefined alias '" + "a" * 400
    assert _yaml_refusal(tmp_path, "suite: *" + "a" * 400 + "\n") == "s.yaml: not valid YAML: " + message[:300]


@pytest.mark.parametrize("annotation, text", [
    (Literal["a", 1, 2.5, True, None], "Literal['a', 1, 2.5, True, None]"), (typing.Any, "Any"),
    (type(None), "None"), (int | None, "int | None"), (tuple[int, ...], "tuple[int, ...]"),
    (dict[str, list[float]], "dict[str, list[float]]"), (Literal["x", "y"] | None, "Literal['x', 'y'] | None")])
def test_an_annotation_is_recorded_as_text_that_reads_back_as_it(annotation, text):
    from clbench import recorded

    assert recorded.annotation_text(annotation) == text
    assert recorded.parse_annotation(text) == annotation


@pytest.mark.parametrize("annotation", [set[int], Literal[b"x"], typing.Callable],
                         ids=["set", "literal_of_bytes", "callable"])
def test_an_annotation_the_index_cannot_write_is_unrecordable(annotation):
    """Such a strategy is left to the full check (its record is None)."""
    from clbench import recorded

    with pytest.raises(recorded.Unrecordable):
        recorded.annotation_text(annotation)


class _Recorded:
    """A strategy without PRESETS whose Config declares a range, a scenario bound, a Literal and an Any field."""

    @dataclasses.dataclass
    class Config:
        lr: float = 0.1
        mem_size: int = typecheck.setting(100, within=typecheck.Range(1), at_most="experience_samples")
        mode: Literal["a", "b"] = "a"
        anything: typing.Any = None


def test_a_strategy_record_holds_each_fields_declarations_and_no_presets_when_the_class_has_none():
    from clbench import recorded

    assert recorded.strategy_record(_Recorded) == {
        "fields": [{"name": "lr", "type": "float", "default": 0.1},
                   {"name": "mem_size", "type": "int", "default": 100,
                    "within": {"low": 1, "high": None, "open_low": False, "open_high": False},
                    "at_most": "experience_samples"},
                   {"name": "mode", "type": "Literal['a', 'b']", "default": "a"},
                   {"name": "anything", "type": "Any", "default": None}],
        "presets": {}, "depends": [__name__]}


def test_a_strategy_whose_stand_in_would_differ_is_not_recorded():
    """A tuple default under ``Any`` would come back from the record as a list: the stand-in's signature differs,
    so no record (the full check handles the strategy)."""
    from clbench import recorded

    class Tupled:
        Config = dataclasses.make_dataclass("Config", [("x", typing.Any, dataclasses.field(default=(1, 2)))])

    assert recorded.strategy_record(Tupled) is None


def test_a_strategy_record_is_kept_only_when_the_stand_in_has_the_same_types_only_with_and_presets(monkeypatch):
    """The stand-in's signature is compared field by field: a record whose type text is wrong (here every field
    written as ``int``), an ``only_with`` value or a preset that comes back as a list instead of a tuple, each make
    the record None (the full check handles the strategy)."""
    from clbench import recorded

    class Typed:
        Config = dataclasses.make_dataclass("Config", [("lr", float, dataclasses.field(default=0.5))])

    class Needing:
        Config = dataclasses.make_dataclass("Config", [
            ("mode", typing.Any, dataclasses.field(default=None)),
            ("x", int, typecheck.setting(1, only_with=typecheck.only_with("mode", (1, 2))))])

    class Preset:
        Config = dataclasses.make_dataclass("Config", [("x", typing.Any, dataclasses.field(default=None))])
        PRESETS = {"p": {"x": (1, 2)}}

    assert recorded.strategy_record(Typed)["fields"] == [{"name": "lr", "type": "float", "default": 0.5}]
    assert recorded.strategy_record(Needing) is None
    assert recorded.strategy_record(Preset) is None
    monkeypatch.setattr(recorded, "annotation_text", lambda tp: "int")
    assert recorded.strategy_record(Typed) is None


def test_a_scenario_record_holds_the_sizes_of_the_arguments_the_loader_accepts(monkeypatch):
    """The defaults and each shipped suite's arguments, checked as the loader checks them (the declared range, the
    annotation): ``n=0`` (below the range) and ``n=3.5`` (not an int) are left to the loader, ``n=3`` after them is
    still recorded."""
    from clbench import recorded

    def factory(n: Annotated[int, typecheck.Range(1)] = 2, **_):
        raise AssertionError("the factory itself is not called")

    factory.sizes = lambda n=2, **_: {"train_samples": 10 * n, "experience_samples": n}
    monkeypatch.setattr(recorded, "_suite_arguments", lambda: {"fake": [{"n": 0}, {"n": 3.5}, {"n": 3}]})
    assert recorded.scenario_record("fake", factory) == {
        "params": {"n": 2}, "depends": [__name__], "datasets": [],
        "signature": {"params": [{"name": "n", "type": "int", "default": 2, "within": {
            "low": 1, "high": None, "open_low": False, "open_high": False}}], "var_keyword": True},
        "sizes": [{"args": {"n": 2}, "sizes": {"train_samples": 20, "experience_samples": 2}},
                  {"args": {"n": 3}, "sizes": {"train_samples": 30, "experience_samples": 3}}]}


def test_recorded_values_are_json_data_and_anything_else_is_unrecordable():
    """Tuples become lists, nested; a dict with a non-string key, a non-finite float, a set or another object cannot
    be written (its strategy is left to the full check)."""
    import math

    from clbench import recorded

    assert recorded._data({"x": (1, [2.5, None]), "y": True, "z": "s"}) == {"x": [1, [2.5, None]], "y": True, "z": "s"}
    for value in ({1: 2}, math.inf, math.nan, {"a"}, object()):
        with pytest.raises(recorded.Unrecordable):
            recorded._data(value)


def test_recorded_sizes_are_found_whatever_the_order_of_the_sizes_functions_parameters(monkeypatch):
    """A ``sizes`` function whose parameters are not in alphabetical order (``b`` before ``a``): the arguments a
    suite gives are matched to the recorded ones as JSON with sorted keys; arguments not recorded give None (the
    full check computes them), as does a scenario without a record."""
    from clbench import recorded

    def factory(b: int = 1, a: int = 2):
        raise AssertionError("the factory itself is not called")

    factory.sizes = lambda b=1, a=2: {"train_samples": 10 * a + b}
    monkeypatch.setattr(recorded, "_suite_arguments", lambda: {"fake": [{"a": 3}]})
    record = recorded.scenario_record("fake", factory)
    assert record["params"] == {"b": 1, "a": 2}
    assert recorded.recorded_sizes(record, {}) == {"train_samples": 21}
    assert recorded.recorded_sizes(record, {"b": 1, "a": 3}) == {"train_samples": 31}
    assert recorded.recorded_sizes(record, {"b": 2}) is None
    assert recorded.recorded_sizes(None, {}) is None


def test_a_record_is_not_used_once_a_module_it_depends_on_changed(monkeypatch):
    from clbench import plugins

    assert plugins.record("strategy", "replay") is not None and plugins.record("scenario", "split_digits")
    monkeypatch.setattr(plugins, "_sha256_of", lambda module: "edited since")
    assert plugins.record("strategy", "replay") is None and plugins.record("scenario", "split_digits") is None


def test_the_suite_files_refusal_benchmark_runs(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/refusal_time.py", "--repeat", "1"], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "duplicated key" in done.stdout and "error:" not in done.stdout


# ------------------------------------------------------------------ the loader's building blocks (mutation testing)
@pytest.mark.parametrize(("allowed", "text"), [
    (typecheck.Range(), "any finite number"), (typecheck.Range(high=2), "<= 2"),
    (typecheck.Range(high=2, open_high=True), "< 2"), (typecheck.Range(1), ">= 1"),
    (typecheck.Range(0, open_low=True), "> 0"), (typecheck.Range(0, 1), "in [0, 1]"),
    (typecheck.Range(0, 1, open_low=True, open_high=True), "in (0, 1)"),
    (typecheck.Range(0, 1, open_high=True), "in [0, 1)"), (typecheck.Range(0.5, 1e6, open_low=True), "in (0.5, 1e+06]"),
])
def test_a_range_reads_as_the_interval_it_checks(allowed, text):
    assert str(allowed) == text


@pytest.mark.parametrize(("value", "tp", "expected"), [
    ([1, "2"], tuple, (1, "2")),
    ([1, "2"], tuple[int, ...], (1, 2)),
    ([1, 2.0], tuple[int, int], (1, 2)),
    ([], tuple[int, ...], ()),
    ([1, "x"], list, [1, "x"]),
])
def test_tuples_and_lists_are_coerced_item_by_item(value, tp, expected):
    out = typecheck.coerce(value, tp, "k")
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize(("value", "tp", "message"), [
    ([1, 2, 3], tuple[int, int], "k: expected 2 items, got 3: [1, 2, 3]"),
    ([1], tuple[int, int], "k: expected 2 items, got 1: [1]"),
    ([1, 1.5], tuple[int, ...], "k[1]: expected an int, got 1.5"),
])
def test_a_tuple_of_the_wrong_length_or_items_is_refused_naming_the_item(value, tp, message):
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(value, tp, "k")
    assert str(info.value) == message


def test_setting_makes_a_dataclass_field_with_its_declaration():
    import dataclasses

    need = typecheck.only_with("mode", "a")

    @dataclasses.dataclass
    class Config:
        mode: str = "b"
        size: int = typecheck.setting(3, within=typecheck.AT_LEAST_1, at_most="train_samples")
        tags: list = typecheck.setting(default_factory=lambda: ["x"], choices=("x", "y"), only_with=need)

    fields = {f.name: f for f in dataclasses.fields(Config)}
    assert Config() == Config("b", 3, ["x"]) and Config().tags is not Config().tags
    assert fields["size"].metadata["clbench"] == typecheck.Declared(typecheck.AT_LEAST_1, None, None, "train_samples")
    assert fields["tags"].metadata["clbench"] == typecheck.Declared(None, ("x", "y"), need, None)
    declared = typecheck.declarations(Config)
    assert declared["mode"] is typecheck.NOTHING_DECLARED
    assert declared["size"].bound_for("size") == "train_samples" and declared["tags"].bound_for("tags") is None
    assert declared["mode"].bound_for("mem_size") == "train_samples"
    assert need.test("a") and not need.test("b") and need.wanted == "a" and need.example == "a"


def test_file_hash_is_the_files_sha256_and_follows_its_changes(tmp_path):
    import hashlib
    import os

    from clbench.config import file_hash

    path = tmp_path / "w.pt"
    assert file_hash(path) == "missing"
    path.write_bytes(b"a" * 3_000_000)          # more than one block of the reader
    assert file_hash(path) == hashlib.sha256(b"a" * 3_000_000).hexdigest()[:16]
    assert file_hash(str(path)) == file_hash(path)
    path.write_bytes(b"b")
    assert file_hash(path) == hashlib.sha256(b"b").hexdigest()[:16]
    other = tmp_path / "v.pt"                   # same size and time, other bytes: the cache is by path too
    other.write_bytes(b"c")
    os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    assert file_hash(other) == hashlib.sha256(b"c").hexdigest()[:16]


def test_name_limit_asks_the_nearest_existing_folder(tmp_path, monkeypatch):
    import os

    from clbench import names

    asked = []
    monkeypatch.setattr(os, "pathconf", lambda folder, name: asked.append((Path(folder), name)) or 77)
    assert names.name_limit(tmp_path / "not" / "yet") == 77 and asked == [(tmp_path, "PC_NAME_MAX")]

    def fails(folder, name):
        raise OSError("no")

    monkeypatch.setattr(os, "pathconf", fails)
    assert names.name_limit(tmp_path) == names.NAME_LIMIT


def test_file_names_longer_than_the_limit_with_their_suffixes_are_refused(tmp_path, monkeypatch):
    from clbench import names

    monkeypatch.setattr(names, "name_limit", lambda folder: 10 if folder == tmp_path else 0)
    names.check_file_names(tmp_path, ["a" * 7, "b" * 3], "run id", extra=3)
    names.check_file_names(tmp_path, ["a" * 10], "run id")
    with pytest.raises(ConfigError) as info:
        names.check_file_names(tmp_path, ["b" * 3, "é" * 4], "run id", extra=3)
    assert str(info.value) == (f"run id 'éééé' (8 bytes, 3 more in the names of its files) is too long for a file "
                               f"name in {tmp_path}, whose file system accepts at most 10 bytes; shorten the labels "
                               f"or seeds that make it.")


def test_only_with_reads_a_boolean_as_yaml_writes_it():
    flag, mode = typecheck.only_with("flag", True), typecheck.only_with("mode", "Sgd")
    assert (flag.other, flag.wanted, flag.example) == ("flag", "true", True) and flag.test(True) and not flag.test(1.5)
    assert (mode.wanted, mode.example) == ("Sgd", "Sgd") and mode.test("Sgd") and not mode.test("sgd")


def factory_with_a_dependent_argument(*, a: Annotated[int, typecheck.Declared(only_with=typecheck.only_with("b", 1))]
                                      = 0, **others) -> None:
    """``a`` is used only with ``b: 1``, which is not a parameter (it arrives through ``**others``)."""


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


def test_the_identity_holds_each_checkpoints_hash_under_its_dotted_field(tmp_path):
    import dataclasses

    from clbench.config import build_config, checkpoint_paths, file_hash
    from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry

    (tmp_path / "w_synthetic.pt").write_bytes(b"weights")
    init = str(tmp_path / "w_{scenario}.pt")
    spec = RunSpec("s", ScenarioEntry("synthetic"), StrategyEntry("naive", {"init": init}, preset="cpu"), 0)
    expected = {"init": file_hash(tmp_path / "w_synthetic.pt")}
    assert spec.identity()["checkpoints"] == expected and len(expected["init"]) == 16
    assert "checkpoints" not in dataclasses.replace(spec, strategy=StrategyEntry("naive", preset="cpu")).identity()
    assert checkpoint_paths({"init": "", "model_args": {"init": init, "x": 1}, "lr": 0.1}, "syn") == {
        "model_args.init": str(tmp_path / "w_syn.pt")}
    given = build_config("naive", "cpu", {"lr": 0.5})        # the caller's Config is the one the identity holds
    assert spec.identity(config=given)["strategy"]["resolved"]["lr"] == 0.5
    assert spec.identity()["strategy"]["resolved"]["lr"] != 0.5


@pytest.mark.parametrize(("tp", "value", "message"), [
    (int, "x", "k: expected an int, got 'x'"),
    (float, [], "k: expected a float, got []"),
    (int | None, "x", "k: expected int or None, got 'x'"),
    (type(None), 1, "k: expected None, got 1"),
    (tuple[int, ...], 3, "k: expected a tuple[int, ...], got 3"),
    (dict[str, int], 3, "k: expected a dict[str, int], got 3"),
    (typing.Literal["a", "b"] | None, 3, "k: expected 'a' or 'b' or None, got 3"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_type(tp, value, message):
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(value, tp, "k")
    assert str(info.value) == message and info.value.key == "k"


def test_in_a_union_the_member_a_container_already_has_wins():
    out = typecheck.coerce([1], tuple[float, ...] | tuple[int, ...], "k")
    assert out == (1,) and type(out[0]) is int


LAUGHS = "".join(f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcde", "bcdef"))


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


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


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


def test_seeds_are_distinct_integers_up_to_numpys_limit():
    from clbench.specs import MAX_SEED, check_seeds

    check_seeds("w", [0, MAX_SEED])
    for seeds in ([MAX_SEED + 1], [-1], [True], [], 3):
        with pytest.raises(ConfigError, match=r"^w: 'seeds' must be a non-empty list of integers from 0 to 2\*\*32"):
            check_seeds("w", seeds)
    for seeds in ([3, 1, 3], [2, 2, 2]):
        with pytest.raises(ConfigError) as info:
            check_seeds("w", seeds)
        assert str(info.value) == (f"w: seed {seeds[0]} appears twice in 'seeds'; each seed is one run, list it "
                                   f"once.")


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


def test_type_names_drop_the_typing_prefix():
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(3, dict[str, typing.Any], "k")
    assert str(info.value) == "k: expected a dict[str, Any], got 3"


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


def test_a_path_name_of_max_name_characters_is_accepted_and_one_more_is_refused_with_the_exact_line():
    """``MAX_NAME`` (100) characters pass; 101 are refused naming where, the key, the value (brief), its length and
    the file-system limit."""
    from clbench import names

    assert names.check_path_name("s.yaml: suite", "label", "a" * 100) == "a" * 100
    with pytest.raises(ConfigError) as info:
        names.check_path_name("s.yaml: suite", "label", "a" * 101)
    assert str(info.value) == (f"s.yaml: suite: 'label' {typecheck.brief('a' * 101)} is 101 characters long; at most "
                               f"100: it becomes part of file names (<scenario>__<strategy>__s<seed>.json), which file "
                               f"systems limit to {names.NAME_LIMIT} bytes.")


@pytest.mark.parametrize("plugins", ["my_plugin", [""], [1], ["ok", None]], ids=["string", "empty", "number", "none"])
def test_plugins_that_are_not_a_list_of_non_empty_names_are_refused_with_the_exact_line(plugins):
    with pytest.raises(ConfigError) as info:
        suite_file._load_plugins("s.yaml", plugins)
    assert str(info.value) == f"s.yaml: 'plugins' must be a list of module names or .py files, got {plugins!r}."


def _sizes_kwargs(*, n_experiences: int = 5, **kwargs) -> dict:
    return {}


def _sizes_required(*, n_experiences: int, **_) -> dict:
    return {}


def _sizes_positional(n_experiences: int = 5, /, **_) -> dict:
    return {}


def _sizes_ok(*, n_experiences: int = 5, max_per_class: int | None = None, **_) -> dict:
    return {}


@pytest.mark.parametrize("sizes", [_sizes_kwargs, _sizes_required, _sizes_positional])
def test_a_sizes_function_the_index_cannot_key_is_not_recorded(sizes):
    """Only keyword parameters with defaults (and ``**_``) can be keyed from a suite's arguments: a ``**kwargs`` that
    may read anything, a parameter without a default or a positional-only one leaves the scenario to the full check."""
    from clbench.recorded import _size_params

    assert _size_params(sizes) is None


def test_a_sizes_function_with_keyword_defaults_is_recorded_with_them():
    from clbench.recorded import _size_params

    assert _size_params(_sizes_ok) == {"n_experiences": 5, "max_per_class": None}


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


# ----------------------------------------------------------- the coercion rules, one by one (config group, 4628a59)
@pytest.mark.parametrize(("value", "tp", "message"), [
    ("c", Literal["a", "b"], "k: 'c' is not one of 'a', 'b'"),          # a string, but not one of the strings
    (1, Literal[True], "k: 1 is not one of True"),                     # equal, but not of the literal's type
    ({"a": "x"}, dict[str, int], "k.a: expected an int, got 'x'"),      # a value, named by its key
    ({"x": "a"}, dict[int, str], "k['x']: expected an int, got 'x'"),   # a key, named in brackets
])
def test_a_literal_or_a_dict_entry_that_does_not_fit_is_refused_naming_it(value, tp, message):
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(value, tp, "k")
    assert str(info.value) == message


def test_dict_keys_and_values_are_coerced_to_their_own_types():
    from collections.abc import Mapping

    out = typecheck.coerce({"1": "a", 2.0: "b"}, dict[int, str], "k")
    assert out == {1: "a", 2: "b"} and all(type(key) is int for key in out)
    out = typecheck.coerce({"a": "1", "b": 2.0}, dict[str, int], "k")
    assert out == {"a": 1, "b": 2} and all(type(value) is int for value in out.values())
    out = typecheck.coerce({"a": 2.0}, Mapping[str, int], "k")
    assert out == {"a": 2} and type(out["a"]) is int


@pytest.mark.parametrize(("value", "tp", "expected"), [
    ({"a": "1"}, dict[str, int] | dict[str, str], {"a": "1"}),       # the member that takes the dict as it is
    ({"1": "a"}, dict[int, str] | dict[str, str], {"1": "a"}),       # ... its keys as they are, too
    (["1"], tuple[int | None, ...] | tuple[str, ...], ("1",)),          # a union inside a member, strict too
    ("1", int | str, "1"),                                              # a string stays one before it is parsed
])
def test_a_union_takes_the_first_member_that_needs_no_coercion_down_to_nested_members(value, tp, expected):
    out = typecheck.coerce(value, tp, "k")
    assert out == expected and type(out) is type(expected)        # {"a": 1}, (1,) and 1 are not equal to these


def test_a_range_is_checked_on_every_number_of_a_list_and_its_rule_named_by_whose_it_is():
    """The generic rule of a name (``lr > 0``) reads as the name's own; a Config number without a range of its own
    or of its name gets :data:`~clbench.typecheck.UNDECLARED` with a hint to declare one."""
    for value in (-1.0, [0.1, -1.0]):
        with pytest.raises(typecheck.TypeMismatch) as info:
            typecheck.check_range("lr", value, "k")
        assert str(info.value) == "k: -1.0 is out of range: lr must be > 0"

    @dataclasses.dataclass
    class Config(typecheck.RangeChecked):
        mode: str = typecheck.setting("a", choices=("a", "b"))
        foo_count: int = 0
        lr: float = 0.1

    for values, message in [
        ({"mode": "z"}, "mode: unknown mode 'z'. Choose one of: a, b."),
        ({"foo_count": -1}, "foo_count: -1 is out of range: foo_count must be >= 0 (the rule of a Config number that "
                            "declares no range; declare its own with clbench.typecheck.setting(default, "
                            "within=Range(...)) beside the field)"),
        ({"lr": -1.0}, "lr: -1.0 is out of range: lr must be > 0"),
    ]:
        with pytest.raises(typecheck.TypeMismatch) as info:
            Config(**values)
        assert str(info.value) == message


def test_a_callback_factory_that_does_not_declare_observer_is_part_of_the_run_identity(monkeypatch):
    """Only ``observer = True`` leaves a callback out of the identity: a plain factory (a plugin's function) without
    the attribute shapes the run as far as resume can tell."""
    from clbench import registry, specs

    monkeypatch.setattr(registry.CALLBACKS, "_entries", {**registry.CALLBACKS._entries})
    monkeypatch.setattr(registry.CALLBACKS, "origins", {**registry.CALLBACKS.origins})
    registry.CALLBACKS.register("plain_factory")(lambda **kwargs: None)
    entries = ({"name": "plain_factory", "args": {}}, {"name": "hook_trace", "args": {}})
    assert specs.identity_callbacks(entries) == entries[:1]


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


def test_brief_keeps_a_repr_of_160_characters_and_cuts_a_longer_one_to_157_and_an_ellipsis():
    exactly, longer = ["a" * 76, "b" * 76], ["a" * 76, "b" * 77]
    assert len(repr(exactly)) == typecheck.BRIEF_LENGTH == 160
    assert typecheck.brief(exactly) == repr(exactly)
    assert typecheck.brief(longer) == repr(longer)[:157] + "..."


def test_a_boolean_is_not_a_number_even_for_a_numeric_abstract_type():
    import numbers

    assert typecheck.coerce(2.5, numbers.Real, "k") == 2.5
    with pytest.raises(typecheck.TypeMismatch) as info:
        typecheck.coerce(True, numbers.Real, "k")
    assert str(info.value) == "k: expected a Real, got True"
