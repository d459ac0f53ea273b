"""Training adequacy (clbench/adequacy.py): the record's per-step accuracy on the data just trained and loss
convergence, computed by hand for tiny runs, and the flags read from fabricated records."""

import json

import pytest
import torch

import tests._fakes  # noqa: F401  (registers test_increasing_logits)
from clbench import adequacy, api, leaderboard, suite_report
from clbench.analysis import reference_tables
from clbench.registry import SCENARIOS, STRATEGIES


def test_a_tiny_runs_adequacy_by_hand():
    """``test_increasing_logits`` predicts the largest class allowed: after step i (class-incremental, 2 classes a
    step) class 2i+1, so on step i's training data (40 items of class 2i, 40 of 2i+1) it scores exactly 40/80 = 0.5,
    chance for k = 2: "not learned" at every step, from the train source. It logs no epochs: no loss."""
    record = api.run("synthetic", "test_increasing_logits", preset="cpu", seed=3)
    assert record.adequacy == [{"experience": i, "train_acc": 0.5, "n": 80, "chance": 0.5, "k": 2, "loss_first": None,
                                "loss_last": None, "epochs": 0, "loss_drop": None} for i in range(3)]
    assert adequacy.record_flags(json.loads(record.to_json())) == [adequacy.Flag("not learned", (0, 1, 2), "train")]


def test_a_trained_runs_losses_are_its_training_logs_and_it_learned(tmp_path):
    """naive, 3 epochs a step: loss_first / loss_last are the committed training log's epoch means of the step and
    loss_drop = (L[1] - L[2]) / L[0] (E = 3, w = 1); the subsample is the step's 80 items; the run learned
    (well-separated clusters: no "not learned" flag)."""
    record = api.run("synthetic", "naive", preset="cpu", args={"epochs": 3}, seed=0,
                     scenario_args={"separation": 6.0}, out=tmp_path)
    assert record.status == "finished", record.reason
    log = [json.loads(line) for line in (tmp_path / "artifacts" / record.run_id / "training_log.jsonl").open()]
    for i, entry in enumerate(record.adequacy):
        losses = [row["loss"] for row in log if row["experience"] == i]
        assert len(losses) == 3 and entry["epochs"] == 3 and entry["n"] == 80 and entry["k"] == 2
        assert (entry["loss_first"], entry["loss_last"]) == (losses[0], losses[2])
        assert entry["loss_drop"] == pytest.approx((losses[1] - losses[2]) / losses[0])
        assert entry["train_acc"] >= 0.75
    assert "not learned" not in [f.kind for f in adequacy.record_flags(json.loads(record.to_json()), tmp_path)]


def test_loss_drop_and_main_call_by_hand():
    """``(L[E-1-w] - L[E-1]) / L[0]``, ``w = max(1, round(E / 5))``; the longest call of the experience counts."""
    assert adequacy.loss_drop([4.0, 3.0, 2.0, 1.5, 1.2, 1.0]) == pytest.approx((1.2 - 1.0) / 4.0)    # E 6, w 1
    assert adequacy.loss_drop([10.0] * 8 + [6.0, 5.0]) == pytest.approx((10.0 - 5.0) / 10.0)         # E 10, w 2
    assert adequacy.loss_drop([1.0, 0.1]) is None                                                    # E < 3
    rows = [{"member": "", "experience": 0, "epoch": e, "loss": v} for e, v in enumerate([3.0, 2.0, 1.0])]
    rows += [{"member": "", "experience": 1, "epoch": e, "loss": v} for e, v in enumerate([5.0, 4.0, 3.0, 2.5])]
    rows += [{"member": "", "experience": 1, "epoch": e, "loss": v} for e, v in enumerate([9.0, 8.0])]  # fine-tune
    rows += [{"member": "m0", "experience": 1, "epoch": 0, "loss": 99.0}]                                 # a member's
    assert adequacy.main_call(rows, 1) == [5.0, 4.0, 3.0, 2.5]
    assert adequacy.main_call(rows, 0) == [3.0, 2.0, 1.0]
    assert adequacy.main_call(rows, 2) == []


