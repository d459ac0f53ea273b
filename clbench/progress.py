"""tqdm progress bars at three levels (runs, experiences, epochs), silenced by ``--quiet``."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

_enabled = True
LEVELS = {"runs": 0, "experiences": 1, "epochs": 2}


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = enabled


def enabled() -> bool:
    return _enabled


def bar(iterable=None, *, total: int | None = None, desc: str = "", level: str = "runs") -> tqdm:
    """A tqdm bar nested at ``level`` (disabled when quiet or when stderr is not a terminal for inner levels)."""
    inner_off = level != "runs" and not sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, position=LEVELS[level], leave=level == "runs",
                disable=not _enabled or inner_off, dynamic_ncols=True)
