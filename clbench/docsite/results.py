"""The results pages, generated from the committed records under ``results/reference/<suite>/``: per suite the
suite file's description (its setting and how its budget was chosen), the command that makes the records, the
machine and packages they were made with, the leaderboard, the comparisons ``results/REFERENCE.md`` declares for the
suite (paired differences, per-step learning, removals: :mod:`clbench.analysis.reference_tables` renders them), the
validation curves behind the budget and the suite-level plots. Plus the claims page (``results/claims.md``).

Nothing here is typed by hand: a page changes when its records do."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from clbench.analysis.reference_tables import BLOCK, REFERENCE, render
from clbench.docsite.text import prose
from clbench.suite_file import shipped_suites

RESULTS = REFERENCE.parent
RECORDS = RESULTS / "reference"
CLAIMS = RESULTS / "claims.md"
FOLDER = "results"
TITLES = {"paired": "Paired differences", "diag": "Learning of each step", "removals": "Removals"}


def suites(root: Path = RECORDS) -> list[str]:
    """The suites with committed records."""
    return sorted(p.name for p in root.iterdir() if (p / "runs").is_dir())


def declared_tables(suite: str, reference: Path = REFERENCE) -> list[dict[str, str]]:
    """The tables of :data:`TITLES` that ``results/REFERENCE.md`` declares for ``suite`` (its leaderboard comes
    first on every page)."""
    options = [dict(item.split("=", 1) for item in m.group("options").split())
               for m in BLOCK.finditer(reference.read_text())] if reference.exists() else []
    return [o for o in options if o.get("suite") == suite and o.get("table") in TITLES]


def suite_plots(suite: str, root: Path = RECORDS) -> list[Path]:
    """The suite-level plots: one per scenario and metric (``<scenario>__<metric>.png``), not the per-row ones."""
    return sorted(p for p in (root / suite / "plots").glob("*.png") if p.stem.count("__") == 1)


def _environment(root: Path, suite: str) -> list[str]:
    """The machines and package versions the suite's records were made with."""
    machines, packages = set(), set()
    for path in sorted((root / suite / "runs").glob("*.json")):
        env = json.loads(path.read_text()).get("env", {})
        kernels = env.get("cpu_capability") or "not recorded"
        machines.add(f"{env.get('machine', 'unknown machine')}, torch CPU kernels: {kernels}")
        packages.add(", ".join(f"{k} {v}" for k, v in sorted(env.get("packages", {}).items()) if k != "clbench"))
    return [f"- {m}" for m in sorted(machines)] + [f"- {p}" for p in sorted(packages) if p]


def _curves(root: Path, suite: str) -> list[str]:
    lines = []
    for path in sorted((root / suite / "budget_curves").glob("*.txt")) if (root / suite / "budget_curves").is_dir() \
            else []:
        body = "\n".join("        " + line for line in path.read_text().rstrip().splitlines())
        lines += [f'??? note "Validation curve: {path.name}"', "", "    ```text", body, "    ```", ""]
    return lines


def suite_page(suite: str, root: Path = RECORDS, reference: Path = REFERENCE) -> str:
    shipped = shipped_suites().get(suite)
    description = prose(" ".join(str(yaml.safe_load(shipped.read_text()).get("description", "")).split())) if shipped \
        else "Records of a suite that is not shipped as a file (its rows are described by the records themselves)."
    parts = [f"# {suite}", "", description, "",
             "Make the same records (finished runs with the same identity and code are skipped, so this resumes):",
             "", "```bash", f"clbench --suite {suite} --out results/{suite}", "```", "",
             "Made on:", "", *_environment(root, suite), "", "## Leaderboard", "",
             render({"suite": suite, "table": "leaderboard"}, root).strip(), ""]
    for options in declared_tables(suite, reference):
        metric = options.get("metric", "last_acc" if options["table"] == "paired" else "")
        parts += [f"## {TITLES[options['table']]}" + (f" ({metric})" if metric else ""), "",
                  render(options, root).strip(), ""]
    curves = _curves(root, suite)
    if curves:
        parts += ["## How the budget was chosen", "", "Validation curves (`benchmarks/budget_curve.py`, scored on "
                  "a held-out part of the training data, never the test data):", "", *curves]
    plots = suite_plots(suite, root)
    if plots:
        parts += ["## Plots", ""] + [f"![{p.stem}](plots/{suite}/{p.name})" + "\n" for p in plots]
    return "\n".join(parts)


def index_page(names: list[str]) -> str:
    rows = []
    for suite in names:
        shipped = shipped_suites().get(suite)
        text = " ".join(str(yaml.safe_load(shipped.read_text()).get("description", "")).split()) if shipped else ""
        rows.append(f"| [{suite}]({suite}.md) | {text.split('. ')[0].replace('|', '/')} |")
    return "\n".join(["# Reference results", "", "Every suite whose records are committed under "
                      "`results/reference/<suite>/runs/`; each page is generated from those records when the site "
                      "is built. [The claims of the seed papers](claims.md) reads them against the papers' own "
                      "numbers.", "", "| suite | setting |", "|---|---|", *rows, ""])


def claims_page() -> str:
    if CLAIMS.exists():
        return CLAIMS.read_text()
    text = REFERENCE.read_text()
    return "# Claims of the seed papers\n" + text.split("## Claims of the seed papers", 1)[1].split("\n## ", 1)[0]


def pages() -> dict[str, str]:
    names = suites()
    return {f"{FOLDER}/index.md": index_page(names), f"{FOLDER}/claims.md": claims_page(),
            **{f"{FOLDER}/{suite}.md": suite_page(suite) for suite in names}}


def files() -> dict[str, Path]:
    """The images the pages show: ``{path in the site: committed file}``."""
    return {f"{FOLDER}/plots/{suite}/{p.name}": p for suite in suites() for p in suite_plots(suite)}
