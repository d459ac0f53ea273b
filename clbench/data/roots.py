"""Where datasets are looked for, and whether they may be downloaded.

Search order (first match wins):

1. the explicit ``data_root`` argument of a lookup, else the one set by :func:`configure` (the CLI's ``--data-root``);
2. ``$CLBENCH_DATA``;
3. ``~/.cache/clbench``;
4. ``/usr/share/datasets`` (Debian's ``dataset-*`` packages install there).

Downloads (only when enabled by ``configure(download=True)`` / ``--download``) are written to the first root of
that list that the user chose (1. or 2.), else to ``~/.cache/clbench``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "CLBENCH_DATA"
SYSTEM_ROOTS = (Path("~/.cache/clbench"), Path("/usr/share/datasets"))


@dataclass
class _Settings:
    data_root: Path | None = None
    download: bool = False


_settings = _Settings()


def configure(*, data_root: str | os.PathLike | None = None, download: bool = False) -> None:
    """Set the process-wide defaults from the CLI: ``--data-root PATH`` and ``--download``."""
    _settings.data_root = Path(data_root).expanduser() if data_root is not None else None
    _settings.download = download


def download_enabled() -> bool:
    return _settings.download


def search_roots(data_root: str | os.PathLike | None = None) -> list[Path]:
    """The roots to search, in order, without duplicates; roots that do not exist are kept (they are reported)."""
    explicit = Path(data_root).expanduser() if data_root is not None else _settings.data_root
    env = os.environ.get(ENV_VAR)
    candidates = [explicit, Path(env).expanduser() if env else None, *(r.expanduser() for r in SYSTEM_ROOTS)]
    roots: list[Path] = []
    for root in candidates:
        if root is not None and root not in roots:
            roots.append(root)
    return roots


def download_root(data_root: str | os.PathLike | None = None) -> Path:
    """Where a download goes: the explicit/configured root, else ``$CLBENCH_DATA``, else ``~/.cache/clbench``."""
    return search_roots(data_root)[0]
