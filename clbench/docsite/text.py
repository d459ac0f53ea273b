"""Docstrings and values as markdown: Sphinx roles dropped, tables escaped."""

from __future__ import annotations

import inspect
import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|obj|exc):`~?([^`]+)`")
_CODE_SPAN = re.compile(r"(`+).+?\1")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def docstring(obj: Any) -> str:
    """``obj``'s docstring, dedented, Sphinx roles (``:class:`X```) written as code."""
    return _ROLE.sub(r"`\1`", inspect.getdoc(obj) or "")


def first_paragraph(obj: Any) -> str:
    return " ".join(docstring(obj).split("\n\n")[0].split())


def cell(value: Any) -> str:
    """A value in a markdown table cell: code, pipes escaped."""
    text = value if isinstance(value, str) else repr(value)
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`" if text else ""


def _entities(text: str) -> str:
    return re.sub("[&<>]", lambda m: _HTML[m.group(0)], text)


def prose(text: str) -> str:
    """``text`` written as markdown (code spans in backticks) made safe for the site's Markdown: outside code spans,
    ``&``, ``<`` and ``>`` become HTML entities, so a placeholder such as ``<label>`` shows as written instead of
    being read as an HTML tag and dropped (a backslash does not escape ``<`` in Python-Markdown)."""
    parts, start = [], 0
    for span in _CODE_SPAN.finditer(text):
        parts += [_entities(text[start:span.start()]), span.group(0)]
        start = span.end()
    return "".join(parts) + _entities(text[start:])
