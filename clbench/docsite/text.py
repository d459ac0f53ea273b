"""Docstrings and values as markdown: Sphinx roles dropped, tables escaped."""

from __future__ import annotations

import inspect
import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|obj|exc):`~?([^`]+)`")


def docstring(obj: Any) -> str:
    """``obj``'s docstring, dedented, Sphinx roles (``:class:`X```) written as code."""
    return _ROLE.sub(r"`\1`", inspect.getdoc(obj) or "")


def first_paragraph(obj: Any) -> str:
    return " ".join(docstring(obj).split("\n\n")[0].split())


def cell(value: Any) -> str:
    """A value in a markdown table cell: code, pipes escaped."""
    text = value if isinstance(value, str) else repr(value)
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`" if text else ""
