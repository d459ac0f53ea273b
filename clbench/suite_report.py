"""``report.md``: one page per suite output folder, built from its run records only (and the plots of
:mod:`clbench.report` drawn from the same records).

Sections, in order:

1. what was run: runs finished and failed, scenarios, strategies, seeds, when, total training time;
2. per scenario, on its primary metric (:class:`~clbench.metrics.MetricSpec`): the best strategy for each summary
   (``avg_inc``, ``last``, ``forgetting``, ``bwt``; direction from the spec, except forgetting, the amount lost
   (:func:`clbench.metrics.summarize_matrix` signs it so), which is lower-is-better for every metric), and a table
   ranking the continual strategies by ``avg_inc`` with their ``last``, the gap ``last(joint) - last(strategy)``
   to the joint upper bound (an offline row: trained on everything at once, one row in its matrix; without one in
   the suite the column is left out), their rank by forgetting and, where a row has one, their adequacy ``flags``
   (:mod:`clbench.adequacy`; a best row that is flagged says so beside its number);
3. the plots: each scenario's score curves inline, its score-matrix heatmaps and parameter curve as links;
4. the leaderboard (:func:`clbench.leaderboard.to_markdown`);
5. failed runs with their reasons;
6. machine and code version: machines, CPU models with the instruction set torch's kernels use
   (``torch.backends.cpu.get_cpu_capability()``: results may differ between hosts), devices, package versions, git
   commits and code fingerprints of the records.

The numbers are the leaderboard's (mean ± sample std over seeds, one row per run identity). What the page copies
from the records (labels, names, paths, reasons, machine and package names) is escaped
(:func:`clbench.escaping.markdown_text`, names as code spans: :func:`clbench.escaping.markdown_code`): a label can
neither end a table, nor link, nor inject HTML.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from clbench import files, leaderboard, report
from clbench import records as record_files
from clbench.artifacts import CURVE_FILE
from clbench.escaping import markdown_code, markdown_text
from clbench.metrics import SUMMARIES, MetricSpec, primary

# how each summary ranks: +1 best = highest, -1 best = lowest, for a higher-is-better metric
DIRECTION = {"avg_inc": 1, "last": 1, "forgetting": -1, "bwt": 1}
# summaries whose direction does not follow the metric's: forgetting is the amount lost whatever the metric
ABSOLUTE = ("forgetting",)


def _best(rows: pd.DataFrame, column: str, sign: int) -> pd.DataFrame:
    """The rows with the best value of ``column`` (ties kept), best = highest for ``sign`` +1."""
    values = pd.to_numeric(rows[column], errors="coerce")
    if values.notna().sum() == 0:
        return rows.iloc[:0]
    best = values.max() if sign > 0 else values.min()
    return rows[np.isclose(values, best, rtol=0, atol=1e-9)]


def _flagged(row: pd.Series) -> str:
    """`` [flags]`` after a number whose row is flagged (:mod:`clbench.adequacy`), else ``""``."""
    return f" [{markdown_text(row['flags'])}]" if isinstance(row.get("flags"), str) and row["flags"] else ""


def _scenario_section(scenario: str, rows: pd.DataFrame, spec: MetricSpec) -> list[str]:
    col = {summary: spec.column(summary) for summary in SUMMARIES}
    sign = 1 if spec.higher_is_better else -1
    offline = rows[rows[col["avg_inc"]].isna() & rows[col["last"]].notna()]
    continual = rows[rows[col["avg_inc"]].notna()]
    unit = f" ({spec.unit})" if spec.unit else ""
    d = leaderboard.score_decimals(spec.unit)
    _pm = functools.partial(leaderboard.mean_pm, decimals=d)          # (row, column) -> "mean ± std"
    lines = [f"### {markdown_text(scenario)}", "", f"Primary metric: {markdown_code(spec.name)}{markdown_text(unit)}; "
             f"{len(continual)} continual "
             f"strategies, {len(offline)} offline (joint) row(s).", ""]
    for summary in SUMMARIES:
        pool = rows if summary == "last" else continual
        direction = DIRECTION[summary] * (1 if summary in ABSOLUTE else sign)
        best = _best(pool, col[summary], direction)
        if len(best):
            names = ", ".join(f"{markdown_code(r['strategy'])}{_flagged(r)}" for _, r in best.iterrows())
            lines.append(f"- best {markdown_code(col[summary])} ({'lowest' if direction < 0 else 'highest'}): "
                         f"{names} with {_pm(best.iloc[0], col[summary])}")
    joint = _best(offline, col["last"], sign)
    if len(joint):
        upper = joint.iloc[0]
        lines.append(f"- joint upper bound: {markdown_code(upper['strategy'])}, {markdown_code(col['last'])} "
                     f"{_pm(upper, col['last'])}"
                     f"{_flagged(upper)}")
    else:
        lines.append("- no offline (joint) row in this suite: no upper bound to compare with")
    if not len(continual):
        return [*lines, ""]
    forgetting = pd.to_numeric(continual[col["forgetting"]], errors="coerce")
    forget_rank = forgetting.rank(method="min")            # NaN where undefined (a single experience)
    shown = forgetting.notna().any()
    flags = leaderboard.flagged(continual)
    header = ["rank", "strategy", "seeds", col["avg_inc"], col["last"],
              *([f"gap to joint ({col['last']})"] if len(joint) else []),
              *([col["forgetting"], "forgetting rank"] if shown else []), *(["flags"] if flags else [])]
    lines += ["", "| " + " | ".join(map(markdown_text, header)) + " |", "|" + "---|" * len(header)]
    for k, (index, row) in enumerate(continual.iterrows(), start=1):      # leaderboard order: best avg_inc first
        gap = [] if not len(joint) else \
            ["–" if pd.isna(row[col["last"]]) else f"{sign * (upper[col['last']] - row[col['last']]):.{d}f}"]
        forget = [_pm(row, col["forgetting"]), "–" if pd.isna(forget_rank[index]) else f"{forget_rank[index]:.0f}"]
        cells = [str(k), markdown_code(row["strategy"], cell=True), str(row["n_seeds"]), _pm(row, col["avg_inc"]),
                 _pm(row, col["last"]), *gap, *(forget if shown else []), *([markdown_text(row["flags"])] if flags
                                                                           else [])]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    gap_note = [f"Gap to joint: {markdown_code(col['last'])} of {markdown_code(upper['strategy'])} minus the "
                "strategy's (positive: below the upper bound)."] if len(joint) else []
    notes = gap_note + (["Forgetting rank 1 = least forgetting."] if shown else
                        ["Forgetting is undefined here (a single experience)."]
                        ) + (["Flags: see the legend under the leaderboard."] if flags else [])
    lines += [" ".join(notes), ""]
    return lines


def _plots_section(plots: Sequence[Path], out_dir: Path, scenarios: list[str]) -> list[str]:
    """Each scenario's curves inline, its heatmaps and parameter curve as links (file names start with the
    scenario's safe name, see :func:`clbench.report.figures`)."""
    lines = ["## Plots", ""]
    names = sorted(p.relative_to(out_dir).as_posix() for p in plots)
    for scenario in scenarios:
        prefix = f"plots/{report._safe(scenario)}__"
        mine = [n for n in names if n.startswith(prefix)]
        curves = [n for n in mine if not n.endswith("__matrix.png") and not n.endswith("__params.png")]
        lines += [f"### {markdown_text(scenario)}", ""] + [f"![{Path(n).stem}]({n})" for n in curves] + [""]
        matrices = [n for n in mine if n.endswith("__matrix.png")]
        if matrices:
            links = ", ".join(f"[{_matrix_label(n, scenario)}]({n})" for n in matrices)
            lines += [f"Score matrices R[i, j] (mean over seeds): {links}", ""]
        lines += [f"Parameters per step: [plot]({n})" for n in mine if n.endswith("__params.png")] + [""]
    return lines


