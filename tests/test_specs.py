"""Round trips of a suite's settings: every field of every entry of every shipped suite YAML reaches the RunSpec,
the scenario factory, the strategy's Config and the run record unchanged; ``RunSpec.from_dict(spec.to_dict()) ==
spec``; the identity hash ignores key order and the device, holds amp when true, and changes with any field
that makes another experiment.

A setting that is dropped on the way (a scenario's ``args``, a strategy's ``preset``, a ``dp`` block) gives a run of
another experiment under the suite's name: the worst kind of wrong number, since nothing fails.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml

import tests._fakes  # noqa: F401  (registers the fake strategies)
from clbench import config, runner, suite_file
from clbench.errors import ConfigError
from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry, SuiteSpec
from clbench.suite_file import load_suite

SUITES = sorted(suite_file.shipped_suites())


def _raw(name: str) -> dict:
    return yaml.safe_load(suite_file.shipped_suites()[name].read_text())


def _entry(item) -> dict:
    return {"name": item} if isinstance(item, str) else item


def _same(a, b) -> bool:
    """Equal after YAML → typed coercion (``1`` may become ``1.0``, a list a tuple); floats compared exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _callbacks_of(item: dict) -> list[dict]:
    """The callback entries a raw strategy entry must become: its ``callbacks`` (a bare name is ``{name, args: {}}``),
    then its ``dp`` block as the ``dp`` callback."""
    out = [{"name": c, "args": {}} if isinstance(c, str) else {"args": {}, **c} for c in item.get("callbacks", [])]
    if "dp" in item:
        out.append({"name": "dp", "args": item["dp"]})
    return out


@pytest.mark.parametrize("suite", SUITES)
def test_every_field_of_every_shipped_suite_reaches_the_run_specs(suite):
    """Suite name, description, seeds, and per entry: name, label, args (scenario), preset, args, label, callbacks
    and dp (strategy) are in the SuiteSpec and in every RunSpec of the cross product, in the file's order; no other
    key of an entry is silently dropped (every raw key is checked, so a key added to the schema is covered)."""
    raw, spec = _raw(suite), suite_file.load_suite(suite)
    assert spec.name == raw["suite"] and spec.seeds == tuple(raw.get("seeds", [0]))
    assert spec.description == str(raw.get("description", ""))
    handled = {"name", "label", "args", "preset", "callbacks", "dp"}
    scenarios = [_entry(s) for s in raw["scenarios"]]
    strategies = [_entry(s) for s in raw["strategies"]]
    assert [s.name for s in spec.scenarios] == [s["name"] for s in scenarios]
    assert [s.name for s in spec.strategies] == [s["name"] for s in strategies]
    for item, entry in zip(scenarios, spec.scenarios):
        assert set(item) <= handled
        assert entry.label == item.get("label", "") and _same(entry.args, item.get("args", {})), (suite, item)
    for item, entry in zip(strategies, spec.strategies):
        assert set(item) <= handled
        assert entry.label == item.get("label", "") and entry.preset == item.get("preset"), (suite, item)
        assert _same(entry.args, item.get("args", {})), (suite, item)
        assert _same(list(entry.callbacks), _callbacks_of(item)), (suite, item)
    runs = spec.run_specs()
    assert [(r.scenario, r.strategy, r.seed) for r in runs] == [
        (sc, st, seed) for sc in spec.scenarios for st in spec.strategies for seed in spec.seeds]
    assert all(r.suite == raw["suite"] for r in runs)


@pytest.mark.parametrize("suite", SUITES)
def test_every_run_spec_survives_to_dict_from_dict_and_json(suite):
    """``RunSpec.from_dict(spec.to_dict()) == spec``, with device and amp set; through JSON (what resume and the Ray
    executor read back from a record) the spec has the same dict (tuples read back as lists), identity hash and
    run id. ``amp`` is set on each spec, not through ``run_specs``, which refuses it for the private rows."""
    for spec in (dataclasses.replace(s, amp=True) for s in suite_file.load_suite(suite).run_specs(device="cpu")):
        assert RunSpec.from_dict(spec.to_dict()) == spec
        data = json.loads(json.dumps(spec.to_dict()))
        back = RunSpec.from_dict(data)
        assert json.loads(json.dumps(back.to_dict())) == data and back.device == "cpu" and back.amp is True
        assert config.config_hash(back.identity()) == config.config_hash(spec.identity()) and back.run_id == spec.run_id


