"""The files of a run's artifacts folder ``<out>/artifacts/<run_id>/`` that clbench itself reads back: the training
log the ``training_log`` callback writes (:mod:`clbench.loggers`) and its plot, which report.md links. (Callbacks
add their own files there: ``hooks.jsonl``, ``tensorboard/``, ``wandb/``, the dual-form store.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOG_FILE = "training_log.jsonl"
"""One JSON line per logged epoch: ``{member, experience, epoch, step, batches, loss, lr}``."""
CURVE_FILE = "training_curve.png"
"""The log drawn by :func:`plot_log` when the run ends."""


def read_log(artifacts: str | Path) -> list[dict[str, Any]]:
    """The rows of ``<artifacts>/training_log.jsonl`` (empty when the run wrote none)."""
    path = Path(artifacts) / LOG_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def plot_log(artifacts: str | Path) -> Path:
    """``<artifacts>/training_curve.png``: loss per logged epoch against the row's position in the log (the order
    of training), one line per member (legend up to 8 members), the run's own experiences marked, its learning rate
    on the right axis."""
    from matplotlib.figure import Figure

    rows = read_log(artifacts)
    members = sorted({r["member"] for r in rows})
    figure = Figure(figsize=(6.4, 3.6))
    figure.subplots_adjust(left=0.1, right=0.83, bottom=0.15, top=0.91)   # fixed: a layout engine doubles the cost
    ax = figure.add_subplot()
    for member in members:
        at = [i for i, r in enumerate(rows) if r["member"] == member]
        ax.plot(at, [rows[i]["loss"] for i in at], marker=".", label=member or "run")
    own = [i for i, r in enumerate(rows) if not r["member"]]
    for previous, i in zip(own, own[1:]):
        if rows[i]["experience"] != rows[previous]["experience"]:
            ax.axvline(i - 0.5, color="0.8", linestyle="--", linewidth=0.8)
    ax.set(xlabel="logged epoch (in training order; dashed: next experience)", ylabel="training loss",
           title=Path(artifacts).name)
    if any(rows[i]["lr"] is not None for i in own):
        lr = ax.twinx()
        lr.plot(own, [rows[i]["lr"] for i in own], color="0.5", linewidth=0.8)
        lr.set_ylabel("learning rate", color="0.5")
    if 1 < len(members) <= 8:
        ax.legend(fontsize="small")
    path = Path(artifacts) / CURVE_FILE
    figure.savefig(path, dpi=80)
    return path


__all__ = ["CURVE_FILE", "LOG_FILE", "plot_log", "read_log"]
