"""Loggers: every run logs loss and learning rate per epoch (training_log.jsonl and .csv, drawn into
training_curve.png and linked from report.md) and its evaluations (evaluation_log.jsonl); TensorBoard and Weights &
Biases (offline) log the same rows, the scores after every step and the run's summary when a suite entry attaches
them; ``--quiet`` silences W&B's console output; api.run prints no Avalanche logger warning."""
from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench.artifacts import CURVE_FILE, read_log
from clbench.callbacks import CallbackContext
from clbench.cli import main
from clbench.loggers import COLUMNS, CSV_FILE, EVALUATION_FILE
from clbench.metrics import seen_accuracy
from tests._cli import run_suite

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
    import wandb

    silent = os.environ.pop("WANDB_SILENT", None)
    wandb.teardown()                 # W&B reads WANDB_SILENT at its first set-up in a process: make this one first
    with tempfile.TemporaryFile() as console:           # the process's stdout and stderr, at the descriptor level
        saved = [os.dup(1), os.dup(2)]
        os.dup2(console.fileno(), 1), os.dup2(console.fileno(), 2)
        try:
            code = main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table", "--device", "cpu"])
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.environ.pop("WANDB_SILENT", None)
            if silent is not None:
                os.environ["WANDB_SILENT"] = silent
        console.seek(0)
        (tmp / "console.txt").write_bytes(console.read())
    assert code == 0
    return out


def _record(out):
    return json.loads((out / "runs" / f"{RUN}.json").read_text())


def _wandb_records(path):
    """The protobuf records of a W&B ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then LevelDB log
    blocks of 32 KiB holding chunks ``crc (4) | length (2, little-endian) | type (1: full, 2-4: first, middle,
    last) | data``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:                       # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def _items(items):
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


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


def test_the_csv_log_holds_the_rows_of_the_jsonl_log(logged):
    rows = read_log(logged / "artifacts" / RUN)
    with open(logged / "artifacts" / RUN / CSV_FILE, newline="") as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == COLUMNS and len(table) == 1 + len(rows) == 7
    assert table[1:] == [["" if r[c] is None else str(r[c]) for c in COLUMNS] for r in rows]


def _expected_evaluations(record):
    """Per step i: accuracy on each experience seen (percent) and A_i, from the record's matrix."""
    R, sizes = np.asarray(record["accuracy_matrix"]), record["test_sizes"]
    return [{**{f"accuracy/exp{j}": 100 * R[i, j] for j in range(i + 1)}, "last_acc": 100 * seen_accuracy(R, sizes, i),
             "avg_inc_acc": 100 * np.mean([seen_accuracy(R, sizes, k) for k in range(i + 1)])}
            for i in range(len(R))]


