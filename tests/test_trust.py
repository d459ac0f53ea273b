"""Issue #9's trust edges, one test per class of problem: records of different configurations mixed in one
leaderboard row, records reused after the code changed, names that escape the output folder, `forget` requests
that cannot be served, values of the wrong type or range, corrupt records, an unusable output folder or device and
a corrupt dataset. Each test failed on the code before the fix (see the commit that added this file)."""

import json
import os
import sys

import pandas as pd
import pytest
import torch
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import executors
from clbench import records as record_files
from clbench.cli import main
from clbench.errors import ConfigError
from clbench.files import locked_folder
from clbench.registry import SCENARIOS
from clbench.suite_file import parse_suite
from tests._cli import run_suite

TINY_VIT = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}
GOOD = {"suite": "s", "seeds": [0], "scenarios": [{"name": "synthetic"}],
        "strategies": [{"name": "replay", "preset": "cpu", "args": {"mem_size": 50, "model": "mlp"}}]}



# ------------------------------------------------------------------------------------------------------- mixing
def test_leaderboard_never_averages_records_of_different_configurations(tiny_suite, tmp_path):
    """The issue's example: mem_size 100 (seed 0) and mem_size 20 (seed 1) written into one --out (the issue's 200
    is more than the tiny stream's 120 samples: refused at load)."""
    out = tmp_path / "out"
    for mem_size, seed in ((100, 0), (20, 1)):
        suite = tiny_suite([{"name": "replay", "preset": "cpu", "args": {"epochs": 1, "mem_size": mem_size}}],
                           seeds=(seed,))
        assert run_suite(suite, out) == 0
    table = pd.read_csv(out / "leaderboard.csv")
    assert set(table["strategy"]) == {"replay [mem_size=20]", "replay [mem_size=100]"}
    assert (table["n_seeds"] == 1).all()


# ---------------------------------------------------------------------------------------------------- staleness
def test_resume_reruns_records_made_by_other_code_and_says_so(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}], seeds=(0, 1))
    assert run_suite(suite, out) == 0
    path = out / "runs" / "synthetic__test_increasing_logits__s0.json"
    record = json.loads(path.read_text())
    assert len(record["code_fingerprint"]) >= 12
    record["code_fingerprint"] = "0" * 12             # as if made before the strategy's code changed
    path.write_text(json.dumps(record))
    capsys.readouterr()

    assert run_suite(suite, out) == 0                          # no -v: the resume line is printed anyway
    err = capsys.readouterr().err
    assert "resuming: 1 of 2 runs already finished" in err and "1 made by other code" in err
    assert json.loads(path.read_text())["code_fingerprint"] != "0" * 12

    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    assert run_suite(suite, out) == 0
    assert "resuming: 2 of 2 runs already finished" in capsys.readouterr().err
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}
    assert run_suite(suite, out, "--force") == 0               # --force reruns everything
    assert all(p.stat().st_mtime_ns != t for p, t in stamps.items())


def test_fingerprint_follows_code_not_comments(tmp_path, monkeypatch):
    """A change to a function body changes the fingerprint of a module and of everything importing it; a change to
    a comment or a docstring does not. The closure follows imports inside clbench and leaves out the CLI."""
    from clbench import fingerprint

    module = tmp_path / "fp_probe.py"
    source = '"""Doc."""\nfrom clbench import metrics\n\n\ndef predict(x):\n    """Doc."""\n    return x + 1\n'
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    files = fingerprint.module_files(["fp_probe"])
    assert "clbench.metrics" in files and "fp_probe" in files and "clbench.cli" not in files
    before = fingerprint.fingerprint_of(["fp_probe"])
    module.write_text(source.replace('"""Doc."""', '"""Other words."""') + "# a comment\n")
    assert fingerprint.fingerprint_of(["fp_probe"]) == before
    module.write_text(source.replace("x + 1", "x + 2"))
    assert fingerprint.fingerprint_of(["fp_probe"]) != before

    core = fingerprint.module_files([SCENARIOS.get("synthetic").__module__, *fingerprint.CORE])
    assert {"clbench.runner", "clbench.metrics", "clbench.scenarios.synthetic"} <= set(core)
    assert not {"clbench.cli", "clbench.leaderboard", "clbench.report"} & set(core)


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