def test_measuring_leaves_the_global_random_state_as_it_was():
    """Scoring the training data draws data-loader seeds; the next step must train as if it had not run."""
    scenario = SCENARIOS.get("synthetic")(seed=0)
    strategy = STRATEGIES.get("test_increasing_logits")(scenario.info, torch.device("cpu"), tests._fakes.FakeConfig())
    torch.manual_seed(7)
    adequacy.measure(strategy, scenario, 1, False, torch.device("cpu"), 0, [])
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(3))


# ------------------------------------------------------------------------------------------------ fabricated records
def _record(seed, train_acc=None, drops=None, matrix=None, run_id=None, cpe=(2, 2, 2)):
    entries = [] if train_acc is None else [
        {"experience": i, "train_acc": a, "n": 100, "chance": 0.5, "k": 2, "loss_first": 1.0, "loss_last": 0.5,
         "epochs": 5, "loss_drop": (drops or [0.0] * len(train_acc))[i]} for i, a in enumerate(train_acc)]
    return {"run_id": run_id or f"sc__a__s{seed}", "status": "finished", "seed": seed, "adequacy": entries,
            "accuracy_matrix": matrix or [], "scenario_info": {"classes_per_experience": list(cpe)},
            "spec": {"suite": "s", "scenario": {"name": "sc", "label": "", "args": {}},
                     "strategy": {"name": "a", "label": "", "preset": "cpu", "args": {}}},
            "metrics": {"avg_inc_acc": 50.0, "last_acc": 40.0, "forgetting": 1.0, "bwt": -1.0}}


def test_learned_not_learned_and_not_converged():
    assert adequacy.record_flags(_record(0, [0.9, 0.95, 0.76])) == []                       # 0.76 >= 1.5 / 2
    assert adequacy.record_flags(_record(0, [0.9, 0.74, 0.5])) == [adequacy.Flag("not learned", (1, 2), "train")]
    assert adequacy.record_flags(_record(0, [0.9, 0.9, 0.9], drops=[0.2, 0.049, 0.05])) == [
        adequacy.Flag("not converged", (0, 2), "record")]


def test_a_record_without_adequacy_is_read_from_its_matrix_and_committed_log(tmp_path):
    """R[i, i] (test) against 1.5 / k_i with k from classes_per_experience; the loss from the committed training
    log, of a file holding two attempts the last (its ``step`` counter restarts at 0)."""
    matrix = [[0.37, 0, 0], [0.30, 0.16, 0], [0.20, 0.10, 0.14]]        # k = 4, 10, 10: bounds 0.375, 0.15, 0.15
    record = _record(0, matrix=matrix, cpe=(4, 10, 10), run_id="old")
    log = tmp_path / "artifacts" / "old" / "training_log.jsonl"
    log.parent.mkdir(parents=True)
    first = [{"member": "", "experience": 0, "epoch": e, "step": e, "loss": v} for e, v in enumerate([9, 1, 1, 1, 1])]
    second = [{"member": "", "experience": 0, "epoch": e, "step": e, "loss": v} for e, v in enumerate([2, 2, 2, 2, 1])]
    log.write_text("".join(json.dumps(r) + "\n" for r in first + second))
    assert adequacy.record_flags(record, tmp_path) == [adequacy.Flag("not learned", (0, 2), "test"),
                                                        adequacy.Flag("not converged", (0,), "log")]
    assert adequacy.record_flags(record) == [adequacy.Flag("not learned", (0, 2), "test")]    # no root: no log


