"""The code a run depends on, as one short hash stored in its record (resume reruns a record whose code changed).

:func:`code_fingerprint` hashes the strategy's module, the scenario's module and the runner core (:data:`CORE`),
with every module of the ``clbench`` package, of a plugin's own top-level package and from outside the installed
trees (a plugin file's helper module beside it) they import, transitively — found by reading their import
statements, not by importing them, so the plugin modules the registry loads by name stay out — and every model module
(:data:`LOOKED_UP`: backbones are found by name through ``MODELS``, so no import leads to them). Modules that cannot
change a run's numbers are left out (:data:`EXCLUDED`: the command line, leaderboard, report, progress bars,
executors, plugin discovery: which module registers a name is found there, and that module counts itself).

A module counts by its code: the hash is taken over its syntax tree with the docstrings removed, so editing a
comment, a docstring or the formatting does not make records stale; changing an expression does.

Parsing is the cost (44 modules, 1-2 s a process on the 2-core VM), so what one file gives — its code digest and its
import statements — is kept in a cache file (:func:`cache_path`) keyed by the file's resolved path, size,
modification and status-change times (ns) and inode: any write to the file changes the key and it is parsed again.
The cache is per Python version (``ast.dump`` differs between versions), written atomically (several worker
processes may write it at once; the last one wins, each complete), and an unreadable cache is ignored.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import site
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

PACKAGE = "clbench"
CORE = ("clbench.runner",)          # with what it imports: config, metrics, evaluation, data, environment...
LOOKED_UP = ("clbench.models",)     # packages whose modules are reached through a registry: all of them count
EXCLUDED = frozenset({"clbench.cli", "clbench.executors", "clbench.leaderboard", "clbench.report",
                      "clbench.progress", "clbench.fingerprint", "clbench.commands.pretrain",
                      "clbench.commands.forget", "clbench.plugins"})
_PACKAGE_DIR = Path(__file__).parent


_PINNED: dict[tuple[str, str], str] = {}


def pin(fingerprints: Iterable[tuple[str, str, str]]) -> None:
    """Make :func:`code_fingerprint` answer these ``(strategy, scenario, fingerprint)`` values in this process: a
    worker process records the fingerprints its driver took when the suite started, as a sequential suite does, so
    that resume compares like with like even if files change meanwhile."""
    _PINNED.update({(strategy, scenario): value for strategy, scenario, value in fingerprints})


def code_fingerprint(strategy: str, scenario: str) -> str:
    """The fingerprint of a run of STRATEGIES ``strategy`` on SCENARIOS ``scenario`` (computed once per process,
    or as :func:`pin` set it)."""
    return _PINNED.get((strategy, scenario)) or _computed(strategy, scenario)


SHIPPED = ("clbench", "clbench.strategies", "clbench.scenarios")
"""The packages of one clbench source tree: the core and the folders the installation maps below it."""


def source_trees() -> dict[str, Path]:
    """``{package: source tree}`` of :data:`SHIPPED`: the folder holding ``clbench/`` (or the mapped
    ``strategies/`` / ``scenarios/``) each package is imported from (or would be, when not imported yet)."""
    core = _package_folders(PACKAGE)[0]
    trees = {}
    for package in SHIPPED:
        module = sys.modules.get(package)
        folders = [Path(p) for p in getattr(module, "__path__", [])] if module else _package_folders(package)
        folder = folders[0].resolve() if folders else core.resolve()
        trees[package] = folder.parent if folder.parent != core.resolve() else core.resolve().parent
    return trees


def check_one_tree() -> None:
    """Refuse (:class:`~clbench.errors.ConfigError`) code from two source trees in one process: with an editable
    install, running from a second checkout imports ``clbench`` from it and ``clbench.strategies`` /
    ``clbench.scenarios`` from the installed tree; the run would mix two trees' code and fingerprint neither."""
    trees = source_trees()
    if len(set(trees.values())) > 1:
        from clbench.errors import ConfigError

        listed = "; ".join(f"{package} from {tree}" for package, tree in trees.items())
        raise ConfigError(f"clbench's code comes from more than one source tree ({listed}): run from the tree that "
                          f"is installed, or install this one (pip install -e .).")


@functools.cache
def _computed(strategy: str, scenario: str) -> str:
    from clbench.registry import SCENARIOS, STRATEGIES

    check_one_tree()

    looked_up = [f"{package}.{p.stem}" for package in LOOKED_UP
                 for p in sorted(_source_file(package).parent.glob("*.py")) if p.stem != "__init__"]
    return fingerprint_of([STRATEGIES.get(strategy).__module__, SCENARIOS.get(scenario).__module__, *CORE,
                           *looked_up])


def fingerprint_of(modules: Iterable[str]) -> str:
    """16 hex digits of sha256 over ``name:code digest`` of every file :func:`module_files` finds."""
    files = module_files(modules)
    blob = "\n".join(f"{name}:{code_digest(path)}" for name, path in sorted(files.items()))
    _CACHE.save()
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def module_files(roots: Iterable[str]) -> dict[str, Path]:
    """``{module: source file}`` for ``roots`` (any importable modules) and every module they import, transitively,
    that is code of this project or of a plugin: ``clbench``'s (minus :data:`EXCLUDED`), the roots' own top-level
    packages, and any module whose file lies outside the installed trees (:func:`installed`: the standard library and
    site-packages), such as the helper module a plugin file imports from its folder."""
    found: dict[str, Path] = {}
    todo = list(roots)
    packages = {PACKAGE} | {root.partition(".")[0] for root in todo}     # a plugin's own package is followed too
    follows = lambda module: module.partition(".")[0] in packages or _local(module.partition(".")[0])  # noqa: E731
    while todo:
        name = todo.pop()
        if name in found or name in EXCLUDED:
            continue
        path = _source_file(name)
        if path is None:
            continue
        found[name] = path
        todo += [m for m in _imports(name, path, follows) if follows(m)]
    return found


