"""One :class:`~clbench.config.RunSpec` -> one :class:`RunRecord` (a JSON file written atomically).

::

    scenario = SCENARIOS.get(spec.scenario.name)(seed=spec.seed, **spec.scenario.args)
    strategy = STRATEGIES.get(spec.strategy.name)(scenario.info, device, config)
    for i, experience in enumerate(scenario.train_stream):
        strategy.train(experience)
        R[i, :] = evaluate(strategy, scenario)          # the same routine for every strategy
    record = RunRecord(..., accuracy_matrix=R, metrics=metrics.summarize(R, n))

Optional strategy hooks the runner calls when present: ``extra_metrics() -> dict[str, float]`` (recorded under
``metrics.extra`` and shown in the leaderboard) and ``save_state(directory)`` (called after the last step with
``<out>/state/<run_id>/``, e.g. for unlearning afterwards).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from clbench import metrics, progress
from clbench.config import RunSpec, build_config, config_hash
from clbench.data import DatasetNotFound
from clbench.environment import PeakMemory, environment, release_freed_memory, resolve_device
from clbench.errors import NonFiniteLossError
from clbench.protocol import ParamCount, Scenario, ScenarioInfo, Strategy
from clbench.registry import SCENARIOS, STRATEGIES

RECORD_VERSION = 1


@dataclass
class RunRecord:
    """Everything one run produced. ``accuracy_matrix[i][j]`` is a fraction; ``metrics`` are percentages,
    seconds, MB and millions of parameters."""

    run_id: str
    status: str                                  # "finished" | "failed"
    spec: dict
    identity_hash: str
    seed: int
    accuracy_matrix: list[list[float]] = field(default_factory=list)
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
    state_dir: str | None = None
    version: int = RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, default=_json_default)

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        data = json.loads(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, path: str | Path) -> Path:
        """Atomic write: a temporary file in the same folder, then ``os.replace``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path


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


# ----------------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(strategy: Strategy, scenario: Scenario, step: int, device: torch.device,
             batch_size: int = 512) -> tuple[list[float], list[int]]:
    """Accuracy on every test experience after training step ``step`` (row ``step`` of the accuracy matrix).

    Class-incremental (and domain-incremental): the prediction is the argmax over the classes seen so far,
    ``0 .. info.n_seen(step) - 1``. Task-incremental (``info.task_aware``): the argmax over test experience ``j``'s
    own classes ``info.class_range(j)``, the task label being given. Returns ``(accuracies, test sizes)``.

    In class-incremental scenarios a future experience ``j > step`` holds only classes that cannot be predicted
    yet, so ``R[step, j] = 0`` exactly; it is filled in without running the model.
    """
    info = scenario.info
    n_seen = info.n_seen(step)
    accuracies, sizes = [], []
    for j, experience in enumerate(scenario.test_stream):
        if j > step and not (info.task_aware or info.domain_incremental):
            accuracies.append(0.0)
            sizes.append(len(experience.dataset))
            continue
        allowed = info.class_range(j) if info.task_aware else range(n_seen)
        loader = DataLoader(experience.dataset.eval(), batch_size=batch_size, shuffle=False)
        correct = total = 0
        for x, y, t in loader:
            logits = strategy.predict(x.to(device), t.to(device))
            if logits.shape[1] < allowed.stop:
                raise ValueError(f"{type(strategy).__name__}.predict returned {logits.shape[1]} logits but "
                                 f"{allowed.stop} classes must be scored after step {step}.")
            scores = logits[:, allowed.start: allowed.stop].float()
            if not torch.isfinite(scores).all():
                raise NonFiniteLossError(f"predictions on test experience {j}", float("nan"))
            pred = scores.argmax(dim=1).cpu() + allowed.start
            correct += int((pred == y).sum())
            total += len(y)
        accuracies.append(correct / total)
        sizes.append(total)
    return accuracies, sizes


# --------------------------------------------------------------------------------------------------------- runner
def build_strategy(spec: RunSpec, info: ScenarioInfo, device: torch.device) -> Strategy:
    config = build_config(spec.strategy.name, spec.strategy.preset, spec.strategy.args)
    return STRATEGIES.get(spec.strategy.name)(info, device, config)


