"""Name -> factory registries (the name is the API, as with timm's ``@register_model``).

Three registries are shared by the whole package::

    STRATEGIES   continual-learning strategies   (clbench/strategies/*.py)
    SCENARIOS    benchmark scenarios             (clbench/scenarios/*.py)
    MODELS       backbones                       (clbench/models/*.py)
    COMMANDS     run_bench.py sub-commands        (clbench/cli.py and feature modules)

Modules register on import; :func:`load_plugins` imports every module of the ``strategies`` and
``scenarios`` packages, so adding a strategy is one new module with one decorator and nothing else.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

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

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(factory: T) -> T:
            if name in self._entries and self._entries[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} is registered twice "
                                 f"({self._entries[name]!r} and {factory!r})")
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
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {', '.join(self.names())}. "
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


STRATEGIES: Registry = Registry("strategy")
SCENARIOS: Registry = Registry("scenario")
MODELS: Registry = Registry("model")
COMMANDS: Registry = Registry("command")

PLUGIN_PACKAGES = ("clbench.models", "clbench.scenarios", "clbench.strategies")
_loaded = False


def load_plugins() -> None:
    """Import every module of the plugin packages once, so that their decorators run."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for package_name in PLUGIN_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{package_name}.{module.name}")
