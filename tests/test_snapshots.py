"""model_snapshot: the weights a run ends with, saved beside its record; loaded into a fresh strategy they give the
record's own test accuracy; an observer (adding it resumes finished runs); a run without one is refused by name."""

import pytest
import torch
from avalanche.models.utils import avalanche_model_adaptation

from clbench import api
from clbench.snapshots import SNAPSHOT_FILE, load_snapshot
from clbench.specs import identity_callbacks

SCENARIO_ARGS = {"train_per_class": 20, "test_per_class": 10}
ARGS = {"epochs": 2, "lr": 0.003}


@pytest.fixture(scope="module")
def snapshot_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("snapshot")
    record = api.run("synthetic", "naive", preset="cpu", args=ARGS, device="cpu", scenario_args=SCENARIO_ARGS,
                     callbacks=["model_snapshot"], out=out)
    assert record.status == "finished", record.reason
    return out, record


def test_the_snapshot_reproduces_the_records_test_accuracy(snapshot_run):
    out, record = snapshot_run
    state = load_snapshot(out / "artifacts" / record.run_id)
    scenario = api.scenario("synthetic", seed=0, **SCENARIO_ARGS)
    fresh = api.strategy("naive", scenario.info, preset="cpu", **ARGS)
    modules = fresh.modules()
    assert set(state) == set(modules)
    for name, module in modules.items():
        for experience in scenario.train_stream:       # the incremental head grows as it did in training first
            avalanche_model_adaptation(module, experience)
        module.load_state_dict(state[name])
        module.eval()
    correct = total = 0
    with torch.no_grad():
        for experience in scenario.test_stream:
            for x, y, t in torch.utils.data.DataLoader(experience.dataset, batch_size=64):
                correct += int((fresh.predict(x, t).argmax(1) == y).sum())
                total += len(y)
    assert record.metrics["last_acc"] > 100 / 6 + 10           # trained: above chance on 6 classes
    assert 100 * correct / total == pytest.approx(record.metrics["last_acc"], abs=1e-9)


def test_it_is_an_observer_left_out_of_the_runs_identity():
    entries = ({"name": "model_snapshot", "args": {}}, {"name": "dp", "args": {"epsilon": 8.0}})
    assert identity_callbacks(entries) == entries[1:]


def test_a_run_without_a_snapshot_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_snapshot.*delete its record"):
        load_snapshot(tmp_path)


def test_an_earlier_attempts_snapshot_is_removed_when_the_run_starts(snapshot_run, tmp_path):
    from clbench.callbacks import CallbackContext
    from clbench.snapshots import ModelSnapshot

    stale = tmp_path / SNAPSHOT_FILE
    stale.write_bytes(b"old")
    ModelSnapshot().setup(CallbackContext(run_id="r", artifacts=tmp_path))
    assert not stale.exists()


def test_it_needs_an_output_folder():
    record = api.run("synthetic", "naive", preset="cpu", args={"epochs": 1}, device="cpu",
                     scenario_args={"train_per_class": 5, "test_per_class": 2}, callbacks=["model_snapshot"])
    assert record.status == "failed" and "model_snapshot: this run has no output folder" in record.reason


def test_a_run_redone_without_the_callback_returns_no_snapshot_and_the_earlier_one_stays_readable(tmp_path):
    """The run made again with another lr and no model_snapshot: its artifacts hold no model.pt (the earlier one
    moved with its record to replaced/, where it still loads with that record); an earlier snapshot copied back in
    is refused as not the file the new run wrote, and so is a snapshot whose record is gone."""
    from clbench.records import ForeignState

    small = {"train_per_class": 5, "test_per_class": 2}
    first = api.run("synthetic", "naive", preset="cpu", args={"epochs": 1}, device="cpu", scenario_args=small,
                    callbacks=["model_snapshot"], out=tmp_path)
    second = api.run("synthetic", "naive", preset="cpu", args={"epochs": 1, "lr": 0.002}, device="cpu",
                     scenario_args=small, out=tmp_path)
    assert first.status == second.status == "finished" and first.run_id == second.run_id
    artifacts = tmp_path / "artifacts" / second.run_id
    with pytest.raises(FileNotFoundError, match="no model snapshot"):
        load_snapshot(artifacts)
    (kept,) = (tmp_path / "replaced").iterdir()
    old = kept / "artifacts" / first.run_id
    assert set(load_snapshot(old)) == {"model"}
    (artifacts / SNAPSHOT_FILE).write_bytes((old / SNAPSHOT_FILE).read_bytes())
    with pytest.raises(ForeignState, match=f"{artifacts / SNAPSHOT_FILE} is not the file its run wrote \\(that run "
                                           "wrote none\\); run it again"):
        load_snapshot(artifacts)
    (kept / "runs" / f"{first.run_id}.json").unlink()
    with pytest.raises(FileNotFoundError, match="no record .* of the run that wrote it"):
        load_snapshot(old)
