"""Plugin discovery: which modules register names into the plugin registries of :mod:`clbench.registry`, what
each one declares before it is imported, importing them, and why one could not be imported.

Where the modules come from (:func:`sources`), nothing to edit by hand:

- shipped: every module of ``clbench`` (sub-packages included, and the mapped ``clbench.strategies`` /
  ``clbench.scenarios``) whose code calls ``<REGISTRY>.register(...)``;
- installed packages: the modules named by the entry points of group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."clbench.plugins"] my_methods = "my_package.strategies"``);
- ``--plugins MODULE_OR_FILE``, a suite's ``plugins:`` and :func:`load_plugin`: imported at once; they are passed on
  to worker processes through ``$CLBENCH_PLUGINS`` (:data:`ENV`, also settable by hand).

Modules are imported lazily. Which module registers which name is known without importing it: for shipped
modules from the committed index ``plugin_index.json`` (:func:`build_index`, ``make lists``; an entry counts only
while its file's sha256 matches), for installed packages from the index cached per distribution and version
(:func:`cache_file`: ``<user cache>/clbench/plugin_index/<distribution>-<version>.json``, written the first time
one of its modules is imported, with what it registered; an entry counts only while the module's sha256 matches, and
another version is another file; it also holds whether each of the module's strategies may train with ``dp``,
which :func:`private_flag` otherwise reads from the module's code), otherwise from the module's syntax tree
(:func:`scan`: literal ``X.register("name")`` calls; a module that registers a computed name is imported when the
full list of names is needed). ``get(name)`` imports the one module that declares ``name``; ``clbench --help`` and
``clbench list`` import none of the shipped ones, nor an installed package's once its index is cached. The committed
index also records each shipped strategy's Config declarations and each scenario's sizes (:mod:`clbench.recorded`,
:func:`record`): suite loading checks values against them before importing anything.

A plugin module that fails to import (a missing optional dependency, a class that breaks the contract) is skipped
whole — whatever it registered before failing is taken back — and its cause is kept in :data:`UNAVAILABLE`:
``clbench list`` shows it and asking for a name it declares raises ``UnavailableError`` (:func:`failure` is its
message, which starts with that cause). A module named by ``--plugins`` or a suite that fails raises
:class:`PluginError` at once.

This module knows the registries only as the objects that :func:`track` was given (each plugin registry of
:mod:`clbench.registry` tracks itself when it is made): the registry module imports this one, never the reverse.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "clbench.plugins"
ENV = "CLBENCH_PLUGINS"
SHIPPED_PACKAGES = ("clbench", "clbench.strategies", "clbench.scenarios")
INDEX_FILE = Path(__file__).with_name("plugin_index.json")
VARIABLES = {"STRATEGIES": "strategy", "SCENARIOS": "scenario", "MODELS": "model", "CALLBACKS": "callback",
             "COMMANDS": "command"}
"""The plugin registries by the variable a module registers through (``STRATEGIES.register("x")``) -> their kind;
:func:`scan` recognizes a registration by this name, also when imported under another one."""
KINDS = tuple(VARIABLES.values())
CHOICE_KINDS = frozenset({"model"})  # plugin registries whose names a Config offers as choices (``model``)
UNSUMMARIZED = frozenset({"strategy"})      # a strategy's summary names its presets: read only from a literal PRESETS


class PluginError(ImportError):
    """A plugin named by ``--plugins``, a suite's ``plugins:``, ``$CLBENCH_PLUGINS`` or :func:`load_plugin` could
    not be loaded: ``plugin 'NAME' failed to load: <cause>`` (one line)."""


UNAVAILABLE: dict[str, str] = {}              # plugin module -> why it could not be imported (one line)
FAILED_NAMES: dict[str, set[tuple[str, str]]] = {}   # plugin module -> (kind, name) it declares or was registering
_tracked: list[Any] = []                      # the plugin registries (clbench.registry.Registry, discovered=True)
_registering: tuple[str, str] | None = None   # the registration under way (named when its check fails)


def track(registry: Any) -> None:
    """Count ``registry`` among the plugin registries: a failed import takes back what it registered there, and
    :func:`build_index` reads its entries. It has ``kind``, ``_entries`` (``{name: factory}``), ``origins``
    (``{name: module}``) and ``describe_entry(factory) -> str``."""
    if registry.kind not in KINDS:
        raise ValueError(f"a plugin registry's kind is one of {', '.join(KINDS)}, got {registry.kind!r}")
    _tracked.append(registry)


@contextmanager
def registering(kind: str, name: str) -> Iterator[None]:
    """Mark the registration of ``name`` under way: when its check raises during a plugin's import, the module's
    failure names it (a computed name is not known from the module's code)."""
    global _registering
    _registering = (kind, name)
    yield
    _registering = None


# --------------------------------------------------------------------------------------------------------- loading
def import_plugin(module: str, path: Path | None = None) -> bool:
    """Import one plugin module (from ``path`` when given: a file, imported as ``module``); on failure take back
    every entry it (or a module it imported that failed with it) registered, record the cause in
    :data:`UNAVAILABLE` and the names it declares in :data:`FAILED_NAMES`, and return False. Entries of modules it
    imported successfully stay: those modules are loaded and will not be imported again."""
    global _registering
    before = {id(r): set(r._entries) for r in _tracked}
    _registering = None
    try:
        if path is None:
            importlib.import_module(module)
        else:
            _import_file(module, path)
        return True
    except Exception as exc:  # noqa: BLE001 - any import failure makes the module unavailable, never the registry
        for registry in _tracked:           # registries made during the import had nothing before it
            for name in set(registry._entries) - before.get(id(registry), set()):
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


def load_declaring(kind: str, name: str) -> None:
    """Import the modules not imported yet that declare ``name`` of ``kind``."""
    for source in sources():
        if name in source.declared.get(kind, {}) and not source.imported:
            source.load()


def load_dynamic(kind: str) -> None:
    """Import the modules that register ``kind`` names not known without importing them."""
    for source in sources():
        if kind in source.dynamic and not source.imported:
            source.load()


def failure(kind: str, name: str) -> str | None:
    """Why ``name`` of ``kind`` is missing when the module that declares it failed to load (None otherwise): the
    module's cause first."""
    for module, names in FAILED_NAMES.items():
        if (kind, name) in names:
            return (f"{UNAVAILABLE[module]} ({kind} {name!r} is registered by plugin module {module}, which could "
                    f"not be loaded).")
    return None


def declared(kind: str) -> dict[str, Source]:
    """``{name: source}`` of the ``kind`` names declared by modules not imported yet."""
    return {name: s for s in sources() if not s.imported for name in s.declared.get(kind, {})}


def holder(kind: str, name: str, module: str) -> str | None:
    """Which other module holds ``name`` of ``kind`` (imported or not), as ``"shipped module M"`` or ``"plugin module
    M (entry point ...)"``; None when only ``module`` declares it. A module registering a held name would shadow it
    (or be shadowed) depending on the order of imports, silently: :class:`clbench.registry.Registry` refuses it."""
    for source in sources():
        if source.module != module and name in source.declared.get(kind, {}):
            read = f"; its names read from the plugin index cache {source.cache}" if source.cached else ""
            return f"shipped module {source.module}" if source.origin == "shipped" else \
                f"plugin module {source.module} ({source.origin}{read})"
    return None


def module_declaring(kind: str, name: str) -> str:
    """The module that declares ``name`` of ``kind`` ('?' when none does)."""
    return next((s.module for s in sources() if name in s.declared.get(kind, {})), "?")


def record(kind: str, name: str) -> dict | None:
    """What the index records of the shipped ``name`` of ``kind`` (:mod:`clbench.recorded`: a strategy's Config
    declarations, a scenario's sizes), while the module that registers it and the modules the record ``depends`` on
    are as when the index was built; None otherwise (the loader's full check, after importing, decides alone)."""
    for source in sources():
        found = source.records.get(kind, {}).get(name)
        if found is not None:
            return found if all(_sha256_of(module) == sha for module, sha in found["depends"].items()) else None
    return None


@functools.cache
def _sha256_of(module: str) -> str | None:
    path = dict(shipped_modules()).get(module)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None


def only_shipped() -> bool:
    """Whether the names of clbench's other registries (optimizers, memories, losses...: the choices a Config
    computes from them) can only be clbench's own: nothing loaded by ``--plugins``, a suite's ``plugins:`` or
    ``$CLBENCH_PLUGINS``, and no installed plugin distribution with code that may register into them
    (:attr:`Source.elsewhere`) or into a plugin registry of :data:`CHOICE_KINDS`. A package that registers only
    strategies, scenarios, callbacks or commands leaves them as shipped."""
    return not _loaded_specs and not any(s.elsewhere or CHOICE_KINDS & (set(s.declared) | s.dynamic)
                                         for s in sources() if s.origin != "shipped")


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
    cache: Path | None = None       # an installed module's cached index (:func:`cache_file`), written on import
    sha256: str = ""                # of its file (installed modules)
    cached: bool = False            # what it declares was read from its cache
    records: dict[str, dict[str, dict]] = field(default_factory=dict)   # {kind: {name: record}} from the index
    elsewhere: bool = False         # its distribution's code may register into a registry that is not a plugin one
    private: dict[str, dict] | None = None   # its strategies' cached ``private`` flags (:func:`private_flag`);
    #                                          None: not cached

    @property
    def imported(self) -> bool:
        return self.module in sys.modules or self.module in UNAVAILABLE

    def load(self) -> bool:
        loaded = import_plugin(self.module)
        if not loaded and self.origin != "shipped":
            UNAVAILABLE[self.module] += f" (from the {self.origin})"
        for source in (_sources or ()) if loaded else ():     # this one and installed ones it imported
            if source.cache is not None and source.module in sys.modules and (
                    not source.cached or source.private is None and "strategy" in source.declared):
                _save_cache(source)
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
        shipped: dict[str, set[str]] = {}
        for source in _sources:
            for kind, names in source.declared.items():
                shipped.setdefault(kind, set()).update(names)
        _sources += _entry_point_sources(shipped)
        for spec in [s for s in os.environ.get(ENV, "").split(os.pathsep) if s]:
            load_plugin(spec)
    return _sources


def shipped_modules() -> list[tuple[str, Path]]:
    """``(module, file)`` of every module of :data:`SHIPPED_PACKAGES` and their sub-packages (found by walking
    their folders, without importing them; ``__main__`` and ``_private`` modules left out)."""
    found: dict[str, Path] = {}
    for package in SHIPPED_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None:
            raise PluginError(NOT_INSTALLED.format(package=package, root=Path(__file__).resolve().parents[1]))
        for folder in spec.submodule_search_locations or []:
            _walk(package, Path(folder), found)
    return sorted(found.items())


NOT_INSTALLED = ("{package} is not found: clbench runs from a checkout that is not installed (the shipped strategies "
                 "and scenarios are mapped in by the installation); run `pip install -e {root}` (or `make venv`) "
                 "and start it again.")


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
        declared, dynamic, records = known["entries"], set(), known.get("records", {})
    else:
        declared, dynamic, records = *scan(data), {}
    return Source(module, path, "shipped", declared, dynamic, records=records) if declared or dynamic else None


def _entry_point_sources(shipped: dict[str, set[str]]) -> list[Source]:
    """The installed plugin modules; ``shipped``: ``{kind: names}`` of the shipped modules (a cache may not claim
    one)."""
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
        data = path.read_bytes() if path else b""
        sha256 = hashlib.sha256(data).hexdigest() if path else ""
        cache = cache_file(ep.dist.name, ep.dist.version) if ep.dist and path else None
        known = _read_cache(cache).get(ep.module) if cache else None
        declared, dynamic = scan(data) if path else ({}, set(KINDS))
        cached = known is not None and known.get("sha256") == sha256 and _trusted(cache, ep.module, known,
                                                                                   declared, dynamic, shipped)
        found.append(Source(ep.module, path, f"entry point {ep.name!r} of {dist}",
                            known["entries"] if cached else declared, set() if cached else dynamic, cache, sha256,
                            cached, elsewhere=path is None or _registers_elsewhere(ep, data),
                            private=_cached_private(known) if cached else None))
    return found


def _registers_elsewhere(ep: Any, data: bytes) -> bool:
    """Whether the entry point's module (``data``) calls ``X.register(...)`` on an ``X`` that is not a plugin
    registry (:data:`VARIABLES`), or another Python file of its distribution calls ``register(`` at all (read as
    bytes, not parsed: a helper module may register an optimizer when the plugin imports it)."""
    try:
        tree = ast.parse(data)
    except SyntaxError:
        return True
    aliases = set(_registry_aliases(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register":
            receiver = node.func.value
            if (receiver.id if isinstance(receiver, ast.Name) else
                    receiver.attr if isinstance(receiver, ast.Attribute) else "") not in aliases:
                return True
    own = ep.module.replace(".", "/") + ".py"
    for file in (ep.dist.files or []) if ep.dist else []:
        if file.suffix == ".py" and str(file) != own:
            try:
                if b"register(" in Path(file.locate()).read_bytes():
                    return True
            except OSError:
                return True
    return False


def _trusted(cache: Path, module: str, known: dict, declared: dict[str, dict[str, str]], dynamic: set[str],
             shipped: dict[str, set[str]]) -> bool:
    """Whether the cached entry ``known`` of ``module`` (its sha256 matching) says what the module's code can
    register: every name its code registers literally (``declared``, from :func:`scan`), no other name except of a
    kind it registers under computed names (``dynamic``), and no name that a shipped module holds (``shipped``:
    ``{kind: names}``). A cache that disagrees is not used (the names are read from the module's code, and the entry
    is written again when the module is next imported) and a warning names the file."""
    entries = known.get("entries")
    if not (isinstance(entries, dict) and all(k in KINDS and isinstance(v, dict) and
                                              all(isinstance(n, str) and isinstance(d, str) for n, d in v.items())
                                              for k, v in entries.items())):
        problem = "its entries are not {kind: {name: summary}}"
    else:
        problem = next((f"it {verb} {kind} {name!r}{why}" for kind in KINDS for verb, names, why in (
            ("hides", set(declared.get(kind, {})) - set(entries.get(kind, {})), ", which the module's code registers"),
            ("claims", set(entries.get(kind, {})) & shipped.get(kind, set()), ", which clbench ships"),
            ("claims", set() if kind in dynamic else set(entries.get(kind, {})) - set(declared.get(kind, {})),
             ", which the module's code does not register")) for name in sorted(names)), None)
    if problem is not None:
        log.warning("the plugin index cache %s is not used for plugin module %s: %s; its names are read from the "
                    "module's code instead (delete the file, or it is rewritten when the module is next imported).",
                    cache, module, problem)
    return problem is None


def _cached_private(known: dict) -> dict[str, dict] | None:
    """The ``private`` flags of a trusted cache entry's strategies (``{name: {"private": bool, "depends": {module:
    sha256}}}``, :func:`_save_cache`), kept only for names the entry declares; None when the entry has none or
    they are not of that form (the flags are then left to the full check, after the import)."""
    flags, names = known.get("private"), known["entries"].get("strategy", {})
    if not (isinstance(flags, dict) and all(
            name in names and isinstance(flag, dict) and isinstance(flag.get("private"), bool)
            and isinstance(flag.get("depends"), dict)
            and all(isinstance(m, str) and isinstance(s, str) for m, s in flag["depends"].items())
            for name, flag in flags.items())):
        return None
    return flags


def private_flag(name: str) -> tuple[bool, str] | None:
    """Whether the strategy ``name`` of an installed plugin module not imported yet declares ``private = True``, and
    where this was read: the package's plugin index cache (a trusted entry whose modules the flag comes from, the
    class's or a base class's, are unchanged: :func:`_save_cache`), else the module's code (:func:`_code_private`);
    None when neither settles it (the full check decides, after the import)."""
    for source in sources():
        if source.imported or source.origin == "shipped" or name not in source.declared.get("strategy", {}):
            continue
        flag = (source.private or {}).get(name)
        if flag is not None and all(_module_sha256(module) == sha for module, sha in flag["depends"].items()):
            return flag["private"], f"the plugin index cache {source.cache}; delete that file if it is out of date"
        found = _code_private(source, name)
        return None if found is None else (found, f"the code of {source.path}")
    return None


def _code_private(source: Source, name: str) -> bool | None:
    """Whether the class that ``source``'s code registers as strategy ``name`` (``@STRATEGIES.register(name)`` on a
    class statement of the module) sets ``private = True``, read from the code of the module and of its bases
    (:func:`clbench.class_literal.class_literal`: shipped files, installed plugin modules and files of the module's
    own package, not imported); None when the code does not settle it: a package's first refusal of ``dp:`` on a
    strategy that cannot train privately needs no import."""
    from clbench.class_literal import UNSET, class_literal

    if source.path is None:
        return None
    try:
        tree = ast.parse(source.path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    aliases = _registry_aliases(tree)

    def registers(decorator: ast.expr, kind: str | None = None, wanted: str | None = None) -> bool:
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "register" and len(decorator.args) == 1
                and isinstance(decorator.args[0], ast.Constant)):
            return False
        receiver = decorator.func.value
        variable = aliases.get(receiver.id if isinstance(receiver, ast.Name) else
                               receiver.attr if isinstance(receiver, ast.Attribute) else "")
        return variable is not None and kind in (None, VARIABLES[variable]) and wanted in (None,
                                                                                            decorator.args[0].value)

    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)
               and any(registers(d, "strategy", name) for d in node.decorator_list)]
    if len(classes) != 1:
        return None
    files = {**{s.module: s.path for s in sources() if s.origin != "shipped" and s.path}, **dict(shipped_modules())}
    value = class_literal(lambda module: files.get(module) or _beside(source, module), source.module, classes[0],
                          "private", registers)
    return None if value is None or value is UNSET else bool(value)


def _beside(near: Source, module: str) -> Path | None:
    """The file of ``module`` when it is in the package of the installed plugin module ``near`` (found beside its
    file, not imported); else None."""
    if near.path is None or module.split(".")[0] != near.module.split(".")[0]:
        return None
    root = near.path.parents[near.module.count(".")].joinpath(*module.split("."))
    return next((p for p in (root.with_suffix(".py"), root / "__init__.py") if p.is_file()), None)


def _module_sha256(module: str) -> str | None:
    """The sha256 of an installed plugin module's file (as found at discovery) or of a shipped module's; None for
    any other module."""
    installed = next((s.sha256 for s in sources() if s.origin != "shipped" and s.module == module), None)
    return installed or _sha256_of(module)


def _private_entry(cls: Any) -> dict | None:
    """A strategy class's cache entry for :func:`private_flag`: its ``private`` and the sha256 of the module it comes
    from (the class itself or the base class that sets it); None when that module is neither shipped nor an installed
    plugin module."""
    module = next((k.__module__ for k in cls.__mro__ if "private" in vars(k)), None)
    if module is None:
        return None
    sha = _module_sha256(module)
    return None if sha is None else {"private": bool(cls.private), "depends": {module: sha}}


def cache_file(distribution: str, version: str) -> Path:
    """Where the index of an installed distribution's plugin modules is cached: ``$CLBENCH_CACHE`` (else
    ``$XDG_CACHE_HOME/clbench``, else ``~/.cache/clbench``) ``/plugin_index/<distribution>-<version>.json``, as
    :data:`INDEX_FILE` (``{"modules": {module: {"sha256", "entries": {kind: {name: summary}}, "private": {strategy:
    {"private", "depends"}}}}}``)."""
    root = os.environ.get("CLBENCH_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                   "clbench")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{distribution}-{version}")
    return Path(root, "plugin_index", f"{safe}.json")


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _save_cache(source: Source) -> None:
    """Add ``source``'s entry (the names its imported module registered, with their summaries) to its
    distribution's cached index, written atomically; a cache that cannot be written is skipped (the next start scans
    the module again)."""
    path = source.cache
    entries = {r.kind: {name: r.describe_entry(r._entries[name]) for name, origin in sorted(r.origins.items())
                        if origin == source.module} for r in _tracked}
    strategies = {r.kind: r for r in _tracked}.get("strategy")
    private = {} if strategies is None else {
        name: flag for name, origin in sorted(strategies.origins.items()) if origin == source.module
        and (flag := _private_entry(strategies._entries[name])) is not None}
    modules = {**_read_cache(path), source.module: {"sha256": source.sha256,
                                                    "entries": {k: v for k, v in entries.items() if v},
                                                    "private": private}}
    source.cached, source.private = True, private
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"modules": modules}, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.info("the plugin index cache %s is not written: %s", path, exc)


