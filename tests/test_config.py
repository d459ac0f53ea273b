"""Suite files and hyperparameters: every mistake is an error that names the file, the key and the fix."""

import dataclasses
import typing

import pytest
import yaml

from clbench import config
from clbench.config import build_config
from clbench.errors import ConfigError
from clbench.suite_file import load_suite, parse_suite, shipped_suites

SEEDS_RULE = "'seeds' must be a non-empty list of integers from 0 to 2**32 - 1 (not booleans), got"
GOOD = {"suite": "s", "seeds": [0, 1], "scenarios": [{"name": "synthetic"}],
        "strategies": [{"name": "replay", "preset": "cpu", "args": {"mem_size": 50}}, "naive"]}


def test_valid_suite_expands_to_run_specs():
    suite = parse_suite(GOOD, "good.yaml")
    specs = suite.run_specs()
    assert [s.run_id for s in specs] == ["synthetic__replay__s0", "synthetic__replay__s1",
                                         "synthetic__naive__s0", "synthetic__naive__s1"]
    assert specs[0].strategy.args == {"mem_size": 50}


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(seed=[1]), r"bad\.yaml: unknown key 'seed'\. Did you mean 'seeds'\?"),
    (lambda d: d["strategies"][0].update(arg={}), r"strategies\[0\]: unknown key 'arg'. Did you mean 'args'"),
    (lambda d: d["strategies"][0]["args"].update(mem_sise=3), r"unknown key 'mem_sise'. Did you mean 'mem_size'"),
    (lambda d: d["strategies"][0].update(preset="gpu"), r"has no preset 'gpu'"),
    (lambda d: d["strategies"].append({"name": "replya"}), r"unknown strategy 'replya'. Did you mean 'replay'"),
    (lambda d: d["scenarios"].append({"name": "split_digit"}), r"Did you mean 'split_digits'"),
    (lambda d: d["scenarios"][0].update(args={"n_clases": 4}), r"unknown key 'n_clases'. Did you mean 'n_classes'"),
    (lambda d: d.update(seeds="0"), r"'seeds' must be a non-empty list of integers"),
    (lambda d: d.pop("strategies"), r"missing required key 'strategies'"),
    (lambda d: d["strategies"].append({"name": "naive"}), r"'naive' appears twice"),
    (lambda d: d["strategies"][0]["args"].update(epochs=0), r"args\.epochs: 0 is out of range: epochs must be >= 1"),
    (lambda d: d["strategies"][0]["args"].update(optimizer="lbfgs"),
     r"strategies\[0\] \(replay\): args\.optimizer: unknown optimizer 'lbfgs'\. Choose one of: adam, adamw, sgd"),
    (lambda d: d["strategies"][0]["args"].update(mem_size=10, epochs=2.5), r"args\.epochs: expected an int"),
    (lambda d: d["strategies"].append({"name": "dytox", "args": {"arch": "imagnet"}}),   # declared choices
     r"strategies\[2\] \(dytox\): args\.arch: unknown arch 'imagnet'\. Did you mean 'imagenet'\? Choose one of: "
     r"cifar, imagenet, tiny\.$"),
    (lambda d: d["strategies"].append({"name": "dytox", "args": {"augment": ["flip", "crpo"]}}),
     r"strategies\[2\] \(dytox\): args\.augment\[1\]: unknown augment 'crpo'\. Did you mean 'crop'\?"),
    (lambda d: d["strategies"].append({"name": "dytox", "args": {"arch_overrides": {"depht": 2}}}),   # its own check
     r"strategies\[2\] \(dytox\): invalid hyperparameters: unknown arch_overrides \['depht'\]"),
])
def test_malformed_suites_raise_clear_errors(mutate, match):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(data)
    with pytest.raises(ConfigError, match=match):
        parse_suite(data, "bad.yaml")


