"""RunRecords -> leaderboard: one row per (suite, scenario, strategy), mean and sample std over seeds.

Written as ``leaderboard.csv`` and ``leaderboard.md`` beside the ``runs/`` folder. Accuracies and forgetting are
percentages; ``params_M`` is the final parameter count in millions, ``params_added_M`` its growth from the first
to the last step; ``train_s``/``peak_mem_MB`` are per run. Extra strategy metrics (``metrics.extra``) become
columns of their own. Failed runs are counted in ``n_failed`` and left out of the means.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

METRICS = ("avg_inc_acc", "last_acc", "forgetting", "bwt", "fwt", "params_M", "params_added_M",
           "trainable_params_M", "train_s", "eval_s", "peak_mem_MB")
WITH_STD = ("avg_inc_acc", "last_acc", "forgetting", "bwt")
KEYS = ("suite", "scenario", "strategy")


def load_records(out_dir: str | Path) -> list[dict]:
    """Every run record (JSON) in ``<out_dir>/runs``, sorted by run id."""
    runs = Path(out_dir) / "runs"
    if not runs.is_dir():
        raise FileNotFoundError(f"no run records in {runs}: run a suite first (python run_bench.py --suite NAME).")
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))]


def _flat(record: dict) -> dict:
    spec = record["spec"]
    row = {"suite": spec["suite"], "scenario": spec["scenario"].get("label") or spec["scenario"]["name"],
           "strategy": spec["strategy"].get("label") or spec["strategy"]["name"],
           "preset": spec["strategy"].get("preset") or "default", "seed": record["seed"],
           "status": record["status"], "machine": record.get("env", {}).get("machine", "")}
    metrics = record.get("metrics", {})
    row.update({m: metrics.get(m) for m in METRICS})
    row.update({f"x_{k}": v for k, v in (metrics.get("extra") or {}).items() if isinstance(v, (int, float))})
    return row


def build(records: list[dict]) -> pd.DataFrame:
    """The leaderboard table (see module docstring for the columns)."""
    if not records:
        return pd.DataFrame(columns=[*KEYS, "n_seeds"])
    flat = pd.DataFrame([_flat(r) for r in records])
    extra = sorted(c for c in flat.columns if c.startswith("x_"))
    rows = []
    for key, group in flat.groupby(list(KEYS), sort=False):
        ok = group[group["status"] == "finished"]
        row = dict(zip(KEYS, key))
        row.update(n_seeds=len(ok), n_failed=int((group["status"] != "finished").sum()),
                   preset=",".join(sorted(set(group["preset"]))))
        for m in (*METRICS, *extra):
            values = pd.to_numeric(ok[m], errors="coerce").dropna() if m in ok else pd.Series(dtype=float)
            name = m[2:] if m.startswith("x_") else m
            row[name] = float(values.mean()) if len(values) else np.nan
            if m in WITH_STD or m.startswith("x_"):
                row[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else (0.0 if len(values) else
                                                                                         np.nan)
        row["machine"] = "; ".join(sorted(set(ok["machine"]))) if len(ok) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame, title: str = "") -> str:
    """A compact markdown table: mean ± std for accuracies, then cost columns."""
    def pm(row, m):
        if pd.isna(row.get(m)):
            return "–"
        std = row.get(f"{m}_std")
        return f"{row[m]:.2f} ± {std:.2f}" if not pd.isna(std) else f"{row[m]:.2f}"

    header = ["scenario", "strategy", "preset", "seeds", "avg_inc_acc", "last_acc", "forgetting", "bwt",
              "params_M", "params_added_M", "train_s", "peak_mem_MB"]
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, r in table.iterrows():
        cost = [f"{r[c]:.3f}" if c.startswith("params") else f"{r[c]:.1f}"
                for c in ("params_M", "params_added_M", "train_s", "peak_mem_MB")]
        lines.append("| " + " | ".join([str(r["scenario"]), str(r["strategy"]), str(r["preset"]),
                                         f"{r['n_seeds']}" + (f" ({r['n_failed']} failed)" if r["n_failed"] else ""),
                                         *(pm(r, m) for m in ("avg_inc_acc", "last_acc", "forgetting", "bwt")),
                                         *cost]) + " |")
    machines = sorted({m for m in table.get("machine", []) if m})
    if machines:
        lines += ["", "Machine: " + "; ".join(machines)]
    return "\n".join(lines) + "\n"


def write(out_dir: str | Path) -> pd.DataFrame:
    """Rebuild ``leaderboard.csv`` and ``leaderboard.md`` in ``out_dir`` from its records; returns the table."""
    out_dir = Path(out_dir)
    table = build(load_records(out_dir))
    table.to_csv(out_dir / "leaderboard.csv", index=False, float_format="%.4f")
    suites = ", ".join(sorted(set(table["suite"]))) if len(table) else ""
    (out_dir / "leaderboard.md").write_text(to_markdown(table, f"Leaderboard: {suites}"))
    return table