def test_the_evaluation_log_holds_every_step_of_the_score_matrix(logged):
    """The scores after step i are row i of the record's matrix (seen experiences only, in percent), A_i and the
    running avg_inc; forgetting is defined from step 1 and at the last step equals the record's."""
    record = _record(logged)
    lines = [json.loads(line) for line in (logged / "artifacts" / RUN / EVALUATION_FILE).read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    for line, want in zip(lines, _expected_evaluations(record)):
        assert {k: line[k] for k in want} == pytest.approx(want, rel=1e-9)
    assert "forgetting" not in lines[0] and "bwt" not in lines[0]
    for key in ("avg_inc_acc", "last_acc", "forgetting", "bwt"):
        assert lines[-1][key] == pytest.approx(record["metrics"][key], rel=1e-9)


def test_tensorboard_holds_the_evaluation_accuracies_per_experience_and_the_summary(logged):
    """The done-when of issue 35: the event file, read back, holds the accuracy on each experience after each step
    (eval/accuracy/exp<j> at step i, j <= i), A_i, forgetting, and the record's final metrics."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record = _record(logged)
    events = EventAccumulator(str(logged / "artifacts" / RUN / "tensorboard"))
    events.Reload()
    for i, want in enumerate(_expected_evaluations(record)):
        for name, value in want.items():
            got = {e.step: e.value for e in events.Scalars(f"eval/{name}")}
            assert got[i] == pytest.approx(value, rel=1e-5), (name, i)
    assert [e.step for e in events.Scalars("eval/accuracy/exp2")] == [2]
    assert [e.step for e in events.Scalars("eval/forgetting")] == [1, 2]
    for key in ("avg_inc_acc", "last_acc", "forgetting", "train_s", "params_M"):
        (final,) = events.Scalars(f"final/{key}")
        assert final.step == 2 and final.value == pytest.approx(record["metrics"][key], rel=1e-5)


def test_wandb_writes_an_offline_run_with_the_evaluations_and_the_summary(logged):
    record = _record(logged)
    runs = list((logged / "artifacts" / RUN / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (store,) = runs[0].glob("*.wandb")
    history, summary = [], {}
    for r in _wandb_records(store):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append(_items(r.history.item))
        elif kind == "summary":
            summary.update(_items(r.summary.update))
    evaluations = [h for h in history if "eval_step" in h]
    assert [h["eval_step"] for h in evaluations] == [0, 1, 2]
    for got, want in zip(evaluations, _expected_evaluations(record)):
        assert {k: got[f"eval/{k}"] for k in want} == pytest.approx(want, rel=1e-9)
    assert [h["loss"] for h in history if "loss" in h] == pytest.approx([r["loss"] for r in read_log(
        logged / "artifacts" / RUN)], rel=1e-9)
    for key in ("avg_inc_acc", "last_acc", "forgetting", "bwt", "train_s"):
        assert summary[key] == pytest.approx(record["metrics"][key], rel=1e-9)


def test_quiet_silences_wandb(logged):
    """W&B prints ~20 lines per run unless silenced (test_wandb_speaks_unless_silenced); under --quiet none."""
    assert "wandb:" not in (logged.parent / "console.txt").read_text()


def test_wandb_speaks_unless_silenced(tmp_path, monkeypatch, capfd):
    """Without --quiet W&B's own console lines stay (they say how to sync the offline run)."""
    import wandb

    from clbench.loggers import WandbLog

    monkeypatch.delenv("WANDB_SILENT", raising=False)
    wandb.teardown()                     # W&B reads WANDB_SILENT once per process, at its first set-up
    logger = WandbLog(project="clbench-test")
    logger.setup(CallbackContext(run_id="r", artifacts=tmp_path))
    logger.close()
    logger.on_run_end({"last_acc": 50.0, "extra": {}})
    assert "wandb: You can sync this run to the cloud" in capfd.readouterr().err


def test_loggers_on_a_finished_run_say_they_logged_nothing(logged, capsys):
    """The run resumes from its record, so its loggers do not run: the console says so and how to rerun."""
    capsys.readouterr()
    assert main(["--suite", str(logged.parent / "suite.yaml"), "--out", str(logged), "--quiet", "--quiet-table",
                 "--device", "cpu"]) == 0
    assert (f"tensorboard, wandb, hook_trace: logged nothing for 1 run(s) already finished in {logged} (e.g. {RUN}): "
            f"they resume from their records without training; pass --force to run them again with them."
            ) in capsys.readouterr().err


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

    run = TrainingLog()                                      # set up before its members train, as in a run
    run.setup(CallbackContext(run_id="r", artifacts=tmp_path))
    member = TrainingLog()
    member.setup(CallbackContext(run_id="r", artifacts=tmp_path, member="shard0"))
    member.write({"member": "shard0", "experience": None, "epoch": 0, "step": 0, "batches": 2, "loss": 1.0, "lr": 0.1})
    member.close()
    assert not (tmp_path / CURVE_FILE).exists()              # members leave the drawing to the run
    run.close()
    assert (tmp_path / CURVE_FILE).stat().st_size > 0 and len(read_log(tmp_path)) == 1


ROOT = Path(__file__).resolve().parents[1]


PYTHON = sys.executable


# --------------------------------------------------------------------------------------------- logs of a run redone
def _logs(artifacts: Path) -> dict[str, str]:
    return {name: (artifacts / name).read_text() for name in
            ("training_log.jsonl", "training_log.csv", "evaluation_log.jsonl", "hooks.jsonl")}


BLOCK = """
import importlib.abc, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ("wandb", "tensorboard"):
            raise ImportError(f"{name} is broken here")
sys.meta_path.insert(0, Broken())
from clbench.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_redone_rewrites_its_training_evaluation_and_hook_logs(tiny_suite, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 2},
                         "callbacks": [{"name": "hook_trace", "args": {"batches": 1}}, {"name": "tensorboard"},
                                       {"name": "wandb"}]}],
                       scenario_args={"train_per_class": 8, "test_per_class": 4, "n_experiences": 2})
    assert run_suite(suite, out) == 0
    artifacts = out / "artifacts" / "synthetic__naive__s0"
    first = _logs(artifacts)
    assert len(first["training_log.jsonl"].splitlines()) == 4              # 2 experiences x 2 epochs
    assert len(first["evaluation_log.jsonl"].splitlines()) == 2
    for name in first:                      # an interrupted earlier attempt left rows behind
        with open(artifacts / name, "a") as f:
            f.write(first[name].splitlines()[-1] + "\n")
    assert run_suite(suite, out, "--force") == 0
    assert _logs(artifacts) == first        # exactly the rerun's own rows (the runs are deterministic)
    assert len(list((artifacts / "tensorboard").glob("events.*"))) == 1       # the rerun's writer only
    assert len(list((artifacts / "wandb" / "wandb").glob("offline-run-*"))) == 1


def test_a_broken_wandb_and_tensorboard_break_only_their_callbacks(tiny_suite, tmp_path):
    plain = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}}], name="plain",
                       scenario_args={"train_per_class": 4, "test_per_class": 2, "n_experiences": 2})
    logged = tiny_suite([{"name": "naive", "preset": "cpu", "callbacks": [{"name": "tensorboard"}]}], name="logged")
    env = {**os.environ, "CLBENCH_JOBS": "1", "PYTHONPATH": str(ROOT)}
    for suite, code in ((plain, 0), (logged, 2)):
        result = subprocess.run([PYTHON, "-c", BLOCK, "--suite", str(suite), "--out", str(tmp_path / suite.stem),
                                 "--quiet", "--quiet-table", "--device", "cpu"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("suite ")]
    assert lines == ["error: callback tensorboard needs torch.utils.tensorboard, which cannot be imported "
                     "(ImportError: tensorboard is broken here); pip install 'clbench[tensorboard]' or remove the "
                     "tensorboard entries."]
    assert not (tmp_path / "logged" / "runs" / "synthetic__naive__s0.json").exists()