def test_invalid_yaml_and_missing_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("suite: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_suite(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_suite(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="unknown suite 'quik'. Did you mean 'quick'"):
        load_suite("quik")


def test_presets_then_overrides():
    config = build_config("replay", "cpu", {"lr": 0.5})
    assert config.optimizer == "adam" and config.lr == 0.5 and config.mem_size == 2000


def test_every_shipped_suite_is_valid():
    suites = shipped_suites()
    assert "quick" in suites
    for name in suites:
        assert load_suite(name).run_specs(), name


def test_select_restricts_and_rejects_unknown():
    suite = parse_suite(GOOD, "good.yaml")
    assert [s.key for s in suite.select(strategies=["naive"]).strategies] == ["naive"]
    with pytest.raises(ConfigError, match="has no strategy 'ewc'"):
        suite.select(strategies=["ewc"])


TWO = {"suite": "two", "seeds": [0, 1],
       "scenarios": [{"name": "synthetic", "label": "syn_a"}, {"name": "synthetic", "label": "syn_b"}, "split_digits"],
       "strategies": [{"name": "replay", "label": "rp"}, "naive", "ewc"]}


def test_select_honours_scenarios_strategies_and_seeds_by_label_or_name():
    suite = parse_suite(TWO, "two.yaml")
    picked = suite.select(scenarios=["syn_b", "split_digits"], strategies=["replay", "ewc"], seeds=[5])
    assert [s.key for s in picked.scenarios] == ["syn_b", "split_digits"]
    assert [s.key for s in picked.strategies] == ["rp", "ewc"]
    assert picked.seeds == (5,) and picked.name == "two" and picked.source == "two.yaml"
    assert [s.key for s in suite.select(scenarios=["synthetic"]).scenarios] == ["syn_a", "syn_b"]   # by name
    assert suite.select() == suite and suite.select(scenarios=[], strategies=[], seeds=[]) == suite
    assert [r.run_id for r in picked.run_specs()] == ["syn_b__rp__s5", "syn_b__ewc__s5", "split_digits__rp__s5",
                                                      "split_digits__ewc__s5"]


def test_select_errors_name_the_suite_the_kind_and_what_it_has():
    suite = parse_suite(TWO, "two.yaml")
    with pytest.raises(ConfigError) as info:
        suite.select(scenarios=["syn_c"])
    assert str(info.value) == ("suite 'two' has no scenario 'syn_c'. Did you mean 'syn_b' or 'syn_a'? "
                               "It has: split_digits, syn_a, syn_b, synthetic.")
    with pytest.raises(ConfigError) as info:
        suite.select(strategies=["zzz"])
    assert str(info.value) == "suite 'two' has no strategy 'zzz'. It has: ewc, naive, replay, rp."
    with pytest.raises(ConfigError) as info:
        suite.select(seeds=[-1])
    assert str(info.value) == f"--seeds: {SEEDS_RULE} [-1]."


def test_run_specs_carry_device_and_amp_in_scenario_strategy_seed_order():
    specs = parse_suite(TWO, "two.yaml").run_specs(device="cpu", amp=True)
    assert len(specs) == 3 * 3 * 2 and all(s.device == "cpu" and s.amp for s in specs)
    assert [s.run_id for s in specs[:4]] == ["syn_a__rp__s0", "syn_a__rp__s1", "syn_a__naive__s0", "syn_a__naive__s1"]
    assert parse_suite(TWO).run_specs()[0].device == "auto" and not parse_suite(TWO).run_specs()[0].amp


@pytest.mark.parametrize("data, message", [
    ({**GOOD, "strategies": [{"name": "replay", "args": {"lrr": 1}}]},
     "bad.yaml: strategies[0] (replay): args: unknown key 'lrr'. Did you mean 'lr'? Allowed keys: model, model_args, "),
    ({**GOOD, "strategies": [{"name": "naive", "args": {"model": "mlp", "model_args": [8]}}]},
     "bad.yaml: strategies[0] (naive): args.model_args: expected a dict, got [8]"),
    ({**GOOD, "strategies": [{"name": "naive", "args": {"model": "mlp", "model_args": {"hiden": [8]}}}]},
     "bad.yaml: strategies[0] (naive): args.model_args: unknown key 'hiden'. Did you mean 'hidden'? Allowed keys: "),
    ({**GOOD, "strategies": [{"name": "naive", "args": {"head": "autoo"}}]},
     "bad.yaml: strategies[0] (naive): args.head: unknown head 'autoo'. Did you mean 'auto'? Choose one of: auto, "),
    ({**GOOD, "scenarios": [{"name": "synthetic", "args": {"n_classes": "four"}}]},
     "bad.yaml: scenarios[0] (synthetic): args.n_classes: expected an int, got 'four'"),
])
def test_error_messages_name_file_entry_key_suggestion_and_choices(data, message):
    """The messages are the interface: the exact start of each (file, entry, key, suggestion, what is allowed)."""
    with pytest.raises(ConfigError) as info:
        parse_suite(data, "bad.yaml")
    assert str(info.value).startswith(message), str(info.value)


def test_suggestions_list_at_most_two_close_names_joined_by_or():
    from clbench.errors import suggest

    close = suggest("mem_sise", ["mem_size", "mem_sizes", "mem_sizer", "lr"])
    assert close == " Did you mean 'mem_size' or 'mem_sizes'?"
    assert suggest("abc", ["abd", "xyz"]) == " Did you mean 'abd'?"
    assert suggest("qqqq", ["abd", "xyz"]) == ""
    assert suggest("abcdef", ["abcxyz"]) == " Did you mean 'abcxyz'?"        # ratio 0.5: the cutoff is inclusive


def test_model_args_of_a_named_model_are_typed_by_its_signature_and_auto_accepts_any_models_keys():
    config = build_config("naive", "cpu", {"model": "mlp", "model_args": {"hidden": [16, 8]}})
    assert config.model_args == {"hidden": (16, 8)}
    with pytest.raises(ConfigError, match=r"model_args\.hidden: expected"):
        build_config("naive", "cpu", {"model": "mlp", "model_args": {"hidden": "wide"}})
    auto = build_config("naive", "cpu", {"model_args": {"embed_dim": 16}})      # a vit key: some model takes it
    assert auto.model_args == {"embed_dim": 16}


def test_suite_paths_by_suffix_or_existing_file(tmp_path):
    from clbench.suite_file import resolve_suite_path

    with pytest.raises(ConfigError, match=r"^suite file .*missing\.yml does not exist\.$"):
        resolve_suite_path(str(tmp_path / "missing.yml"))
    plain = tmp_path / "suite_without_suffix"
    plain.write_text(yaml.safe_dump(GOOD))
    assert resolve_suite_path(str(plain)) == plain and load_suite(plain).name == "s"
    assert resolve_suite_path("quick") == shipped_suites()["quick"]


def test_build_config_names_the_strategy_in_its_errors_unless_told_where():
    with pytest.raises(ConfigError) as info:
        build_config("replay", "gpu")
    assert str(info.value) == ("strategy 'replay': strategy 'replay' has no preset 'gpu'. Did you mean 'cpu'? "
                               "Presets: cpu, full.")
    with pytest.raises(ConfigError) as info:
        build_config("dytox", None, {"arch_overrides": {"depht": 2}})
    assert str(info.value).startswith("strategy 'dytox': invalid hyperparameters: unknown arch_overrides ['depht']")
    with pytest.raises(ConfigError) as info:
        build_config("dytox", None, {"arch": "huge"}, where="here")
    assert str(info.value).startswith("here: args.arch: unknown arch 'huge'.")


def test_config_dict_of_dataclasses_and_mappings_and_hash_of_non_json_values():
    from pathlib import Path

    from clbench.config import config_dict, config_hash

    assert config_dict(build_config("naive", "cpu"))["epochs"] == 2
    assert config_dict({"a": 1}) == {"a": 1} and config_dict([("b", 2)]) == {"b": 2}
    assert config_hash({"init": Path("ckpt/x.pt")}) == config_hash({"init": "ckpt/x.pt"})


def test_identity_is_suite_scenario_strategy_with_resolved_config_and_seed():
    suite = parse_suite(GOOD, "good.yaml")
    spec = suite.run_specs()[1]
    assert spec.identity() == {
        "suite": "s", "scenario": {"name": "synthetic", "args": {}, "label": ""},
        "strategy": {"name": "replay", "args": {"mem_size": 50}, "label": "", "preset": "cpu", "callbacks": (),
                     "resolved": dataclasses.asdict(build_config("replay", "cpu", {"mem_size": 50}))},
        "seed": 1}


def test_unknown_suite_lists_every_shipped_suite(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_suite("quik")
    assert str(info.value) == (f"unknown suite 'quik'. Did you mean 'quick'? Shipped suites: "
                               f"{', '.join(sorted(shipped_suites()))}; or pass the path of a .yaml file.")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "seeds": [2]}))
    assert load_suite(path).source == str(path) and load_suite(str(path)).seeds == (2,)
    path.write_text(yaml.safe_dump({**GOOD, "seed": [2]}))
    with pytest.raises(ConfigError, match=rf"^{path}: unknown key 'seed'"):
        load_suite(path)


