"""Runner and executor behaviour: determinism, failures, interruption and resume."""

import json

import pytest

import tests._fakes  # noqa: F401
from clbench.executors import LocalExecutor, is_done
from clbench.runner import record_path
from clbench.suite_file import parse_suite

SCENARIO = {"name": "synthetic", "args": {"train_per_class": 15, "test_per_class": 10}}


def _suite(strategies, seeds=(0,)):
    return parse_suite({"suite": "t", "seeds": list(seeds), "scenarios": [SCENARIO], "strategies": strategies})


def test_same_seed_gives_identical_accuracy_matrix(tmp_path):
    suite = _suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}}])
    a = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path / "a")[0]
    b = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path / "b")[0]
    assert a.status == b.status == "finished"
    assert a.accuracy_matrix == b.accuracy_matrix


def test_nan_loss_marks_the_run_failed_and_the_suite_continues(tmp_path):
    suite = _suite([{"name": "naive", "preset": "cpu", "label": "diverges",
                     "args": {"epochs": 1, "optimizer": "sgd", "lr": 1e30, "momentum": 0.0}},
                    {"name": "test_increasing_logits"}])
    records = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert [r.status for r in records] == ["failed", "finished"]
    assert "non-finite" in records[0].reason
    saved = json.loads(record_path(tmp_path, records[0].run_id).read_text())
    assert saved["status"] == "failed" and "lower the learning rate" in saved["reason"].lower()


def test_interrupted_suite_keeps_finished_runs_and_resumes(tmp_path):
    interrupted = _suite([{"name": "test_increasing_logits", "args": {"interrupt_at_seed": 1}}], seeds=(0, 1))
    with pytest.raises(KeyboardInterrupt):
        LocalExecutor().run_all(interrupted.run_specs("cpu"), tmp_path)
    first = record_path(tmp_path, "synthetic__test_increasing_logits__s0")
    assert first.exists() and not record_path(tmp_path, "synthetic__test_increasing_logits__s1").exists()

    # the same command again (here without the interruption, i.e. another config) resumes where it stopped
    resumed = _suite([{"name": "test_increasing_logits", "args": {"interrupt_at_seed": 1}}], seeds=(0,))
    assert is_done(resumed.run_specs("cpu")[0], tmp_path)
    assert LocalExecutor().run_all(resumed.run_specs("cpu"), tmp_path) == []


def test_changed_configuration_or_failed_run_is_run_again(tmp_path):
    suite = _suite([{"name": "test_increasing_logits"}])
    (spec,) = suite.run_specs("cpu")
    LocalExecutor().run_all([spec], tmp_path)
    assert is_done(spec, tmp_path)
    changed = _suite([{"name": "test_increasing_logits", "args": {"extra": 2.0}}]).run_specs("cpu")[0]
    assert changed.run_id == spec.run_id and not is_done(changed, tmp_path)
    path = record_path(tmp_path, spec.run_id)
    data = json.loads(path.read_text())
    data["status"] = "failed"
    path.write_text(json.dumps(data))
    assert not is_done(spec, tmp_path)
    assert len(LocalExecutor().run_all([spec], tmp_path)) == 1
