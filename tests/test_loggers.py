"""Training curves: every run logs loss and learning rate per epoch (training_log.jsonl, drawn into
training_curve.png and linked from report.md); TensorBoard and Weights & Biases (offline) log the same rows when a
suite entry attaches them; api.run prints no Avalanche logger warning."""

import json
import subprocess
import sys

import pytest

from clbench.artifacts import CURVE_FILE, read_log
from clbench.cli import main

RUN = "synthetic__naive__s0"


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One naive run (Avalanche template, 3 experiences x 2 epochs) with every logger and hook_trace attached."""
    import yaml

    tmp = tmp_path_factory.mktemp("loggers")
    suite = tmp / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "suite": "logged", "seeds": [0],
        "scenarios": [{"name": "synthetic", "args": {"train_per_class": 20, "test_per_class": 10}}],
        "strategies": [{"name": "naive", "preset": "cpu", "args": {"epochs": 2, "lr": 0.003},
                        "callbacks": ["tensorboard", {"name": "wandb", "args": {"project": "clbench-test"}},
                                      {"name": "hook_trace"}]}]}))
    out = tmp / "out"
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table", "--device", "cpu"]) == 0
    return out


def test_training_log_has_one_row_per_epoch_with_the_mean_loss_of_its_batches(logged):
    artifacts = logged / "artifacts" / RUN
    rows = read_log(artifacts)
    assert [(r["experience"], r["epoch"], r["step"]) for r in rows] == \
        [(t, e, 2 * t + e) for t in range(3) for e in range(2)]
    assert all(r["lr"] == 0.003 and r["member"] == "" for r in rows)
    # independently: hook_trace's per-batch losses, cut at each row's batch count
    trace = [json.loads(line) for line in (artifacts / "hooks.jsonl").read_text().splitlines()]
    losses = [t["loss"] for t in trace if t["hook"] == "after_forward"]
    assert sum(r["batches"] for r in rows) == len(losses)
    start = 0
    for row in rows:
        batch = losses[start:start + row["batches"]]
        assert row["loss"] == pytest.approx(sum(batch) / len(batch), rel=1e-6)
        start += row["batches"]
    assert (artifacts / CURVE_FILE).stat().st_size > 0
    assert f"- [{RUN}](artifacts/{RUN}/{CURVE_FILE})" in (logged / "report.md").read_text()


def test_tensorboard_gets_the_same_rows(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = read_log(logged / "artifacts" / RUN)
    events = EventAccumulator(str(logged / "artifacts" / RUN / "tensorboard"))
    events.Reload()
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [r["step"] for r in rows]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    assert [e.value for e in events.Scalars("lr")] == pytest.approx([0.003] * len(rows))


def test_wandb_writes_an_offline_run(logged):
    runs = list((logged / "artifacts" / RUN / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_file_loggers_need_an_output_folder():
    from clbench import api

    record = api.run("synthetic", "naive", preset="cpu", args={"epochs": 1}, device="cpu",
                     scenario_args={"train_per_class": 5, "test_per_class": 2}, callbacks=["tensorboard"])
    assert record.status == "failed" and "writes under the run's artifacts folder" in record.reason


def test_api_run_prints_no_avalanche_logger_warning():
    code = ("from clbench import api; r = api.run('synthetic', 'naive', preset='cpu', args={'epochs': 1}, "
            "device='cpu', scenario_args={'train_per_class': 5, 'test_per_class': 2}); print(r.status)")
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "finished", done.stderr
    assert "No loggers specified" not in done.stderr


def test_the_run_draws_its_members_rows_when_it_trained_none_itself(tmp_path):
    """The tangent strategies train only in member jobs: their rows alone make the run's curve."""
    from clbench.callbacks import CallbackContext
    from clbench.loggers import TrainingLog

    member = TrainingLog()
    member.setup(CallbackContext(run_id="r", artifacts=tmp_path, member="shard0"))
    member.write({"member": "shard0", "experience": None, "epoch": 0, "step": 0, "batches": 2, "loss": 1.0, "lr": 0.1})
    member.close()
    assert not (tmp_path / CURVE_FILE).exists()              # members leave the drawing to the run
    run = TrainingLog()
    run.setup(CallbackContext(run_id="r", artifacts=tmp_path))
    run.close()
    assert (tmp_path / CURVE_FILE).stat().st_size > 0 and len(read_log(tmp_path)) == 1
