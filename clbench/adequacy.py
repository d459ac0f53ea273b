"""Training adequacy: did each training step learn the data it had just trained on, and had its loss flattened?

Computed by clbench after each step (never by a strategy) and stored in the record's ``adequacy``, one entry per
experience (training step) ``i``::

    {experience: i, train_acc, n, chance, k, loss_first, loss_last, epochs, loss_drop}

- ``train_acc``: accuracy on a fixed subsample of the step's training data (``n <= min(SAMPLE, PER_CLASS * k)``
  items, :func:`sample_size`, drawn by a generator seeded with ``seed * 1000 + i``: the same items for every strategy
  of a seed), with the test
  evaluation's prediction rule, right after the step's test evaluation (the evaluator's ``train_accuracy``:
  :meth:`clbench.evaluation.AccuracyEvaluator.train_accuracy`). The global random state is saved and restored around
  it, so the run trains and scores exactly as without it. None where the scenario's evaluator scores no training data
  (ranking: :mod:`clbench.evaluation` says why).
- ``chance = 1 / k``, ``k`` the classes of the step (``classes_per_experience[i]``; an offline run's one step: the
  classes of the whole stream).
- ``loss_first``, ``loss_last``: mean training loss of the first and last epoch of the step's main training call
  (the call with the most epochs, the first of equals: DyTox's and DER's balanced fine-tuning are shorter calls), as
  the always-on ``training_log`` sees it (:mod:`clbench.loggers`: the loss of every minibatch, every term added),
  ``epochs = E`` that call's epochs, and::

      loss_drop = (L[E-1-w] - L[E-1]) / L[0],     w = max(1, round(E / 5))

  the part of the first epoch's loss that the last fifth of the epochs still removed. None for ``E`` <
  :data:`MIN_EPOCHS` (the window would start at the first epoch, whose mean holds the descent from the untrained
  model: a 2-epoch step "drops" 90% on split digits where the loss is near 0 at the end) and for training that the
  run's own process did not log (shard members trained in other processes).

Flags (:func:`record_flags`; one row's flag is the union over its finished seeds, :func:`row_flags`)::

    not learned     accuracy on the just-trained data < LEARNED / k        at any step      (LEARNED = 1.5)
    not converged   loss_drop >= CONVERGED                                 at any step      (CONVERGED = 0.05)

``LEARNED = 1.5``: a model that learned nothing of the step's classes scores about ``1/k`` on them (less in
class-incremental scenarios, where it predicts old classes: DER++ scores 0.0 on B50's later steps). At most half
again above chance is below 75% for a pair of digits (which a linear model separates above 95%) and below 15% for ten
CIFAR classes (30-55% for the rows that learn them), and far above the noise of the estimate (one standard error at
chance: 1.6 points for k = 2 and n = 1000, 0.9 for k = 10). ``CONVERGED = 0.05``: for a loss decaying as
``L0 exp(-t / tau)`` the last fifth removes >= 5% of ``L0`` when the step ran fewer than about 2.6 time constants, with
more than 7% of the initial loss still to lose; a flattened curve removes ~0 (the PETL transfer rows at 5 epochs: 1-2%
on CIFAR, 3-8% on MNIST).

Records written before ``adequacy`` existed are read from what they hold, and the flag says the source: ``test``
(the diagonal ``R[i, i]`` of the accuracy matrix: accuracy on the TEST data of the step just trained, a lower bound
of what it learned; an offline run's one row, weighted by the test sizes) instead of ``train``, and ``log`` (the
committed ``<root>/artifacts/<run_id>/training_log.jsonl``, the run's own rows; of a file holding two attempts, the
last) instead of ``record``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clbench.protocol import Scenario, StrategyBase

SAMPLE = 1000
"""At most this many training items are scored per step."""
PER_CLASS = 50
"""At most this many training items per class of the step are scored (:func:`sample_size`)."""
LEARNED = 1.5
"""``not learned``: the just-trained accuracy is below ``LEARNED / k`` at some step."""
CONVERGED = 0.05
"""``not converged``: ``loss_drop`` is at least this at some step."""
MIN_EPOCHS = 3
"""Fewest epochs of a step's main training call for which ``loss_drop`` is defined."""
LOG_FILE = "training_log.jsonl"


