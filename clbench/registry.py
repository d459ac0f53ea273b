"""Name -> factory registries (the name is the API, as with timm's ``@register_model``).

Registries shared by the whole package::

    STRATEGIES   continual-learning strategies   (strategies/*.py; checked by clbench.protocol.check_strategy)
    SCENARIOS    benchmark scenarios             (scenarios/*.py)
    MODELS       backbones                       (clbench/models/*.py)
    COMMANDS     run_bench.py sub-commands        (clbench/cli.py and the modules in COMMAND_MODULES)

Modules register on import; :func:`load_plugins` imports every module of :data:`PLUGIN_PACKAGES`,
:data:`COMMAND_MODULES` and :data:`CALLBACK_MODULES` (callbacks defined outside ``clbench.callbacks``), so adding a
strategy is one new module with one decorator and nothing else. A plugin module
that fails to import (a missing optional dependency, a broken strategy) is skipped whole — whatever it registered
before failing is taken back — and its reason is kept in :data:`UNAVAILABLE`: ``run_bench.py list`` shows it, an
unknown name mentions it, and everything else keeps working.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import pkgutil
import sys
import types
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that no registry entry carries; the message suggests close names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class Registry(Generic[T]):
    """A mapping ``name -> factory`` filled by a decorator.

    >>> MODELS = Registry("model")
    >>> @MODELS.register("mlp")
    ... def mlp(**kw): ...
    >>> MODELS.get("mlp")  # doctest: +ELLIPSIS
    <function mlp ...>
    """

    def __init__(self, kind: str, validate: str | None = None) -> None:
        self.kind = kind
        self.validate = validate        # "module:function" called as function(name, factory) on registration
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(factory: T) -> T:
            if name in self._entries and self._entries[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} is registered twice "
                                 f"({self._entries[name]!r} and {factory!r})")
            if self.validate:
                module, function = self.validate.split(":")
                getattr(importlib.import_module(module), function)(name, factory)
            self._entries[name] = factory
            return factory

        return decorator

    def get(self, name: str) -> T:
        load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._entries, n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            broken = f" Unavailable plugin modules: {'; '.join(f'{m} ({r})' for m, r in UNAVAILABLE.items())}." \
                if UNAVAILABLE else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {', '.join(self.names())}.{broken} "
                f"List them with `python run_bench.py list`."
            ) from None

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


STRATEGIES: Registry = Registry("strategy", validate="clbench.protocol:check_strategy")
SCENARIOS: Registry = Registry("scenario")
MODELS: Registry = Registry("model")
COMMANDS: Registry = Registry("command")
REGISTRIES: tuple[Registry, ...] = (STRATEGIES, SCENARIOS, MODELS, COMMANDS)

PLUGIN_PACKAGES = ("clbench.models", "clbench.scenarios", "clbench.strategies")
COMMAND_MODULES = ("clbench.cli", "clbench.tangent.commands", "clbench.analysis.commands")
CALLBACK_MODULES = ("clbench.privacy.step",)
UNAVAILABLE: dict[str, str] = {}        # plugin module -> why it could not be imported
_loaded = False


def plugin_modules() -> list[str]:
    """Every plugin module name, in load order."""
    names = []
    for package_name in PLUGIN_PACKAGES:
        package = importlib.import_module(package_name)
        names += [f"{package_name}.{m.name}" for m in pkgutil.iter_modules(package.__path__)
                  if not m.name.startswith("_")]
    return names + list(COMMAND_MODULES) + list(CALLBACK_MODULES)


def import_plugin(module: str) -> bool:
    """Import one plugin module; on failure take back every entry it (or a module it imported that failed with it)
    registered, record the reason in :data:`UNAVAILABLE` and return False. Entries of modules it imported
    successfully stay: those modules are loaded and will not be imported again."""
    before = [set(r._entries) for r in REGISTRIES]
    try:
        importlib.import_module(module)
        return True
    except Exception as exc:  # noqa: BLE001 - any import failure makes the module unavailable, never the registry
        for registry, names in zip(REGISTRIES, before):
            for name in set(registry._entries) - names:
                if not _defined_in_loaded_module(registry._entries[name], module):
                    del registry._entries[name]
        UNAVAILABLE[module] = f"{type(exc).__name__}: {exc}"
        log.info("plugin module %s is unavailable: %s", module, UNAVAILABLE[module])
        return False


def _defined_in_loaded_module(entry: object, failed: str) -> bool:
    """True for a class or function defined by a module other than ``failed`` that imported successfully."""
    home = getattr(entry, "__module__", None) if isinstance(entry, (type, types.FunctionType)) else None
    return home is not None and home != failed and home in sys.modules


def load_plugins() -> None:
    """Import every plugin module once, so that their decorators run (failures: see :func:`import_plugin`)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in plugin_modules():
        import_plugin(module)
