"""``report.html``: one self-contained page per suite output folder, built from its run records only; it needs no
server and no network (styles, the sorting script and every image are inside the file).

Sections, in order:

1. what was run: suites, runs finished and failed, seeds, when;
2. per scenario, the leaderboard of its primary metric (:func:`clbench.leaderboard.build`: one row per run identity,
   mean ± sample std over the row's ``n`` finished seeds, the adequacy ``flags`` where the table has them). A click
   on a column header sorts the rows (best first on a score's first click); a click on a row's ``▸`` shows what is
   behind its numbers: preset and overrides, the value of every seed, the paired difference to the scenario's top
   continual row (the first with an ``avg_inc``) with its 95% Student-t interval
   (:class:`clbench.analysis.paired.Paired`, over the seeds both rows finished with a value) and the row's
   score-matrix heatmaps;
3. per scenario, the score-vs-step curves and the parameters per step (:func:`clbench.report.figures`, PNG
   embedded as base64);
4. the claims of the seed papers that name this suite, from the ``REFERENCE.md`` of the folder or of a folder above
   it (up to two levels: ``results/reference/<suite>`` finds ``results/REFERENCE.md``), when there is one;
5. failed runs with their reasons;
6. machine and code version (:func:`clbench.suite_report.provenance`).
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from clbench import files, leaderboard, report, suite_report
from clbench import records as record_files
from clbench.analysis.paired import Paired
from clbench.metrics import SUMMARIES, MetricSpec, primary

PAGE = "report.html"
CLAIMS_HEADING = "## Claims of the seed papers"
COSTS = {"params_M": ("params (M)", "{:.3f}", "total parameters after the last step, in millions"),
         "train_s": ("train (s)", "{:.1f}", "training time of one run, seconds"),
         "peak_mem_MB": ("peak mem (MB)", "{:.1f}", "peak memory of one run above its start, MB")}
SUMMARY_HELP = {
    "avg_inc": "average incremental score: the mean over steps i of A_i, the score on the test data of every "
               "experience seen up to step i",
    "last": "score on all test data after the last step (A of the last step)",
    "forgetting": "mean over the earlier experiences of (best score before the last step - score after it); "
                  "lower is better",
    "bwt": "backward transfer: mean over the earlier experiences of (score after the last step - score just after "
           "training on it); negative = forgotten",
}
EXTRA_HELP = {"epsilon": "privacy budget spent (lower = more private)",
              "trainable_pct": "trainable parameters in % of the backbone",
              "route_acc": "accuracy of routing a test sample to its task's module set (%)"}


# ------------------------------------------------------------------------------------------------------ helpers
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _png(fig: Figure) -> str:
    """``data:`` URI of the figure as PNG (closed afterwards)."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    finally:
        plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _img(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{_e(alt)}" loading="eager">'


def _number(value: object, fmt: str) -> str:
    return "–" if value is None or pd.isna(value) else fmt.format(value)


def _when(stamp: str) -> str:
    """An ISO time stamp as ``2026-11-26 04:43 UTC``."""
    return datetime.fromisoformat(stamp).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _inline(text: str) -> str:
    """A markdown table cell as HTML: escaped, with ``code`` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


# ------------------------------------------------------------------------------------------------------ records
def _rows_of(records: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """Records by leaderboard row (suite, scenario label, strategy label), as :func:`clbench.leaderboard.build`
    groups them."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r, (scenario, strategy) in zip(records, leaderboard.row_labels(records)):
        groups[(r["spec"]["suite"], scenario, strategy)].append(r)
    return groups


def _paired(runs: list[dict], top: list[dict], column: str, scenario: str, a: str, b: str) -> Paired | None:
    """``column`` of this row minus the top row's, over the seeds both finished (None without such a seed)."""
    def values(rs: list[dict]) -> dict[int, float]:
        return {r["seed"]: float(r["metrics"][column]) for r in rs
                if r["status"] == "finished" and r["metrics"].get(column) is not None}

    mine, theirs = values(runs), values(top)
    seeds = sorted(set(mine) & set(theirs))
    if not seeds:
        return None
    return Paired(scenario, a, b, column, tuple(seeds), tuple(mine[s] - theirs[s] for s in seeds),
                  tuple(theirs[s] for s in seeds))


# -------------------------------------------------------------------------------------------------- leaderboard
class Column(NamedTuple):
    """A column of a scenario's table: the leaderboard column ``key``, its header, number format and meaning, and
    whether higher is better (None for a cost, which shows no std and takes no paired difference)."""

    key: str
    header: str
    fmt: str
    help: str
    higher_is_better: bool | None
    summary: bool = False           # one of the primary metric's summaries (paired in a row's detail)


def _columns(rows: pd.DataFrame, spec: MetricSpec) -> list[Column]:
    """The primary metric's summaries, the extras and the costs that some row of ``rows`` has."""
    decimals = leaderboard.score_decimals(spec.unit)
    unit = f" ({spec.unit})" if spec.unit else ""
    present = lambda key: key in rows and rows[key].notna().any()  # noqa: E731
    out = [Column(spec.column(summary), spec.column(summary), f"{{:.{decimals}f}}", f"{SUMMARY_HELP[summary]}{unit}",
                  spec.higher_is_better if summary != "forgetting" else False, summary=True)
           for summary in SUMMARIES if present(spec.column(summary))]
    out += [Column(key, key, "{:.2f}", help_text, key != "epsilon") for key, help_text in EXTRA_HELP.items()
            if present(key)]
    return out + [Column(key, header, fmt, help_text, None) for key, (header, fmt, help_text) in COSTS.items()
                  if present(key)]


def _cell(row: pd.Series, column: Column) -> str:
    """Mean ± std (the mean alone for a cost or one seed), the mean as the sort key."""
    value = row.get(column.key)
    if value is None or pd.isna(value):
        return '<td data-v="">–</td>'
    std = row.get(f"{column.key}_std") if column.higher_is_better is not None else None
    spread = "" if std is None or pd.isna(std) else f' <span class="pm">± {column.fmt.format(std)}</span>'
    return f'<td data-v="{float(value):.10g}">{column.fmt.format(value)}{spread}</td>'


def _seeds_table(runs: list[dict], columns: list[Column]) -> str:
    head = "".join(f"<th>{_e(c.header)}</th>" for c in columns)
    lines = [f"<table class='seeds'><tr><th>seed</th><th>status</th>{head}</tr>"]
    for r in sorted(runs, key=lambda r: r["seed"]):
        metrics = r.get("metrics") or {}
        extra = metrics.get("extra") or {}
        cells = "".join(f"<td>{_number(metrics.get(c.key, extra.get(c.key)), c.fmt)}</td>" for c in columns)
        status = r["status"] if r["status"] == "finished" else f"{r['status']}: {r.get('reason') or '?'}"
        lines.append(f"<tr><td>{r['seed']}</td><td>{_e(status)}</td>{cells}</tr>")
    return "".join(lines) + "</table>"


def _paired_text(pair: Paired, column: Column, top: str) -> str:
    fmt, seeds = column.fmt, ", ".join(str(s) for s in pair.seeds)
    if np.isnan(pair.half_width):
        interval = f"{fmt.format(pair.mean)} (one common seed, {seeds}: no interval)"
    else:
        low, high = pair.mean - pair.half_width, pair.mean + pair.half_width
        better = "better" if (low > 0) == column.higher_is_better else "worse"
        where = f"excludes 0: this row {better}" if low > 0 or high < 0 else "includes 0: no difference shown"
        interval = (f"{fmt.format(pair.mean)} ± {fmt.format(pair.half_width)} (95% interval {where}; "
                    f"seeds {seeds})")
    return f"<li><code>{_e(column.key)}</code> this row − <code>{_e(top)}</code>: {interval}</li>"


def _detail(row: pd.Series, runs: list[dict], top: tuple[str, list[dict]], columns: list[Column], scenario: str,
            images: dict[str, str]) -> str:
    """What is behind a row's numbers: preset and overrides, every seed, the paired differences to the top
    continual row ``top`` (label, records), the row's heatmaps."""
    strategy = row["strategy"]
    parts = [f"<p><b>preset</b> {_e(row['preset'])} · <b>overrides</b> {_e(row['overrides'])}"
             f"{' · <b>machine</b> ' + _e(row['machine']) if row.get('machine') else ''}</p>",
             "<h4>Every seed</h4>", _seeds_table(runs, columns)]
    if top[0] == strategy:
        parts.append("<p>This is the scenario's top continual row: the other rows' paired differences are taken "
                     "to it.</p>")
    else:
        pairs = [(c, pair) for c in columns if c.summary and (pair := _paired(runs, top[1], c.key, scenario,
                                                                                   strategy, top[0]))]
        items = "".join(_paired_text(pair, c, top[0]) for c, pair in pairs)
        parts.append(f"<h4>Paired difference to the top continual row, <code>{_e(top[0])}</code> (mean over the "
                     f"seeds both rows finished of the per-seed difference, 95% Student-t interval)</h4>"
                     + (f"<ul>{items}</ul>" if pairs else "<p>No seed with a value in common.</p>"))
    mine = {f"{report._safe(scenario)}__{report._safe(strategy)}__{report._safe(metric)}__matrix.png"
            for r in runs if r["status"] == "finished" for metric in report.scores(r)}
    heatmaps = [_img(uri, name) for name, uri in images.items() if name in mine]
    if heatmaps:
        parts += ["<h4>Score matrix R[i, j] (mean over seeds)</h4>", *heatmaps]
    return "".join(parts)


def _board(scenario: str, rows: pd.DataFrame, groups: dict, spec: MetricSpec, images: dict[str, str],
           k: int) -> str:
    """The ``k``-th scenario's sortable table: one ``<tbody>`` per leaderboard row (its line and its hidden detail,
    so that sorting moves both), each cell's sort key in ``data-v``."""
    columns = _columns(rows, spec)
    flags = "flags" in rows and rows["flags"].fillna("").astype(str).str.len().gt(0).any()
    header = ['<th data-col="0" data-first="ascending" title="rank in the leaderboard">#</th>',
              '<th data-col="1" data-first="ascending">strategy</th>']
    if flags:
        header.append(f'<th data-col="{len(header)}" data-first="descending" '
                      'title="training adequacy: the row did not learn, or had not converged">flags</th>')
    header.append(f'<th data-col="{len(header)}" data-first="descending" '
                  'title="finished seeds averaged (failed runs in brackets)">n</th>')
    for c in columns:
        first = "ascending" if c.higher_is_better is False else "descending"
        header.append(f'<th data-col="{len(header)}" data-first="{first}" title="{_e(c.help)}">{_e(c.header)}</th>')
    width = len(header)
    records = [r for key, rs in groups.items() if key[1] == scenario for r in rs]
    continual = rows[rows[spec.column("avg_inc")].notna()] if spec.column("avg_inc") in rows else rows
    top_row = (continual if len(continual) else rows).iloc[0]
    top = (top_row["strategy"], groups[(top_row["suite"], scenario, top_row["strategy"])])
    bodies = []
    for rank, (_, row) in enumerate(rows.iterrows(), start=1):
        runs = groups[(row["suite"], scenario, row["strategy"])]
        n = f"{row['n_seeds']}" + (f" ({row['n_failed']} failed)" if row["n_failed"] else "")
        offline = pd.isna(row.get(spec.column("avg_inc"))) and not pd.isna(row.get(spec.column("last")))
        tag = (' <span class="tag" title="trained on all experiences at once and evaluated once: the upper bound '
               'of the continual rows, not one of them">offline</span>') if offline else ""
        cells = [f'<td data-v="{rank}">{rank}</td>',
                 f'<td data-v="{_e(row["strategy"])}"><button class="open" aria-expanded="false" '
                 f'title="per-seed values, paired interval, score matrix">▸</button> {_e(row["strategy"])}{tag}</td>']
        if flags:
            text = "" if pd.isna(row.get("flags")) else str(row.get("flags"))
            cells.append(f'<td data-v="{_e(text)}" class="flag">{_e(text)}</td>')
        one = ' class="n1" title="one seed: no spread to show"' if row["n_seeds"] == 1 else ""
        cells.append(f'<td data-v="{row["n_seeds"]}"{one}>{_e(n)}</td>')
        cells += [_cell(row, c) for c in columns]
        detail = _detail(row, runs, top, columns, scenario, images)
        bodies.append(f'<tbody><tr class="main">{"".join(cells)}</tr>'
                      f'<tr class="detail" hidden><td colspan="{width}">{detail}</td></tr></tbody>')
    seeds = sorted({r["seed"] for r in records})
    ranked = spec.column("avg_inc")
    return (f'<h3>{_e(scenario)}</h3><p class="note">Primary metric <code>{_e(spec.name)}</code>'
            f'{" (" + _e(spec.unit) + ")" if spec.unit else ""}; {len(rows)} rows ranked by <code>{_e(ranked)}</code> '
            f'(<code>{_e(spec.column("last"))}</code> where it is undefined), best first; seeds '
            f'{", ".join(map(str, seeds))}. Scores: mean ± sample std over the row\'s n seeds; a row of '
            f'<span class="n1">one seed</span> has no ± part. Click a header to sort, ▸ to see a row\'s seeds, its '
            f'paired interval to the top continual row and its score matrix.</p>'
            f'<table class="board" id="board{k}"><thead><tr>{"".join(header)}</tr></thead>{"".join(bodies)}</table>'
            + _glossary(columns, opened=k == 0))


def _glossary(columns: list[Column], opened: bool) -> str:
    """The columns' meanings, open under the page's first table only."""
    items = "".join(f"<dt>{_e(c.header)}</dt><dd>{_e(c.help)}</dd>" for c in columns)
    return (f'<details class="glossary"{" open" if opened else ""}><summary>What the columns mean</summary>'
            f'<dl>{items}</dl></details>')


# ------------------------------------------------------------------------------------------------------ claims
def claims(out_dir: Path, suites: list[str]) -> tuple[list[str], list[list[str]]] | None:
    """``(header, rows)`` of the claims table of the nearest ``REFERENCE.md`` (the folder, its parent or
    grandparent) whose "suite rows" cell names one of ``suites``; None when there is no such table or row."""
    for folder in (out_dir, *list(out_dir.resolve().parents)[:2]):
        path = folder / "REFERENCE.md"
        if path.exists() and CLAIMS_HEADING in (text := path.read_text()):
            lines = [line for line in text.split(CLAIMS_HEADING, 1)[1].split("\n## ", 1)[0].splitlines()
                     if line.startswith("|")]
            if len(lines) < 3:
                return None
            split = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
            header, rows = split(lines[0]), [split(line) for line in lines[2:]]
            where = header.index("suite rows") if "suite rows" in header else None
            pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, suites)) + r")(?![\w-])")
            mine = [r for r in rows if where is not None and where < len(r) and pattern.search(r[where])]
            return (header, mine) if mine else None
    return None