def scan(source: bytes) -> tuple[dict[str, dict[str, str]], set[str]]:
    """The plugin registrations in a module's code, without running it: ``({kind: {name: summary}}, kinds)`` where
    ``kinds`` are registered with a computed name (``STRATEGIES.register(method + suffix)``). Registries are
    recognized by their variable name (:data:`VARIABLES`), also when imported under another name. A summary is the
    decorated definition's first docstring line or a command's help string; a strategy's names its presets too
    (:func:`strategy_summary`), read from the class's own docstring and literal ``PRESETS = {...}``. Where that is not
    written so, the summary is '' and ``clbench list`` imports the module."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}, set(KINDS)       # importing it reports the error
    names = _registry_aliases(tree)
    summaries = {}          # register call -> one line readable without importing
    with_presets = {}       # the same for a strategy: the line and its presets, where both are written
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            line = (ast.get_docstring(node) or "").split("\n")[0]
            summaries.update({id(d): line for d in node.decorator_list})
            presets = _literal_presets(node) if isinstance(node, ast.ClassDef) and line else None
            if presets is not None:
                with_presets.update({id(d): strategy_summary(line, presets) for d in node.decorator_list})
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
        kind = VARIABLES[variable]
        if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            summary = (with_presets if kind in UNSUMMARIZED else summaries).get(id(node), "")
            declared.setdefault(kind, {})[node.args[0].value] = summary
        else:
            dynamic.add(kind)
    return declared, dynamic


def _registry_aliases(tree: ast.Module) -> dict[str, str]:
    """The names a module reaches the plugin registries by -> their variable (:data:`VARIABLES`): the variables
    themselves and ``from ... import STRATEGIES as S``."""
    names = {variable: variable for variable in VARIABLES}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update({alias.asname: alias.name for alias in node.names
                          if alias.name in VARIABLES and alias.asname})
    return names


def strategy_summary(first_line: str, presets: Iterable[str]) -> str:
    """A strategy's line in ``clbench list``: its docstring's first line and its presets."""
    return f"{first_line} (presets: {', '.join(presets) or 'none'})"


def _literal_presets(node: ast.ClassDef) -> list[str] | None:
    """The keys of the class body's own ``PRESETS = {"cpu": ..., ...}`` (None when it is not a literal with string
    keys, or not in the body: inherited presets are known only after importing)."""
    for statement in node.body:
        target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else \
            statement.target if isinstance(statement, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "PRESETS":
            keys = statement.value.keys if isinstance(statement.value, ast.Dict) else [None]
            return [k.value for k in keys] if all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                  for k in keys) else None
    return None


# ----------------------------------------------------------------------------------------------------------- index
def _read_index() -> dict:
    try:
        return json.loads(INDEX_FILE.read_text())["modules"]
    except (OSError, ValueError, KeyError):
        return {}


def build_index() -> dict:
    """The index of the shipped plugin modules: ``{"modules": {module: {"sha256", "entries": {kind: {name:
    summary}}, "records": {kind: {name: record}}}}}``, made by importing every one of them (:func:`write_index` saves
    it as :data:`INDEX_FILE`). A record (:data:`clbench.recorded.RECORDERS`: a strategy's Config declarations, a
    scenario's sizes) names the sha256 of each module it ``depends`` on."""
    from clbench.recorded import RECORDERS  # imports clbench.config: only when the index is built

    files = dict(shipped_modules())
    modules = {}
    for module, path in shipped_modules():
        data = path.read_bytes()
        if b"register(" not in data:
            continue
        declared, dynamic = scan(data)
        if (declared or dynamic) and not import_plugin(module):
            raise PluginError(f"plugin {module!r} failed to load: {UNAVAILABLE[module]}")
        modules[module] = {"sha256": hashlib.sha256(data).hexdigest(), "entries": {}}
    for registry in _tracked:
        for name, origin in sorted(registry.origins.items()):
            if origin in modules:
                entry = registry._entries[name]
                modules[origin]["entries"].setdefault(registry.kind, {})[name] = registry.describe_entry(entry)
                found = RECORDERS[registry.kind](name, entry) if registry.kind in RECORDERS else None
                if found is not None:
                    found["depends"] = {m: hashlib.sha256(files[m].read_bytes()).hexdigest()
                                        for m in found["depends"] if m in files}
                    modules[origin].setdefault("records", {}).setdefault(registry.kind, {})[name] = found
    return {"modules": modules}


def write_index(path: Path = INDEX_FILE) -> None:
    """Write :func:`build_index` to ``path`` (``make lists``)."""
    path.write_text(json.dumps(build_index(), indent=1, sort_keys=True, ensure_ascii=False) + "\n")


__all__ = ["ENTRY_POINT_GROUP", "ENV", "FAILED_NAMES", "INDEX_FILE", "KINDS", "UNAVAILABLE", "VARIABLES",
           "PluginError", "Source", "build_index", "cache_file", "declared", "failure", "holder", "import_plugin",
           "load_declaring", "load_dynamic", "load_plugin", "load_plugins", "module_declaring", "only_shipped",
           "private_flag", "record", "registering", "scan", "shipped_modules", "sources", "strategy_summary", "track",
           "write_index"]