@pytest.mark.parametrize("callbacks, message", [
    (["hook_trac"], "bad.yaml: strategies[0] (naive).callbacks[0]: unknown callback 'hook_trac'. Did you mean "
                    "'hook_trace'? Known callbacks: "),
    ([{"name": "hook_trace", "args": {"batch": 1}}],
     "bad.yaml: strategies[0] (naive).callbacks[0].args (callback 'hook_trace'): unknown key 'batch'. Did you mean "
     "'batches'? Allowed keys: batches."),
    ([{"name": "hook_trace", "args": {"batches": "many"}}],
     "bad.yaml: strategies[0] (naive).callbacks[0].args.batches: expected an int, got 'many'"),
    ("hook_trace", "bad.yaml: strategies[0] (naive).callbacks: expected a list of entries, each a mapping with keys "
                   "('name', 'args')."),
])
def test_callback_entries_are_checked_against_the_registry_and_the_factorys_signature(callbacks, message):
    with pytest.raises(ConfigError) as info:
        parse_suite({**GOOD, "strategies": [{"name": "naive", "callbacks": callbacks}]}, "bad.yaml")
    assert str(info.value).startswith(message), str(info.value)


def test_callback_args_are_typed_and_a_factory_taking_kwargs_accepts_any_key(monkeypatch):
    from clbench.callbacks import CALLBACKS, Callback

    def open_ended(rate: float = 0.0, **kwargs) -> Callback:
        return Callback()

    monkeypatch.setitem(CALLBACKS._entries, "test_open_ended", open_ended)
    entry = parse_suite({**GOOD, "strategies": [{"name": "naive", "callbacks": [
        {"name": "hook_trace", "args": {"batches": "3"}},
        {"name": "test_open_ended", "args": {"rate": 1, "anything": [1]}}]}]}).strategies[0]
    assert entry.callbacks == ({"name": "hook_trace", "args": {"batches": 3}},
                               {"name": "test_open_ended", "args": {"rate": 1.0, "anything": [1]}})
    assert isinstance(entry.callbacks[1]["args"]["rate"], float)