def _claims_section(table: tuple[list[str], list[list[str]]] | None) -> str:
    if table is None:
        return ""
    header, rows = table
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<h2>Claims of the seed papers</h2><p class='note'>From REFERENCE.md: the rows naming this suite."
            f"</p><table class='claims'><tr>{head}</tr>{body}</table>")


# ---------------------------------------------------------------------------------------------------------- page
STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1200px;color:#222;
padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
.note{color:#555}code{background:#f3f3f3;padding:0 .25em;border-radius:3px}
table{border-collapse:collapse;margin:.5em 0}th,td{padding:.3em .6em;border-bottom:1px solid #e4e4e4;
text-align:right;vertical-align:top}th{background:#f7f7f7;position:sticky;top:0}
table.board th[data-col]{cursor:pointer;user-select:none}table.board th[data-col]:hover{background:#e8eefc}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
table.board td:nth-child(2),table.board th:nth-child(2){text-align:left}
table.board tbody:nth-of-type(odd) tr.main{background:#fbfbfb}
.pm{color:#666;font-size:.9em}.tag{font-size:.75em;color:#fff;background:#888;border-radius:3px;
padding:0 .35em;margin-left:.3em}.n1{color:#a60;font-weight:600}.flag{color:#b00;text-align:left}
button.open{border:0;background:none;cursor:pointer;font-size:1em;padding:0 .2em}
tr.detail td{text-align:left;background:#f6f8fc}table.seeds{font-size:.92em}
img{max-width:100%;margin:.3em .6em .3em 0;vertical-align:top}
table.claims td,table.claims th{text-align:left;font-size:.92em}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dt{font-family:monospace}dd{margin:0}
"""

SCRIPT = """
document.querySelectorAll("table.board").forEach(function (table) {
  function key(body, col) {
    var v = body.rows[0].cells[col].getAttribute("data-v");
    if (v === null || v === "") return null;
    var n = Number(v);
    return isNaN(n) ? v : n;
  }
  table.querySelectorAll("th[data-col]").forEach(function (th) {
    th.addEventListener("click", function () {
      var col = Number(th.getAttribute("data-col"));
      var current = th.getAttribute("aria-sort");
      var dir = current ? (current === "ascending" ? "descending" : "ascending") : th.getAttribute("data-first");
      table.querySelectorAll("th[data-col]").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", dir);
      var bodies = Array.prototype.slice.call(table.tBodies);
      bodies.sort(function (a, b) {
        var x = key(a, col), y = key(b, col);
        if (x === null || y === null) return (x === null) - (y === null);       // empty cells last
        var c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return dir === "ascending" ? c : -c;
      });
      bodies.forEach(function (body) { table.appendChild(body); });
    });
  });
  table.querySelectorAll("button.open").forEach(function (button) {
    button.addEventListener("click", function () {
      var detail = button.closest("tbody").rows[1];
      detail.hidden = !detail.hidden;
      button.setAttribute("aria-expanded", String(!detail.hidden));
      button.textContent = detail.hidden ? "▸" : "▾";
    });
  });
});
"""


def _figures(records: list[dict]) -> dict[str, str]:
    """Every plot of :func:`clbench.report.figures` as a ``data:`` URI, by file name."""
    return {name: _png(fig) for name, fig in report.figures(records)}


def _plots_section(scenarios: list[str], images: dict[str, str]) -> str:
    parts = ["<h2>Curves</h2><p class='note'>Score on the test data of the experiences seen so far after each "
             "training step (line: mean over seeds, band: ± 1 std), and parameters per step where they change. "
             "Score matrices are under each row's ▸ above.</p>"]
    for scenario in scenarios:
        prefix = f"{report._safe(scenario)}__"
        mine = [(n, uri) for n, uri in images.items() if n.startswith(prefix) and not n.endswith("__matrix.png")]
        parts += [f"<h3>{_e(scenario)}</h3>", *(_img(uri, name) for name, uri in mine)]
    return "".join(parts)


def render(records: list[dict], out_dir: str | Path) -> str:
    """The page for ``records`` (those of ``out_dir``, whose REFERENCE.md is looked for)."""
    out_dir = Path(out_dir)
    records = leaderboard.unique_runs(records)
    table = leaderboard.build(records, out_dir)
    groups = _rows_of(records)
    images = _figures(records)
    suites = sorted({r["spec"]["suite"] for r in records})
    finished = [r for r in records if r["status"] == "finished"]
    times = sorted(t for r in records for t in (r.get("started"), r.get("finished")) if t)
    title = ", ".join(suites) or "no runs"
    body = [f"<h1>clbench · {_e(title)}</h1>",
            f"<p class='note'>{len(records)} runs ({len(finished)} finished, {len(records) - len(finished)} failed), "
            f"seeds {', '.join(str(s) for s in sorted({r['seed'] for r in records}))}"
            + (f", run from {_e(_when(times[0]))} to {_e(_when(times[-1]))}" if times else "")
            + f". Built from the records in <code>{_e(out_dir.as_posix())}/runs/</code> on "
              f"{_when(datetime.now(UTC).isoformat())}.</p>",
            "<h2>Leaderboard</h2>"]
    scenarios = list(dict.fromkeys(table["scenario"])) if len(table) else []
    for k, scenario in enumerate(scenarios):
        rows = table[table["scenario"] == scenario].reset_index(drop=True)
        first = next(rs[0] for key, rs in groups.items() if key[1] == scenario)
        body.append(_board(scenario, rows, groups, primary(leaderboard.metric_specs(first)), images, k))
    if not scenarios:
        body.append("<p>No run records.</p>")
    body.append(_plots_section(scenarios, images))
    body.append(_claims_section(claims(out_dir, suites) if suites else None))
    failed = [r for r in records if r["status"] != "finished"]
    if failed:
        body.append("<h2>Failed runs</h2><ul>" + "".join(
            f"<li><code>{_e(r['run_id'])}</code>: {_e(r.get('reason') or 'no reason recorded')}</li>"
            for r in failed) + "</ul>")
    body.append("<h2>Machine and code</h2><ul>" + "".join(
        f"<li><b>{_e(what)}</b>: {_e(value)}</li>" for what, value in suite_report.provenance(records)) + "</ul>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>clbench · {_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
            f'<body>{"".join(body)}<script>{SCRIPT}</script></body></html>\n')


def write_html(results_dir: str | Path) -> Path:
    """Write ``<results_dir>/report.html`` from the folder's run records (:func:`clbench.records.load_dir`; a file
    that is not a record is left out, as for ``report.md``); returns its path."""
    results_dir = Path(results_dir)
    records, _ = record_files.load_dir(results_dir)
    return files.write_atomic(results_dir / PAGE, render(records, results_dir))


__all__ = ["PAGE", "claims", "render", "write_html"]