def test_a_rows_flag_is_the_union_over_its_seeds_with_the_count():
    records = [_record(0, [0.9, 0.9, 0.9]), _record(1, [0.9, 0.5, 0.9]), _record(2, [0.9, 0.9, 0.6]),
               {**_record(3, [0.1, 0.1, 0.1]), "status": "failed"}]
    assert adequacy.row_flags(records) == "not learned (2/3 seeds; steps 2,3; train)"   # steps from 1
    assert adequacy.row_flags(records[:1]) == ""


def test_the_leaderboard_and_report_show_a_rows_flag_beside_its_numbers():
    records = [_record(0, [0.9, 0.5, 0.9]), _record(1, [0.9, 0.9, 0.9])]
    records += [{**_record(s, [0.9, 0.9, 0.9]), "run_id": f"sc__b__s{s}",
                 "spec": {**records[0]["spec"], "strategy": {"name": "b", "label": "", "preset": "cpu", "args": {}}}}
                for s in (0, 1)]
    table = leaderboard.build(records)
    assert dict(zip(table["strategy"], table["flags"])) == {"a": "not learned (1/2 seeds; step 2; train)", "b": ""}
    md = leaderboard.to_markdown(table).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in md[:4]]
    assert [row[10] for row in cells] == ["flags", "---", "not learned (1/2 seeds; step 2; train)", ""]
    assert adequacy.FLAGS_LEGEND in md
    report = suite_report.render(records, [], "out")
    assert "| `a` |" in report and "not learned (1/2 seeds; step 2; train) |" in report


def test_a_paired_statistic_with_a_flagged_row_is_marked():
    a = [_record(s, [0.9, 0.9, 0.9]) for s in (0, 1)]
    b = [{**_record(s, [0.9, 0.2, 0.9]), "run_id": f"sc__b__s{s}",
          "spec": {**a[0]["spec"], "strategy": {"name": "b", "label": "", "preset": "cpu", "args": {}}}}
         for s in (0, 1)]
    text = reference_tables.paired_table(a + b, {"pairs": "a:b"})
    assert text.splitlines()[2].endswith("| not shown (flagged: b not learned) |")
    clean = reference_tables.paired_table(a + a, {"pairs": "a:a"})
    assert reference_tables.FLAGGED not in clean


def test_the_subsample_is_50_items_per_class_of_the_step():
    """200 training items per class, 2 classes a step: 100 items are scored (``PER_CLASS * k``), not the step's 400
    (the fixed 1,000-item cap alone took all 400); the cap still bounds a step with many classes."""
    record = api.run("synthetic", "test_increasing_logits", preset="cpu", seed=0,
                     scenario_args={"train_per_class": 200})
    assert [e["n"] for e in record.adequacy] == [100, 100, 100]
    assert all(round(e["train_acc"] * 100, 9).is_integer() for e in record.adequacy)     # a count out of 100
    assert adequacy.sample_size(2) == 100 and adequacy.sample_size(10) == 500 and adequacy.sample_size(50) == 1000


def test_a_check_that_could_not_be_made_is_said_not_left_blank(tmp_path):
    """2 epochs a step: the convergence rule (3 epochs) cannot be read; no log and no adequacy: no loss at all."""
    short = {**_record(0, [0.9, 0.9]), "adequacy": [
        {"experience": i, "train_acc": 0.9, "n": 100, "chance": 0.5, "k": 2, "loss_first": 1.0, "loss_last": 0.5,
         "epochs": 2, "loss_drop": None} for i in range(2)]}
    assert adequacy.unchecked(short) == ("convergence n/a: 2 epochs",)
    assert adequacy.row_flags([short]) == "convergence n/a: 2 epochs"
    floor = {**_record(0), "adequacy": [{"experience": 0, "train_acc": None, "k": None, "epochs": 0,
                                         "loss_drop": None}]}                     # a ranking floor: no training
    assert adequacy.unchecked(floor, tmp_path) == ("learning n/a: no per-step accuracy",
                                                   "convergence n/a: no loss per epoch")
    assert adequacy.unchecked(_record(0, [0.9, 0.9, 0.9])) == ()
