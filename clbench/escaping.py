"""What a table copies from a record (labels, names, paths, reasons, machine names), made literal for the file it goes
into: markdown (leaderboard.md, report.md) and CSV (leaderboard.csv, paired.csv).

- :func:`markdown_text`: one literal markdown table cell or line of text.
- :func:`markdown_code`: a code span that holds the text literally, whatever backticks it has.
- :func:`csv_cell` / :func:`csv_table`: the rule against formula injection. A spreadsheet runs a cell that begins
  with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return as a formula (OWASP's "CSV injection"); such a TEXT cell
  gets a leading ``'`` (the spreadsheet's mark of a literal string; the rest of the text is kept). Numbers are never
  changed: a cell that is a number, or a text that reads as one (``-0.25``, ``+3``, ``-inf``), is left as it is, so
  a negative score stays a number.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

MARKDOWN_SPECIAL = re.compile(r"([\\`*<>|~&]|(?<=\])\()")
"""The characters a markdown cell escapes (CommonMark: a backslash before ASCII punctuation keeps it literal): code,
emphasis, inline HTML, table cells, strikethrough, entities, and the ``(`` that makes ``[text](url)`` a link.
``_ . + - = [ ]`` (names, overrides such as ``hidden: [8]``) stay as they are."""


def _one_line(text: object) -> str:
    return " ".join(str(text).splitlines())


def markdown_text(text: object) -> str:
    """``text`` as one literal markdown table cell: line breaks as spaces, :data:`MARKDOWN_SPECIAL` escaped (a label,
    name or path read from a record can neither end the table, nor link, nor inject HTML)."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", _one_line(text))


def markdown_code(text: object, cell: bool = False) -> str:
    """``text`` as one code span (shown in a fixed font, nothing in it interpreted): line breaks as spaces, fenced
    by one backtick more than its longest run of backticks (padded with a space where it starts or ends with one).
    In a table ``cell``, ``|`` is written ``\\|`` (a cell ends at a bare ``|`` even inside a code span; GitHub-flavoured
    markdown shows ``\\|`` there as ``|``); elsewhere it stays. A name without backticks is `` `name` ``, as before."""
    text = _one_line(text).replace("|", r"\|") if cell else _one_line(text)
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""How a cell that a spreadsheet would run as a formula begins."""


def csv_cell(value: Any) -> Any:
    """``value`` made safe for a CSV cell: a text beginning with one of :data:`FORMULA_START` that does not read as a
    number gets a leading ``'``; anything else (numbers, numeric text, other text) is returned unchanged."""
    if not isinstance(value, str) or not value.startswith(FORMULA_START):
        return value
    try:
        float(value)
    except ValueError:
        return "'" + value
    return value


def csv_table(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``table`` whose non-numeric columns (and column names) went through :func:`csv_cell`; numeric
    columns are left as they are."""
    safe = table.copy()
    for column in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[column]):
            safe[column] = safe[column].map(csv_cell)
    return safe.rename(columns=csv_cell)


__all__ = ["FORMULA_START", "MARKDOWN_SPECIAL", "csv_cell", "csv_table", "markdown_code", "markdown_text"]
