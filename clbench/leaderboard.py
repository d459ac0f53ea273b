"""RunRecords -> leaderboard: one row per run identity, mean and sample std over seeds.

A row holds only records of the same identity — the same suite, scenario (name and arguments), strategy (name,
resolved hyperparameters as stored in the record's ``strategy_config``, callbacks) and code (``code_fingerprint``):
everything but the seed. Records written under one (suite, scenario, strategy) label with different identities,
e.g. two runs of a suite with ``mem_size: 200`` (seed 0) and ``mem_size: 20`` (seed 1) into one ``--out``, become
distinct rows labelled by the keys that differ: ``replay [mem_size=20]`` and ``replay [mem_size=200]`` (scenario
arguments label the scenario column, ``code=<fingerprint>`` marks records of different code).

Score columns come from the records' :class:`~clbench.metrics.MetricSpec` s (``metric_specs``; classification
records without them are read as :data:`~clbench.metrics.ACCURACY`): each metric gives ``avg_inc``, ``last``,
``forgetting`` and ``bwt`` columns — ``avg_inc_acc``, ``last_acc``, ``forgetting``, ``bwt`` for accuracy,
``ndcg@10_last`` and so on for others — each with a std over seeds; the markdown shows those of each row's primary
metric.

Written as ``leaderboard.csv`` and ``leaderboard.md`` beside the ``runs/`` folder. Accuracies and forgetting are
percentages; ``params_M`` is the final parameter count in millions, ``params_added_M`` its growth from the first
to the last step; ``train_s``/``peak_mem_MB`` are per run. Extra strategy metrics (``metrics.extra``) become
columns of their own. Failed runs are counted in ``n_failed`` and left out of the means; the std of one seed is
undefined (empty in the CSV; the markdown shows the value and "(n=1)", and a legend line says what "±" is).
``overrides`` are the suite's ``args`` of the row's strategy.
``flags`` is the row's training adequacy (:func:`clbench.adequacy.row_flags`: ``not learned`` / ``not converged``,
with the seeds flagged of those finished, the 0-based steps and the source of the numbers; empty when none), shown
beside the scores in the markdown when a row has one, with a legend line that says what the flags mean.
Rows are sorted by suite, scenario and then the primary metric (its ``avg_inc``, or ``last`` where that is undefined,
e.g. for joint training), best first.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clbench import adequacy, files
from clbench import records as record_files
from clbench.escaping import csv_table, markdown_text
from clbench.metrics import ACCURACY, SUMMARIES, MetricSpec, primary
from clbench.specs import identity_callbacks

log = logging.getLogger(__name__)

# Cost columns (every record has them), which are shown in the markdown and how; score columns come from MetricSpecs.
COSTS = ("params_M", "params_added_M", "trainable_params_M", "train_s", "eval_s", "peak_mem_MB")
MARKDOWN_COST = {"params_M": "{:.3f}", "params_added_M": "{:.3f}", "train_s": "{:.1f}", "peak_mem_MB": "{:.1f}"}
KEYS = ("suite", "scenario", "strategy")
MARKDOWN_EXTRA = ("epsilon", "trainable_pct", "route_acc")
"""Extra metrics the markdown also shows where a row has them: private runs' ε spent, PETL's trainable parameters in %
of the backbone and the per-task module sets' routing accuracy."""


def metric_specs(record: dict) -> list[MetricSpec]:
    """The record's metric specs (accuracy for records written before specs were stored)."""
    return [MetricSpec(**s) for s in record.get("metric_specs") or []] or [ACCURACY]


def score_columns(spec: MetricSpec) -> list[str]:
    return [spec.column(summary) for summary in SUMMARIES]


def load_records(out_dir: str | Path) -> list[dict]:
    """Every run record in ``<out_dir>/runs``, sorted by file name; a file that is not one is logged (by path) and
    left out (:mod:`clbench.records`)."""
    records, corrupt = record_files.load_dir(out_dir)
    for problem in corrupt:
        log.warning("%s; skipped", problem)
    return records


