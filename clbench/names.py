"""Names that become parts of file names: a suite's name (``results/<suite>/``) and its entries' row keys (labels,
else registry names: ``runs/<scenario>__<strategy>__s<seed>.json``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clbench.errors import ConfigError
from clbench.typecheck import brief

MAX_NAME = 100
"""The longest registry name, label or suite name: a run id joins two of them (``<scenario>__<strategy>__s<seed>``)
and its files add a suffix, which must stay within the 255-byte file name limit of common file systems (ext4, XFS,
APFS, NTFS; :data:`NAME_LIMIT`)."""
NAME_LIMIT = 255
"""The file name limit (bytes) assumed when a folder cannot tell its own (``os.pathconf(folder, "PC_NAME_MAX")``)."""


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def check_path_name(where: str, key: str, value: Any) -> str:
    """``value`` if it is a :data:`SAFE_NAME` without ``..`` (leaves its folder) or ``__`` (separates the parts of
    a run id); else :class:`ConfigError` naming ``where`` and ``key``."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value or "__" in value:
        raise ConfigError(f"{where}: {key!r} {brief(value)} may contain only letters, digits, '_', '.', '+' and '-', "
                          f"start with a letter or digit and contain neither '..' nor '__': it becomes part of file "
                          f"names (results/<suite>/runs/<scenario>__<strategy>__s<seed>.json).")
    if len(value) > MAX_NAME:
        raise ConfigError(f"{where}: {key!r} {brief(value)} is {len(value)} characters long; at most {MAX_NAME}: it "
                          f"becomes part of file names (<scenario>__<strategy>__s<seed>.json), which file systems "
                          f"limit to {NAME_LIMIT} bytes.")
    return value


def name_limit(folder: str | Path) -> int:
    """The longest file name (bytes) ``folder``'s file system accepts, asked of the nearest folder that exists
    (``folder`` may be made later; :data:`NAME_LIMIT` when it cannot tell)."""
    folder = Path(folder)
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return NAME_LIMIT


def check_file_names(folder: str | Path, names: Iterable[str], what: str, extra: int = 0) -> None:
    """A :class:`ConfigError` naming the limit when one of ``names``, with the ``extra`` bytes that the files made
    from it add (suffixes, a temporary file's pid), is longer than ``folder``'s file system accepts (``OSError`` 36
    in the middle of a suite otherwise)."""
    limit = name_limit(folder)
    long = [n for n in names if len(n.encode()) + extra > limit]
    if long:
        raise ConfigError(f"{what} {brief(long[0])} ({len(long[0].encode())} bytes, {extra} more in the names of its "
                          f"files) is too long for a file name in {folder}, whose file system accepts at most {limit} "
                          f"bytes; shorten the labels or seeds that make it.")
