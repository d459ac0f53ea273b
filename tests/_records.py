"""Synthetic run records that read back as true (:func:`clbench.records.check`): what tests that write records to a
results folder build theirs with."""

from __future__ import annotations

import copy

from clbench import metrics
from clbench import records as record_files
from clbench.config import config_hash
from clbench.specs import RunSpec


def sealed(record: dict) -> dict:
    """A copy of ``record`` completed as the runner writes one: its spec with every key (seed, device, amp, labels,
    args, preset, callbacks), the run id of that spec, ``strategy_config`` holding the spec's args, the identity hash,
    and for a finished record the summaries recomputed from its matrices. A finished record without a matrix gets the
    2 x 2 accuracy matrix (test sizes 1, 1) whose ``avg_inc_acc`` and ``last_acc`` are those it sets (one row when
    ``avg_inc_acc`` is None: an offline run); its forgetting and bwt then follow from that matrix. ``params_M``,
    ``params_added_M`` (0 with one row) and ``train_s`` it sets become parameter counts and step times that give them
    back."""
    r = copy.deepcopy(record)
    spec = r["spec"]
    spec.setdefault("seed", r["seed"])
    spec.setdefault("device", "auto")
    spec.setdefault("amp", False)
    for part in ("scenario", "strategy"):
        spec[part].setdefault("args", {})
        spec[part].setdefault("label", "")
    spec["strategy"].setdefault("preset", None)
    spec["strategy"].setdefault("callbacks", [])
    run = RunSpec.from_dict(spec)
    r["run_id"] = run.run_id
    r["strategy_config"] = {**(r.get("strategy_config") or {}), **spec["strategy"]["args"]}
    r["identity_hash"] = config_hash(record_files.identity(r, run))
    if r["status"] == "finished":
        _summarized(r)
    return r


def _summarized(r: dict) -> None:
    stored = r.setdefault("metrics", {})
    if not r.get("matrices") and not r.get("accuracy_matrix"):
        last = stored["last_acc"] / 100
        if stored.get("avg_inc_acc") is None:
            r["accuracy_matrix"] = [[last, last]]
        else:
            first = 2 * stored["avg_inc_acc"] / 100 - last
            r["accuracy_matrix"] = [[first, 0.0], [last, last]]
        r["test_sizes"] = [1, 1]
    if not r.get("metric_specs"):
        r["metric_specs"] = [metrics.ACCURACY.to_dict()]
        r["matrices"] = {"accuracy": r["accuracy_matrix"]}
    specs = [metrics.MetricSpec(**s) for s in r["metric_specs"]]
    R = r["matrices"][specs[0].name]
    stored.update(metrics.summarize(r["matrices"], r["test_sizes"], specs, offline=len(R) != len(R[0])))
    if "params_M" in stored:
        total, added = stored["params_M"] * 1e6, stored.get("params_added_M", 0.0) * 1e6
        trainable = stored.get("trainable_params_M", stored["params_M"]) * 1e6
        r["params_per_step"] = [{"total": total - added, "trainable": trainable}] * (len(R) - 1) + [
            {"total": total, "trainable": trainable}]
        if "params_added_M" in stored:        # one row (an offline run) adds nothing
            stored["params_added_M"] = (total - r["params_per_step"][0]["total"]) / 1e6
    if "train_s" in stored:
        r["step_train_s"] = [stored["train_s"]]
