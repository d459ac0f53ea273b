"""Run records on disk: one read and checked, or every one of an output folder, corrupt files reported.

A record is the JSON file a :class:`~clbench.runner.RunRecord` writes to ``<out>/runs/<run_id>.json``. A file there
that cannot be read as JSON (cut short, binary), that is not a record (the JSON of something else), or whose
``run_id`` could name a path outside ``runs/``, is a :class:`CorruptRecord`: the leaderboard and the end of a
``run`` report it by path and go on without it; resume runs the run again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
STATUSES = ("finished", "failed")


class CorruptRecord(ValueError):
    """A file in ``runs/`` that is not a usable run record; the message starts with its path."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)


def read(path: str | Path) -> dict:
    """The record at ``path`` as a dict, checked for the keys every reader needs; raises :class:`CorruptRecord`."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptRecord(path, f"not a readable JSON file ({exc})") from None
    problem = _problem(data)
    if problem:
        raise CorruptRecord(path, f"not a clbench run record ({problem})")
    return data


def _problem(data: object) -> str:
    """What makes ``data`` not a record, or ``""``."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    expected = {"run_id": str, "status": str, "spec": dict, "seed": int, "metrics": dict}
    wrong = [k for k, t in expected.items() if not isinstance(data.get(k), t)]
    if wrong:
        return f"missing or mistyped {', '.join(wrong)}"
    spec = data["spec"]
    if not (isinstance(spec.get("suite"), str) and all(isinstance(spec.get(k), dict) and "name" in spec[k]
                                                       for k in ("scenario", "strategy"))):
        return "its spec lacks suite, scenario or strategy"
    if not RUN_ID.fullmatch(data["run_id"]) or ".." in data["run_id"]:
        return f"run_id {data['run_id']!r} is not a file name"
    if data["status"] not in STATUSES:
        return f"status {data['status']!r} is not one of {', '.join(STATUSES)}"
    return ""


def load_dir(out_dir: str | Path) -> tuple[list[dict], list[CorruptRecord]]:
    """``(records, corrupt)``: every record in ``<out_dir>/runs`` (sorted by file name) and every file there that
    is not one. A missing ``runs`` folder is a ``FileNotFoundError`` saying what to do."""
    runs = Path(out_dir) / "runs"
    if not runs.is_dir():
        raise FileNotFoundError(f"no run records in {runs}: run a suite first (python run_bench.py --suite NAME).")
    records, corrupt = [], []
    for path in sorted(runs.glob("*.json")):
        try:
            records.append(read(path))
        except CorruptRecord as exc:
            corrupt.append(exc)
    return records, corrupt
