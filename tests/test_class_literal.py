"""clbench.class_literal: a class attribute's literal value read from source files without importing them. Where it
answers, the answer is what importing the files gives (checked by importing them); where the text could lie, it
answers None."""

from __future__ import annotations

import ast
import importlib
import itertools
import sys
import textwrap
from pathlib import Path

import pytest

from clbench.class_literal import UNSET, class_literal

_count = itertools.count()


def _package(tmp_path: Path, files: dict[str, str]) -> tuple[str, dict[str, Path]]:
    """``files`` (``{"": __init__, "mod": code, "sub/x": code}``, ``PKG`` standing for the package's name) written as
    a fresh package; its name and the module -> file map."""
    name = f"cl_literal_{next(_count)}"
    found = {}
    for relative, code in files.items():
        parts = [name, *relative.split("/")] if relative else [name, "__init__"]
        path = tmp_path.joinpath(*parts).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code.replace("PKG", name)))
        found[".".join(p for p in parts if p != "__init__")] = path
    for folder in [tmp_path / name, *(tmp_path / name).rglob("*/")]:
        if folder.is_dir():
            (folder / "__init__.py").touch()
            found.setdefault(".".join(folder.relative_to(tmp_path).parts), folder / "__init__.py")
    return name, found


def _registration(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "register"


def _read(tmp_path: Path, files: dict[str, str], module: str, cls: str) -> tuple[object, object]:
    """``(class_literal's answer, getattr after importing)`` for ``<package>.<module>.<cls>``."""
    name, found = _package(tmp_path, files)
    answer = class_literal(found.get, f"{name}.{module}", cls, "private", _registration)
    sys.path.insert(0, str(tmp_path))
    try:
        imported = getattr(getattr(importlib.import_module(f"{name}.{module}"), cls), "private", UNSET)
    finally:
        sys.path.remove(str(tmp_path))
        for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[loaded]
    return answer, imported


REGISTRY = """
class _Registry:
    def register(self, name):
        return lambda cls: cls
STRATEGIES = _Registry()
"""

ANSWERED = {
    "own literal": ({"m": "class A:\n    private = True\n"}, True),
    "annotated": ({"m": "from typing import ClassVar\nclass A:\n    private: ClassVar[bool] = False\n"}, False),
    "from a base of the same file": ({"m": "class B:\n    private = True\nclass A(B):\n    x = 1\n"}, True),
    "the subclass's own value first": ({"m": "class B:\n    private = True\nclass A(B):\n    private = False\n"},
                                       False),
    "from an imported module": ({"base": "class B:\n    private = True\n",
                                 "m": "from PKG.base import B\nclass A(B):\n    pass\n"}, True),
    "through `import x.y as z`": ({"base": "class B:\n    private = True\n",
                                   "m": "import PKG.base as b\nclass A(b.B):\n    pass\n"}, True),
    "through `import x.y`": ({"base": "class B:\n    private = True\n",
                              "m": "import PKG.base\nclass A(PKG.base.B):\n    pass\n"}, True),
    "a relative import": ({"base": "class B:\n    private = True\n",
                           "m": "from .base import B\nclass A(B):\n    pass\n"}, True),
    "a package's re-export": ({"": "from .base import B\n", "base": "class B:\n    private = True\n",
                               "m": "from PKG import B\nclass A(B):\n    pass\n"}, True),
    "a mixin that sets nothing": ({"m": "class M:\n    def f(self):\n        return 1\nclass B:\n    private = True\n"
                                        "class A(M, B):\n    pass\n"}, True),
    "bases that agree": ({"m": "class B:\n    private = True\nclass C:\n    private = True\nclass A(B, C):\n"
                               "    pass\n"}, True),
    "registration decorators": ({"reg": REGISTRY, "m": "from PKG.reg import STRATEGIES\n@STRATEGIES.register('b')\n"
                                 "class B:\n    private = False\n@STRATEGIES.register('a')\nclass A(B):\n    pass\n"},
                                False),
    "not set anywhere": ({"m": "class A:\n    pass\n"}, UNSET),
    "object as a base": ({"m": "class A(object):\n    pass\n"}, UNSET),
    "another attribute set dynamically": ({"m": "class A:\n    private = True\n"
                                           "setattr(A, 'other', 1)\n"}, True),
    "an instance attribute set in a method": ({"m": "class A:\n    private = True\n    def f(self):\n"
                                               "        self.other = 1\n"}, True),
    "set after a method": ({"m": "class B:\n    private = False\nclass A(B):\n    def f(self):\n        return 1\n"
                                 "    private = True\n"}, True),
    "set after another attribute": ({"m": "class A:\n    x = 1\n    private = True\n"}, True),
    "beside an unrelated `from . import`": ({"base": "", "m": "from . import base\nclass A:\n    private = True\n"},
                                           True),
    "a sub-package's parent-relative re-export": ({"base": "class B:\n    private = True\n",
                                                   "sub/__init__": "from ..base import B\n",
                                                   "m": "from PKG.sub import B\nclass A(B):\n    pass\n"}, True),
    "a chain of 32 classes": ({"m": "class C0:\n    private = True\n" + "".join(
        f"class C{i}(C{i - 1}):\n    pass\n" for i in range(1, 32)) + "class A(C31):\n    pass\n"}, True),
}


@pytest.mark.parametrize("files, expected", ANSWERED.values(), ids=ANSWERED.keys())
def test_where_it_answers_the_answer_is_the_imported_value(tmp_path, files, expected):
    assert _read(tmp_path, files, "m", "A") == (expected, expected)


UNSETTLED = {
    "a decorator that may set it": "def d(cls):\n    cls.extra = 1\n    return cls\n@d\nclass A:\n    private = "
                                   "False\n",
    "a decorator on a base": "def d(cls):\n    return cls\n@d\nclass B:\n    private = False\nclass A(B):\n    pass\n",
    "a metaclass": "class Meta(type):\n    pass\nclass A(metaclass=Meta):\n    private = False\n",
    "__init_subclass__ in a base": "class B:\n    private = False\n    def __init_subclass__(cls):\n"
                                   "        cls.private = True\nclass A(B):\n    pass\n",
    "__init_subclass__ calling a helper of another file": "from PKG.helper import mark\nclass B:\n    private = False\n"
                                                          "    def __init_subclass__(cls):\n        mark(cls)\n"
                                                          "class A(B):\n    pass\n",
    "set on the class after it": "class A:\n    private = False\nA.private = True\n",
    "deleted from the class": "class B:\n    private = True\nclass A(B):\n    private = False\ndel A.private\n",
    "setattr": "class A:\n    private = False\nsetattr(A, 'private', True)\n",
    "type.__setattr__": "class A:\n    private = False\ntype.__setattr__(A, 'private', True)\n",
    "delattr": "class B:\n    private = True\nclass A(B):\n    private = False\ndelattr(A, 'private')\n",
    "setattr with a computed name": "class A:\n    private = False\nname = 'priv' + 'ate'\nsetattr(A, name, True)\n",
    "a non-literal value": "def f():\n    return True\nclass A:\n    private = f()\n",
    "set twice": "class A:\n    private = False\n    private = True\n",
    "set under a condition": "import os\nclass A:\n    private = False\n    if os.sep:\n        private = True\n",
    "a walrus": "class A:\n    private = False\n    flag = (private := True)\n",
    "a property": "class A:\n    @property\n    def private(self):\n        return True\n",
    "a name bound twice": "class B:\n    private = False\nclass B:\n    private = True\nclass A(B):\n    pass\n",
    "a base rebound": "class B:\n    private = False\nB = type('B', (), {'private': True})\nclass A(B):\n    pass\n",
    "a base redefined under an if": "class B:\n    private = False\nif True:\n    class B:\n        private = True\n"
                                    "class A(B):\n    pass\n",
    "a base rebound by an import under an if": "class B:\n    private = False\nif True:\n    from PKG.base import B\n"
                                               "class A(B):\n    pass\n",
    "a module alias rebound by an assignment": "import PKG.base as b\nimport PKG.other\nb = PKG.other\n"
                                               "class A(b.B):\n    pass\n",
    "a module alias imported twice": "import PKG.other as b\nclass A(b.B):\n    pass\nimport PKG.base as b\n",
    "a module alias rebound by a from-import": "import PKG.base as b\nfrom PKG import other as b\n"
                                               "class A(b.B):\n    pass\n",
    "bases that disagree": "class B:\n    private = False\nclass C:\n    private = True\nclass A(B, C):\n    pass\n",
    "a base from a module without a file": "from collections import OrderedDict\nclass A(OrderedDict):\n    pass\n",
    "a subscripted base, even with the body's own value": "from typing import Generic, TypeVar\nT = TypeVar('T')\n"
                                                          "class A(Generic[T]):\n    private = True\n",
    "a base's __init_subclass__ in another file": "from PKG.hidden import B\nclass A(B):\n    private = False\n",
    "a chain of 33 classes": "class C0:\n    private = True\n" + "".join(
        f"class C{i}(C{i - 1}):\n    pass\n" for i in range(1, 33)) + "class A(C32):\n    pass\n",
}
BESIDE = {"base": "class B:\n    private = True\n", "other": "class B:\n    private = False\n",
          "hidden": "class B:\n    def __init_subclass__(cls):\n        cls.private = True\n",
          "helper": "def mark(cls):\n    setattr(cls, 'private', True)\n"}
"""Modules the cases of :data:`UNSETTLED` may import: where a naive reading would answer, it answers wrong."""


@pytest.mark.parametrize("code", UNSETTLED.values(), ids=UNSETTLED.keys())
def test_where_the_text_could_lie_it_does_not_answer(tmp_path, code):
    answer, _ = _read(tmp_path, {**BESIDE, "m": code}, "m", "A")
    assert answer is None


@pytest.mark.parametrize("module", ["m", "sub.m"])
def test_a_package_that_sets_it_on_import_is_not_answered(tmp_path, module):
    """Each package's ``__init__`` runs before the module and may change the class."""
    folder = module.rpartition(".")[0]
    init = f"{folder}/__init__" if folder else ""
    code = f"import sys\nimport PKG.{module}\nsetattr(sys.modules['PKG.{module}'].A, 'private', True)\n"
    assert _read(tmp_path, {init: code, module.replace(".", "/"): "class A:\n    private = False\n"}, module,
                 "A") == (None, True)


def test_an_unreadable_or_missing_file_is_not_answered(tmp_path):
    assert class_literal(lambda module: None, "nowhere", "A", "private") is None
    broken = tmp_path / "broken.py"
    broken.write_text("class A(:\n")
    assert class_literal({"broken": broken}.get, "broken", "A", "private") is None
    loop = tmp_path / "loop.py"
    loop.write_text("from loop import A\n")
    assert class_literal({"loop": loop}.get, "loop", "A", "private") is None
