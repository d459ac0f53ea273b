"""Validation score against training epochs for rows of a suite, to choose their budget on held-out training data:
the test data are not read.

    CLBENCH_DATA=<root> python benchmarks/budget_curve.py SUITE SCENARIO STRATEGY [STRATEGY ...] \\
        [--epochs 30] [--steps 1] [--seed 0] [--valid-fraction 0.1] [--at 5,10,20,30] [--threads 1]

Each row is the suite's entry (``SCENARIO``, ``STRATEGY``: labels, else names) with ``holdout: valid`` added to the
scenario's arguments (the validation part of each class's training data is scored, :class:`clbench.streams.Holdout`;
``--valid-fraction`` sets ``valid_fraction``) and ``epochs: E`` to the strategy's, re-checked as a suite file is. It
trains the first ``--steps`` steps (all by default) and prints one JSON line per scored point: ``step``, ``epoch``,
``just_trained`` (the primary metric on the validation data of the step just trained: ``R[step, step]``), ``seen``
(on the validation data of every step seen so far, size-weighted: the running ``last_acc``), ``sizes`` (validation
samples of each step scored), in the leaderboard's units (percent for accuracy), with the seconds spent.

- Default, one training per row: ``--epochs E`` and, after every epoch of every step (the training loops'
  ``on_epoch_end`` hook, :mod:`clbench.callbacks`), the strategy's ``predict`` is scored. The scoring leaves the
  random state and every module's train/eval mode as it found them, so the training is the run of ``E`` epochs. A
  point at epoch ``e < E`` is the model after ``e`` epochs of an ``E``-epoch run: the same as an ``e``-epoch run for
  strategies whose prediction is ready after every epoch and whose learning rate does not depend on ``E`` (replay,
  DER++, the PETL rows at a constant rate), NOT for those that finish their predictor at the end of a step (iCaRL's
  class means of exemplars, a balanced fine-tuning phase) or decay the rate over ``E`` epochs. A private row whose
  noise is calibrated from epsilon over the ``E`` epochs is refused here (use ``--at``).
- ``--at 5,10,20,30``: one training per budget, each scored at the end of every step, as a run is: exact for every
  strategy, at the cost of the sum of the budgets.
- ``--trajectory`` (with ``--epochs E``): every epoch of one ``E``-epoch run scored, also for the rows whose noise
  or schedule depends on ``E``: the run's course (stability, Ding et al.'s Figure 4), its last point the ``E``-epoch
  budget; the JSON lines say ``"trajectory": true`` and the table reads no flattening from it.

At the end: a markdown table of the curve (one row per epoch, one column per row and step: just trained / seen) and,
per row and step, the epoch where the curve flattens. Rule: the first epoch ``e`` after which the just-trained
score never rises by more than ``--tolerance`` (1 point of a metric in percent; for another, such as NDCG@10,
required, in its units) at any later epoch up to ``E``, with at least ``--tail`` (20%) of ``E`` after it
(``E - e >= 0.2 E``), so that a curve still rising at ``E`` is reported as not flat (raise ``E``) rather than flat at
``E``. Read a budget off it: the flattening epoch (or a rounder one just above it), then
run the suite's rows at that budget with ``holdout: test``, which reads the test data once, at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from clbench import suite_file
from clbench.callbacks import Callback, CallbackContext, CallbackSpec
from clbench.environment import resolve_device
from clbench.errors import ConfigError
from clbench.metrics import MetricSpec
from clbench.registry import CALLBACKS
from clbench.runner import build_scenario, build_strategy, seed_everything
from clbench.specs import RunSpec


@contextlib.contextmanager
def undisturbed(device: torch.device) -> Iterator[None]:
    """Puts back, on exit, the random state (Python, numpy, torch and the GPU's) and the train/eval mode of every
    module whose ``train()``/``eval()`` was called inside (a strategy's ``predict`` switches its model to eval)."""
    changed: list[tuple[nn.Module, bool]] = []
    original = nn.Module.train

    def train(module: nn.Module, mode: bool = True) -> nn.Module:
        changed.append((module, module.training))
        return original(module, mode)

    states = random.getstate(), np.random.get_state()
    nn.Module.train = train
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        nn.Module.train = original
        for module, mode in reversed(changed):
            module.training = mode
        random.setstate(states[0])
        np.random.set_state(states[1])


@dataclass
class Curve:
    """The scored points of one row: ``points[step] = [(epoch, just_trained, seen), ...]``."""

    spec: RunSpec
    scenario: object
    strategy: object
    device: torch.device
    points: dict[int, list[tuple[int, float, float]]] = field(default_factory=dict)
    trajectory: bool = False    # the points are one run's epochs whose schedule or noise depends on E, not budgets

    @property
    def metric(self) -> MetricSpec:
        """The scenario's primary metric (the one scored)."""
        specs = self.scenario.evaluator.specs
        return next((s for s in specs if s.primary), specs[0])

    @property
    def decimals(self) -> int:
        """Decimals the table prints: 1 for a metric in percent (accuracy), 4 for a fraction (NDCG@10 ~ 0.05)."""
        return 1 if self.metric.unit == "%" else 4

    def score(self, step: int, epoch: int, train_s: float) -> None:
        """Score the strategy on the validation data of steps ``0..step`` and print the point's JSON line."""
        start = time.perf_counter()
        metric = self.metric
        with undisturbed(self.device):
            scores = self.scenario.evaluator(self.strategy, self.scenario, step, self.device)
        row, sizes = scores.rows[metric.name][:step + 1], scores.sizes[:step + 1]
        just = metric.scale * row[step]
        seen = metric.scale * sum(r * n for r, n in zip(row, sizes)) / sum(sizes)
        self.points.setdefault(step, []).append((epoch, just, seen))
        digits = self.decimals + 2
        print(json.dumps({"event": "epoch", "scenario": self.spec.scenario.key, "row": self.spec.strategy.key,
                          "seed": self.spec.seed, "step": step, "epoch": epoch, "metric": metric.name,
                          "holdout": "valid", "just_trained": round(just, digits), "seen": round(seen, digits),
                          "sizes": sizes, "trajectory": self.trajectory, "train_s": round(train_s, 2),
                          "eval_s": round(time.perf_counter() - start, 2)}), flush=True)


class EpochScores(Callback):
    """Scores the curve's strategy after every epoch of every training call of a step (``on_epoch_end``), epochs
    counted from 1 across the step's calls (a strategy with several phases continues the count)."""

    def __init__(self, curve: Curve) -> None:
        self.curve, self.step, self.epoch, self.start = curve, 0, 0, time.perf_counter()

    def on_experience_start(self, experience: int) -> None:
        self.step, self.epoch, self.start = experience, 0, time.perf_counter()

    def on_epoch_end(self, epoch: int) -> None:
        self.epoch += 1
        try:
            self.curve.score(self.step, self.epoch, time.perf_counter() - self.start)
        except Exception as exc:  # noqa: BLE001 - any failure of predict mid-step means the same thing
            raise ConfigError(f"{self.curve.spec.strategy.key} cannot predict before its step ends "
                              f"({type(exc).__name__}: {exc}); score it at the end of each step with --at.") from exc
        self.start = time.perf_counter()


def tolerance_for(metric: MetricSpec, given: float | None) -> float:
    """The flattening rule's allowed rise: ``given``, else 1 point for a metric in percent; a metric in other units
    (NDCG@10) has no default (a point of NDCG@10 is not a point of accuracy) and is refused without one."""
    if given is not None:
        return given
    if metric.unit != "%":
        raise ConfigError(f"the metric {metric.name} is not in percent: pass --tolerance in its units (e.g. 0.001 "
                          f"for NDCG@10).")
    return 1.0


def run_row(spec: RunSpec, steps: int | None, every_epoch: bool, tolerance: float | None = None,
            trajectory: bool = False) -> Curve:
    """Train ``spec``'s first ``steps`` steps as the runner does, scoring after every epoch (``every_epoch``) or at
    the end of every step; the entry's observer callbacks (``model_snapshot``, loggers: they change neither the
    training nor the scores, and a curve has no output folder) are left out. ``tolerance`` None is refused, before
    training, for a metric not in percent (it has no default: a point of NDCG@10 is not a point of accuracy). Every
    epoch of a private row whose noise is calibrated from epsilon is refused (its epoch e is not the e-epoch run at
    that epsilon: use ``--at``), unless ``trajectory``: the points are then read as one run's course (Ding et al.'s
    Figure 4 plots one such run every five epochs), never as budgets."""
    calibrated = any(c["name"] == "dp" and "epsilon" in c.get("args", {}) for c in spec.strategy.callbacks)
    if every_epoch and calibrated and not trajectory:
        raise ConfigError(f"{spec.strategy.key} calibrates its noise from epsilon over all its epochs: epoch e of one "
                          f"run is not the e-epoch run at that epsilon. Curve it with --at (one run per budget).")
    device = resolve_device(spec.device)
    seed_everything(spec.seed)
    scenario = build_scenario(spec)
    seed_everything(spec.seed)
    strategy = build_strategy(spec, scenario.info, device)
    if strategy.offline:
        raise ConfigError(f"{spec.strategy.key} trains once on the whole stream (offline): it has no steps to curve.")
    curve = Curve(spec, scenario, strategy, device, trajectory=trajectory)
    tolerance_for(curve.metric, tolerance)
    callbacks = strategy.callbacks
    trained_with = [c for c in spec.strategy.callbacks if not getattr(CALLBACKS.get(c["name"]), "observer", False)]
    callbacks.attach([CallbackSpec(**c) for c in trained_with],
                     CallbackContext(run_id=spec.run_id, modules=strategy.modules,
                                     n_train=sum(len(e.dataset) for e in scenario.train_stream)))
    if every_epoch:
        callbacks.callbacks.append(EpochScores(curve))
    for i, experience in enumerate(list(scenario.train_stream)[:steps]):
        start = time.perf_counter()
        callbacks.on_experience_start(i)
        strategy.train(experience)
        callbacks.on_experience_end(i)
        if every_epoch and i not in curve.points:
            raise ConfigError(f"{spec.strategy.key} trained step {i} without the curve's epoch hook firing (members "
                              f"trained with callbacks rebuilt from their specs, as taft's or model_soup's, or a loop "
                              f"without on_epoch_end): score it at the end of each step with --at.")
        if not every_epoch:
            curve.score(i, spec.config().epochs, time.perf_counter() - start)
    callbacks.close()
    return curve


def flattening_epoch(points: Sequence[tuple[int, float, float]], tolerance: float, tail: float) -> int | None:
    """The first epoch ``e`` whose just-trained score no later point exceeds by more than ``tolerance``, with
    ``E - e >= tail * E`` (``E`` the last epoch); None when there is none (still rising at ``E``)."""
    last = points[-1][0]
    for i, (epoch, just, _) in enumerate(points):
        if last - epoch >= tail * last and all(later <= just + tolerance for _, later, _ in points[i + 1:]):
            return epoch
    return None


def table(curves: Sequence[Curve], tolerance: float, tail: float) -> str:
    """The curves as one markdown table (``just trained / seen`` per row and step) and the flattening epochs."""
    columns = [(c, step) for c in curves for step in sorted(c.points)]
    epochs = sorted({e for c, step in columns for e, _, _ in c.points[step]})
    lines = ["| epoch | " + " | ".join(f"{c.spec.strategy.key} step {s}" for c, s in columns) + " |",
             "|---:|" + "---:|" * len(columns)]
    for epoch in epochs:
        cells = [next((f"{j:.{c.decimals}f} / {s:.{c.decimals}f}" for e, j, s in c.points[step] if e == epoch), "")
                 for c, step in columns]
        lines.append(f"| {epoch} | " + " | ".join(cells) + " |")
    lines.append("")
    for c, step in columns:
        if c.trajectory:
            lines.append(f"- {c.spec.strategy.key}, step {step}: the course of one {c.points[step][-1][0]}-epoch run "
                         f"(--trajectory): its epochs are not budgets; flattening not read")
            continue
        flat = flattening_epoch(c.points[step], tolerance, tail)
        lines.append(f"- {c.spec.strategy.key}, step {step}: " + (
            f"flattens at epoch {flat}" if flat is not None else
            f"not flat within {c.points[step][-1][0]} epochs (raise --epochs)"))
    return "\n".join(lines)


def row_specs(suite: str, scenario: str, strategies: Sequence[str], epochs: int, seed: int,
              valid_fraction: float | None) -> list[RunSpec]:
    """The suite's rows for ``scenario`` x ``strategies`` and ``seed``, with ``holdout: valid`` (and
    ``valid_fraction``) added to the scenario entry and ``epochs`` to each strategy entry, checked as a suite file
    is (:func:`clbench.suite_file.parse_suite`)."""
    path = suite_file.resolve_suite_path(suite)
    data = suite_file.read_yaml(path)

    def entries(key: str, wanted: Sequence[str], extra: dict) -> list[dict]:
        items = [{"name": e} if isinstance(e, str) else dict(e) for e in data.get(key, [])]
        for item in items:
            if (item.get("label") or item["name"]) in wanted or item["name"] in wanted:
                item["args"] = {**item.get("args", {}), **extra}
        return items

    holdout = {"holdout": "valid", **({} if valid_fraction is None else {"valid_fraction": valid_fraction})}
    data = {**data, "scenarios": entries("scenarios", [scenario], holdout),
            "strategies": entries("strategies", strategies, {"epochs": epochs}), "seeds": [seed]}
    spec = suite_file.parse_suite(data, str(path)).select([scenario], list(strategies), [seed])
    return spec.run_specs()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", help="a shipped suite's name or a suite file")
    parser.add_argument("scenario", help="the scenario entry (its label, else its name)")
    parser.add_argument("strategies", nargs="+", help="strategy entries (labels, else names)")
    parser.add_argument("--epochs", type=int, default=30, help="epochs per step of the one training (default 30)")
    parser.add_argument("--at", type=lambda text: sorted(int(b) for b in text.split(",")), default=[],
                        help="comma-separated budgets, one training each (instead of --epochs)")
    parser.add_argument("--steps", type=int, default=None, help="train only the first N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--valid-fraction", type=float, default=None, help="the scenario's valid_fraction")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="flattening: rise allowed, in the metric's units (default 1 point for a metric in "
                             "percent; required for others, e.g. 0.001 for NDCG@10)")
    parser.add_argument("--tail", type=float, default=0.2, help="flattening: fraction of E that must follow")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the suites' runs)")
    parser.add_argument("--trajectory", action="store_true",
                        help="with --epochs: score every epoch of one run even where its noise or learning rate "
                             "depends on the epochs (private rows, decaying schedules): the run's course, not budgets")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    budgets = args.at or [args.epochs]
    if args.steps is not None and args.steps < 1 or min(budgets) < 1:
        parser.error("--steps, --epochs and every --at budget must be at least 1")
    if args.trajectory and args.at:
        parser.error("--trajectory scores every epoch of one --epochs run; --at trains one run per budget")
    try:
        curves: dict[str, Curve] = {}
        for budget in budgets:
            for spec in row_specs(args.suite, args.scenario, args.strategies, budget, args.seed,
                                  args.valid_fraction):
                curve = run_row(spec, args.steps, every_epoch=not args.at, tolerance=args.tolerance,
                                trajectory=args.trajectory)
                merged = curves.setdefault(spec.strategy.key, curve)
                for step, points in curve.points.items() if merged is not curve else ():
                    merged.points[step] += points
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = list(curves.values())
    print(table(rows, tolerance_for(rows[0].metric, args.tolerance), args.tail))
    return 0


if __name__ == "__main__":
    sys.exit(main())