# --------------------------------------------------------------------------------------------------------- identity
def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value, sort_keys=True, default=str)


def identity(record: dict) -> tuple[dict[str, str], dict[str, str]]:
    """``(scenario part, strategy part)`` of the record's identity as flat ``{key: JSON value}`` maps (the seed,
    device, labels and observing callbacks are not part of it; ``amp`` is, when true)."""
    spec = record["spec"]
    scenario: dict[str, str] = {}
    _flatten("", {"name": spec["scenario"]["name"], **(spec["scenario"].get("args") or {})}, scenario)
    strategy_spec = {**spec["strategy"], "callbacks": identity_callbacks(spec["strategy"].get("callbacks") or ())}
    resolved = record.get("strategy_config") or {"preset": strategy_spec.get("preset"),
                                                 **(strategy_spec.get("args") or {})}
    others = {k: v for k, v in strategy_spec.items() if k not in ("name", "label", "preset", "args") and v}
    if record.get("checkpoints"):       # the content of the checkpoints read (init): same path, other weights
        others["checkpoints"] = record["checkpoints"]
    if spec.get("amp"):                 # bf16 autocast (--amp): another experiment than float32 (RunSpec.identity)
        others["amp"] = True
    strategy: dict[str, str] = {}
    _flatten("", {"name": strategy_spec["name"], **resolved, **others}, strategy)
    strategy["code"] = json.dumps(record.get("code_fingerprint") or "unknown")
    return scenario, strategy


def row_labels(records: list[dict]) -> list[tuple[str, str]]:
    """``(scenario label, strategy label)`` per record: the entries' labels, plus ``[key=value, ...]`` for the
    identity keys that differ between records sharing a label. Records with equal labels have equal identities, so
    anything that averages over seeds (this table, plots) must group by these labels, not by the entries'."""
    base = [(r["spec"]["scenario"].get("label") or r["spec"]["scenario"]["name"],
             r["spec"]["strategy"].get("label") or r["spec"]["strategy"]["name"]) for r in records]
    ids = [identity(r) for r in records]
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (r, b) in enumerate(zip(records, base)):
        groups[(r["spec"]["suite"], *b)].append(i)
    labels = list(base)
    for members in groups.values():
        for part in (0, 1):
            keys = sorted({k for i in members for k in ids[i][part]})
            differing = [k for k in keys if len({ids[i][part].get(k) for i in members}) > 1]
            if not differing:
                continue
            for i in members:
                tag = ", ".join(f"{k}={_short(k, ids[i][part].get(k))}" for k in differing)
                labels[i] = tuple(f"{labels[i][p]} [{tag}]" if p == part else labels[i][p] for p in (0, 1))
    return labels


def _short(key: str, value: str | None) -> str:
    """A JSON value as it reads in a label: strings unquoted, code fingerprints cut to 7 digits, "–" if absent."""
    if value is None:
        return "–"
    decoded = json.loads(value)
    if not isinstance(decoded, str):
        return value
    return decoded[:7] if key == "code" else decoded


def _overrides(record: dict) -> str:
    """The suite's ``args`` of the record's strategy as ``key=value, ...`` ("–" when none)."""
    args = record["spec"]["strategy"].get("args") or {}
    return ", ".join(f"{k}={_plain(v)}" for k, v in args.items()) or "–"


def _plain(value: Any) -> str:
    """``value`` as YAML flow style would show it: ``adamw``, ``[0, 0.5]``, ``{embed_dim: 64}``."""
    return json.dumps(value, default=str).replace('"', "")


