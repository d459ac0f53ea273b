"""A non-classification scenario (next-item ranking, NDCG@10/HIT@10) through the same runner, leaderboard and
plots; the ranking evaluator against hand-computed ranks."""

from types import SimpleNamespace

import pytest
import torch

import tests._ranking  # noqa: F401  (registers test_next_item and test_transitions)
from clbench.evaluation import RankingEvaluator
from clbench.executors import LocalExecutor
from clbench.protocol import ParamCount, Scenario, ScenarioInfo, StrategyBase
from clbench.suite_file import parse_suite
from tests._ranking import Windows


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
