"""One :class:`~clbench.specs.RunSpec` -> one :class:`RunRecord` (in memory; a JSON file written atomically by
:func:`run`).

::

    scenario = SCENARIOS.get(spec.scenario.name)(seed=spec.seed, **spec.scenario.args)
    config = with_scenario_paths(spec.config(), spec.scenario.name)                   # "{scenario}" in init
    strategy = STRATEGIES.get(spec.strategy.name)(scenario.info, device, config)     # a StrategyBase
    strategy.callbacks.attach(ALWAYS_ON + spec.strategy.callbacks, context)           # hooks of every loop
    for i, experience in enumerate(scenario.train_stream):
        callbacks.on_experience_start(i); strategy.train(experience); callbacks.on_experience_end(i)
        scores = scenario.evaluator(strategy, scenario, i, device)     # row i of every matrix, same for all
        callbacks.on_evaluation(Evaluation.after(i, matrices, ...))       # loggers: scores per experience
        record.adequacy.append(adequacy.measure(strategy, scenario, i, ...))  # accuracy on the data just trained, loss
    callbacks.close(); metrics = ...; callbacks.on_run_end(metrics)   # the run's summary to every logger
    record = RunRecord(..., matrices={metric: R}, metrics=metrics.summarize(matrices, sizes, evaluator.specs))

The runner calls the strategy's optional hooks (defaults in :class:`~clbench.protocol.StrategyBase`):
``extra_metrics()`` (recorded under ``metrics.extra`` and shown in the leaderboard) and ``save_state(directory)``
(after the last step, with ``<out>/state/<run_id>/``, e.g. for unlearning afterwards; the record stores that
folder relative to ``<out>`` and the folder an owner file, :func:`clbench.records.state_dir`). Callbacks write
under ``<out>/artifacts/<run_id>/`` (marked with an owner file too when the run ends). A record holds no absolute
path: a copied results folder is self-contained. What a run wrote before is moved to ``<out>/replaced/`` first
(:mod:`clbench.replaced`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clbench import adequacy, files, metrics, progress, replaced
from clbench import records as record_files
from clbench.callbacks import CallbackContext, CallbackSpec, Evaluation
from clbench.config import config_hash, with_scenario_paths
from clbench.data import DatasetNotFound
from clbench.environment import PeakMemory, environment, resolve_device
from clbench.errors import NonFiniteLossError, OutputError
from clbench.loggers import ALWAYS_ON, TrainingLog
from clbench.precision import autocast
from clbench.protocol import (
    ParamCount,
    Scenario,
    ScenarioInfo,
    StrategyBase,
    StrategyContractError,
    checked,
    hooks_checked,
)
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.specs import RunSpec

RECORD_VERSION = 1


@dataclass
class RunRecord:
    """Everything one run produced. ``matrices[metric][i][j]``: score on test experience ``j`` after step ``i``
    (``metric_specs`` says what each is); classification records also keep ``accuracy_matrix`` (fractions) at the top
    level. ``metrics`` are the summaries (percent for ``%`` metrics), seconds, MB and millions of parameters."""

    run_id: str
    status: str                                  # "finished" | "failed"
    spec: dict
    identity_hash: str
    seed: int
    code_fingerprint: str = ""                  # clbench.fingerprint: the code the run depended on (resume)
    accuracy_matrix: list[list[float]] = field(default_factory=list)
    matrices: dict[str, list[list[float]]] = field(default_factory=dict)
    metric_specs: list[dict] = field(default_factory=list)
    test_sizes: list[int] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    params_per_step: list[dict] = field(default_factory=list)
    step_train_s: list[float] = field(default_factory=list)
    strategy_config: dict = field(default_factory=dict)
    scenario_info: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    started: str = ""
    finished: str = ""
    reason: str | None = None
    state_dir: str | None = None                # relative to the results folder (absolute in older records)
    checkpoints: dict[str, str] = field(default_factory=dict)     # config field -> content hash of the file read
    adequacy: list[dict] = field(default_factory=list)            # per step: clbench.adequacy.StepAdequacy
    version: int = RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, default=_json_default)

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        data = json.loads(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, path: str | Path) -> Path:
        """Atomic write (:func:`clbench.files.write_atomic`: no temporary file is left behind; a full disk is an
        :class:`~clbench.errors.OutputError`)."""
        return files.write_atomic(path, self.to_json())


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    return str(obj)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def record_path(out_dir: str | Path, run_id: str) -> Path:
    return Path(out_dir) / "runs" / f"{run_id}.json"


# --------------------------------------------------------------------------------------------------------- runner
def build_strategy(spec: RunSpec, info: ScenarioInfo, device: torch.device, config: Any = None) -> StrategyBase:
    """The run's strategy, with ``config`` (default: :meth:`RunSpec.config`) whose checkpoint paths have
    ``{scenario}`` replaced (:func:`clbench.config.with_scenario_paths`): a run and ``forget`` read the same file."""
    return STRATEGIES.get(spec.strategy.name)(info, device, with_scenario_paths(
        spec.config() if config is None else config, spec.scenario.name))


def build_scenario(spec: RunSpec) -> Scenario:
    return SCENARIOS.get(spec.scenario.name)(seed=spec.seed, **spec.scenario.args)


def _mega(n: int) -> float:
    return n / 1e6


def execute(spec: RunSpec, out_dir: str | Path | None = None) -> RunRecord:
    """Train and evaluate one run and return its record, in memory. With ``out_dir``, callbacks write their
    artifacts under ``<out_dir>/artifacts/<run_id>/`` and ``save_state`` saves under ``<out_dir>/state/<run_id>/``;
    without it nothing touches the disk.

    Any exception (a NaN loss included) gives a ``failed`` record with the reason. Set-up errors that every run
    would repeat (a missing dataset) and ``KeyboardInterrupt`` propagate.
    """
    device = resolve_device(spec.device)
    config = spec.config()                  # built once: the identity's resolved values and the strategy's
    identity = spec.identity(config)
    record = RunRecord(run_id=spec.run_id, status="failed", spec=spec.to_dict(), identity_hash=config_hash(identity),
                       seed=spec.seed, code_fingerprint=spec.code_fingerprint(),
                       strategy_config=identity["strategy"]["resolved"], env=environment(device),
                       checkpoints=identity.get("checkpoints", {}),
                       started=datetime.now(UTC).isoformat(timespec="seconds"))
    try:
        with PeakMemory(device) as memory:       # read once _execute returned: its objects are gone
            _execute(spec, config, device, record, None if out_dir is None else Path(out_dir))
        record.metrics["peak_mem_MB"] = memory.peak_mb      # after on_run_end: loggers' final metrics lack it
        record.env["peak_mem_method"] = memory.method
        record.status = "finished"
    except (KeyboardInterrupt, DatasetNotFound, OutputError):
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and the suite goes on
        record.reason = f"{type(exc).__name__}: {exc}"
        record.metrics["traceback"] = traceback.format_exc(limit=8)
    record.finished = datetime.now(UTC).isoformat(timespec="seconds")
    return record


def run(spec: RunSpec, out_dir: str | Path) -> RunRecord:
    """:func:`execute` with ``out_dir``, then write the record to ``<out_dir>/runs/<run_id>.json`` (finished
    records of other runs stay whatever happens to this one). What the run wrote there before (record, artifacts,
    state) is first moved to ``<out_dir>/replaced/`` (:func:`clbench.replaced.set_aside`; one line on stderr says
    so), and a results folder whose ``runs/``, ``artifacts/``, ``state/`` or ``replaced/`` is a link is refused."""
    kept = replaced.set_aside(out_dir, spec.run_id)
    if kept is not None:
        print(kept.line(), file=sys.stderr)
    record = execute(spec, out_dir)
    artifacts = Path(out_dir) / "artifacts" / spec.run_id
    if artifacts.is_dir():                      # its files tied to this record (clbench.snapshots.load_snapshot)
        record_files.write_owner(artifacts, record)
    record.write(record_path(out_dir, spec.run_id))
    return record


def _execute(spec: RunSpec, config: Any, device: torch.device, record: RunRecord, out_dir: Path | None) -> None:
    seed_everything(spec.seed)
    scenario = build_scenario(spec)
    info, evaluator = scenario.info, scenario.evaluator
    record.scenario_info = dataclasses.asdict(info)
    record.metric_specs = [s.to_dict() for s in evaluator.specs]
    seed_everything(spec.seed)
    strategy = build_strategy(spec, info, device, config)
    callbacks = strategy.callbacks
    artifacts = None if out_dir is None else out_dir / "artifacts" / spec.run_id
    callbacks.attach([*ALWAYS_ON, *(CallbackSpec(**c) for c in spec.strategy.callbacks)],
                     CallbackContext(run_id=spec.run_id, artifacts=artifacts, modules=strategy.modules,
                                     n_train=sum(len(e.dataset) for e in scenario.train_stream)))
    offline = strategy.offline
    experiences = list(scenario.train_stream)
    steps = [experiences] if offline else experiences
    train_s = eval_s = 0.0
    with autocast(spec.amp, device):
        for i, step in enumerate(progress.bar(steps, desc=spec.run_id, level="experiences")):
            start = time.perf_counter()
            callbacks.on_experience_start(i)
            with hooks_checked(strategy, i):
                strategy.train(step)
            callbacks.on_experience_end(i)
            record.step_train_s.append(time.perf_counter() - start)
            train_s += record.step_train_s[-1]
            count = checked(strategy.num_parameters(), ParamCount, strategy, "num_parameters")
            record.params_per_step.append({"total": count.total, "trainable": count.trainable})
            start = time.perf_counter()
            scores = evaluator(strategy, scenario, len(experiences) - 1 if offline else i, device)
            eval_s += time.perf_counter() - start
            for name, row in scores.rows.items():
                record.matrices.setdefault(name, []).append(row)
            record.test_sizes = scores.sizes
            callbacks.on_evaluation(Evaluation.after(i, record.matrices, scores.sizes, evaluator.specs, offline))
            record.adequacy.append(adequacy.measure(strategy, scenario, i, offline, device, spec.seed,
                                                    callbacks.find(TrainingLog).rows).to_dict())
    callbacks.close()
    record.accuracy_matrix = record.matrices.get(metrics.ACCURACY.name, [])
    summary = metrics.summarize(record.matrices, record.test_sizes, evaluator.specs, offline=offline)
    totals = [p["total"] for p in record.params_per_step]
    summary.update(params_M=_mega(totals[-1]), trainable_params_M=_mega(record.params_per_step[-1]["trainable"]),
                   params_added_M=_mega(totals[-1] - totals[0]), train_s=train_s, eval_s=eval_s)
    summary["extra"] = _extra_metrics(strategy)
    record.metrics = summary
    if out_dir is not None:
        relative = Path("state") / spec.run_id
        with files.writing(out_dir / relative):
            if strategy.save_state(out_dir / relative) is not None:
                record_files.write_owner(out_dir / relative, record)
                record.state_dir = relative.as_posix()
    callbacks.on_run_end(record.metrics)


def _extra_metrics(strategy: StrategyBase) -> dict[str, float]:
    """``strategy.extra_metrics()`` and its callbacks' (``epsilon`` of private training), checked: a dict of names
    to finite numbers."""
    extra = {**checked(strategy.extra_metrics(), dict, strategy, "extra_metrics"), **strategy.callbacks.extra_metrics()}
    wrong = sorted(k for k, v in extra.items() if not isinstance(k, str) or not isinstance(v, (int, float)))
    if wrong:
        raise StrategyContractError(f"{type(strategy).__name__}.extra_metrics() must map names to numbers; "
                                    f"not so for {wrong}.")
    bad = {k: v for k, v in extra.items() if not math.isfinite(v)}
    if bad:
        raise NonFiniteLossError(f"extra metrics {sorted(bad)}", next(iter(bad.values())))
    return extra


__all__ = ["RunRecord", "execute", "run", "record_path", "build_scenario", "build_strategy", "seed_everything"]
