"""Optional packages that third-party code imports whether it uses them or not: a missing or broken one must not
break the runs that do not need it.

Avalanche imports W&B (``avalanche/evaluation/metrics/confusion_matrix.py``: ``import wandb``) and TensorBoard
(``avalanche/logging/tensorboard_logger.py``: ``from torch.utils.tensorboard import SummaryWriter``) when
``avalanche.training`` is imported, so without this guard every Avalanche strategy fails when either package is
not installed or fails at import. :func:`install` (done by ``import clbench``) puts a finder first on
``sys.meta_path`` for the modules of :data:`GUARDED`: when one cannot be found or its import raises, the import
succeeds with a stand-in module, the cause is kept (:func:`failure`), and calling any of the stand-in's names
(``wandb.init(...)``, ``SummaryWriter(...)``) raises ``ImportError`` with that cause. Only the callbacks that need
the package (``wandb``, ``tensorboard``) then refuse, in the pre-flight (:mod:`clbench.preflight`), with one line.
So ``importlib.util.find_spec("wandb")`` finds a spec even when wandb is not installed: ask :func:`failure`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

GUARDED = {"wandb": "wandb", "torch.utils.tensorboard": "tensorboard"}
"""Guarded module -> the pip package that provides it (``torch.utils.tensorboard`` needs ``tensorboard``)."""

FAILURES: dict[str, str] = {}
"""Guarded module -> why it could not be imported (one line), for those that could not."""


def failure(module: str) -> str | None:
    """Why the guarded ``module`` cannot be used (None when it can): imports it first if nothing has yet."""
    if module not in sys.modules and module not in FAILURES:
        try:
            __import__(module)
        except Exception as exc:  # noqa: BLE001 - the guard not installed: any failure is the cause
            FAILURES[module] = _one_line(exc)
    return FAILURES.get(module)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


class _Missing:
    """A name of a stand-in module: importing it works (``from torch.utils.tensorboard import SummaryWriter``), so
    does reaching its attributes; calling it raises ``ImportError`` with the module's cause."""

    def __init__(self, module: str, path: str) -> None:
        self._module, self._path = module, path

    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(self._module, f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        raise ImportError(f"{self._path} cannot be used: {self._module} could not be imported "
                          f"({FAILURES.get(self._module, 'unavailable')}); pip install {GUARDED[self._module]}")

    def __repr__(self) -> str:
        return f"<unavailable {self._path}>"


class _StandIn(types.ModuleType):
    """The module put in place of a guarded one that could not be imported: each public name is a :class:`_Missing`."""

    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(self.__name__, f"{self.__name__}.{name}")


class _Loader(importlib.abc.Loader):
    """Runs the real loader (None: the module is not installed); on failure the module becomes a :class:`_StandIn`."""

    def __init__(self, real: importlib.abc.Loader | None, cause: str | None = None) -> None:
        self.real, self.cause = real, cause

    def __getattr__(self, name: str):
        """Anything else a loader offers (resource readers, ``get_source``) is the real loader's."""
        if self.real is None:
            raise AttributeError(name)
        return getattr(self.real, name)

    def create_module(self, spec):
        return self.real.create_module(spec) if self.real is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            if self.real is None:
                raise ModuleNotFoundError(f"No module named {module.__name__!r}")
            self.real.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure of an optional package leaves a stand-in
            FAILURES[module.__name__] = self.cause or _one_line(exc)
            keep = {k: v for k, v in vars(module).items() if k.startswith("__")}
            vars(module).clear()
            vars(module).update(keep)
            module.__class__ = _StandIn


class _Guard(importlib.abc.MetaPathFinder):
    """Finds the guarded modules through the other finders and wraps their loader in :class:`_Loader`."""

    def find_spec(self, name, path, target=None):
        if name not in GUARDED:
            return None
        real, cause = None, None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                real = finder.find_spec(name, path, target)
            except Exception as exc:  # noqa: BLE001 - a finder that refuses counts as not found, with its cause
                cause = _one_line(exc)
                break
            if real is not None:
                break
        if real is None or real.loader is None:
            return importlib.machinery.ModuleSpec(name, _Loader(None, cause))
        real.loader = _Loader(real.loader)
        return real


def install() -> None:
    """Put the guard first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Guard) for f in sys.meta_path):
        sys.meta_path.insert(0, _Guard())


__all__ = ["FAILURES", "GUARDED", "failure", "install"]