def test_scenario_arg_errors_start_with_file_and_entry():
    with pytest.raises(ConfigError) as info:
        parse_suite({**GOOD, "scenarios": [{"name": "synthetic", "args": {"n_clases": 4}}]}, "bad.yaml")
    assert str(info.value).startswith("bad.yaml: scenarios[0] (synthetic): args: unknown key 'n_clases'. Did you "
                                      "mean 'n_classes' or 'train_per_class'? Allowed keys: n_classes, ")


KEYS = "('name', 'preset', 'args', 'label', 'callbacks', 'dp')"


@pytest.mark.parametrize("change, message", [
    ({"strategies": []},
     f"bad.yaml: strategies: expected a non-empty list of entries, each a mapping with keys {KEYS}."),
    ({"scenarios": "synthetic"}, "bad.yaml: scenarios: expected a non-empty list of entries, each a mapping with keys "
                                 "('name', 'args', 'label')."),
    ({"strategies": [{"name": "naive", "callbacks": {}}]},
     "bad.yaml: strategies[0] (naive).callbacks: expected a list of entries, each a mapping with keys "
     "('name', 'args')."),
    ({"strategies": [{"preset": "cpu"}]}, "bad.yaml: strategies[0]: each entry needs at least a 'name' (got "
                                          "{'preset': 'cpu'})."),
    ({"strategies": [3]}, "bad.yaml: strategies[0]: each entry needs at least a 'name' (got 3)."),
    ({"strategies": [{"name": "naive", "args": [1]}]}, "bad.yaml: strategies[0].args: expected a mapping, got [1]."),
    ({"scenarios": [{"name": "synthetic", "args": {"seed": 3}}]},
     "bad.yaml: scenarios[0] (synthetic): args: unknown key 'seed'. Allowed keys: n_classes, "),
])
def test_entry_lists_are_checked_with_one_line_each(change, message):
    """Lists of entries: non-empty where required (callbacks may be empty), each a mapping with a name or a bare
    name, args a mapping; the seed is the suite's, never a scenario argument."""
    with pytest.raises(ConfigError) as info:
        parse_suite({**GOOD, **change}, "bad.yaml")
    assert str(info.value).startswith(message), str(info.value)
    assert parse_suite({**GOOD, "strategies": [{"name": "naive", "callbacks": []}]}).strategies[0].callbacks == ()