def build_scenario(spec: RunSpec) -> Scenario:
    return SCENARIOS.get(spec.scenario.name)(seed=spec.seed, **spec.scenario.args)


def _mega(n: int) -> float:
    return n / 1e6


def run(spec: RunSpec, out_dir: str | Path) -> RunRecord:
    """Train and evaluate one run, write its record to ``<out_dir>/runs/<run_id>.json`` and return it.

    Any exception (a NaN loss included) gives a ``failed`` record with the reason. Set-up errors that every run
    would repeat (a missing dataset) and ``KeyboardInterrupt`` propagate and write nothing for this run (finished
    records of other runs stay).
    """
    device = resolve_device(spec.device)
    identity = spec.identity()
    record = RunRecord(run_id=spec.run_id, status="failed", spec=spec.to_dict(), identity_hash=config_hash(identity),
                       seed=spec.seed, strategy_config=identity["strategy"]["resolved"], env=environment(device),
                       started=datetime.now(UTC).isoformat(timespec="seconds"))
    try:
        _execute(spec, device, record, Path(out_dir))
        record.status = "finished"
    except (KeyboardInterrupt, DatasetNotFound):
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and the suite goes on
        record.reason = f"{type(exc).__name__}: {exc}"
        record.metrics["traceback"] = traceback.format_exc(limit=8)
    record.finished = datetime.now(UTC).isoformat(timespec="seconds")
    record.write(record_path(out_dir, spec.run_id))
    return record


def _execute(spec: RunSpec, device: torch.device, record: RunRecord, out_dir: Path) -> None:
    release_freed_memory()          # before this run's data exists: what earlier runs freed goes back to the OS
    seed_everything(spec.seed)
    scenario = build_scenario(spec)
    info = scenario.info
    record.scenario_info = dataclasses.asdict(info)
    seed_everything(spec.seed)
    strategy = build_strategy(spec, info, device)
    offline = bool(getattr(strategy, "offline", False))
    experiences = list(scenario.train_stream)
    steps = [experiences] if offline else experiences
    train_s = eval_s = 0.0
    amp = spec.amp and device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
    with PeakMemory(device) as memory, autocast:
        for i, step in enumerate(progress.bar(steps, desc=spec.run_id, level="experiences")):
            start = time.perf_counter()
            strategy.train(step)
            record.step_train_s.append(time.perf_counter() - start)
            train_s += record.step_train_s[-1]
            count: ParamCount = strategy.num_parameters()
            record.params_per_step.append({"total": count.total, "trainable": count.trainable})
            start = time.perf_counter()
            row, sizes = evaluate(strategy, scenario, len(experiences) - 1 if offline else i, device)
            eval_s += time.perf_counter() - start
            record.accuracy_matrix.append(row)
            record.test_sizes = sizes
    summary = metrics.summarize(record.accuracy_matrix, record.test_sizes, offline=offline,
                                fwt_reference=info.extra.get("fwt_reference"))
    totals = [p["total"] for p in record.params_per_step]
    summary.update(params_M=_mega(totals[-1]), trainable_params_M=_mega(record.params_per_step[-1]["trainable"]),
                   params_added_M=_mega(totals[-1] - totals[0]), train_s=train_s, eval_s=eval_s,
                   peak_mem_MB=memory.peak_mb)
    extra = strategy.extra_metrics() if hasattr(strategy, "extra_metrics") else {}
    bad = {k: v for k, v in extra.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        raise NonFiniteLossError(f"extra metrics {sorted(bad)}", next(iter(bad.values())))
    summary["extra"] = extra
    record.metrics = summary
    if hasattr(strategy, "save_state"):
        state_dir = out_dir / "state" / spec.run_id
        strategy.save_state(state_dir)
        record.state_dir = str(state_dir)


__all__ = ["RunRecord", "run", "evaluate", "record_path", "build_scenario", "build_strategy",
           "seed_everything"]