def test_from_dict_defaults_device_and_amp_and_reads_callbacks_back_as_a_tuple():
    spec = RunSpec("s", ScenarioEntry("synthetic", {"n_classes": 4}, "lab"),
                   StrategyEntry("naive", {"epochs": 1}, "n1", "cpu", ({"name": "hook_trace", "args": {}},)), 3)
    d = spec.to_dict()
    del d["device"], d["amp"]
    back = RunSpec.from_dict(json.loads(json.dumps(d)))
    assert back.device == "auto" and back.amp is False
    assert back == spec and isinstance(back.strategy.callbacks, tuple)


class _Recorded(Exception):
    """Stops a run once the scenario factory and the strategy have received their settings."""


@pytest.mark.parametrize("suite", SUITES)
def test_every_setting_reaches_the_scenario_factory_and_the_strategy_config(suite, monkeypatch):
    """What the runner hands the scenario factory is the entry's args plus the seed; the Config the strategy gets
    is the strategy's defaults, then its preset, then the suite's args (model_args included). No data is loaded:
    the factory is replaced by a recorder."""
    received: list = []

    class FakeRegistry:
        def get(self, name):
            def factory(**kwargs):
                received.append((name, kwargs))
                raise _Recorded

            return factory

    monkeypatch.setattr(runner, "SCENARIOS", FakeRegistry())
    for spec in suite_file.load_suite(suite).run_specs():
        received.clear()
        with pytest.raises(_Recorded):
            runner.build_scenario(spec)
        assert received == [(spec.scenario.name, {"seed": spec.seed, **spec.scenario.args})]
        built = config.build_config(spec.strategy.name, spec.strategy.preset, spec.strategy.args)
        preset = spec.strategy.preset and runner.STRATEGIES.get(spec.strategy.name).PRESETS[spec.strategy.preset]
        for key, value in {**(preset or {}), **spec.strategy.args}.items():
            assert _same(getattr(built, key), value), (suite, spec.run_id, key)


def test_every_setting_reaches_the_run_record(tmp_path):
    """A tiny run through the runner: the record's spec is the RunSpec (it reads back equal), its identity hash is
    that of ``spec.identity()``, its resolved strategy config holds preset and args, its seed and run id match, and
    the callbacks of the entry were attached (hook_trace wrote its file)."""
    spec = RunSpec("rt", ScenarioEntry("synthetic", {"n_classes": 4, "n_experiences": 2, "train_per_class": 4,
                                                     "test_per_class": 3}, "syn4"),
                   StrategyEntry("test_increasing_logits", {"extra": 2.5}, "inc", "cpu",
                                 ({"name": "hook_trace", "args": {"batches": 3}},)), 7, "cpu")
    record = runner.run(spec, tmp_path)
    assert record.status == "finished", record.reason
    data = json.loads((tmp_path / "runs" / "syn4__inc__s7.json").read_text())
    assert RunSpec.from_dict(data["spec"]) == spec
    assert data["run_id"] == spec.run_id == "syn4__inc__s7" and data["seed"] == 7
    assert data["identity_hash"] == config.config_hash(spec.identity())
    assert data["strategy_config"] == {"interrupt_at_seed": -1, "extra": 2.5}
    assert data["metrics"]["extra"]["answer"] == 2.5                     # the overridden field reached the strategy
    assert (tmp_path / "artifacts" / spec.run_id / "hooks.jsonl").exists()


# ------------------------------------------------------------------------------------------------------ identity
def _reorder(value):
    """The same mapping with every dict's keys in reverse order, recursively."""
    if isinstance(value, dict):
        return {k: _reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reorder(v) for v in value]
    return value


def _base() -> RunSpec:
    return RunSpec("s", ScenarioEntry("synthetic", {"n_classes": 4, "n_experiences": 2}, "syn"),
                   StrategyEntry("replay", {"mem_size": 50, "lr": 0.01}, "rp", "cpu",
                                 ({"name": "dp", "args": {"epsilon": 8.0}},)), 0)   # hook_trace: an observer


