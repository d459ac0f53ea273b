"""``clbench forget`` (:mod:`clbench.commands.forget`): requests it cannot serve are refused in one line and nothing
is removed; what it removes is recorded exactly."""

import json
import os
import shutil

import pytest
import torch
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import records as record_files
from clbench import tasks
from clbench.cli import main
from clbench.files import locked_folder
from tests._cli import one_error_line, run_suite

TINY_VIT = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}


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


def test_forget_on_a_copied_results_folder_uses_the_copy_s_own_state(copied_results, capsys):
    archive = copied_results / "archive/runs/synthetic__taft_shards__s0.json"
    (copied_results / "ids.txt").write_text("4")
    capsys.readouterr()
    assert main(["forget", "--run", str(archive), "--ids", str(copied_results / "ids.txt"), "--mode", "retrain"]) == 0
    row = json.loads((copied_results / "archive/removals/synthetic__taft_shards__s0__retrain__ids.json").read_text())
    assert row["shards_left"] == 3 * 3                            # the archive's 3 shards per experience, not 2
    assert not (copied_results / "original/removals").exists()


def test_forget_refuses_a_record_whose_state_belongs_to_another_run(copied_results, capsys):
    """A record written before paths were relative names the original folder's state, which another run replaced."""
    archive = copied_results / "archive/runs/synthetic__taft_shards__s0.json"
    old_style = copied_results / "old/runs/synthetic__taft_shards__s0.json"
    old_style.parent.mkdir(parents=True)
    record = json.loads(archive.read_text())
    record["state_dir"] = str(copied_results / "original/state/synthetic__taft_shards__s0")
    old_style.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["forget", "--run", str(old_style), "--touch", "1"]) == 2
    one_error_line(capsys, "written by another run", "--force")
    assert not (copied_results / "old/removals").exists()


def test_forget_refuses_a_state_whose_strategy_file_was_swapped_for_another_run_s(copied_results, capsys):
    """The archive's own state folder (owner file intact), its strategy.pt replaced by the rerun's (2 shards, not 3):
    forget would serve the other run's weights under this record's name (issue #37)."""
    swapped = copied_results / "swapped"
    shutil.copytree(copied_results / "archive", swapped)
    shutil.rmtree(swapped / "removals", ignore_errors=True)          # the archive's own, made by an earlier test
    state = "state/synthetic__taft_shards__s0/strategy.pt"
    shutil.copy(copied_results / "original" / state, swapped / state)
    capsys.readouterr()
    assert main(["forget", "--run", str(swapped / "runs/synthetic__taft_shards__s0.json"), "--touch", "1"]) == 2
    one_error_line(capsys, "strategy.pt differ from what the run saved", "--force")
    assert not (swapped / "removals").exists()


def test_forget_command_records_subtraction_and_retraining(tiny_suite, tmp_path, monkeypatch):
    pools = []       # --shard-workers reaches the task pool of both commands (kept in-process: no spawn here)
    monkeypatch.setattr(tasks, "make_pool", lambda kind, workers: pools.append((kind, workers)) or
                        tasks.SequentialPool())
    suite = tiny_suite([{"name": "taft_shards", "preset": "cpu",
                         "args": {"n_shards": 3, "epochs": 1, "model_args": TINY_VIT}}])
    out = tmp_path / "out"
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table", "--shard-workers", "2"]) == 0
    run = out / "runs" / "synthetic__taft_shards__s0.json"
    assert json.loads(run.read_text())["state_dir"]
    assert main(["forget", "--run", str(run), "--touch", "1", "--per-shard", "2",
                 "--mode", "subtract", "retrain", "--shard-workers", "3"]) == 0
    assert pools == [("process", 2), ("process", 3)]
    removals = {p.name: json.loads(p.read_text()) for p in (out / "removals").glob("*.json")}
    subtract = removals["synthetic__taft_shards__s0__subtract__touch1.json"]
    retrain = removals["synthetic__taft_shards__s0__retrain__touch1.json"]
    for row in (subtract, retrain):
        assert len(row["ids"]) == 2 and row["hash_before"] != row["hash_after"]
        assert 0.0 <= row["accuracy_after"] <= 100.0
    # the two ids come from one shard; subtraction drops that whole shard, retraining only the ids
    assert len(subtract["shards_touched"]) == len(retrain["shards_touched"]) >= 1
    assert subtract["samples_dropped"] > retrain["samples_dropped"] == 2
    assert "touch1" in (out / "removals.md").read_text()
