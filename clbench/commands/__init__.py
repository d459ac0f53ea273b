"""Every ``clbench`` sub-command, one short module each; :mod:`clbench.cli` is only the parser and the dispatch.

A module registers its :class:`Command` into :data:`clbench.registry.COMMANDS` (found by the registry's discovery of
shipped modules, so only the chosen command's module is imported): :mod:`.run` (``run``, the default),
:mod:`.lists` (``list``), :mod:`.leaderboard` (``leaderboard``), :mod:`.report` (``report``), :mod:`.config`
(``config``), :mod:`.analyze` (``analyze``), :mod:`.pretrain` (``pretrain``) and :mod:`.forget` (``forget``). A
plugin adds a command the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A sub-command: ``add_arguments(parser)`` declares its flags, ``run(args) -> exit code`` executes it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


__all__ = ["Command"]