@dataclass(frozen=True)
class StepAdequacy:
    """One step's entry of a record's ``adequacy`` (module docstring)."""

    experience: int
    train_acc: float | None
    n: int
    chance: float | None
    k: int | None
    loss_first: float | None
    loss_last: float | None
    epochs: int
    loss_drop: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def loss_drop(losses: Sequence[float]) -> float | None:
    """``(L[E-1-w] - L[E-1]) / L[0]`` with ``w = max(1, round(E / 5))`` for the epoch losses ``L`` of one training
    call; None for fewer than :data:`MIN_EPOCHS` epochs or a first loss of 0."""
    if len(losses) < MIN_EPOCHS or not losses[0]:
        return None
    w = max(1, round(len(losses) / 5))
    return (losses[-1 - w] - losses[-1]) / losses[0]


def main_call(rows: Sequence[Mapping[str, Any]], experience: int) -> list[float]:
    """Epoch losses of the longest training call of ``experience`` among the run's own ``training_log`` rows
    (``member`` ""); a call starts where the epoch counter does not go up."""
    calls: list[list[float]] = []
    last = None
    for row in rows:
        if row.get("member") or row.get("experience") != experience:
            continue
        if last is None or row["epoch"] <= last:
            calls.append([])
        calls[-1].append(float(row["loss"]))
        last = row["epoch"]
    return max(calls, key=len) if calls else []


def step_classes(info: Mapping[str, Any], step: int, offline: bool) -> int:
    """``k`` of a step: the classes it introduces, or for an offline run's one step those of the whole stream
    (per task where predictions are made per task or the labels are shared)."""
    per = list(info["classes_per_experience"])
    if not offline:
        return per[step]
    return max(per) if info.get("task_aware") or info.get("domain_incremental") else sum(per)


def sample_size(k: int) -> int:
    """Training items scored for a step of ``k`` classes: ``min(SAMPLE, PER_CLASS * k)`` (fewer when the step has
    fewer). The flag's margin above chance is ``(LEARNED - 1) / k = 0.5 / k`` and the standard error of an accuracy at
    chance over ``n = PER_CLASS * k`` items is ``sqrt((1/k)(1 - 1/k) / n) < 1 / (k sqrt(PER_CLASS))``, so the margin
    is more than ``0.5 sqrt(PER_CLASS) = 3.5`` standard errors at every ``k`` (5 for ``k = 2``, n = 100; 3.7 for
    ``k = 10``, n = 500), as with the fixed 1,000 items scored before (5.3 SE at ``k = 10``, 16 at ``k = 2``), at a
    cost in proportion to the step's classes: 100 forward passes for two classes instead of 1,000, a small part of
    the test evaluation that scores every class seen."""
    return min(SAMPLE, PER_CLASS * k)


@contextmanager
def _isolated_rng(device: torch.device) -> Iterator[None]:
    """The global random states (Python, NumPy, torch CPU and CUDA) as they were before, afterwards: data loaders
    draw a seed from torch's when iterated, and the next step must train as if nothing had run."""
    python, numpy = random.getstate(), np.random.get_state()
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(python)
    np.random.set_state(numpy)