# -------------------------------------------------------------------------------------------------- forget inputs
@pytest.fixture(scope="module")
def shard_run(tmp_path_factory):
    """A finished taft_shards run (3 experiences x 3 shards) with its saved state."""
    root = tmp_path_factory.mktemp("forget")
    suite = root / "s.yaml"
    suite.write_text(yaml.safe_dump({
        "suite": "s", "scenarios": [{"name": "synthetic", "args": {"train_per_class": 10, "test_per_class": 5}}],
        "strategies": [{"name": "taft_shards", "preset": "cpu",
                        "args": {"n_shards": 3, "epochs": 1, "model_args": TINY_VIT}}]}))
    assert run_suite(suite, root / "out") == 0
    return root / "out" / "runs" / "synthetic__taft_shards__s0.json"


@pytest.mark.parametrize("ids, touch, extra, message", [
    ("0 1 999999", None, [], "not in the training set"),          # 60 training samples: ids 0..59
    ("", None, [], "no sample ids"),
    ("3 x", None, [], "not an integer"),
    (None, ["-1"], [], "--touch"),
    (None, ["0"], [], "--touch"),
    (None, ["10"], [], "9 shards"),
    (None, ["many"], [], "--touch"),
    (None, ["1"], ["--per-shard", "0"], "--per-shard"),
    (None, ["1"], ["--shard-workers", "0"], "--shard-workers"),
])
def test_forget_refuses_requests_it_cannot_serve(shard_run, tmp_path, capsys, ids, touch, extra, message):
    if ids is not None:
        (tmp_path / "ids.txt").write_text(ids)
        request = ["--ids", str(tmp_path / "ids.txt")]
    else:
        request = ["--touch", *touch]
    removals = shard_run.parent.parent / "removals"
    before = sorted(removals.glob("*.json")) if removals.exists() else []
    capsys.readouterr()
    assert main(["forget", "--run", str(shard_run), *request, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert (sorted(removals.glob("*.json")) if removals.exists() else []) == before


def test_forget_refuses_a_corrupt_run_record(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r.json").write_text("{not json")
    assert main(["forget", "--run", str(tmp_path / "runs" / "r.json"), "--touch", "1"]) == 2
    assert "r.json" in capsys.readouterr().err


def test_forget_is_refused_while_a_suite_holds_the_folder(shard_run, tmp_path, capsys):
    """forget appends to removals.md: run beside a suite (or a second forget) its lines would interleave."""
    out = shard_run.parent.parent
    before = sorted((out / "removals").glob("*.json")) if (out / "removals").exists() else []
    capsys.readouterr()
    with locked_folder(out, "the suite s (run)"):
        assert main(["forget", "--run", str(shard_run), "--touch", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: output folder {out} is in use by the suite s (run) (pid {os.getpid()}); wait for it "
                   f"to end, then forget again."]
    assert (sorted((out / "removals").glob("*.json")) if (out / "removals").exists() else []) == before


def test_forget_records_exactly_the_samples_removed(shard_run, tmp_path):
    (tmp_path / "ids.txt").write_text("4 4 5")
    assert main(["forget", "--run", str(shard_run), "--ids", str(tmp_path / "ids.txt"),
                 "--mode", "subtract", "retrain"]) == 0
    removals = shard_run.parent.parent / "removals"
    subtract = json.loads((removals / "synthetic__taft_shards__s0__subtract__ids.json").read_text())
    retrain = json.loads((removals / "synthetic__taft_shards__s0__retrain__ids.json").read_text())
    assert subtract["ids"] == retrain["ids"] == [4, 5]
    assert retrain["removed_ids"] == [4, 5] and retrain["samples_dropped"] == 2
    # subtraction drops whole shards: every sample of the shards holding 4 and 5, and those only
    assert {4, 5} <= set(subtract["removed_ids"]) and len(subtract["removed_ids"]) == subtract["samples_dropped"]
    assert len(subtract["removed_ids"]) < 60


def test_the_forget_method_refuses_unknown_and_empty_ids(shard_run):
    """The library call checks what the command checks: nothing is removed for a request it cannot serve."""
    from clbench.runner import RunRecord, build_scenario, build_strategy
    from clbench.specs import RunSpec

    record = RunRecord.load(shard_run)
    spec = RunSpec.from_dict(record.spec)
    strategy = build_strategy(spec, build_scenario(spec).info, torch.device("cpu"))
    strategy.load_state(record_files.state_dir(shard_run, record_files.read(shard_run)))
    before = strategy.shard_ids()
    for ids, message in (([3, 999999], "not training samples"), ([], "no sample ids")):
        with pytest.raises(ValueError, match=message):
            strategy.forget(ids, "subtract")
    assert strategy.shard_ids() == before


# ----------------------------------------------------------------------------------------------- load-time types
STRATEGY = "strategies[0] (replay): "


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


# ------------------------------------------------------------------------------------------------ corrupt records
def test_corrupt_and_foreign_records_are_reported_and_skipped(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}], seeds=(0, 1))
    assert run_suite(suite, out) == 0
    runs = out / "runs"
    (runs / "synthetic__test_increasing_logits__s1.json").write_text('{"run_id": "synthetic__te')   # cut short
    (runs / "notes.json").write_text('{"hello": "world"}')
    (runs / "list.json").write_text("[1, 2]")
    capsys.readouterr()

    assert main(["leaderboard", "--out", str(out)]) == 2          # the table is still written from the rest
    err = capsys.readouterr().err
    for name in ("synthetic__test_increasing_logits__s1.json", "notes.json", "list.json"):
        assert str(runs / name) in err
    assert "Traceback" not in err
    table = pd.read_csv(out / "leaderboard.csv")
    assert list(table["n_seeds"]) == [1]

    assert run_suite(suite, out) == 0                                  # the run reruns the corrupt one, skips foreign
    assert "notes.json" in capsys.readouterr().err
    assert list(pd.read_csv(out / "leaderboard.csv")["n_seeds"]) == [2]


# -------------------------------------------------------------------------------------- output folder and flags
def test_unusable_output_folder_device_and_executor_stop_before_the_first_run(tiny_suite, tmp_path, capsys,
                                                                             monkeypatch):
    calls = []
    monkeypatch.setattr(executors, "run", lambda spec, out: calls.append(spec))
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    (tmp_path / "a_file").write_text("")
    cases = [(["--out", str(tmp_path / "a_file")], "output folder"),
             (["--out", str(tmp_path / "a_file" / "below")], "output folder"),
             (["--shard-workers", "0"], "--shard-workers"),
             (["--device", "tpu"], "--device")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda"))
    monkeypatch.setitem(sys.modules, "ray", None)                     # Ray not installed
    cases.append((["--executor", "ray"], "pip install"))
    for flags, message in cases:
        capsys.readouterr()
        argv = ["--suite", str(suite), "--quiet", "--quiet-table"]
        argv += flags if "--out" in flags else ["--out", str(tmp_path / "out"), *flags]
        assert main(argv) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (flags, err)
    assert calls == []


# ------------------------------------------------------------------------------------------------ corrupt dataset
SCENARIO_CALLS = []


@SCENARIOS.register("test_corrupt_dataset")
def corrupt_dataset(*, seed: int = 0, path: str = "") -> None:
    """A scenario whose data file fails its checksum."""
    from clbench.data.checksums import verify

    SCENARIO_CALLS.append(seed)
    verify(__import__("pathlib").Path(path), "0" * 32)


def test_a_checksum_mismatch_stops_the_suite_once(tmp_path, capsys):
    data = tmp_path / "data.bin"
    data.write_bytes(b"not the official file")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"suite": "s", "seeds": [0, 1],
                                     "scenarios": [{"name": "test_corrupt_dataset", "args": {"path": str(data)}}],
                                     "strategies": ["test_increasing_logits", "naive"]}))
    SCENARIO_CALLS.clear()
    assert run_suite(suite, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "content md5" in err and SCENARIO_CALLS == [0]
    assert not list((tmp_path / "out").rglob("*.json"))
