"""Why a dataset cannot be used. Both errors stop a suite before its next run: every run would fail the same way,
so the runner lets them propagate and the command line prints the message once (exit code 2)."""

from __future__ import annotations


class DatasetNotFound(FileNotFoundError):
    """No usable copy of a dataset: none under the data roots (the message names every path searched and the files
    expected), or a file found with the wrong content (:class:`ChecksumMismatch`)."""


class ChecksumMismatch(DatasetNotFound):
    """A known file whose content is not the expected one (truncated, corrupted or a different version)."""
