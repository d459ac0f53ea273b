"""The shared evaluation routine against hand-computed accuracy matrices.

A non-classification scenario (next-item ranking, NDCG@10/HIT@10) through the same runner, leaderboard and
plots; the ranking evaluator against hand-computed ranks."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import tests._fakes  # noqa: F401  (registers the fake strategies)
import tests._ranking  # noqa: F401  (registers test_next_item and test_transitions)
from clbench import protocol
from clbench.errors import NonFiniteLossError
from clbench.evaluation import AccuracyEvaluator, RankingEvaluator
from clbench.executors import LocalExecutor
from clbench.protocol import ParamCount, Scenario, ScenarioInfo, StrategyBase
from clbench.runner import run
from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry
from clbench.suite_file import parse_suite
from tests._ranking import Windows

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


# ------------------------------------------------------------------------------- the evaluator on fixed predictions


class Fixed(protocol.StrategyBase):
    """Returns ``logits`` (one row, repeated) for every input; counts the samples it was asked about."""

    Config = dict

    def __init__(self, logits):
        super().__init__(protocol.ClassificationInfo("fixed", n_classes=4, classes_per_experience=(2, 2)), "cpu", {})
        self.logits, self.seen = torch.tensor(logits), 0

    def predict(self, x, task_labels):
        self.seen += len(x)
        return self.logits.expand(len(x), -1) if self.logits.ndim == 1 else self.logits

    def num_parameters(self):
        return protocol.ParamCount(0, 0)


def _experience(labels, task=0):
    y = torch.tensor(labels)
    data = TensorDataset(torch.zeros(len(y), 1), y, torch.full_like(y, task))
    data.eval = lambda: data
    return SimpleNamespace(dataset=data)


def _scenario(batch_size=2, **info):
    info = protocol.ClassificationInfo("c", n_classes=4, classes_per_experience=(2, 2), **info)
    test_stream = [_experience([1, 1, 0]), _experience([2, 3], task=1)]
    return protocol.Scenario(info, [], test_stream, AccuracyEvaluator(batch_size))


CPU = torch.device("cpu")


def test_class_incremental_argmax_is_over_the_seen_classes_and_future_experiences_are_zero_unrun():
    """After step 0 only classes 0-1 compete (class 2's high score is ignored), experience 1 is 0 exactly and the
    model is not run on it; after step 1 every class competes. Counts add up across batches (batch 2, 3 samples)."""
    scenario, strategy = _scenario(), Fixed([0.1, 0.9, 5.0, 0.0])
    row = scenario.evaluator(strategy, scenario, 0, CPU)
    assert row.rows == {"accuracy": [2 / 3, 0.0]} and row.sizes == [3, 2] and strategy.seen == 3
    row = scenario.evaluator(strategy, scenario, 1, CPU)
    assert row.rows == {"accuracy": [0.0, 0.5]} and row.sizes == [3, 2]


def test_task_incremental_argmax_is_within_the_task_and_future_tasks_are_run():
    """With the task label given, experience j is scored over its own classes (labels offset by the range start):
    experience 1's columns 2-3 give class 2; a future task is evaluated, not zeroed."""
    scenario, strategy = _scenario(task_aware=True), Fixed([0.1, 0.9, 5.0, 0.0])
    row = scenario.evaluator(strategy, scenario, 0, CPU)
    assert row.rows == {"accuracy": [2 / 3, 0.5]} and strategy.seen == 5


def test_domain_incremental_scores_the_shared_labels_on_every_experience():
    """Domain-incremental: every experience uses labels 0-1; future experiences are evaluated with the model."""
    info = protocol.ClassificationInfo("d", n_classes=2, classes_per_experience=(2, 2), domain_incremental=True)
    scenario = protocol.Scenario(info, [], [_experience([1, 1, 0]), _experience([1, 0])], AccuracyEvaluator(512))
    strategy = Fixed([0.1, 0.9, 5.0, 0.0])
    row = scenario.evaluator(strategy, scenario, 0, CPU)
    assert row.rows == {"accuracy": [2 / 3, 0.5]} and row.sizes == [3, 2] and strategy.seen == 5


@pytest.mark.parametrize("logits, error, message", [
    ([[0.0, 1.0]] * 3, protocol.StrategyContractError,
     "Fixed.predict returned shape (3, 2) for 3 inputs; at least 4 columns must be scored on test experience 0 "
     "after step 1."),
    ([[0.0, 1.0, 0.0, 0.0]] * 2, protocol.StrategyContractError,
     "Fixed.predict returned shape (2, 4) for 3 inputs; at least 4 columns must be scored on test experience 0 "
     "after step 1."),
    ([0.0, float("nan"), 0.0, 0.0], NonFiniteLossError,
     "non-finite value (nan) in predictions on test experience 0 after step 1. Lower the learning rate"),
])
def test_malformed_predictions_stop_the_run_with_one_line(logits, error, message):
    scenario = _scenario(batch_size=512)
    with pytest.raises(error) as info:
        scenario.evaluator(Fixed(logits), scenario, 1, CPU)
    assert str(info.value).startswith(message), str(info.value)


def test_only_the_scored_columns_must_be_finite():
    """A NaN in a column outside the allowed classes (an unseen class) does not matter."""
    scenario = _scenario()
    row = scenario.evaluator(Fixed([0.1, 0.9, float("nan"), float("inf")]), scenario, 0, CPU)
    assert row.rows["accuracy"] == [2 / 3, 0.0]


def test_ranking_at_the_cut_off_and_across_batches_and_experiences():
    """Rank k-1 is inside the top k, rank k is not; the sums run over batches (batch 2) and each experience is
    averaged over its own samples."""
    from tests._ranking import Windows

    scores = [float(11 - i) for i in range(12)]               # item i has rank i
    first = Windows(torch.zeros(3, 2, dtype=torch.long), torch.tensor([9, 10, 0]), 0)
    second = Windows(torch.zeros(1, 2, dtype=torch.long), torch.tensor([1]), 1)
    evaluator = RankingEvaluator(12, k=10, batch_size=2)
    scenario = protocol.Scenario(protocol.ClassificationInfo("r", n_classes=12, classes_per_experience=(12,)), [],
                        [SimpleNamespace(dataset=first), SimpleNamespace(dataset=second)], evaluator)
    row = evaluator(Fixed(scores), scenario, 0, CPU)
    assert [s.name for s in evaluator.specs] == ["ndcg@10", "hit@10"] and evaluator.specs[0].primary
    assert row.rows["hit@10"] == [pytest.approx(2 / 3), 1.0] and row.sizes == [3, 1]
    assert row.rows["ndcg@10"] == [pytest.approx((1 / np.log2(11) + 1.0) / 3), pytest.approx(1 / np.log2(3))]


class Recording(Fixed):
    """Also keeps the devices and task labels ``predict`` received."""

    def predict(self, x, task_labels):
        labels = task_labels.tolist() if task_labels.device.type == "cpu" else None
        self.received = getattr(self, "received", []) + [(x.device, task_labels.device, labels)]
        return super().predict(x, task_labels)


def test_inputs_and_task_labels_reach_predict_on_the_evaluation_device():
    """``predict(x, t)`` gets the batch and its task labels, both moved to the device the evaluator is given (the
    meta device here: moved tensors carry no data, which predict does not read)."""
    scenario, strategy = _scenario(task_aware=True), Recording([0.1, 0.9, 5.0, 0.0])
    scenario.evaluator(strategy, scenario, 0, torch.device("meta"))
    meta = torch.device("meta")
    assert [(xd, td) for xd, td, _ in strategy.received] == [(meta, meta)] * 3      # batches of 2: 2 + 1, then 2


def test_task_labels_passed_to_predict_are_the_experiences():
    scenario, strategy = _scenario(task_aware=True), Recording([0.1, 0.9, 5.0, 0.0])
    scenario.evaluator(strategy, scenario, 1, CPU)
    assert [t for _, _, t in strategy.received] == [[0, 0], [0], [1, 1]]


def test_predict_must_return_a_tensor():
    scenario, strategy = _scenario(), Fixed([0.0] * 4)
    strategy.predict = lambda x, t: [[0.0] * 4] * len(x)
    with pytest.raises(protocol.StrategyContractError) as info:
        scenario.evaluator(strategy, scenario, 0, CPU)
    assert str(info.value) == "Fixed.predict() returned list, expected Tensor (see clbench.protocol.StrategyBase)."


def test_evaluator_defaults_top_10_and_batches_of_512():
    """The defaults the scenarios rely on: NDCG@10/HIT@10 and 512 test samples per forward pass (evaluation's peak
    memory)."""
    ranking = RankingEvaluator(7)
    assert (ranking.n_items, ranking.k, ranking.batch_size) == (7, 10, 512)
    assert AccuracyEvaluator().batch_size == 512


class InferenceModeSpy(Fixed):
    """Fixed, and records whether each ``predict`` call ran under ``torch.inference_mode``."""

    def __init__(self, logits):
        super().__init__(logits)
        self.modes = []

    def predict(self, x, task_labels):
        self.modes.append(torch.is_inference_mode_enabled())
        return super().predict(x, task_labels)


def test_evaluation_and_the_training_accuracy_run_under_inference_mode():
    """No autograd bookkeeping in any evaluation call (``no_grad`` alone left it on)."""
    scenario, strategy = _scenario(), InferenceModeSpy([0.1, 0.9, 5.0, 0.0])
    scenario.evaluator(strategy, scenario, 1, CPU)
    train = [_experience([1, 1, 0]), _experience([2, 3], task=1)]
    scenario = protocol.Scenario(scenario.info, train, scenario.test_stream, scenario.evaluator)
    scenario.evaluator.train_accuracy(strategy, scenario, 1, CPU, [1], 10, 0)
    assert strategy.modes and all(strategy.modes)


class FixedScores(StrategyBase):
    """Item ``i`` scored ``scores[i]`` for every input."""

    Config = dict

    def __init__(self, scores):
        super().__init__(ScenarioInfo("fixed", 1), "cpu", {})
        self.scores = torch.tensor(scores)

    def predict(self, x, task_labels):
        return self.scores.expand(len(x), -1)

    def num_parameters(self):
        return ParamCount(0, 0)


def test_ranking_evaluator_against_hand_computed_ranks():
    # 12 items scored 11, 10, ..., 0: item i has rank i. Targets 0, 3, 9, 11: NDCG terms 1/log2(rank + 2).
    scores = [float(11 - i) for i in range(12)]
    y = torch.tensor([0, 3, 9, 11])
    data = Windows(torch.zeros(4, 2, dtype=torch.long), y, 0)
    scenario = Scenario(ScenarioInfo("r", 1), [], [SimpleNamespace(dataset=data)], RankingEvaluator(12, k=10))
    row = scenario.evaluator(FixedScores(scores), scenario, 0, torch.device("cpu"))
    assert row.rows["hit@10"] == [pytest.approx(3 / 4)]                 # ranks 0, 3, 9 are inside the top 10
    assert row.rows["ndcg@10"] == [pytest.approx((1 / 1 + 1 / 2.321928094887362 + 1 / 3.4594316186372973) / 4)]
    assert row.sizes == [4]
    # ties count against the target: all items equal -> rank 11, outside the top 10
    tied = scenario.evaluator(FixedScores([0.0] * 12), scenario, 0, torch.device("cpu"))
    assert tied.rows["hit@10"] == [0.0]


def test_ranking_scenario_runs_through_runner_leaderboard_and_plots(tmp_path):
    from clbench import leaderboard, report

    suite = parse_suite({"suite": "rank", "seeds": [0, 1], "scenarios": [{"name": "test_next_item"}],
                         "strategies": [{"name": "test_transitions", "preset": "cpu"}]})
    records = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert [r.status for r in records] == ["finished", "finished"], [r.reason for r in records]
    record = records[0]
    assert record.accuracy_matrix == []                                     # not a classification scenario
    assert set(record.matrices) == {"ndcg@10", "hit@10"}
    assert [s["name"] for s in record.metric_specs if s["primary"]] == ["ndcg@10"]
    ndcg = record.matrices["ndcg@10"]
    assert ndcg[0][0] > 0.9 and ndcg[1][1] > 0.9           # each experience's transitions are learned...
    assert record.metrics["ndcg@10_forgetting"] > 0.3      # ...and the first one's forgotten after the second
    assert record.metrics["ndcg@10_last"] == pytest.approx(
        sum(r * n for r, n in zip(ndcg[1], record.test_sizes)) / sum(record.test_sizes))

    table = leaderboard.write(tmp_path)
    (row,) = table.to_dict("records")
    assert row["n_seeds"] == 2 and row["ndcg@10_last"] == pytest.approx(
        sum(r.metrics["ndcg@10_last"] for r in records) / 2)
    markdown = (tmp_path / "leaderboard.md").read_text()
    assert "ndcg@10_last" in markdown
    # NDCG is a unitless fraction: 4 decimals in the markdown (2 would hide differences below 0.01)
    mean, std = row["ndcg@10_last"], row["ndcg@10_last_std"]
    assert f"| {mean:.4f} ± {std:.4f} |" in markdown
    written = report.plot(leaderboard.load_records(tmp_path), tmp_path)
    assert {p.name for p in written} >= {"test_next_item__ndcg@10.png", "test_next_item__hit@10.png"}