def _curves_section(records: list[dict], out_dir: Path) -> list[str]:
    """A link to each run's training curve (:data:`clbench.artifacts.CURVE_FILE`, drawn when the run ended)."""
    curves = sorted(f"artifacts/{r['run_id']}/{CURVE_FILE}" for r in records
                    if (out_dir / "artifacts" / r["run_id"] / CURVE_FILE).exists())
    if not curves:
        return []
    return ["## Training curves", "", "Loss and learning rate per epoch of each run (the numbers: "
            "`training_log.jsonl` beside each plot):", ""] + [f"- [{Path(c).parent.name}]({c})" for c in curves] + [""]


def _matrix_label(name: str, scenario: str) -> str:
    """``plots/<scenario>__<strategy>__<metric>__matrix.png`` -> ``<strategy> · <metric>``."""
    stem = Path(name).stem.removeprefix(f"{report._safe(scenario)}__").removesuffix("__matrix")
    return stem.replace("__", " · ")


def provenance(records: list[dict]) -> list[tuple[str, str]]:
    """``(what, values)`` of the records' machine and code, each value deduplicated and sorted (``unknown`` where a
    record lacks it): machine, CPU (model and torch's kernel set), device and python, packages, git commits, code
    fingerprints."""
    envs = [r.get("env") or {} for r in records]
    packages = sorted({f"{k} {v}" for e in envs for k, v in (e.get("packages") or {}).items() if v})
    commits = sorted({(e.get("git_commit") or "unknown")[:10] for e in envs})
    fingerprints = sorted({r.get("code_fingerprint") or "unknown" for r in records})
    cpus = sorted({f"{e['cpu_model']} (torch CPU kernels: {e.get('cpu_capability') or 'unknown'})"
                   if e.get("cpu_model") else "not recorded" for e in envs})
    return [("machine", "; ".join(sorted({e.get("machine", "unknown") for e in envs}))),
            ("CPU", "; ".join(cpus)),
            ("device", f"{', '.join(sorted({e.get('device', 'unknown') for e in envs}))}; python "
                       f"{', '.join(sorted({e.get('python', '?') for e in envs}))}"),
            ("packages", ", ".join(packages) or "unknown"),
            ("git commit(s) of the runs", ", ".join(commits)),
            (f"code fingerprints ({len(fingerprints)})", f"{', '.join(fingerprints)} (per row in leaderboard.csv)")]


