"""Loggers as callbacks: the loss and learning rate of every epoch, the scores after every training step and the
run's summary metrics, written while a run trains.

Each logger keeps, per epoch of a training call (the hooks of :mod:`clbench.callbacks`)::

    loss  = mean over the epoch's minibatches of the training loss seen by after_forward (every term added)
    lr    = optimizer.param_groups[0]["lr"] at the epoch's last step
    row   = {member, experience, epoch (0-based within the training call), step (epochs logged so far by this
             process), batches, loss, lr}

and, in the run's own process, after each training step ``i`` (0-based, the row ``i`` of the score matrices) the
evaluation's scalars (:meth:`clbench.callbacks.Evaluation.scalars`, leaderboard units: percent for accuracy)::

    <metric>/exp<j>     R[i, j] for each experience j <= i seen so far (e.g. accuracy/exp0)
    <summary column>    the summaries of the matrix seen so far: last_acc = A_i (score on the seen test data),
                        avg_inc_acc = mean of A_0..A_i, forgetting and bwt over the experiences before i (from i = 1)

and when the run has finished, its record's ``metrics`` (the leaderboard's columns, ``extra`` ones included).

- ``training_log`` (always on: the runner attaches :data:`ALWAYS_ON` to every run, outside its identity) starts the
  files of the run afresh (an interrupted or replaced attempt's rows are removed when the run starts) and appends one
  JSON line per row to ``<artifacts>/training_log.jsonl`` and the same row to ``<artifacts>/training_log.csv``
  (shard members trained elsewhere append their own rows, with their ``member`` key), one JSON line per evaluation
  (``{"step": i, <scalars>}``) to ``<artifacts>/evaluation_log.jsonl``, and, when the run ends, draws the training
  rows in ``<artifacts>/training_curve.png`` (report.md links it); the record holds the summary;
- ``tensorboard`` writes the rows as scalars ``loss`` and ``lr`` (``<member>/loss`` for a member) against the
  logged epoch, the evaluations as ``eval/<scalar>`` against the training step ``i``, and the summary as
  ``final/<column>`` at the last step, through ``torch.utils.tensorboard`` into ``<artifacts>/tensorboard/`` (extra
  ``tensorboard``; an earlier attempt's event files are removed when the run starts);
- ``wandb`` logs them to a Weights & Biases run named after the run, offline by default, under
  ``<artifacts>/wandb/`` (extra ``wandb``; an earlier attempt's offline runs are removed when the run starts):
  ``loss``/``lr`` against ``train_step``, ``eval/<scalar>`` against ``eval_step``, the summary in the run's summary.
  ``--quiet`` silences its console output (``WANDB_SILENT``).

Attach the optional ones like any callback: ``callbacks: [{name: tensorboard}]`` in a suite entry, or
``clbench.api.run(..., callbacks=["tensorboard"], out=...)``; they need an output folder.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from clbench.artifacts import LOG_FILE, plot_log
from clbench.callbacks import Callback, CallbackContext, CallbackSpec, Evaluation
from clbench.registry import CALLBACKS

CSV_FILE = "training_log.csv"
"""The rows of :data:`clbench.artifacts.LOG_FILE` as CSV, columns :data:`COLUMNS` (an empty cell for None)."""
EVALUATION_FILE = "evaluation_log.jsonl"
"""One JSON line per evaluation of the run: ``{"step": i, <Evaluation.scalars()>}``."""
COLUMNS = ("member", "experience", "epoch", "step", "batches", "loss", "lr")


def summary_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a record's ``metrics`` (``extra`` ones under their own names), flat; None and text left out."""
    flat = {**{k: v for k, v in metrics.items() if k != "extra"}, **(metrics.get("extra") or {})}
    return {k: float(v) for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def append(path: Path, text: str) -> None:
    """Append ``text`` with one ``write`` on an ``O_APPEND`` file: lines of members appending at once stay whole."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def resumed_observers(specs: Any, finished: Any, out: Path) -> str | None:
    """The console line for the observer callbacks (loggers, snapshots, traces: ``observer = True``) of ``specs``
    whose run is ``finished(spec)`` in ``out``: such a run resumes from its record without training, so they write
    nothing for it (a logger attached after the run finished would otherwise be silently empty). None when there is
    none."""
    from clbench.specs import identity_callbacks

    skipped: dict[str, list[str]] = {}
    for spec in specs:
        kept = identity_callbacks(spec.strategy.callbacks)
        names = [c["name"] for c in spec.strategy.callbacks if c not in kept]
        if names and finished(spec):
            for name in dict.fromkeys(names):
                skipped.setdefault(name, []).append(spec.run_id)
    if not skipped:
        return None
    runs = max(skipped.values(), key=len)
    return (f"{', '.join(skipped)}: logged nothing for {len(runs)} run(s) already finished in {out} (e.g. {runs[0]}): "
            f"they resume from their records without training; pass --force to run them again with "
            f"{'it' if len(skipped) == 1 else 'them'}.")


class EpochLogger(Callback):
    """Collects the rows described in the module docstring; subclasses write each with :meth:`write`. Loggers are
    observers (:attr:`clbench.callbacks.Callback.observer`): adding or removing one resumes a finished run."""

    observer = True

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        self.experience: int | None = None
        self.step = 0
        self.last_step = 0
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.batches, self.lr = 0.0, 0, None

    def on_experience_start(self, experience: int) -> None:
        self.experience = experience

    def after_forward(self, loss: Tensor) -> None:
        self.loss_sum += float(loss.detach().float().sum())
        self.batches += 1

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.lr = float(optimizer.param_groups[0]["lr"])

    def on_epoch_end(self, epoch: int) -> None:
        if self.batches:
            self.write({"member": self.context.member, "experience": self.experience, "epoch": epoch,
                        "step": self.step, "batches": self.batches, "loss": self.loss_sum / self.batches,
                        "lr": self.lr})
            self.step += 1
        self._reset()

    def write(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.last_step = evaluation.step
        self.write_evaluation(evaluation.step, evaluation.scalars())

    def write_evaluation(self, step: int, scalars: dict[str, float]) -> None:
        """The scalars of the evaluation after training step ``step`` (module docstring)."""

    def on_run_end(self, metrics: Mapping[str, Any]) -> None:
        self.write_summary(summary_scalars(metrics))

    def write_summary(self, scalars: dict[str, float]) -> None:
        """The finished run's summary metrics."""

    def folder(self, name: str) -> Path:
        """``<artifacts>/<name>``, created; a logger that writes files needs the run's output folder."""
        if self.context.artifacts is None:
            raise ValueError(f"callback {type(self).__name__} writes under the run's artifacts folder: run it with an "
                             f"output folder (a suite, or clbench.api.run(..., out=...)).")
        folder = self.context.artifacts / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder


@CALLBACKS.register("training_log")
class TrainingLog(EpochLogger):
    """Loss and learning rate per epoch, one JSON line each in ``<artifacts>/training_log.jsonl`` and one CSV line
    each in ``<artifacts>/training_log.csv``, the evaluations in ``<artifacts>/evaluation_log.jsonl`` (always on;
    without an artifacts folder the rows are only kept in ``rows`` and ``evaluations``)."""

    def setup(self, context: CallbackContext) -> None:
        """In the run's own process, the files of an earlier attempt of the run (interrupted, replaced, ``--force``)
        are removed: a run's logs hold exactly its own rows (its members append theirs after this)."""
        super().setup(context)
        self.rows: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, float]] = []
        if context.artifacts is not None and not context.member:
            for name in (LOG_FILE, CSV_FILE, EVALUATION_FILE):
                (context.artifacts / name).unlink(missing_ok=True)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.context.artifacts is None:
            return
        self.context.artifacts.mkdir(parents=True, exist_ok=True)
        append(self.context.artifacts / LOG_FILE, json.dumps(row) + "\n")
        self._append_csv(row)

    def _append_csv(self, row: dict[str, Any]) -> None:
        """One CSV line; the header goes with the first line written, under an exclusive lock on the file (members
        of one run append to it from several processes)."""
        line = io.StringIO()
        csv.writer(line, lineterminator="\n").writerow(["" if row[c] is None else row[c] for c in COLUMNS])
        fd = os.open(self.context.artifacts / CSV_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            header = ",".join(COLUMNS) + "\n" if os.fstat(fd).st_size == 0 else ""
            os.write(fd, (header + line.getvalue()).encode())
        finally:
            os.close(fd)             # releases the lock

    def write_evaluation(self, step: int, scalars: dict[str, float]) -> None:
        self.evaluations.append({"step": step, **scalars})
        if self.context.artifacts is not None:
            self.context.artifacts.mkdir(parents=True, exist_ok=True)
            append(self.context.artifacts / EVALUATION_FILE, json.dumps(self.evaluations[-1]) + "\n")

    def close(self) -> None:
        """The run's own process draws every row of the file once training is over (its members' included: they
        may be the only ones, as for the tangent strategies, whose training is all member jobs)."""
        if self.context.artifacts is not None and not self.context.member and (self.context.artifacts /
                                                                                 LOG_FILE).exists():
            plot_log(self.context.artifacts)


@CALLBACKS.register("tensorboard")
class TensorBoardLog(EpochLogger):
    """Loss and learning rate per epoch, the scores after each training step and the run's summary as TensorBoard
    scalars in ``<artifacts>/tensorboard/`` (``tensorboard --logdir results/<suite>/artifacts``)."""

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (extra "tensorboard")

        if context.artifacts is not None and not context.member:    # an earlier attempt's event files
            shutil.rmtree(context.artifacts / "tensorboard", ignore_errors=True)
        self.writer = SummaryWriter(log_dir=str(self.folder("tensorboard")))

    def write(self, row: dict[str, Any]) -> None:
        prefix = f"{row['member']}/" if row["member"] else ""
        self.writer.add_scalar(f"{prefix}loss", row["loss"], row["step"])
        if row["lr"] is not None:
            self.writer.add_scalar(f"{prefix}lr", row["lr"], row["step"])

    def write_evaluation(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(f"eval/{name}", value, step)

    def write_summary(self, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(f"final/{name}", value, self.last_step)

    def close(self) -> None:
        """A member job's writer closes here; the run's flushes and stays open for :meth:`on_run_end`."""
        if self.context.member:
            self.writer.close()
        else:
            self.writer.flush()

    def on_run_end(self, metrics: Mapping[str, Any]) -> None:
        super().on_run_end(metrics)
        self.writer.close()


@CALLBACKS.register("wandb")
class WandbLog(EpochLogger):
    """Loss and learning rate per epoch, the scores after each training step and the run's summary (in the W&B run
    summary) logged to a Weights & Biases run named after the run (``mode: offline``, the default, writes under
    ``<artifacts>/wandb/`` for a later ``wandb sync``; ``online`` needs a login)."""

    def __init__(self, project: str = "clbench", mode: Literal["offline", "online"] = "offline") -> None:
        self.project, self.mode = project, mode

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        import wandb  # extra "wandb"

        name = f"{context.run_id}.{context.member}" if context.member else context.run_id
        if context.artifacts is not None and not context.member:    # an earlier attempt's offline runs
            shutil.rmtree(context.artifacts / "wandb", ignore_errors=True)
        self.run = wandb.init(project=self.project, name=name, dir=str(self.folder("wandb")), mode=self.mode,
                              reinit="create_new")
        for axis, logged in (("train_step", ("loss", "lr")), ("eval_step", ("eval/*",))):
            self.run.define_metric(axis)
            for key in logged:
                self.run.define_metric(key, step_metric=axis)

    def write(self, row: dict[str, Any]) -> None:
        self.run.log({"loss": row["loss"], **({"lr": row["lr"]} if row["lr"] is not None else {}),
                      "experience": row["experience"], "epoch": row["epoch"], "train_step": row["step"]})

    def write_evaluation(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log({"eval_step": step, **{f"eval/{k}": v for k, v in scalars.items()}})

    def write_summary(self, scalars: dict[str, float]) -> None:
        self.run.summary.update(scalars)

    def close(self) -> None:
        """A member job's run finishes here; the run's own stays open for :meth:`on_run_end`."""
        if self.context.member:
            self.run.finish()

    def on_run_end(self, metrics: Mapping[str, Any]) -> None:
        super().on_run_end(metrics)
        self.run.finish()


ALWAYS_ON = (CallbackSpec("training_log"),)
"""Callbacks the runner attaches to every run (not part of its identity)."""


__all__ = ["ALWAYS_ON", "COLUMNS", "CSV_FILE", "EVALUATION_FILE", "EpochLogger", "TensorBoardLog", "TrainingLog",
           "WandbLog", "resumed_observers", "summary_scalars"]