def measure(strategy: StrategyBase, scenario: Scenario, step: int, offline: bool, device: torch.device, seed: int,
            log_rows: Sequence[Mapping[str, Any]]) -> StepAdequacy:
    """The adequacy entry of training step ``step`` (module docstring), measured right after its evaluation;
    ``log_rows``: the run's ``training_log`` rows so far."""
    info = scenario.info
    experiences = list(range(info.n_experiences)) if offline else [step]
    last = info.n_experiences - 1 if offline else step
    scorer = getattr(scenario.evaluator, "train_accuracy", None)
    accuracy, n, k = None, 0, None
    if scorer is not None:
        k = step_classes(asdict(info), step, offline)
        with _isolated_rng(device):
            accuracy, n = scorer(strategy, scenario, last, device, experiences, sample_size(k), seed * 1000 + step)
    losses = main_call(log_rows, step)
    return StepAdequacy(experience=step, train_acc=accuracy, n=n, chance=None if k is None else 1 / k, k=k,
                        loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
                        epochs=len(losses), loss_drop=loss_drop(losses))


# ------------------------------------------------------------------------------------------------------------ flags
@dataclass(frozen=True)
class Flag:
    """One record's flag: ``kind`` ("not learned" / "not converged"), the 0-based ``steps`` where it holds (shown
    from 1 by :func:`row_flags`) and the ``source`` of the numbers ("train" / "test" for accuracy, "record" / "log"
    for the loss)."""

    kind: str
    steps: tuple[int, ...]
    source: str


def _accuracies(record: Mapping[str, Any]) -> tuple[str, list[tuple[float, int]]] | None:
    """``(source, [(accuracy on the step's data, k) per step])`` of a record, or None where it has neither the
    adequacy accuracies nor an accuracy matrix with the scenario's classes."""
    entries = record.get("adequacy") or []
    if entries and all(e.get("train_acc") is not None for e in entries):
        return "train", [(e["train_acc"], e["k"]) for e in entries]
    matrix, info = record.get("accuracy_matrix") or [], record.get("scenario_info") or {}
    if not matrix or "classes_per_experience" not in info:
        return None
    if len(matrix) == 1 and len(info["classes_per_experience"]) > 1:           # offline: one row over everything
        sizes = record.get("test_sizes") or [1] * len(matrix[0])
        return "test", [(float(np.average(matrix[0], weights=sizes)), step_classes(info, 0, True))]
    return "test", [(matrix[i][i], step_classes(info, i, False)) for i in range(len(matrix))]


def _log_rows(root: Path | None, run_id: str) -> list[dict]:
    """The run's committed ``training_log.jsonl`` rows (those after the last restart of its ``step`` counter: a file
    an earlier attempt also wrote to holds both)."""
    path = None if root is None else root / "artifacts" / run_id / LOG_FILE
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    own = [r for r in rows if not r.get("member")]
    starts = [i for i, r in enumerate(own) if r.get("step") == 0]
    return own[starts[-1]:] if starts else own


def _drops(record: Mapping[str, Any], root: Path | None) -> tuple[str, list[float | None]] | None:
    entries = record.get("adequacy") or []
    if entries and any(e.get("epochs") for e in entries):
        return "record", [e.get("loss_drop") for e in entries]
    rows = _log_rows(root, record["run_id"])
    if not rows:
        return None
    return "log", [loss_drop(main_call(rows, i)) for i in sorted({r["experience"] for r in rows})]


def record_flags(record: Mapping[str, Any], root: str | Path | None = None) -> list[Flag]:
    """The flags of one finished record (module docstring); ``root``: its results folder (the one holding
    ``runs/``), where committed training logs of records without ``adequacy`` are read."""
    flags = []
    accuracies = _accuracies(record)
    if accuracies:
        source, values = accuracies
        steps = tuple(i for i, (acc, k) in enumerate(values) if acc < LEARNED / k)
        if steps:
            flags.append(Flag("not learned", steps, source))
    drops = _drops(record, None if root is None else Path(root))
    if drops:
        source, values = drops
        steps = tuple(i for i, d in enumerate(values) if d is not None and d >= CONVERGED)
        if steps:
            flags.append(Flag("not converged", steps, source))
    return flags


