"""Name -> factory registries (the name is the API, as with timm's ``@register_model``), and plugin discovery.

The plugin registries, filled by modules that register on import::

    STRATEGIES   continual-learning strategies   (checked by clbench.protocol.check_strategy)
    SCENARIOS    benchmark scenarios             (checked by clbench.protocol.check_scenario)
    MODELS       backbones
    CALLBACKS    training callbacks              (checked by clbench.protocol.check_callback)
    COMMANDS     ``clbench`` sub-commands

Where their modules come from (:func:`sources`), nothing to edit by hand:

- shipped: every module of ``clbench`` (sub-packages included, and the mapped ``clbench.strategies`` /
  ``clbench.scenarios``) whose code calls ``<REGISTRY>.register(...)``;
- installed packages: the modules named by the entry points of group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."clbench.plugins"] my_methods = "my_package.strategies"``);
- ``--plugins MODULE_OR_FILE``, a suite's ``plugins:`` and :func:`load_plugin`: imported at once; they are passed on
  to worker processes through ``$CLBENCH_PLUGINS`` (:data:`ENV`, also settable by hand).

Modules are imported lazily. Which module registers which name is known without importing it: for shipped
modules from the committed index ``plugin_index.json`` (:func:`build_index`, ``make lists``; an entry counts only
while its file's sha256 matches), otherwise from the module's syntax tree (literal ``X.register("name")`` calls; a
module that registers a computed name is imported when the full list of names is needed). ``get(name)`` imports the
one module that declares ``name``; ``clbench --help`` and ``clbench list`` import none of the shipped ones.

A plugin module that fails to import (a missing optional dependency, a class that breaks the contract) is skipped
whole — whatever it registered before failing is taken back — and its cause is kept in :data:`UNAVAILABLE`:
``clbench list`` shows it and asking for a name it declares raises :class:`UnavailableError`, whose message starts
with that cause. A module named by ``--plugins`` or a suite that fails raises :class:`PluginError` at once.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

ENTRY_POINT_GROUP = "clbench.plugins"
ENV = "CLBENCH_PLUGINS"
SHIPPED_PACKAGES = ("clbench", "clbench.strategies", "clbench.scenarios")
INDEX_FILE = Path(__file__).with_name("plugin_index.json")


class UnknownNameError(KeyError):
    """Raised for a name that no registry entry carries; the message suggests close names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class UnavailableError(UnknownNameError):
    """A name whose plugin module failed to load; the message starts with the module's failure."""


