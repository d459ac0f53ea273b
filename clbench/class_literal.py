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
    except (Unknown, OSError, SyntaxError, ValueError, RecursionError):
        return None


class _Reader:
    def __init__(self, locate: Callable[[str], Path | None], attribute: str,
                 allowed: Callable[[ast.expr], bool]) -> None:
        self.locate, self.attribute, self.allowed = locate, attribute, allowed
        self.trees: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self.trees:
            path = self.locate(module)
            if path is None:
                raise Unknown(module)
            tree = ast.parse(path.read_bytes())
            if any(self.sets_dynamically(node) for node in ast.walk(tree)):
                raise Unknown(f"{module} may set {self.attribute} from outside a class body")
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
        """The attribute's value on class ``name`` of ``module`` (followed through re-exports)."""
        if depth > MAX_DEPTH:
            raise Unknown("too deep")
        if module == "builtins" and name == "object":
            return UNSET
        binding = self.binding(module, name)
        if isinstance(binding, tuple):                      # from M import X: the class is M's
            return self.value(*binding, depth + 1)
        node = binding
        if node.keywords or not all(self.allowed(d) for d in node.decorator_list):
            raise Unknown(f"{name}: a metaclass or decorator")
        found = {self.base_value(module, base, depth) for base in node.bases} - {UNSET}   # read even when the
        own = self.own(node)                    # body sets it: a base's __init_subclass__ could set it after
        if own is not UNSET:
            return own
        if len(found) > 1:
            raise Unknown(f"{name}: its bases disagree")
        return found.pop() if found else UNSET

    def own(self, node: ast.ClassDef) -> Any:
        """The value the class body itself sets, or :data:`UNSET`."""
        value = UNSET
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if statement.name in (self.attribute, "__init_subclass__"):
                    raise Unknown(f"{node.name}.{statement.name}")
                continue
            bound = [n for n in ast.walk(statement) if isinstance(n, ast.Name) and n.id == self.attribute
                     and isinstance(n.ctx, (ast.Store, ast.Del))]
            if not bound:
                continue
            literal = statement.value if isinstance(statement, ast.AnnAssign) or isinstance(statement, ast.Assign) \
                and len(statement.targets) == 1 else None
            if value is not UNSET or len(bound) != 1 or not isinstance(literal, ast.Constant) or \
                    not isinstance(statement.targets[0] if isinstance(statement, ast.Assign) else statement.target,
                                   ast.Name):
                raise Unknown(f"{node.name}.{self.attribute} is not set once to a literal")
            value = literal.value
        return value

    def base_value(self, module: str, base: ast.expr, depth: int) -> Any:
        if isinstance(base, ast.Name):
            return self.value(module, base.id, depth + 1)
        dotted = _dotted(base)
        if dotted is None:
            raise Unknown("a base that is not a name")
        head, _, rest = dotted.partition(".")
        imported = self.imports(module).get(head)
        if not rest or not isinstance(imported, str):
            raise Unknown(dotted)
        target, _, name = f"{imported}.{rest}".rpartition(".")
        return self.value(target, name, depth + 1)

    def binding(self, module: str, name: str) -> ast.ClassDef | tuple[str, str]:
        """What ``name`` is at the top level of ``module``: its class statement, or ``(module, name)`` it is
        imported from; raises :class:`Unknown` when it is bound otherwise or more than once."""
        tree = self.tree(module)
        found: list[ast.ClassDef | tuple[str, str]] = []
        for statement in tree.body:
            if isinstance(statement, ast.ClassDef) and statement.name == name:
                found.append(statement)
            elif isinstance(statement, ast.ImportFrom):
                source = _absolute(module, statement, self.is_package(module))
                found += [(source, alias.name) for alias in statement.names if (alias.asname or alias.name) == name]
            elif name in _bindings(statement):
                raise Unknown(f"{module}.{name} is not a class statement")
        if name == "object" and not found:
            return "builtins", "object"
        if len(found) != 1:
            raise Unknown(f"{module}.{name} bound {len(found)} times")
        return found[0]

    def imports(self, module: str) -> dict[str, str | None]:
        """Top-level ``import a.b`` / ``import a.b as c``: the bound name -> the module it names (``a`` for the
        first); None for a name bound otherwise (as well)."""
        names: dict[str, str | None] = {}
        for statement in self.tree(module).body:
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    bound, named = (alias.asname, alias.name) if alias.asname else (alias.name.split(".")[0],) * 2
                    names[bound] = named if names.get(bound, named) == named else None
                continue
            bound = {statement.name} if isinstance(statement, ast.ClassDef) else \
                {a.asname or a.name for a in statement.names} if isinstance(statement, ast.ImportFrom) else \
                _bindings(statement)
            names.update(dict.fromkeys(bound))
        return names

    def is_package(self, module: str) -> bool:
        path = self.locate(module)
        return path is not None and path.name == "__init__.py"


def _absolute(module: str, statement: ast.ImportFrom, package: bool) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``module``."""
    if not statement.level:
        return statement.module or ""
    parts = module.split(".")[:len(module.split(".")) - statement.level + (1 if package else 0)]
    if not parts:
        raise Unknown("a relative import above the top package")
    return ".".join(parts + ([statement.module] if statement.module else []))


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _bound(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _bindings(statement: ast.stmt) -> set[str]:
    """Names a top-level statement other than a class statement or ``from ... import`` binds."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {statement.name}
    if isinstance(statement, ast.Import):
        return {(a.asname or a.name.split(".")[0]) for a in statement.names}
    if isinstance(statement, (ast.ClassDef, ast.ImportFrom)):
        return set()
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | \
        {a.asname or a.name for n in ast.walk(statement) if isinstance(n, (ast.Import, ast.ImportFrom))
         for a in n.names} | {n.name for n in ast.walk(statement) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


__all__ = ["UNSET", "class_literal"]