def test_a_registered_name_unfit_for_file_names_is_refused_without_a_label(monkeypatch):
    from clbench.registry import SCENARIOS

    monkeypatch.setitem(SCENARIOS._entries, "syn__thetic", SCENARIOS.get("synthetic"))
    with pytest.raises(ConfigError) as info:
        parse_suite({**GOOD, "scenarios": ["syn__thetic"]}, "bad.yaml")
    assert str(info.value).startswith("bad.yaml: scenarios[0] (syn__thetic): 'name' 'syn__thetic' may contain only "
                                      "letters, digits, '_', '.', '+' and '-'")
    assert parse_suite({**GOOD, "scenarios": [{"name": "syn__thetic", "label": "syn"}]}).scenarios[0].key == "syn"


@dataclasses.dataclass
class _ModelConfig:
    model: str = "mlp"
    model_args: dict = dataclasses.field(default_factory=dict)
    rate: float = 0.5


class _NoPresets:
    Config = _ModelConfig


class _VitPreset:
    Config = _ModelConfig
    PRESETS = {"vit": {"model": "vit"}, "bad": {"rate": "fast"}}


@pytest.fixture
def fake_strategies(monkeypatch):
    from clbench.registry import STRATEGIES

    monkeypatch.setitem(STRATEGIES._entries, "test_no_presets", _NoPresets)
    monkeypatch.setitem(STRATEGIES._entries, "test_vit_preset", _VitPreset)


def test_presets_are_optional_and_a_presets_model_decides_which_model_args_are_valid(fake_strategies):
    """A strategy without PRESETS builds from its defaults and says it has none; ``model_args`` are checked against
    the model chosen by args, else by the preset, else by the Config's default (here mlp, which takes ``hidden``
    and not vit's ``embed_dim``); a preset's own bad value names the preset."""
    assert build_config("test_no_presets").rate == 0.5
    with pytest.raises(ConfigError) as info:
        build_config("test_no_presets", "cpu")
    assert str(info.value) == ("strategy 'test_no_presets': strategy 'test_no_presets' has no preset 'cpu'. "
                               "Presets: none.")
    assert build_config("test_no_presets", None, {"model_args": {"hidden": [4]}}).model_args == {"hidden": (4,)}
    with pytest.raises(ConfigError, match=r"model_args: unknown key 'embed_dim'"):
        build_config("test_no_presets", None, {"model_args": {"embed_dim": 4}})
    assert build_config("test_vit_preset", "vit", {"model_args": {"embed_dim": 4}}).model == "vit"
    with pytest.raises(ConfigError, match=r"model_args: unknown key 'hidden'"):
        build_config("test_vit_preset", "vit", {"model_args": {"hidden": [4]}})
    with pytest.raises(ConfigError) as info:
        build_config("test_vit_preset", "bad")
    assert str(info.value).startswith("strategy 'test_vit_preset': preset 'bad'.rate: expected a float")


@pytest.mark.parametrize("change, message", [
    ({"strategies": [{"name": "naive", "label": "a..b"}]}, "bad.yaml: strategies[0] (naive): 'label' 'a..b' may "),
    ({"seeds": {0: 1}}, f"bad.yaml: {SEEDS_RULE} {{0: 1}}."),
])
def test_labels_leaving_their_folder_and_seeds_that_are_not_a_list_are_refused(change, message):
    with pytest.raises(ConfigError) as info:
        parse_suite({**GOOD, **change}, "bad.yaml")
    assert str(info.value).startswith(message), str(info.value)


