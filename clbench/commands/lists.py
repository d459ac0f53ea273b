"""``clbench list [--markdown] [--shipped] [--check]``: every scenario, strategy, model,
callback and shipped suite with its one-line summary, and the plugin modules that failed to load.

Shipped names come from the registries' index (no module is imported for them: ``list`` starts in a fraction of
a second); ``--check`` imports every plugin module first to find those that fail."""

from __future__ import annotations

import argparse

import yaml

from clbench.commands import Command
from clbench.plugins import UNAVAILABLE, load_plugins
from clbench.registry import CALLBACKS, COMMANDS, MODELS, SCENARIOS, STRATEGIES, Registry, UnknownNameError
from clbench.suite_file import shipped_suites

LISTED: tuple[tuple[str, Registry], ...] = (("Scenarios", SCENARIOS), ("Strategies", STRATEGIES), ("Models", MODELS),
                                           ("Callbacks", CALLBACKS))


def list_lines(markdown: bool = False, shipped: bool = False) -> list[str]:
    """What ``clbench list`` prints: every name of :data:`LISTED` with its one-line summary (shipped names from the
    registries' index: no module is imported for them; a plugin's marked ``[plugin: MODULE]``), the plugin modules
    that failed to load, and the shipped suites. ``shipped``: only what ships with clbench."""
    fmt = (lambda name, doc: f"- `{name}`: {doc}") if markdown else (lambda name, doc: f"  {name:22s} {doc}")
    lines = []
    for title, registry in LISTED:
        lines.append(f"### {title}" if markdown else f"{title.lower()}:")
        for name in registry.names():
            module = registry.module_of(name)
            plugin = not module.startswith("clbench.")
            if not (shipped and plugin):
                lines.append(fmt(name, _describe(registry, name) + (f" [plugin: {module}]" if plugin else "")))
        if registry is STRATEGIES and not shipped:
            lines += [fmt(module, f"UNAVAILABLE: {reason}") for module, reason in sorted(UNAVAILABLE.items())]
        lines.append("")
    lines.append("### Suites" if markdown else "suites:")
    for name, path in sorted(shipped_suites().items()):
        description = " ".join(str(yaml.safe_load(path.read_text()).get("description", "")).split())
        lines.append(fmt(name, description.split(". ")[0].rstrip(".") + "."))
    return lines


def _describe(registry: Registry, name: str) -> str:
    try:
        return registry.describe(name)
    except UnknownNameError as exc:          # its module failed to load (listed below the strategies)
        return f"UNAVAILABLE: {exc}"


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", action="store_true", help="markdown lists")
    p.add_argument("--shipped", action="store_true", help="only what ships with clbench (no plugins)")
    p.add_argument("--check", action="store_true",
                   help="import every plugin module first (slow; list reads the index): shows those that fail")


def run(args: argparse.Namespace) -> int:
    if args.check:
        load_plugins()
    print("\n".join(list_lines(args.markdown, args.shipped)))
    return 0


COMMANDS.register("list")(Command("list scenarios, strategies, models, callbacks and suites", _add_arguments, run))
