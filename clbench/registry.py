"""Name -> factory registries (the name is the API, as with timm's ``@register_model``).

The plugin registries, filled by modules that register on import::

    STRATEGIES   continual-learning strategies   (checked by clbench.protocol.check_strategy)
    SCENARIOS    benchmark scenarios             (checked by clbench.protocol.check_scenario)
    MODELS       backbones
    CALLBACKS    training callbacks              (checked by clbench.protocol.check_callback)
    COMMANDS     ``clbench`` sub-commands        (:class:`clbench.commands.Command`)

A name belongs to one module: registering a name that another module registers (imported or not: shipped modules
are imported only when one of their names is asked for) raises ``ValueError`` naming both, so that a plugin cannot
silently shadow a shipped strategy or scenario. A plugin registry also finds names in modules not imported yet:
:mod:`clbench.plugins` discovers the modules that register (shipped, installed through entry points,
``--plugins``), knows what each declares without importing it, imports the one that declares a name asked for, and
keeps why a module could not be loaded (asking for one of its names raises :class:`UnavailableError` with that
cause first). :func:`load_plugin`, :func:`load_plugins` and
:class:`PluginError` are that module's, named here too for the modules that ask a registry for a plugin.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from clbench import plugins as discovery
from clbench.errors import PLUGIN_HINT
from clbench.plugins import PluginError, load_plugin, load_plugins

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that no registry entry carries; the message suggests close names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class UnavailableError(UnknownNameError):
    """A name whose plugin module failed to load; the message starts with the module's failure."""


def first_line(obj: object) -> str:
    """The first line of ``obj``'s docstring ('' without one)."""
    return (inspect.getdoc(obj) or "").split("\n")[0]


class Registry(Generic[T]):
    """A mapping ``name -> factory`` filled by a decorator.

    >>> WIDGETS = Registry("widget")
    >>> @WIDGETS.register("mlp")
    ... def mlp(**kw): ...
    >>> WIDGETS.get("mlp")  # doctest: +ELLIPSIS
    <function mlp ...>

    A plugin registry (``discovered=True``: the five of :data:`PLUGINS`) also finds names in modules not imported
    yet (:mod:`clbench.plugins`); any other registry holds what its own modules registered.
    """

    def __init__(self, kind: str, validate: str | None = None, describe: Callable[[T], str] = first_line,
                 discovered: bool = False) -> None:
        self.kind = kind
        self.plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        self.validate = validate        # "module:function" called as function(name, factory) on registration
        self.describe_entry = describe  # one line for `clbench list`
        self.discovered = discovered
        self._entries: dict[str, T] = {}
        self.origins: dict[str, str] = {}   # name -> module whose code registered it
        if discovered:
            discovery.track(self)

    def register(self, name: str) -> Callable[[T], T]:
        origin = sys._getframe(1).f_globals.get("__name__", "?")

        def decorator(factory: T) -> T:
            if name in self._entries and self._entries[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} of {origin} is already registered by {self.origins[name]}; "
                                 f"choose another name.")
            held = discovery.holder(self.kind, name, origin) if self.discovered and name not in self._entries \
                else None
            if held is not None:
                raise ValueError(f"{self.kind} {name!r} of {origin} is already registered by {held}; choose another "
                                 f"name.")
            if self.validate:
                module, function = self.validate.split(":")
                with discovery.registering(self.kind, name):
                    getattr(importlib.import_module(module), function)(name, factory)
            self._entries[name] = factory
            self.origins[name] = origin
            if origin.split(".")[0] != "clbench":
                OUTSIDE.add(origin)
            return factory

        return decorator

    def get(self, name: str) -> T:
        if name in self._entries:
            return self._entries[name]
        if self.discovered:
            discovery.load_declaring(self.kind, name)
            if name not in self._entries:
                discovery.load_dynamic(self.kind)
            if name in self._entries:
                return self._entries[name]
            cause = discovery.failure(self.kind, name)
            if cause is not None:
                raise UnavailableError(cause)
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        broken = f" Plugin modules that failed to load: {', '.join(sorted(discovery.UNAVAILABLE))}." \
            if discovery.UNAVAILABLE and self.discovered else ""
        plugin = f" {PLUGIN_HINT}" if self.discovered else ""
        raise UnknownNameError(f"unknown {self.kind} {name!r}.{hint} Known {self.plural}: {', '.join(self.names())}."
                               f"{broken} List them with `clbench list`.{plugin}")

    def names(self) -> list[str]:
        """Every name: registered ones and, for a plugin registry, those declared by modules not imported yet."""
        if not self.discovered:
            return sorted(self._entries)
        discovery.load_dynamic(self.kind)
        return sorted(set(self._entries) | set(discovery.declared(self.kind)))

    def describe(self, name: str) -> str:
        """One line about ``name`` (``clbench list``), from the index while its module is not imported."""
        if name not in self._entries:
            source = discovery.declared(self.kind).get(name) if self.discovered else None
            summary = source.declared[self.kind][name] if source is not None else ""
            if summary:
                return summary
        return self.describe_entry(self.get(name))

    def module_of(self, name: str) -> str:
        """The module that registers ``name`` (known without importing it for a declared name)."""
        if name in self.origins:
            return self.origins[name]
        return discovery.module_declaring(self.kind, name) if self.discovered else "?"

    def __contains__(self, name: str) -> bool:
        return name in self._entries or self.discovered and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


OUTSIDE: set[str] = set()
"""Modules outside clbench that registered a name into a registry (any registry: the optimizers, memories... too)
in this process."""


def only_shipped() -> bool:
    """Whether every name of every registry comes from clbench's own modules (none registered from outside, no
    outside plugin module known: :func:`clbench.plugins.only_shipped`): then a Config's choices computed from a
    registry (``MODELS.names()``, ``OPTIMIZERS.names``) are those the index recorded (:mod:`clbench.recorded`)."""
    return not OUTSIDE and discovery.only_shipped()


def _describe_strategy(cls: type) -> str:
    return discovery.strategy_summary(first_line(cls), getattr(cls, "PRESETS", {}))


STRATEGIES: Registry = Registry("strategy", validate="clbench.protocol:check_strategy", describe=_describe_strategy,
                                discovered=True)
SCENARIOS: Registry = Registry("scenario", validate="clbench.protocol:check_scenario", discovered=True)
MODELS: Registry = Registry("model", discovered=True)
CALLBACKS: Registry = Registry("callback", validate="clbench.protocol:check_callback", discovered=True)
COMMANDS: Registry = Registry("command", describe=lambda command: command.help, discovered=True)
PLUGINS: dict[str, Registry] = {"STRATEGIES": STRATEGIES, "SCENARIOS": SCENARIOS, "MODELS": MODELS,
                                "CALLBACKS": CALLBACKS, "COMMANDS": COMMANDS}
"""The plugin registries by the variable name a module registers through (:data:`clbench.plugins.VARIABLES`)."""
REGISTRIES: tuple[Registry, ...] = tuple(PLUGINS.values())
assert {v: r.kind for v, r in PLUGINS.items()} == discovery.VARIABLES

__all__ = ["CALLBACKS", "COMMANDS", "MODELS", "PLUGINS", "REGISTRIES", "SCENARIOS", "STRATEGIES", "PluginError",
           "Registry", "UnavailableError", "UnknownNameError", "first_line", "load_plugin", "load_plugins",
           "only_shipped"]
