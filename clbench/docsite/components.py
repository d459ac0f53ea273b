"""The reference of everything else a suite names: scenarios (with their arguments), callbacks, models, shipped
suites, and the metrics with the training-adequacy flags. Read from the registered objects and the suite files."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import yaml

from clbench import adequacy
from clbench.docsite.text import cell, docstring
from clbench.metrics import SUMMARIES, MetricSpec
from clbench.registry import CALLBACKS, MODELS, SCENARIOS, Registry
from clbench.suite_file import shipped_suites
from clbench.typecheck import parameter_declarations, type_hints, type_name


def _parameters(func: Any) -> list[str]:
    """A table of ``func``'s keyword arguments (a scenario factory, a callback's ``__init__``)."""
    target = func.__init__ if isinstance(func, type) else func
    hints, declared = type_hints(target), parameter_declarations(func)
    rows = ["| argument | type | default | allowed |", "|---|---|---|---|"]
    for p in inspect.signature(target).parameters.values():
        if p.name in ("self", "seed", "data_root") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        default = "" if p.default is inspect.Parameter.empty else cell(p.default)
        allowed = declared.get(p.name)
        text = ""
        if allowed is not None:
            text = ("one of " + ", ".join(cell(c) for c in allowed.allowed())) if allowed.choices is not None \
                else str(allowed.range_for(p.name)[0])
        kind = cell(type_name(hints[p.name])) if p.name in hints else ""
        rows.append(f"| `{p.name}` | {kind} | {default} | {text} |")
    return rows if len(rows) > 2 else []


def _registry_page(title: str, intro: str, registry: Registry, with_arguments: bool) -> str:
    parts = [f"# {title}", "", intro, ""]
    modules_seen: set[str] = set()
    for name in registry.names():
        module = registry.module_of(name)
        if not module.startswith("clbench."):
            continue
        obj = registry.get(name)
        parts += [f"## `{name}`", ""]
        if with_arguments and module not in modules_seen and docstring(importlib.import_module(module)):
            parts += [f"Module `{module}`: {docstring(importlib.import_module(module))}", ""]
        modules_seen.add(module)
        parts += [docstring(obj), ""]
        if with_arguments:
            parts += [*_parameters(obj), ""]
    return "\n".join(parts)


def suites_page() -> str:
    parts = ["# Suites", "", "The suites shipped with clbench (`clbench --suite NAME`; a path to your own `.yaml` "
             "works the same). Each suite file's own description:", ""]
    for name, path in sorted(shipped_suites().items()):
        suite = yaml.safe_load(path.read_text())
        scenarios = ", ".join(f"`{s['name']}`" for s in suite.get("scenarios", []))
        rows = len(suite.get("strategies", []))
        parts += [f"## `{name}`", "", " ".join(str(suite.get("description", "")).split()), "",
                  f"Seeds {suite.get('seeds', [0])}; scenarios {scenarios}; {rows} strategy entries.", ""]
    return "\n".join(parts)


def _metric_rows(spec: MetricSpec) -> list[str]:
    return [f"| `{spec.column(summary)}` | {spec.name} | {spec.unit or 'fraction'} | "
            f"{'higher' if spec.higher_is_better else 'lower'} is better |" for summary in SUMMARIES]


def metrics_page() -> str:
    from clbench.evaluation import AccuracyEvaluator, RankingEvaluator

    parts = ["# Metrics and flags", "", "Computed by `clbench.metrics` from the score matrices only, never by a "
             "strategy.", "", docstring(importlib.import_module("clbench.metrics")), "",
             "## Leaderboard columns", "",
             "Classification scenarios (`AccuracyEvaluator`) fill the `accuracy` matrix; next-item recommendation "
             "(`RankingEvaluator`, k = 10) fills `ndcg@10` and `hit@10`.", "",
             docstring(RankingEvaluator), "", "| column | matrix | unit | direction |", "|---|---|---|---|",
             *(row for spec in (*AccuracyEvaluator().specs, *RankingEvaluator(n_items=1).specs)
               for row in _metric_rows(spec)), "",
             "Besides these: `params_M`, `params_added_M`, `train_s`, `eval_s`, `peak_mem_MB`, and the strategy's "
             "own `extra_metrics()` (such as `epsilon` of a private run).", "",
             "## Training-adequacy flags", "", adequacy.FLAGS_LEGEND, "",
             docstring(adequacy), ""]
    return "\n".join(parts)


def pages() -> dict[str, str]:
    return {
        "reference/scenarios.md": _registry_page(
            "Scenarios", "Every shipped scenario with its arguments (a suite entry's `args`; `seed` comes from the "
            "suite's seeds). The module text of each family comes first.", SCENARIOS, True),
        "reference/callbacks.md": _registry_page(
            "Callbacks", "Every shipped callback (a suite entry's `callbacks:`, by name or `{name, args}`).",
            CALLBACKS, True),
        "reference/models.md": _registry_page(
            "Models", "Every registered backbone (a strategy's `model` field; `model_args` are its arguments).",
            MODELS, False),
        "reference/suites.md": suites_page(),
        "reference/metrics.md": metrics_page(),
    }

