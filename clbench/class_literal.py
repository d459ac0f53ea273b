"""A class attribute's literal value read from source files, without importing them.

:func:`class_literal` answers "what does ``getattr(cls, attribute)`` give" for a class written in a file, through its
bases (classes of the same file, or of other files reached by the file's top-level ``import`` / ``from ... import``
lines), as long as the answer is certain from the text: the first class of the method resolution order whose body
sets the attribute to a literal (``private = True``, ``private: ClassVar[bool] = False``). It gives up (None) on
anything that could make the text lie: a class decorator the caller does not allow (it allows registrations), a
metaclass or ``__init_subclass__``, ``setattr`` or an assignment to ``X.<attribute>`` anywhere in a file read, a
non-literal value, a name bound twice, a base it cannot find or read (``Generic[T]``, a module it has no file for),
or bases that disagree. Giving up only costs time: the caller imports the module and reads the attribute.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

UNSET = object()     # the class and its bases do not set the attribute (getattr would raise)
MAX_DEPTH = 32       # bases and re-exports followed before giving up


class Unknown(Exception):
    """The text does not settle the value."""


def class_literal(locate: Callable[[str], Path | None], module: str, class_name: str, attribute: str,
                  allowed_decorators: Callable[[ast.expr], bool] = lambda d: False) -> Any:
    """``getattr(<module>.<class_name>, attribute)`` read from source: the literal value, :data:`UNSET`, or None when
    the text does not settle it. ``locate`` maps a module name to its file (None: no file to read; importing it is
    the caller's business); ``allowed_decorators`` accepts the class decorators (of ``class_name`` and of its
    bases) that cannot change the attribute (a registration); any other decorator leaves the value unsettled."""
    reader = _Reader(locate, attribute, allowed_decorators)
    try:
        for i in range(1, module.count(".") + 1):        # its packages, run first on import, may set it too
            if locate(package := module.rsplit(".", i)[0]) is not None:
                reader.tree(package)
        return reader.value(module, class_name, 0)
    except (Unknown, OSError, SyntaxError, ValueError):
        return None


class _Reader:
    def __init__(self, locate: Callable[[str], Path | None], attribute: str,
                 allowed: Callable[[ast.expr], bool]) -> None:
        self.locate, self.attribute, self.allowed = locate, attribute, allowed
        self.trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        """``module``'s syntax tree; :class:`Unknown` when it has no file or may set the attribute from outside a
        class body."""
        if module not in self.trees:
            path = self.locate(module)
            if path is None:
                raise Unknown
            tree = ast.parse(path.read_bytes())
            if any(self.sets_dynamically(node) for node in ast.walk(tree)):
                raise Unknown
            self.trees[module] = tree
        return self.trees[module]

    def sets_dynamically(self, node: ast.AST) -> bool:
        """``X.<attribute> = ...`` / ``del X.<attribute>``, or ``setattr`` / ``__setattr__`` / ``delattr`` called
        with that name or a name not written as a literal."""
        if isinstance(node, ast.Attribute):
            return node.attr == self.attribute and isinstance(node.ctx, (ast.Store, ast.Del))
        if isinstance(node, ast.Call):
            func = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if func in ("setattr", "__setattr__", "delattr", "__delattr__"):
                names = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                return not names or any(a.value == self.attribute for a in names)
        return False

    def value(self, module: str, name: str, depth: int) -> Any:
        """The attribute's value on class ``name`` of ``module`` (followed through re-exports), ``depth`` classes
        and re-exports below the one asked for."""
        if depth > MAX_DEPTH:
            raise Unknown
        binding = self.binding(module, name)
        if binding is None:                                 # the built-in object
            return UNSET
        if isinstance(binding, tuple):                      # from M import X: the class is M's
            return self.value(*binding, depth + 1)
        if binding.keywords or not all(self.allowed(d) for d in binding.decorator_list):
            raise Unknown                                   # a metaclass or a decorator
        # the bases are read even when the body sets it: a base's __init_subclass__ could set it after the body
        found = {self.base_value(module, base, depth + 1) for base in binding.bases} - {UNSET}
        own = self.own(binding)
        if own is not UNSET:
            return own
        if len(found) > 1:
            raise Unknown                                   # bases that disagree: the order of resolution decides
        return found.pop() if found else UNSET

    def own(self, node: ast.ClassDef) -> Any:
        """The value the class body itself sets, or :data:`UNSET`; :class:`Unknown` unless it is set at most once,
        by ``<attribute> = <literal>``, and no ``__init_subclass__`` (which can set it on subclasses) is defined."""
        value = UNSET
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if statement.name in (self.attribute, "__init_subclass__"):
                    raise Unknown
                continue
            bound = [n for n in ast.walk(statement) if isinstance(n, ast.Name) and n.id == self.attribute
                     and isinstance(n.ctx, (ast.Store, ast.Del))]
            if not bound:
                continue
            target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else \
                statement.target if isinstance(statement, ast.AnnAssign) else None
            if value is not UNSET or len(bound) != 1 or not isinstance(target, ast.Name) or \
                    not isinstance(statement.value, ast.Constant):
                raise Unknown
            value = statement.value.value
        return value

    def base_value(self, module: str, base: ast.expr, depth: int) -> Any:
        """The attribute's value on the base class written ``base`` in ``module``: a name, or ``a.b.X`` through a
        top-level ``import``."""
        if isinstance(base, ast.Name):
            return self.value(module, base.id, depth)
        head, _, rest = _dotted(base).partition(".")
        imported = self.imports(module).get(head)
        if imported is None:
            raise Unknown
        target, _, name = f"{imported}.{rest}".rpartition(".")
        return self.value(target, name, depth)

    def binding(self, module: str, name: str) -> ast.ClassDef | tuple[str, str] | None:
        """What ``name`` is at the top level of ``module``: its class statement, ``(module, name)`` it is imported
        from, or None for the built-in ``object``; :class:`Unknown` when it is bound otherwise or more than once."""
        found: list[ast.ClassDef | tuple[str, str]] = []
        package = self.is_package(module)
        for statement in self.tree(module).body:
            if isinstance(statement, ast.ClassDef) and statement.name == name:
                found.append(statement)
            elif isinstance(statement, ast.ImportFrom):
                source = _absolute(module, statement, package)
                found += [(source, alias.name) for alias in statement.names if (alias.asname or alias.name) == name]
            elif name in _bindings(statement):
                raise Unknown
        if name == "object" and not found:
            return None
        if len(found) != 1:
            raise Unknown
        return found[0]

    def imports(self, module: str) -> dict[str, str | None]:
        """Top-level ``import a.b`` / ``import a.b as c``: the bound name -> the module it names (``a`` for the
        first); None for a name bound otherwise (as well)."""
        names: dict[str, str | None] = {}
        for statement in self.tree(module).body:
            if isinstance(statement, ast.Import):
                for bound, named in _imported(statement):
                    names[bound] = named if names.get(bound, named) == named else None
            else:
                names.update(dict.fromkeys(_bindings(statement)))
        return names

    def is_package(self, module: str) -> bool:
        path = self.locate(module)
        return path is not None and path.name == "__init__.py"


def _absolute(module: str, statement: ast.ImportFrom, package: bool) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``module`` (a package when
    ``package``: its ``__init__``)."""
    if not statement.level:
        return str(statement.module)
    parts = module.split(".")[:len(module.split(".")) - statement.level + (1 if package else 0)]
    if not parts:
        raise Unknown                                       # above the top package
    return ".".join(parts + ([statement.module] if statement.module else []))


def _dotted(node: ast.expr) -> str:
    """``a.b.X`` of an attribute chain; :class:`Unknown` for any other expression (``Generic[T]``, a call)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise Unknown


def _imported(statement: ast.Import) -> list[tuple[str, str]]:
    """``(bound name, module)`` of each name of an ``import``: ``import a.b`` binds ``a`` to module ``a``,
    ``import a.b as c`` binds ``c`` to ``a.b``."""
    return [(a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2 for a in statement.names]


def _bindings(statement: ast.stmt) -> set[str]:
    """The names a top-level statement binds (those bound inside it too: under an ``if``, a ``try``...)."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, ast.Import):
        return {bound for bound, _ in _imported(statement)}
    if isinstance(statement, ast.ImportFrom):
        return {a.asname or a.name for a in statement.names}
    return set().union(*(_bindings(n) for n in ast.iter_child_nodes(statement) if isinstance(n, ast.stmt))) | \
        {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


__all__ = ["UNSET", "class_literal"]