def _provenance(records: list[dict]) -> list[str]:
    return ["## Machine and code", "", *(f"- {what}: {markdown_text(value)}" for what, value in provenance(records)),
            ""]


def render(records: list[dict], plots: Sequence[Path], out_dir: str | Path) -> str:
    """The markdown of ``report.md`` for ``records`` and the ``plots`` written under ``out_dir``."""
    out_dir = Path(out_dir)
    table = leaderboard.build(records, out_dir)
    finished = [r for r in records if r["status"] == "finished"]
    suites = sorted({r["spec"]["suite"] for r in records})
    times = sorted(t for r in records for t in (r.get("started"), r.get("finished")) if t)
    train_s = sum(r["metrics"].get("train_s") or 0 for r in finished)
    scenarios = list(dict.fromkeys(table["scenario"])) if len(table) else []
    lines = [f"# Report: {markdown_text(', '.join(suites)) or 'no runs'}", "",
             f"Built from the {len(records)} run records in {markdown_code(f'{out_dir.as_posix()}/runs/')} only "
             f"({len(finished)} finished, {len(records) - len(finished)} failed): {len(scenarios)} scenario(s), "
             f"{table['strategy'].nunique() if len(table) else 0} strategy row(s), seeds "
             f"{', '.join(str(s) for s in sorted({r['seed'] for r in records}))}."
             + (f" Runs from {times[0]} to {times[-1]}; {train_s / 60:.1f} min of training in total." if times else ""),
             "", "## Summary per scenario", ""]
    for scenario in scenarios:
        rows = table[table["scenario"] == scenario]
        first = next(r for r, (sc, _) in zip(records, leaderboard.row_labels(records)) if sc == scenario)
        lines += _scenario_section(scenario, rows, primary(leaderboard.metric_specs(first)))
    lines += _plots_section(plots, out_dir, scenarios)
    lines += _curves_section(records, out_dir)
    lines += ["## Leaderboard", "", leaderboard.to_markdown(table).rstrip(), ""]
    failed = [r for r in records if r["status"] != "finished"]
    if failed:
        lines += ["## Failed runs", ""] + [f"- {markdown_code(r['run_id'])}: "
                                           f"{markdown_text(r.get('reason') or 'no reason recorded')}"
                                           for r in failed] + [""]
    lines += _provenance(records)
    return "\n".join(lines)


def write(out_dir: str | Path, records: list[dict] | None = None, plots: Sequence[Path] | None = None) -> Path:
    """Write ``<out_dir>/report.md`` from ``records`` (default: the folder's records) and ``plots`` (default: drawn
    now with :func:`clbench.report.plot`); returns its path."""
    out_dir = Path(out_dir)
    if records is None:
        records, _ = record_files.load_dir(out_dir)
    if plots is None:
        plots = report.plot(records, out_dir)
    return files.write_atomic(out_dir / "report.md", render(records, plots, out_dir))