# ------------------------------------------------------------------------------------------------------------ table
def _flat(record: dict, scenario: str, strategy: str) -> dict:
    spec = record["spec"]
    row = {"suite": spec["suite"], "scenario": scenario, "strategy": strategy,
           "preset": spec["strategy"].get("preset") or "default", "overrides": _overrides(record),
           "seed": record["seed"], "status": record["status"], "machine": record.get("env", {}).get("machine", ""),
           "code_fingerprint": record.get("code_fingerprint") or ""}
    metrics = record.get("metrics", {})
    row.update({m: metrics.get(m) for spec in metric_specs(record) for m in score_columns(spec)})
    row.update({m: metrics.get(m) for m in COSTS})
    row.update({f"x_{k}": v for k, v in (metrics.get("extra") or {}).items() if isinstance(v, (int, float))})
    return row


def unique_runs(records: list[dict]) -> list[dict]:
    """Each run once (its first record, by :func:`clbench.records.run_key`), in order."""
    keys = [record_files.run_key(r) for r in records]
    return [r for i, r in enumerate(records) if keys.index(keys[i]) == i]


def build(records: list[dict], root: str | Path | None = None) -> pd.DataFrame:
    """The leaderboard table (see the module docstring for rows and columns); ``root``: the results folder of the
    records, where the adequacy flags of records written without ``adequacy`` read their committed training logs."""
    records = unique_runs(records)
    if not records:
        return pd.DataFrame(columns=[*KEYS, "n_seeds"])
    flat = pd.DataFrame([_flat(r, *labels) for r, labels in zip(records, row_labels(records))])
    extra = sorted(c for c in flat.columns if c.startswith("x_"))
    scores = list(dict.fromkeys(c for r in records for spec in metric_specs(r) for c in score_columns(spec)))
    primaries = [primary(metric_specs(r)) for r in records]
    rows, row_primary = [], []
    for key, group in flat.groupby(list(KEYS), sort=False):
        ok = group[group["status"] == "finished"]
        row = dict(zip(KEYS, key))
        row.update(n_seeds=len(ok), n_failed=int((group["status"] != "finished").sum()),
                   preset=",".join(sorted(set(group["preset"]))), overrides=" | ".join(sorted(set(group["overrides"]))))
        for m in (*scores, *COSTS, *extra):
            values = pd.to_numeric(ok[m], errors="coerce").dropna() if m in ok else pd.Series(dtype=float)
            name = m[2:] if m.startswith("x_") else m
            row[name] = float(values.mean()) if len(values) else np.nan
            if m not in COSTS:
                row[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else np.nan
        row["machine"] = "; ".join(sorted(set(ok["machine"]))) if len(ok) else ""
        row["code_fingerprint"] = "; ".join(sorted(set(group["code_fingerprint"]) - {""}))
        row["flags"] = adequacy.row_flags([records[i] for i in group.index], root)
        spec = primaries[group.index[0]]
        row["primary_metric"] = spec.name
        rows.append(row)
        row_primary.append(spec)
    table = pd.DataFrame(rows)

    def rank(i: int) -> float:
        """The row's primary ``avg_inc`` (``last`` where undefined), best first; rows without one last."""
        spec = row_primary[i]
        value = next((table[c][i] for c in score_columns(spec)[:2] if not pd.isna(table[c][i])), np.nan)
        return np.inf if pd.isna(value) else (-value if spec.higher_is_better else value)

    order = sorted(range(len(table)), key=lambda i: (table["suite"][i], table["scenario"][i], rank(i),
                                                     table["strategy"][i]))
    table = table.iloc[order].reset_index(drop=True)
    table.attrs["primary_columns"] = list(dict.fromkeys(c for spec in row_primary for c in score_columns(spec)))
    table.attrs["units"] = {c: spec.unit for spec in row_primary for c in score_columns(spec)}
    return table


def score_decimals(unit: str) -> int:
    """Decimals a score is shown with: 2 for a percentage (``unit`` "%"), 4 for a unitless metric (NDCG, HIT:
    fractions, where 2 decimals would print 0.02 for every private row of dp_seqrec)."""
    return 2 if unit == "%" else 4


def mean_pm(row: pd.Series, column: str, decimals: int) -> str:
    """``"mean ± std"`` of ``column`` in a leaderboard row; ``"value (n=1)"`` where the std is undefined (one seed),
    ``–`` for a missing mean."""
    if pd.isna(row.get(column)):
        return "–"
    std = row.get(f"{column}_std")
    return f"{row[column]:.{decimals}f} " + ("(n=1)" if pd.isna(std) else f"± {std:.{decimals}f}")


LEGEND = ("Scores: mean ± std, the sample standard deviation over the row's n seeds (column `seeds`); a row of one "
          "seed shows its value and (n=1). Costs: mean over the seeds.")
"""The line under every markdown leaderboard that says what its cells are."""


def flagged(table: pd.DataFrame) -> bool:
    """Whether a row of ``table`` has an adequacy flag (then the markdown tables show the ``flags`` column)."""
    return "flags" in table and bool(table["flags"].fillna("").astype(str).str.len().gt(0).any())


def to_markdown(table: pd.DataFrame, title: str = "") -> str:
    """A compact markdown table: labels and overrides, mean ± std (:func:`mean_pm`) for the scores, the adequacy
    ``flags`` (where a row has one: :func:`flagged`), then costs, followed by :data:`LEGEND`,
    :data:`clbench.adequacy.FLAGS_LEGEND` (with the flags) and the machines. Scores get :func:`score_decimals` of
    their unit, the extra columns 2."""
    shown = [*(table.attrs.get("primary_columns") or score_columns(ACCURACY)),
             *(c for c in MARKDOWN_EXTRA if c in table and table[c].notna().any())]
    units = table.attrs.get("units", {})
    decimals = {m: score_decimals(units.get(m, "%")) for m in shown}
    flags = flagged(table)
    header = ["suite", "scenario", "strategy", "preset", "overrides", "seeds", *shown, *(["flags"] if flags else []),
              *MARKDOWN_COST]
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, r in table.iterrows():
        seeds = f"{r['n_seeds']}" + (f" ({r['n_failed']} failed)" if r["n_failed"] else "")
        cost = ["–" if pd.isna(r[c]) else fmt.format(r[c]) for c, fmt in MARKDOWN_COST.items()]
        cells = [str(r["suite"]), str(r["scenario"]), str(r["strategy"]), str(r["preset"]), str(r["overrides"]),
                 seeds, *(mean_pm(r, m, decimals[m]) for m in shown), *([r["flags"]] if flags else []), *cost]
        lines.append("| " + " | ".join(map(markdown_text, cells)) + " |")
    lines += ["", LEGEND] if len(table) else []
    lines += ["", adequacy.FLAGS_LEGEND] if flags else []
    machines = sorted({m for row in table.get("machine", []) for m in str(row).split("; ") if m})
    if machines:
        lines += ["", "Machine: " + "; ".join(map(markdown_text, machines))]
    return "\n".join(lines) + "\n"


def write(out_dir: str | Path, records: list[dict] | None = None) -> pd.DataFrame:
    """Rebuild ``leaderboard.csv`` (text cells safe from formula injection: :func:`clbench.escaping.csv_cell`) and
    ``leaderboard.md`` (cells escaped: :func:`clbench.escaping.markdown_text`) in ``out_dir`` from ``records``
    (default: its :func:`load_records`); returns the table."""
    out_dir = Path(out_dir)
    table = build(load_records(out_dir) if records is None else records, out_dir)
    files.write_atomic(out_dir / "leaderboard.csv", csv_table(table).to_csv(index=False, float_format="%.4f"))
    suites = ", ".join(sorted(set(table["suite"]))) if len(table) else ""
    files.write_atomic(out_dir / "leaderboard.md", to_markdown(table, f"Leaderboard: {suites}"))
    return table