class PluginError(ImportError):
    """A plugin named by ``--plugins``, a suite's ``plugins:``, ``$CLBENCH_PLUGINS`` or :func:`load_plugin` could
    not be loaded: ``plugin 'NAME' failed to load: <cause>`` (one line)."""


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

    A plugin registry (``plugins=True``: the five of :data:`PLUGINS`) also finds names in modules not imported yet
    (see the module docstring); any other registry holds what its own modules registered.
    """

    def __init__(self, kind: str, validate: str | None = None, describe: Callable[[T], str] = first_line,
                 plugins: bool = False) -> None:
        self.kind = kind
        self.plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        self.validate = validate        # "module:function" called as function(name, factory) on registration
        self.describe_entry = describe  # one line for `clbench list`
        self.plugins = plugins
        self._entries: dict[str, T] = {}
        self.origins: dict[str, str] = {}   # name -> module whose code registered it

    def register(self, name: str) -> Callable[[T], T]:
        origin = sys._getframe(1).f_globals.get("__name__", "?")

        def decorator(factory: T) -> T:
            global _registering
            if name in self._entries and self._entries[name] is not factory:
                raise ValueError(f"{self.kind} {name!r} is registered twice "
                                 f"({self._entries[name]!r} and {factory!r})")
            _registering = (self.kind, name)
            if self.validate:
                module, function = self.validate.split(":")
                getattr(importlib.import_module(module), function)(name, factory)
            _registering = None
            self._entries[name] = factory
            self.origins[name] = origin
            return factory

        return decorator

    def get(self, name: str) -> T:
        if name in self._entries:
            return self._entries[name]
        if self.plugins:
            for source in sources():
                if name in source.declared.get(self.kind, {}) and not source.imported:
                    source.load()
            if name not in self._entries:
                _load_dynamic(self.kind)
            if name in self._entries:
                return self._entries[name]
            for module, failure in FAILED_NAMES.items():
                if (self.kind, name) in failure:
                    raise UnavailableError(f"{UNAVAILABLE[module]} ({self.kind} {name!r} is registered by plugin "
                                           f"module {module}, which could not be loaded).")
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        broken = f" Plugin modules that failed to load: {', '.join(sorted(UNAVAILABLE))}." \
            if UNAVAILABLE and self.plugins else ""
        raise UnknownNameError(f"unknown {self.kind} {name!r}.{hint} Known {self.plural}: {', '.join(self.names())}."
                               f"{broken} List them with `clbench list`.")

    def names(self) -> list[str]:
        """Every name: registered ones and, for a plugin registry, those declared by modules not imported yet."""
        if not self.plugins:
            return sorted(self._entries)
        _load_dynamic(self.kind)
        declared = {n for s in sources() if not s.imported for n in s.declared.get(self.kind, {})}
        return sorted(set(self._entries) | declared)

    def describe(self, name: str) -> str:
        """One line about ``name`` (``clbench list``), from the index while its module is not imported."""
        if name not in self._entries:
            for source in sources():
                summary = source.declared.get(self.kind, {}).get(name)
                if summary and not source.imported:
                    return summary
        return self.describe_entry(self.get(name))

    def module_of(self, name: str) -> str:
        """The module that registers ``name`` (known without importing it for a declared name)."""
        if name in self.origins:
            return self.origins[name]
        return next((s.module for s in sources() if name in s.declared.get(self.kind, {})), "?") if self.plugins \
            else "?"

    def __contains__(self, name: str) -> bool:
        return name in self._entries or self.plugins and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _describe_strategy(cls: type) -> str:
    return f"{first_line(cls)} (presets: {', '.join(getattr(cls, 'PRESETS', {})) or 'none'})"


STRATEGIES: Registry = Registry("strategy", validate="clbench.protocol:check_strategy", describe=_describe_strategy,
                                plugins=True)
SCENARIOS: Registry = Registry("scenario", validate="clbench.protocol:check_scenario", plugins=True)
MODELS: Registry = Registry("model", plugins=True)
CALLBACKS: Registry = Registry("callback", validate="clbench.protocol:check_callback", plugins=True)
COMMANDS: Registry = Registry("command", describe=lambda command: command.help, plugins=True)
PLUGINS: dict[str, Registry] = {"STRATEGIES": STRATEGIES, "SCENARIOS": SCENARIOS, "MODELS": MODELS,
                                "CALLBACKS": CALLBACKS, "COMMANDS": COMMANDS}
"""The plugin registries by the variable name a module registers through (``STRATEGIES.register("x")``)."""
REGISTRIES: tuple[Registry, ...] = tuple(PLUGINS.values())

UNAVAILABLE: dict[str, str] = {}              # plugin module -> why it could not be imported (one line)
FAILED_NAMES: dict[str, set[tuple[str, str]]] = {}   # plugin module -> (kind, name) it declares or was registering
_registering: tuple[str, str] | None = None   # the registration under way (named when its check fails)


# --------------------------------------------------------------------------------------------------------- loading
def import_plugin(module: str, path: Path | None = None) -> bool:
    """Import one plugin module (from ``path`` when given: a file, imported as ``module``); on failure take back
    every entry it (or a module it imported that failed with it) registered, record the cause in
    :data:`UNAVAILABLE` and the names it declares in :data:`FAILED_NAMES`, and return False. Entries of modules it
    imported successfully stay: those modules are loaded and will not be imported again."""
    global _registering
    before = [set(r._entries) for r in REGISTRIES]
    _registering = None
    try:
        if path is None:
            importlib.import_module(module)
        else:
            _import_file(module, path)
        return True
    except Exception as exc:  # noqa: BLE001 - any import failure makes the module unavailable, never the registry
        for registry, names in zip(REGISTRIES, before):
            for name in set(registry._entries) - names:
                if not _defined_in_loaded_module(registry._entries[name], module):
                    del registry._entries[name]
                    registry.origins.pop(name, None)
        UNAVAILABLE[module] = " ".join(f"{type(exc).__name__}: {exc}".split())
        declared = next((s.declared for s in _sources or () if s.module == module), None)
        path = path or _module_file(module)
        if declared is None and path is not None:
            declared = scan(path.read_bytes())[0]
        FAILED_NAMES[module] = {(kind, name) for kind, names in (declared or {}).items() for name in names} | \
            ({_registering} if _registering else set())
        _registering = None
        log.info("plugin module %s is unavailable: %s", module, UNAVAILABLE[module])
        return False


def _module_file(module: str) -> Path | None:
    try:
        origin = getattr(importlib.util.find_spec(module), "origin", None)
    except (ImportError, ValueError):
        return None
    return Path(origin) if origin and origin.endswith(".py") else None


def _import_file(module: str, path: Path) -> None:
    """Import the file ``path`` as module ``module`` (kept in ``sys.modules``, so its ``__file__`` is found by the
    code fingerprint)."""
    spec = importlib.util.spec_from_file_location(module, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[module]
        raise


def _defined_in_loaded_module(entry: object, failed: str) -> bool:
    """True for a class or function defined by a module other than ``failed`` that imported successfully."""
    home = getattr(entry, "__module__", None) if isinstance(entry, (type, types.FunctionType)) else None
    return home is not None and home != failed and home in sys.modules


_loaded_specs: dict[str, str] = {}     # --plugins / suite / $CLBENCH_PLUGINS spec (resolved) -> module


def load_plugin(spec: str, base: Path | None = None) -> str:
    """Import a plugin now: a module name (``my_package.strategies``) or a ``.py`` file (relative to ``base``,
    default the working directory; imported as the module named by its stem). Raises :class:`PluginError` naming
    the plugin with its cause; returns the module name. The plugin is added to ``$CLBENCH_PLUGINS`` so that worker
    processes load it too."""
    is_file = spec.endswith(".py") or os.sep in spec or "/" in spec
    if is_file:
        path = Path(spec).expanduser()
        path = ((base or Path.cwd()) / path if not path.is_absolute() else path).resolve()
        key, module = str(path), path.stem
        if not path.is_file():
            raise PluginError(f"plugin {spec!r} failed to load: no such file {path}.")
        known = getattr(sys.modules.get(module), "__file__", None)
        if known and Path(known).resolve() != path:
            raise PluginError(f"plugin {spec!r} failed to load: a module named {module!r} is already imported from "
                              f"{known}; rename the file.")
    else:
        path, key, module = None, spec, spec
    if key in _loaded_specs:
        return module
    if not (module in sys.modules or import_plugin(module, path)):
        raise PluginError(f"plugin {spec!r} failed to load: {UNAVAILABLE[module]}")
    _loaded_specs[key] = module
    listed = [s for s in os.environ.get(ENV, "").split(os.pathsep) if s]
    if key not in listed:
        os.environ[ENV] = os.pathsep.join([*listed, key])
    return module


def load_plugins() -> None:
    """Import every plugin module now (shipped, installed and named), so that every registry is complete; failures:
    see :func:`import_plugin`."""
    for source in sources():
        if not source.imported:
            source.load()


def _load_dynamic(kind: str) -> None:
    """Import the modules that register ``kind`` names not known without importing them."""
    for source in sources():
        if kind in source.dynamic and not source.imported:
            source.load()


# ------------------------------------------------------------------------------------------------------- discovery
@dataclass
class Source:
    """A module that registers plugins: its import name, its file (None: not found without importing), where it
    comes from, the names it declares (``{kind: {name: summary}}``; summaries from the index, else '') and the kinds
    it registers under names known only after importing it."""

    module: str
    path: Path | None
    origin: str
    declared: dict[str, dict[str, str]] = field(default_factory=dict)
    dynamic: set[str] = field(default_factory=set)

    @property
    def imported(self) -> bool:
        return self.module in sys.modules or self.module in UNAVAILABLE

    def load(self) -> bool:
        loaded = import_plugin(self.module)
        if not loaded and self.origin != "shipped":
            UNAVAILABLE[self.module] += f" (from the {self.origin})"
        return loaded


_sources: list[Source] | None = None


def sources() -> list[Source]:
    """Every plugin module known to this process (found once; ``$CLBENCH_PLUGINS`` plugins are imported here)."""
    global _sources
    if _sources is None:
        _sources = []
        index = _read_index()
        for module, path in shipped_modules():
            source = _shipped_source(module, path, index)
            if source is not None:
                _sources.append(source)
        _sources += _entry_point_sources()
        for spec in [s for s in os.environ.get(ENV, "").split(os.pathsep) if s]:
            load_plugin(spec)
    return _sources


def shipped_modules() -> list[tuple[str, Path]]:
    """``(module, file)`` of every module of :data:`SHIPPED_PACKAGES` and their sub-packages (found by walking
    their folders, without importing them; ``__main__`` and ``_private`` modules left out)."""
    found: dict[str, Path] = {}
    for package in SHIPPED_PACKAGES:
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            _walk(package, Path(folder), found)
    return sorted(found.items())


def _walk(package: str, folder: Path, found: dict[str, Path]) -> None:
    for path in sorted(folder.iterdir()):
        if path.is_dir() and (path / "__init__.py").is_file():
            _walk(f"{package}.{path.name}", path, found)
        elif path.suffix == ".py" and not path.stem.startswith("_"):
            found.setdefault(f"{package}.{path.stem}", path)
        elif path.name == "__init__.py":
            found.setdefault(package, path)


def _shipped_source(module: str, path: Path, index: dict) -> Source | None:
    data = path.read_bytes()
    if b"register(" not in data:
        return None
    known = index.get(module)
    if known is not None and known["sha256"] == hashlib.sha256(data).hexdigest():
        declared, dynamic = known["entries"], set()
    else:
        declared, dynamic = scan(data)
    return Source(module, path, "shipped", declared, dynamic) if declared or dynamic else None


def _entry_point_sources() -> list[Source]:
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "?"
        try:
            spec = importlib.util.find_spec(ep.module)
        except Exception as exc:  # noqa: BLE001 - a broken package is reported, never fatal
            UNAVAILABLE[ep.module] = f"{type(exc).__name__}: {exc} (entry point {ep.name!r} of {dist})"
            FAILED_NAMES[ep.module] = set()
            continue
        origin = getattr(spec, "origin", None)
        path = Path(origin) if origin and origin.endswith(".py") else None
        declared, dynamic = scan(path.read_bytes()) if path else ({}, set(PLUGINS_KINDS))
        found.append(Source(ep.module, path, f"entry point {ep.name!r} of {dist}", declared, dynamic))
    return found


PLUGINS_KINDS = tuple(r.kind for r in REGISTRIES)


def scan(source: bytes) -> tuple[dict[str, dict[str, str]], set[str]]:
    """The plugin registrations in a module's code, without running it: ``({kind: {name: summary}}, kinds)`` where
    ``kinds`` are registered with a computed name (``STRATEGIES.register(method + suffix)``). Registries are
    recognized by their variable name (:data:`PLUGINS`), also when imported under another name. A summary is the
    decorated definition's first docstring line or a command's help string ('' for strategies, whose summary names
    their presets, and where none is written: ``clbench list`` then imports the module)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}, set(PLUGINS_KINDS)       # importing it reports the error
    names = {variable: variable for variable in PLUGINS}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update({alias.asname: alias.name for alias in node.names if alias.name in PLUGINS and alias.asname})
    summaries = {}          # register call -> one line readable without importing (not for strategies: presets)
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            summaries.update({id(d): (ast.get_docstring(node) or "").split("\n")[0] for d in node.decorator_list})
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Call) and node.args[0].args and \
                isinstance(node.args[0].args[0], ast.Constant) and isinstance(node.args[0].args[0].value, str):
            summaries[id(node.func)] = node.args[0].args[0].value      # COMMANDS.register("x")(Command("help", ..))
    declared: dict[str, dict[str, str]] = {}
    dynamic: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register"):
            continue
        receiver = node.func.value
        variable = names.get(receiver.id if isinstance(receiver, ast.Name) else
                             receiver.attr if isinstance(receiver, ast.Attribute) else "")
        if variable is None:
            continue
        kind = PLUGINS[variable].kind
        if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            summary = summaries.get(id(node), "") if PLUGINS[variable] is not STRATEGIES else ""
            declared.setdefault(kind, {})[node.args[0].value] = summary
        else:
            dynamic.add(kind)
    return declared, dynamic