def test_identity_hash_ignores_key_order_and_device_and_holds_amp_only_when_true():
    spec = _base()
    identity = spec.identity()
    assert list(_reorder(identity)) != list(identity)
    assert config.config_hash(_reorder(identity)) == config.config_hash(identity)
    assert config.config_hash(json.loads(json.dumps(identity))) == config.config_hash(identity)
    same = dataclasses.replace(spec, device="cuda")
    assert config.config_hash(same.identity()) == config.config_hash(identity)
    assert "amp" not in identity            # float32 records keep the hash they had before amp entered the identity
    bf16 = dataclasses.replace(spec, amp=True).identity()
    assert bf16 == {**identity, "amp": True} and config.config_hash(bf16) != config.config_hash(identity)
    flipped = dataclasses.replace(spec, strategy=dataclasses.replace(spec.strategy, args={"lr": 0.01, "mem_size": 50}))
    assert config.config_hash(flipped.identity()) == config.config_hash(identity)


def _variants(spec: RunSpec) -> dict[str, RunSpec]:
    sc, st = spec.scenario, spec.strategy
    return {
        "suite": dataclasses.replace(spec, suite="t"),
        "seed": dataclasses.replace(spec, seed=1),
        "scenario name": dataclasses.replace(spec, scenario=dataclasses.replace(sc, name="split_digits", args={})),
        "scenario args": dataclasses.replace(spec, scenario=dataclasses.replace(sc, args={**sc.args, "n_classes": 6})),
        "scenario label": dataclasses.replace(spec, scenario=dataclasses.replace(sc, label="other")),
        "strategy name": dataclasses.replace(spec, strategy=dataclasses.replace(st, name="naive", args={})),
        "strategy args": dataclasses.replace(spec, strategy=dataclasses.replace(st, args={**st.args, "mem_size": 51})),
        "strategy label": dataclasses.replace(spec, strategy=dataclasses.replace(st, label="other")),
        "preset": dataclasses.replace(spec, strategy=dataclasses.replace(st, preset=None)),
        "callback args": dataclasses.replace(spec, strategy=dataclasses.replace(
            st, callbacks=({"name": "dp", "args": {"epsilon": 4.0}},))),
        "no callbacks": dataclasses.replace(spec, strategy=dataclasses.replace(st, callbacks=())),
    }


@pytest.mark.parametrize("field", list(_variants(_base())))
def test_identity_hash_changes_with_every_field(field):
    spec = _base()
    assert config.config_hash(_variants(spec)[field].identity()) != config.config_hash(spec.identity())


def test_identity_holds_the_resolved_config_so_a_changed_default_is_another_run():
    """The resolved hyperparameters (defaults + preset + args) are part of the identity: a preset that changes a
    field changes the hash even when the suite's args are the same."""
    spec = _base()
    resolved = spec.identity()["strategy"]["resolved"]
    assert resolved == config.config_dict(config.build_config("replay", "cpu", {"mem_size": 50, "lr": 0.01}))
    assert resolved["mem_size"] == 50 and resolved["lr"] == 0.01


def test_config_hash_is_twelve_hex_digits_of_sorted_json():
    assert config.config_hash({"b": 1, "a": [1, 2]}) == config.config_hash({"a": [1, 2], "b": 1})
    assert config.config_hash({"a": 1}) != config.config_hash({"a": 1.5}) != config.config_hash({"a": "1"})
    digest = config.config_hash({"a": 1})
    assert len(digest) == 12 and int(digest, 16) >= 0
    import hashlib
    assert digest == hashlib.sha256(b'{"a": 1}').hexdigest()[:12]


def test_parse_suite_keeps_labels_presets_seeds_and_coerced_args():
    """A suite written by hand (not shipped) with every kind of field: labels, preset, callbacks as a bare name,
    seeds, a string number coerced to the field's type."""
    data = {"suite": "hand", "description": "d", "seeds": [3, 1],
            "scenarios": [{"name": "synthetic", "label": "syn", "args": {"n_classes": 6}}, "split_digits"],
            "strategies": [{"name": "replay", "preset": "cpu", "label": "r", "args": {"lr": "1e-3", "mem_size": 9},
                            "callbacks": ["hook_trace"]},
                           {"name": "naive"}]}
    spec = suite_file.parse_suite(data, "hand.yaml")
    assert spec == SuiteSpec(
        "hand", (ScenarioEntry("synthetic", {"n_classes": 6}, "syn"), ScenarioEntry("split_digits")),
        (StrategyEntry("replay", {"lr": 0.001, "mem_size": 9}, "r", "cpu", ({"name": "hook_trace", "args": {}},)),
         StrategyEntry("naive")), (3, 1), "d", "hand.yaml")
    assert isinstance(spec.strategies[0].args["lr"], float) and math.isclose(spec.strategies[0].args["lr"], 1e-3)