def test_parse_suite_defaults_source_and_seeds():
    with pytest.raises(ConfigError) as info:
        parse_suite([GOOD])
    assert str(info.value) == ("<suite>: a suite file must be a mapping with keys suite, description, seeds, plugins, "
                               "scenarios, strategies.")
    assert parse_suite({k: v for k, v in GOOD.items() if k != "seeds"}).seeds == (0,)


PATH_RULE = ("may contain only letters, digits, '_', '.', '+' and '-', start with a letter or digit and contain "
             "neither '..' nor '__': it becomes part of file names (results/<suite>/runs/<scenario>__<strategy>__"
             "s<seed>.json).")


@pytest.mark.parametrize("change, message", [
    ({"seeds": []}, f"bad.yaml: {SEEDS_RULE} []."),
    ({"suite": 12}, f"bad.yaml: 'suite' 12 {PATH_RULE}"),
    ({"strategies": [{"name": "naive", "label": 5}]}, f"bad.yaml: strategies[0] (naive): 'label' 5 {PATH_RULE}"),
    ({"strategies": [{"name": "replay", "preset": ["cpu"]}]},
     "bad.yaml: strategies[0] (replay): strategy 'replay' has no preset ['cpu']. Did you mean 'cpu'? "
     "Presets: cpu, full."),
    ({"strategies": [{"name": "naive", "dp": {"epsilon": 3.0}, "callbacks": [{"name": "dp", "args": {}}]}]},
     "bad.yaml: strategies[0] (naive): private training is given twice (dp: and a dp callback); keep one."),
])
def test_empty_seeds_non_string_names_and_presets_and_two_dp_blocks_are_one_exact_line(change, message):
    """An empty seed list, a suite name or label that is not a string, a preset that is not a string (refused,
    not a TypeError from looking it up) and private training given both as ``dp:`` and as a ``dp`` callback: each
    is a ConfigError with this exact line."""
    with pytest.raises(ConfigError) as info:
        parse_suite({**GOOD, **change}, "bad.yaml")
    assert str(info.value) == message


def test_a_dp_callback_alone_is_kept_as_the_entrys_private_training():
    """A ``dp`` entry under ``callbacks:`` (no ``dp:`` key) is one private-training setting, kept as written."""
    entry = parse_suite({**GOOD, "strategies": [{"name": "naive", "callbacks": [
        {"name": "dp", "args": {"epsilon": 1.0}}]}]}).strategies[0]
    assert entry.callbacks == ({"name": "dp", "args": {"epsilon": 1.0}},)


def test_model_args_of_a_model_taking_kwargs_accept_any_key_and_type_the_named_ones():
    """``dytox`` takes ``**overrides``: any key passes, the annotated ones (``arch: str``) are still typed; ``cnn``
    (no ``**``) coerces ``width: '8'`` to 8 by its annotation."""
    args = {"model": "dytox", "model_args": {"anything": 1, "arch": "tiny"}}
    assert build_config("naive", "cpu", args).model_args == {"anything": 1, "arch": "tiny"}
    with pytest.raises(ConfigError) as info:
        build_config("naive", "cpu", {"model": "dytox", "model_args": {"arch": 3}})
    assert str(info.value) == "strategy 'naive': args.model_args.arch: expected a str, got 3"
    assert build_config("naive", "cpu", {"model": "cnn", "model_args": {"width": "8"}}).model_args == {"width": 8}


@pytest.mark.parametrize("change, message", [
    ({"scenarios": ["synthetic", {"name": "split_digits", "label": "synthetic"}]},
     "bad.yaml: scenario 'synthetic' appears twice; give the entries distinct 'label's."),
    ({"strategies": ["naive", "replay", {"name": "ewc", "label": "replay"}, {"name": "naive"}]},
     "bad.yaml: strategy 'naive' appears twice; give the entries distinct 'label's."),
])
def test_a_row_key_used_twice_is_one_line_naming_the_kind_and_the_first_duplicate(change, message):
    """Two entries with one row key (a label equal to another entry's name counts) are refused, naming whether
    scenarios or strategies clash and the first duplicate in sorted order."""
    with pytest.raises(ConfigError) as info:
        parse_suite({**GOOD, **change}, "bad.yaml")
    assert str(info.value) == message


