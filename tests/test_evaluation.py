"""The shared evaluation routine against hand-computed accuracy matrices."""

import pytest
import torch

import tests._fakes  # noqa: F401  (registers the fake strategies)
from clbench.config import RunSpec, ScenarioEntry, StrategyEntry
from clbench.runner import run

ARGS = {"n_classes": 6, "n_experiences": 3, "train_per_class": 4, "test_per_class": 10}


def _spec(task_aware: bool, seed: int = 0) -> RunSpec:
    return RunSpec("t", ScenarioEntry("synthetic", {**ARGS, "task_aware": task_aware}),
                   StrategyEntry("test_increasing_logits"), seed, "cpu")


def test_class_incremental_matrix_masks_unseen_classes(tmp_path):
    record = run(_spec(False), tmp_path)
    assert record.status == "finished", record.reason
    # after step i the prediction is always class 2i+1 (largest seen): half of experience i is right, nothing else
    assert record.accuracy_matrix == [[0.5, 0, 0], [0, 0.5, 0], [0, 0, 0.5]]
    m = record.metrics
    assert m["avg_inc_acc"] == pytest.approx(100 * (0.5 + 0.25 + 10 / 60) / 3)
    assert m["last_acc"] == pytest.approx(100 * 10 / 60)
    assert m["forgetting"] == pytest.approx(50.0) and m["bwt"] == pytest.approx(-50.0)
    assert record.test_sizes == [20, 20, 20]
    assert m["params_added_M"] == pytest.approx(2e-6) and m["extra"] == {"answer": 1.5}


def test_task_incremental_predicts_within_the_task(tmp_path):
    record = run(_spec(True), tmp_path)
    # with the task label given, the argmax is over task j's two classes: always its second class
    assert record.accuracy_matrix == [[0.5] * 3] * 3
    assert record.metrics["forgetting"] == pytest.approx(0.0)


def test_record_json_layout(tmp_path):
    import json

    run(_spec(False), tmp_path)
    data = json.loads((tmp_path / "runs" / "synthetic__test_increasing_logits__s0.json").read_text())
    assert isinstance(data["accuracy_matrix"], list) and len(data["accuracy_matrix"]) == 3
    for key in ("spec", "identity_hash", "seed", "metrics", "env", "status", "params_per_step", "strategy_config"):
        assert key in data
    assert data["env"]["packages"]["torch"] == torch.__version__.split("+")[0]
    assert set(data["metrics"]) >= {"avg_inc_acc", "last_acc", "forgetting", "bwt", "params_M", "train_s",
                                     "eval_s", "peak_mem_MB"}