# ----------------------------------------------------------------------------------------------------------- index
def _read_index() -> dict:
    try:
        return json.loads(INDEX_FILE.read_text())["modules"]
    except (OSError, ValueError, KeyError):
        return {}


def build_index() -> dict:
    """The index of the shipped plugin modules: ``{"modules": {module: {"sha256", "entries": {kind: {name:
    summary}}}}}``, made by importing every one of them (:func:`write_index` saves it as :data:`INDEX_FILE`)."""
    modules = {}
    for module, path in shipped_modules():
        data = path.read_bytes()
        if b"register(" not in data:
            continue
        declared, dynamic = scan(data)
        if (declared or dynamic) and not import_plugin(module):
            raise PluginError(f"plugin {module!r} failed to load: {UNAVAILABLE[module]}")
        modules[module] = {"sha256": hashlib.sha256(data).hexdigest(), "entries": {}}
    for registry in REGISTRIES:
        for name, origin in sorted(registry.origins.items()):
            if origin in modules:
                modules[origin]["entries"].setdefault(registry.kind, {})[name] = registry.describe_entry(
                    registry._entries[name])
    return {"modules": modules}


def write_index(path: Path = INDEX_FILE) -> None:
    """Write :func:`build_index` to ``path`` (``make lists``)."""
    path.write_text(json.dumps(build_index(), indent=1, sort_keys=True, ensure_ascii=False) + "\n")


__all__ = ["CALLBACKS", "COMMANDS", "ENTRY_POINT_GROUP", "ENV", "MODELS", "PLUGINS", "REGISTRIES", "SCENARIOS",
           "STRATEGIES", "UNAVAILABLE", "PluginError", "Registry", "Source", "UnavailableError", "UnknownNameError",
           "build_index", "first_line", "import_plugin", "load_plugin", "load_plugins", "scan", "shipped_modules",
           "sources", "write_index"]
