"""Errors whose messages tell the user what to do."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

from clbench.typecheck import brief, suggest


class NonFiniteLossError(RuntimeError):
    """A training loss or prediction became NaN/inf; the run is marked failed and the suite continues."""

    def __init__(self, where: str, value: float) -> None:
        super().__init__(f"non-finite value ({value}) in {where}. Lower the learning rate, enable gradient "
                         f"clipping, or check the inputs; the run was marked failed and the suite went on.")


class OutputError(RuntimeError):
    """An output file (a record, a leaderboard, a plot) could not be written: a full disk, a read-only or vanished
    folder. Every later write would fail the same way, so the command stops; finished records are kept. The command
    line prints the message as one line and exits with code 2."""

    @classmethod
    def of(cls, path: str | Path, exc: OSError) -> OutputError:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        return cls(f"cannot write {path}: {exc.strerror or exc}; {'free some space' if full else 'check the folder'} "
                   f"and rerun the same command (finished records are kept; it resumes).")


class ConfigError(ValueError):
    """A suite file, hyperparameter set or command-line choice that cannot be used as written; the message says
    what to change. The command line prints it as one line and exits with code 2."""


PLUGIN_HINT = ("If it comes from a plugin, pass --plugins MODULE_OR_FILE (or name it under the suite's plugins:) "
               "or install its package.")
"""The end of an unknown-name error of a plugin registry (:meth:`clbench.registry.Registry.get`): a name of one's
own is unknown until its module is loaded."""


def check_keys(where: str, given: dict, known: Iterable[str]) -> None:
    """A :class:`ConfigError` naming ``where`` for the first key of ``given`` that is not in ``known``."""
    known = list(known)
    for key in given:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {brief(key)}.{suggest(str(key), known)} "
                              f"Allowed keys: {', '.join(known)}.")
