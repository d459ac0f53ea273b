"""The strategy reference: one page per strategy module, each strategy with its summary, its presets and a table of
its Config fields (type, default, what the field declares beside it: range, choices, the setting it needs, the
scenario size it may not exceed; and its value in each preset). All read from the classes, nothing typed here."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from clbench.docsite.text import cell, docstring, first_paragraph
from clbench.registry import STRATEGIES
from clbench.typecheck import SCENARIO_SIZES, declarations, type_hints, type_name

FOLDER = "reference/strategies"


def _allowed(name: str, declared: Any) -> str:
    """What a field may be, in words: its choices or range, the setting it needs, the size bounding it."""
    choices = declared.allowed()
    if choices is not None:
        parts = ["one of " + ", ".join(cell(c) for c in choices)]
    elif declared.within is not None or declared.range_for(name)[1]:
        parts = [str(declared.range_for(name)[0])]
    else:
        parts = []
    if declared.only_with is not None:
        parts.append(f"used only with `{declared.only_with.other}` = `{declared.only_with.wanted}`")
    if (bound := declared.bound_for(name)) is not None:
        parts.append(f"at most the scenario's {SCENARIO_SIZES[bound]}")
    return "; ".join(parts)


def config_table(cls: type) -> list[str]:
    """The markdown table of ``cls.Config``'s fields with one column per preset."""
    config, presets = cls.Config, getattr(cls, "PRESETS", {})
    hints, declared = type_hints(config), declarations(config)
    lines = ["| field | type | default | allowed | " + " | ".join(f"`{p}`" for p in presets) + " |",
             "|---|---|---|---|" + "---|" * len(presets)]
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        values = [cell(preset[f.name]) if f.name in preset else "" for preset in presets.values()]
        lines.append(f"| `{f.name}` | {cell(type_name(hints[f.name]))} | {cell(default)} | "
                     f"{_allowed(f.name, declared[f.name])} | " + " | ".join(values) + " |")
    return lines


def _by_module() -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name in STRATEGIES.names():
        module = STRATEGIES.module_of(name)
        if module.startswith("clbench."):
            grouped.setdefault(module, []).append(name)
    return grouped


def _slug(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def module_page(module: str, names: list[str]) -> str:
    parts = [f"# {_slug(module)}", "", f"Module `{module}`. {first_paragraph(importlib.import_module(module))}", "",
             "Each table lists the strategy's Config fields (defaults are the paper's values) and, per preset, the "
             "values that preset sets; a suite entry's `args` override both. *allowed* is what the field declares "
             "beside it, checked when a suite loads.", ""]
    for name in names:
        cls = STRATEGIES.get(name)
        parts += [f"## `{name}`", "", docstring(cls), "",
                  f"Class `{cls.__module__}.{cls.__qualname__}`; presets: "
                  + (", ".join(f"`{p}`" for p in getattr(cls, "PRESETS", {})) or "none") + ".", "",
                  *config_table(cls), ""]
    return "\n".join(parts)


def index_page(grouped: dict[str, list[str]]) -> str:
    parts = ["# Strategies", "", "Every shipped strategy, by the module that registers it (`clbench list` prints the "
             "same names; a plugin's strategies are listed there too). A page per module gives each strategy's "
             "Config fields, ranges, choices and presets.", "", "| strategy | module | summary |", "|---|---|---|"]
    for module, names in grouped.items():
        for name in names:
            parts.append(f"| [`{name}`]({_slug(module)}.md#{name}) | `{_slug(module)}` | "
                         f"{first_paragraph(STRATEGIES.get(name)).replace('|', '/')} |")
    return "\n".join(parts) + "\n"


def pages() -> dict[str, str]:
    grouped = _by_module()
    return {f"{FOLDER}/index.md": index_page(grouped),
            **{f"{FOLDER}/{_slug(m)}.md": module_page(m, names) for m, names in grouped.items()}}