@functools.cache
def _local(top: str) -> bool:
    """Whether the top-level module ``top`` is code outside the installed trees (not the standard library, not
    site-packages, not built in): then a run that imports it depends on it as on its own code."""
    path = _source_file(top)
    return path is not None and not installed(path)


@functools.cache
def _installed_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= set(getattr(site, "getsitepackages", list)()) | {site.getusersitepackages()}
    return tuple(Path(r).resolve() for r in roots if r)


def installed(path: Path) -> bool:
    """Whether ``path`` lies in the standard library or a site-packages folder (installed code, not a project's)."""
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(root) for root in _installed_roots()) or \
        bool({"site-packages", "dist-packages"} & set(resolved.parts))


def _source_file(name: str) -> Path | None:
    if name == PACKAGE or name.startswith(PACKAGE + "."):
        parent, _, leaf = name.rpartition(".")
        candidates = [folder / f"{leaf}.py" for folder in (_package_folders(parent) if parent else [])] + \
                     [folder / "__init__.py" for folder in _package_folders(name)]
        return next((p for p in candidates if p.is_file()), None)
    module = sys.modules.get(name)                  # a strategy or scenario defined outside the package
    try:
        origin = getattr(module, "__file__", None) if module else getattr(importlib.util.find_spec(name), "origin",
                                                                              None)
    except (ImportError, ValueError):
        return None
    return Path(origin) if origin and origin.endswith(".py") else None


def _package_folders(package: str) -> list[Path]:
    """The folders a ``clbench`` package's modules live in: below its parent package's folder, or wherever the
    installation maps it (``clbench.strategies`` is the repository's top-level ``strategies/``)."""
    if package == PACKAGE:
        return [_PACKAGE_DIR]
    parent, _, leaf = package.rpartition(".")
    inside = [folder / leaf for folder in _package_folders(parent) if (folder / leaf / "__init__.py").is_file()]
    return inside or _mapped_folders(package)


@functools.cache
def _mapped_folders(package: str) -> list[Path]:
    """A package's folders from its import spec (found without importing the package itself)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _imports(name: str, path: Path, follows: Callable[[str], bool] = lambda m: m.partition(".")[0] == PACKAGE
             ) -> list[str]:
    """Module names imported anywhere in ``path`` (``from a import b`` gives ``a.b`` when that is a module and ``a``
    is ``follows``-ed, else ``a``); relative imports resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for level, module, names in _CACHE.entry(path)["imports"]:
        if module is None:                                   # import a, b.c
            out += names
            continue
        base = module
        if level:
            parts = package.split(".")[: len(package.split(".")) - level + 1]
            base = ".".join(parts + ([base] if base else []))
        if follows(base):
            out += [f"{base}.{a}" if _source_file(f"{base}.{a}") else base for a in names]
    return out


def code_digest(path: Path) -> str:
    """sha256 of the file's syntax tree without docstrings."""
    return _CACHE.entry(path)["digest"]


def _digest(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def _import_statements(tree: ast.Module) -> list[tuple[int, str | None, list[str]]]:
    """Every import of ``tree`` as ``(level, module, names)``: ``(0, None, [a, b.c])`` for ``import a, b.c``,
    ``(level, module or "", [names])`` for ``from ... import``."""
    out: list[tuple[int, str | None, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.append((0, None, [alias.name for alias in node.names]))
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", [alias.name for alias in node.names]))
    return out


def analysed(source: bytes) -> dict:
    """``{"digest": code digest, "imports": import statements}`` of one file's source (parsed once)."""
    tree = ast.parse(source)
    imports = _import_statements(tree)           # before _digest edits the tree
    return {"digest": _digest(tree), "imports": imports}


CACHE_VERSION = 1


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/clbench-code/fingerprints-<python>-v<CACHE_VERSION>.json`` (``~/.cache`` when unset)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "clbench-code" / f"fingerprints-{sys.implementation.cache_tag}-v{CACHE_VERSION}.json"


class FileCache:
    """:func:`analysed` per file, kept across processes in :func:`cache_path`, keyed by the file's
    :func:`file_key` (module docstring)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict] | None = None
        self.changed = False

    def _load(self) -> dict[str, dict]:
        if self.entries is None:
            try:
                loaded = json.loads(cache_path().read_text())
                self.entries = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self.entries = {}
        return self.entries

    def entry(self, path: Path) -> dict:
        entries = self._load()
        key = file_key(path)
        if key not in entries:
            entries[key] = analysed(path.read_bytes())
            self.changed = True
        return entries[key]

    def save(self) -> None:
        """Write the cache if this process parsed a file (atomically; a cache that cannot be written is skipped),
        keeping only entries of files that still exist unchanged."""
        if not self.changed or self.entries is None:
            return
        self.changed = False
        live = {key: value for key, value in self.entries.items() if _still(key)}
        target = cache_path()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, suffix=".tmp") as handle:
                json.dump(live, handle)
            os.replace(handle.name, target)
        except OSError:
            pass


def file_key(path: Path) -> str:
    """``resolved path|size|mtime_ns|ctime_ns|inode``: changed by any write to the file."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}"


def _still(key: str) -> bool:
    try:
        return file_key(Path(key.split("|", 1)[0])) == key
    except OSError:
        return False


_CACHE = FileCache()