def unchecked(record: Mapping[str, Any], root: str | Path | None = None) -> tuple[str, ...]:
    """The checks of :func:`record_flags` that could not be made on one record, said instead of left blank:
    ``convergence n/a: 2 epochs`` (a step's main training ran fewer than :data:`MIN_EPOCHS` epochs, where
    ``loss_drop`` is undefined; epochs from the adequacy entries or the committed training log), and for a record
    with adequacy entries ``learning n/a: no per-step accuracy`` (a ranking run: no accuracy on the step's data) and
    ``convergence n/a: no loss per epoch`` (no training loop, as the popularity floors). A record from before the
    checks with neither adequacy entries nor a training log has nothing to say here."""
    entries = record.get("adequacy") or []
    notes = ["learning n/a: no per-step accuracy"] if entries and not _accuracies(record) else []
    if any(e.get("epochs") for e in entries):
        epochs = [e.get("epochs") or 0 for e in entries]
    else:
        rows = _log_rows(None if root is None else Path(root), record["run_id"])
        epochs = [len(main_call(rows, i)) for i in sorted({r["experience"] for r in rows})]
        if entries and not epochs:
            notes.append("convergence n/a: no loss per epoch")
    short = sorted({e for e in epochs if e < MIN_EPOCHS})
    if short:
        notes.append(f"convergence n/a: {'/'.join(map(str, short))} epoch{'s' * (short != [1])}")
    return tuple(notes)


def row_flags(records: Sequence[Mapping[str, Any]], root: str | Path | None = None) -> str:
    """The flag text of one leaderboard row: per kind, the seeds flagged out of the row's finished seeds, the union
    of their steps counted from 1 (as the plots: step 1 trains the first experience) and the sources, e.g.
    ``not learned (2/3 seeds; steps 2,4,5; test)``, then each check
    that could not be made (:func:`unchecked`); "" only when both checks were made on every seed and none flags."""
    finished = [r for r in records if r.get("status") == "finished"]
    found: dict[str, list[Flag]] = {}
    for record in finished:
        for flag in record_flags(record, root):
            found.setdefault(flag.kind, []).append(flag)
    parts = []
    for kind in ("not learned", "not converged"):
        if kind in found:
            steps = ",".join(str(s + 1) for s in sorted({s for f in found[kind] for s in f.steps}))
            sources = "+".join(sorted({f.source for f in found[kind]}))
            parts.append(f"{kind} ({len(found[kind])}/{len(finished)} seeds; "
                         f"step{'s' if ',' in steps else ''} {steps}; {sources})")
    parts += dict.fromkeys(note for record in finished for note in unchecked(record, root))
    return "; ".join(parts)


FLAGS_LEGEND = (f"Flags (clbench/adequacy.py): `not learned` = accuracy on the data of a step just trained "
                f"below {LEARNED}/k for its k classes at some step; `not converged` = the last fifth of a step's "
                f"epochs still removed at least {CONVERGED:.0%} of its first epoch's loss; seeds flagged / finished, "
                f"steps counted from 1 as in the plots (step 1 trains the first experience), source: train (a <= "
                f"{SAMPLE}-item subsample of the step's training data), test "
                f"(R[i, i], records without adequacy), record or log (the committed training log). A check that could "
                f"not be made is said: `convergence n/a: 2 epochs` (the rule needs {MIN_EPOCHS} epochs a step), "
                f"`convergence n/a: no loss per epoch`, `learning n/a: no per-step accuracy`; an empty cell: both "
                f"checks made and neither flags (or a record from before the checks, without a training log).")
"""The line under a table with a ``flags`` column that says what the flags mean."""


__all__ = ["CONVERGED", "FLAGS_LEGEND", "LEARNED", "MIN_EPOCHS", "PER_CLASS", "SAMPLE", "Flag", "StepAdequacy",
           "loss_drop", "main_call", "measure", "record_flags", "row_flags", "sample_size", "step_classes", "unchecked"]