def test_a_suite_without_description_has_an_empty_one_and_keeps_a_given_one_as_text():
    """The description defaults to "" and is kept as text (a number in YAML becomes its string)."""
    assert parse_suite(GOOD).description == ""
    assert parse_suite({**GOOD, "description": 2026}).description == "2026"


def test_model_args_under_model_auto_are_keys_of_some_model_and_left_as_written():
    """With ``model: auto`` (the backbone is the scenario's, unknown at load) a key no registered model takes is
    still refused with the exact line although ``dytox`` takes ``**overrides`` (catches the key check skipped for
    ``auto``), and values are not typed by any one model: cnn's ``width: int`` does not turn ``'8'`` into 8 (catches
    the first registered model's annotations applied to every backbone)."""
    from clbench.registry import MODELS

    with pytest.raises(ConfigError) as info:
        build_config("naive", "cpu", {"model_args": {"widht": 8}})
    assert str(info.value).startswith("strategy 'naive': args.model_args: unknown key 'widht'. Did you mean 'width'? "
                                      "Allowed keys: width, arch, hidden, dropout, embed_dim, depth,"), str(info.value)
    assert MODELS.names()[0] == "cnn"           # the model whose annotations the second half must not apply
    assert build_config("naive", "cpu", {"model_args": {"width": "8"}}).model_args == {"width": "8"}


@dataclasses.dataclass
class _LooseModelArgsConfig:
    model: str = "mlp"
    model_args: typing.Any = None


class _LooseModelArgs:
    Config = _LooseModelArgsConfig


def test_model_args_that_are_not_a_mapping_are_one_exact_line_even_where_the_config_does_not_type_them(monkeypatch):
    """A Config annotating ``model_args`` as ``Any`` lets a list through its own type check; the model-args check
    still refuses it with this exact line (catches the message replaced or dropped)."""
    from clbench.registry import STRATEGIES

    monkeypatch.setitem(STRATEGIES._entries, "test_loose_model_args", _LooseModelArgs)
    with pytest.raises(ConfigError) as info:
        build_config("test_loose_model_args", None, {"model_args": [8]})
    assert str(info.value) == "strategy 'test_loose_model_args': args.model_args: expected a mapping, got [8]."


class _PlainFactory:
    def __init__(self, width: int = 1) -> None:
        self.width = width


def test_type_hints_of_a_dataclass_are_its_fields_and_of_a_plain_class_its_init_parameters():
    """A dataclass Config is typed by its fields (no ``return`` entry from its generated ``__init__``: catches the
    dataclass test dropped so that every class reads ``__init__``); a plain class by its ``__init__``'s parameters;
    an annotation that cannot be resolved leaves the object unchecked ({})."""
    from clbench.config import type_hints

    def unresolved(x: "NoSuchType") -> None:  # noqa: F821
        return None

    assert type_hints(_ModelConfig) == {"model": str, "model_args": dict, "rate": float}
    assert type_hints(_PlainFactory) == {"width": int, "return": type(None)}
    assert type_hints(unresolved) == {}


def test_with_scenario_paths_replaces_init_at_any_depth_and_nothing_else():
    """Top-level ``init`` and ``model_args.init`` are replaced, other strings holding ``{scenario}`` and the input
    config are not; a config without the placeholder comes back as the same object."""
    base = config.build_config("naive", "cpu", {"init": "c/{scenario}.pt"})
    out = config.with_scenario_paths(base, "split_mnist")
    assert out.init == "c/split_mnist.pt" and base.init == "c/{scenario}.pt"
    assert {k: v for k, v in vars(out).items() if k != "init"} == {k: v for k, v in vars(base).items() if k != "init"}
    nested = {"init": None, "model_args": {"init": "{scenario}/b.pt", "name": "{scenario}"}}
    assert config.with_scenario_paths(nested, "x") == {"init": None, "model_args": {"init": "x/b.pt",
                                                                                    "name": "{scenario}"}}
    plain = config.build_config("naive", "cpu", {})
    assert config.with_scenario_paths(plain, "x") is plain


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
