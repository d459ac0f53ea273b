"""Training curves as callbacks: the loss and learning rate of every epoch, written while a run trains.

Each logger keeps, per epoch of a training call (the hooks of :mod:`clbench.callbacks`)::

    loss  = mean over the epoch's minibatches of the training loss seen by after_forward (every term added)
    lr    = optimizer.param_groups[0]["lr"] at the epoch's last step
    row   = {member, experience, epoch (0-based within the training call), step (epochs logged so far by this
             process), batches, loss, lr}

- ``training_log`` (always on: the runner attaches :data:`ALWAYS_ON` to every run, outside its identity) appends one
  JSON line per row to ``<artifacts>/training_log.jsonl`` (shard members trained elsewhere append their own rows,
  with their ``member`` key) and, when the run ends, draws them in ``<artifacts>/training_curve.png`` (report.md
  links it);
- ``tensorboard`` writes the rows as scalars ``loss`` and ``lr`` (``<member>/loss`` for a member) through
  ``torch.utils.tensorboard`` into ``<artifacts>/tensorboard/`` (extra ``tensorboard``);
- ``wandb`` logs them to a Weights & Biases run, offline by default, under ``<artifacts>/wandb/`` (extra ``wandb``).

Attach the optional ones like any callback: ``callbacks: [{name: tensorboard}]`` in a suite entry, or
``clbench.api.run(..., callbacks=["tensorboard"], out=...)``; they need an output folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from clbench.artifacts import LOG_FILE, plot_log
from clbench.callbacks import Callback, CallbackContext, CallbackSpec
from clbench.registry import CALLBACKS


class EpochLogger(Callback):
    """Collects the rows described in the module docstring; subclasses write each with :meth:`write`."""

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        self.experience: int | None = None
        self.step = 0
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
    """Loss and learning rate per epoch, one JSON line each in ``<artifacts>/training_log.jsonl`` (always on;
    without an artifacts folder the rows are only kept in ``rows``)."""

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.context.artifacts is None:
            return
        self.context.artifacts.mkdir(parents=True, exist_ok=True)
        # one write of one line on an O_APPEND file: rows of members appending at once stay whole lines
        fd = os.open(self.context.artifacts / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(row) + "\n").encode())
        finally:
            os.close(fd)

    def close(self) -> None:
        """The run's own process draws every row of the file once training is over (its members' included: they
        may be the only ones, as for the tangent strategies, whose training is all member jobs)."""
        if self.context.artifacts is not None and not self.context.member and (self.context.artifacts /
                                                                                 LOG_FILE).exists():
            plot_log(self.context.artifacts)


@CALLBACKS.register("tensorboard")
class TensorBoardLog(EpochLogger):
    """Loss and learning rate per epoch as TensorBoard scalars in ``<artifacts>/tensorboard/`` (``tensorboard
    --logdir results/<suite>/artifacts``)."""

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (extra "tensorboard")

        self.writer = SummaryWriter(log_dir=str(self.folder("tensorboard")))

    def write(self, row: dict[str, Any]) -> None:
        prefix = f"{row['member']}/" if row["member"] else ""
        self.writer.add_scalar(f"{prefix}loss", row["loss"], row["step"])
        if row["lr"] is not None:
            self.writer.add_scalar(f"{prefix}lr", row["lr"], row["step"])

    def close(self) -> None:
        self.writer.close()


@CALLBACKS.register("wandb")
class WandbLog(EpochLogger):
    """Loss and learning rate per epoch logged to a Weights & Biases run named after the run (``mode: offline``, the
    default, writes under ``<artifacts>/wandb/`` for a later ``wandb sync``; ``online`` needs a login)."""

    def __init__(self, project: str = "clbench", mode: Literal["offline", "online"] = "offline") -> None:
        self.project, self.mode = project, mode

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        import wandb  # extra "wandb"

        name = f"{context.run_id}.{context.member}" if context.member else context.run_id
        self.run = wandb.init(project=self.project, name=name, dir=str(self.folder("wandb")), mode=self.mode,
                              reinit="create_new")

    def write(self, row: dict[str, Any]) -> None:
        self.run.log({"loss": row["loss"], **({"lr": row["lr"]} if row["lr"] is not None else {}),
                      "experience": row["experience"], "epoch": row["epoch"]}, step=row["step"])

    def close(self) -> None:
        self.run.finish()


ALWAYS_ON = (CallbackSpec("training_log"),)
"""Callbacks the runner attaches to every run (not part of its identity)."""


__all__ = ["ALWAYS_ON", "EpochLogger", "TensorBoardLog", "TrainingLog", "WandbLog"]
