"""Content checksums of known files.

A file is identified by the md5 of its CONTENT: for ``.gz`` files that is the md5 of the decompressed bytes, so a
re-compressed copy of an official file (different ``.gz`` bytes, same content) is accepted, and the same checksum
serves a file whether it is stored compressed or not. Results are remembered per ``(path, size, mtime)`` so a
file is hashed once per process.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

from clbench.data.errors import ChecksumMismatch

_CHUNK = 1 << 20
_verified: dict[tuple[str, int, int], str] = {}
_FIX = "Delete it and fetch an official copy (rerun with --download, or place the official file there yourself)."


def content_md5(path: Path) -> str:
    """md5 hex digest of the file's content (decompressed when the name ends with ``.gz``)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _verified:
        digest = hashlib.md5()
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
        except (OSError, EOFError) as err:   # a truncated or damaged gzip stream
            raise ChecksumMismatch(f"{path}: cannot be read ({err}). {_FIX}") from err
        _verified[key] = digest.hexdigest()
    return _verified[key]


def verify(path: Path, expected_md5: str) -> None:
    """Raise :class:`ChecksumMismatch` unless ``content_md5(path) == expected_md5``."""
    actual = content_md5(path)
    if actual != expected_md5:
        raise ChecksumMismatch(f"{path}: content md5 is {actual}, expected {expected_md5} "
                               f"(corrupted, truncated or not the official file). {_FIX}")