# ---------------------------------------------------------------------------------------------------------- dp
def _dp_suite(**strategy) -> dict:
    return {"suite": "dp", "scenarios": ["synthetic"], "strategies": [{"name": "naive", **strategy}]}


def test_a_dp_block_becomes_the_dp_callback_after_the_entrys_callbacks_and_enters_the_identity():
    """``dp: {...}`` reaches the StrategyEntry as the last callback ``{name: dp, args: the block}``, survives
    to_dict/from_dict, and is part of the identity (another budget is another run)."""
    entry = suite_file.parse_suite(_dp_suite(callbacks=["hook_trace"], dp={"epsilon": 3.0, "clip": 0.5}), "dp.yaml")
    strategy = entry.strategies[0]
    assert strategy.callbacks == ({"name": "hook_trace", "args": {}},
                                  {"name": "dp", "args": {"epsilon": 3.0, "clip": 0.5}})
    spec = entry.run_specs()[0]
    assert RunSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    other = suite_file.parse_suite(_dp_suite(callbacks=["hook_trace"], dp={"epsilon": 8.0, "clip": 0.5})).run_specs()[0]
    assert config.config_hash(other.identity()) != config.config_hash(spec.identity())


@pytest.mark.parametrize("dp, message", [
    (3, "dp.yaml: strategies[0] (naive).dp: expected a mapping like {epsilon: 3.0, clip: 1.0}, got 3."),
    ({"epsilon": -1.0}, "dp.yaml: strategies[0] (naive): dp: epsilon must be a finite number > 0, got -1.0."),
    ({"epsilon": 1.0, "clip": 0.0}, "dp.yaml: strategies[0] (naive): dp: clip (the clipping norm R) must be > 0, "
                                    "got 0.0."),
])
def test_a_bad_dp_block_is_one_line_naming_file_entry_and_key(dp, message):
    with pytest.raises(ConfigError) as info:
        suite_file.parse_suite(_dp_suite(dp=dp), "dp.yaml")
    assert str(info.value) == message


def test_dp_is_refused_for_a_strategy_whose_epsilon_cannot_be_accounted():
    data = _dp_suite(dp={"epsilon": 1.0})
    data["strategies"][0]["name"] = "replay"
    with pytest.raises(ConfigError, match=r"^dp\.yaml: strategies\[0\] \(replay\): dp: strategy 'replay' is "
                                                 r"not known to use each sample in one training call only"):
        suite_file.parse_suite(data, "dp.yaml")


def test_a_record_spec_without_callbacks_reads_back_with_none():
    """Records written before callbacks existed have no ``callbacks`` key in their spec's strategy."""
    d = _base().to_dict()
    del d["strategy"]["callbacks"]
    assert RunSpec.from_dict(d).strategy.callbacks == ()


def test_code_fingerprint_is_that_of_the_specs_strategy_and_scenario():
    from clbench.fingerprint import code_fingerprint

    spec = _base()
    assert spec.code_fingerprint() == code_fingerprint("replay", "synthetic")
    assert len(spec.code_fingerprint()) == 16


def test_a_dp_block_with_an_unknown_key_names_the_dp_entry():
    with pytest.raises(ConfigError) as info:
        suite_file.parse_suite(_dp_suite(dp={"epsilom": 1.0}), "dp.yaml")
    assert str(info.value).startswith("dp.yaml: strategies[0] (naive).dp[0].args (callback 'dp'): unknown key "
                                      "'epsilom'. Did you mean 'epsilon'?"), str(info.value)


def _keys(suite: SuiteSpec) -> list[str]:
    return [e.key for e in suite.strategies]


def test_strategy_filter_picks_a_row_by_its_exact_label_or_name():
    """In the quick suite ``naive`` is a row and ``naive_dp_eps8`` another row of strategy naive: each word picks its
    own row only. A name no row is labelled with picks every row of it; an unknown word is refused."""
    quick = load_suite("quick")
    assert _keys(quick.select(strategies=["naive"])) == ["naive"]
    assert _keys(quick.select(strategies=["naive_dp_eps8"])) == ["naive_dp_eps8"]
    assert _keys(quick.select(strategies=["naive", "naive_dp_eps8"])) == ["naive", "naive_dp_eps8"]
    labelled = SuiteSpec("s", (ScenarioEntry("synthetic"),), (StrategyEntry("replay", label="replay_m50"),
                                                              StrategyEntry("replay", label="replay_m200"),
                                                              StrategyEntry("naive")))
    assert _keys(labelled.select(strategies=["replay"])) == ["replay_m50", "replay_m200"]
    with pytest.raises(ConfigError, match="has no strategy 'replya'. Did you mean 'replay'"):
        labelled.select(strategies=["replya"])


# ------------------------------------------------------------------------------------------- observing callbacks
def _spec(*callbacks: dict):
    from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry

    return RunSpec("s", ScenarioEntry("synthetic"), StrategyEntry("naive", preset="cpu", callbacks=callbacks), 0)


def test_observing_callbacks_are_outside_the_run_identity_and_shaping_ones_stay_in():
    """Loggers and the hook trace declare ``observer = True``: a run with them has the identity (and hash) of the
    run without them; ``dual_form`` and ``dp`` stay in, in their order, next to observers too. A run without
    observers keeps the identity it had before observers were left out: its entry with its callbacks as written."""
    import dataclasses

    from clbench.config import config_dict, config_hash

    observers = [{"name": n, "args": {}} for n in ("tensorboard", "wandb", "training_log", "hook_trace")]
    shaping = [{"name": "dual_form", "args": {}}, {"name": "dp", "args": {"epsilon": 8.0}}]
    plain = _spec()
    assert config_hash(_spec(*observers).identity()) == config_hash(plain.identity())
    mixed = _spec(observers[0], shaping[0], observers[3], shaping[1])
    assert mixed.identity()["strategy"]["callbacks"] == tuple(shaping)
    assert config_hash(mixed.identity()) == config_hash(_spec(*shaping).identity()) != config_hash(plain.identity())
    for spec in (plain, _spec(*shaping)):           # the pre-observer formula: the entry as written
        before = {"suite": "s", "scenario": dataclasses.asdict(spec.scenario), "seed": 0,
                  "strategy": {**dataclasses.asdict(spec.strategy), "resolved": config_dict(spec.config())}}
        assert config_hash(spec.identity()) == config_hash(before)


def test_a_callback_name_no_registry_knows_stays_in_the_identity():
    """A record's plugin callback that is not loaded is not assumed to observe (leaderboard rows stay apart)."""
    from clbench.specs import identity_callbacks

    assert identity_callbacks([{"name": "not_loaded_anywhere", "args": {}}, {"name": "tensorboard", "args": {}}]) \
        == ({"name": "not_loaded_anywhere", "args": {}},)


def test_adding_or_removing_a_logger_resumes_the_finished_run(tiny_suite, tmp_path, capsys):
    """The one test here that trains (a tiny run): the suite run again with ``tensorboard`` added resumes (the record
    untouched, no event file written), and so does the suite with it removed again; the leaderboard keeps one row."""
    import pandas as pd

    from clbench.cli import main

    entry = {"name": "naive", "preset": "cpu", "args": {"epochs": 1}}
    out = tmp_path / "out"
    assert main(["--suite", str(tiny_suite([entry])), "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    record = out / "runs" / "synthetic__naive__s0.json"
    stamp, text = record.stat().st_mtime_ns, record.read_text()
    logged = tiny_suite([{**entry, "callbacks": [{"name": "tensorboard"}]}], name="tiny")
    for suite in (logged, tiny_suite([entry])):
        capsys.readouterr()
        assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table"]) == 0
        assert "resuming: 1 of 1 runs already finished" in capsys.readouterr().err
        assert (record.stat().st_mtime_ns, record.read_text()) == (stamp, text)
    assert not (out / "artifacts" / "synthetic__naive__s0" / "tensorboard").exists()
    assert len(pd.read_csv(out / "leaderboard.csv")) == 1


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


def test_a_callback_factory_that_does_not_declare_observer_is_part_of_the_run_identity(monkeypatch):
    """Only ``observer = True`` leaves a callback out of the identity: a plain factory (a plugin's function) without
    the attribute shapes the run as far as resume can tell."""
    from clbench import registry, specs

    monkeypatch.setattr(registry.CALLBACKS, "_entries", {**registry.CALLBACKS._entries})
    monkeypatch.setattr(registry.CALLBACKS, "origins", {**registry.CALLBACKS.origins})
    registry.CALLBACKS.register("plain_factory")(lambda **kwargs: None)
    entries = ({"name": "plain_factory", "args": {}}, {"name": "hook_trace", "args": {}})
    assert specs.identity_callbacks(entries) == entries[:1]
