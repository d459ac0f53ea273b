"""Run records on disk: one read and checked, or every one of an output folder, corrupt files reported.

A record is the JSON file a :class:`~clbench.runner.RunRecord` writes to ``<out>/runs/<run_id>.json``. A file there
that cannot be read as JSON (cut short, binary), that is not a record (the JSON of something else), or whose
``run_id`` could name a path outside ``runs/``, is a :class:`CorruptRecord`: the leaderboard and the end of a
``run`` report it by path and go on without it; resume runs the run again. A second record of a run already read
(the same identity hash, code fingerprint and seed: a copy under another file name) is a :class:`DuplicateRecord`,
reported and skipped the same way, so that no run counts twice in a mean over seeds.

Paths a record stores (``state_dir``) are relative to its results folder (the folder holding ``runs/``), so that a
copied or moved results folder is self-contained; records written before that stored absolute paths, which are read
as they are. A saved state carries an owner file (:data:`OWNER_FILE`: the run id, identity hash, code fingerprint
and start time of the record that wrote it, and the sha256 of each state file): :func:`state_dir` refuses a record
whose state was written by another run (:class:`ForeignState`), e.g. the state now at an old record's absolute path
after the run was made again with other settings, or one of whose files was swapped for another run's.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from clbench.files import write_atomic

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
STATUSES = ("finished", "failed")


class CorruptRecord(ValueError):
    """A file in ``runs/`` that is not a usable run record; the message starts with its path."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)


class DuplicateRecord(CorruptRecord):
    """A record of a run (identity, code, seed) that another file in ``runs/`` already holds."""


class ForeignState(CorruptRecord):
    """A record whose saved state is missing or was written by another run."""


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
    """``(records, problems)``: every record in ``<out_dir>/runs`` (sorted by file name) and every file there that
    is not one or repeats one (:class:`DuplicateRecord`: of the files holding one run, the one named after its
    ``run_id`` is kept, else the first by name). A missing ``runs`` folder is a ``FileNotFoundError`` saying what to
    do."""
    runs = Path(out_dir) / "runs"
    if not runs.is_dir():
        raise FileNotFoundError(f"no run records in {runs}: run a suite first (python run_bench.py --suite NAME).")
    read_back, corrupt = [], []
    for path in sorted(runs.glob("*.json")):
        try:
            read_back.append((path, read(path)))
        except CorruptRecord as exc:
            corrupt.append(exc)
    kept: dict[tuple, tuple[Path, dict]] = {}
    for path, record in sorted(read_back, key=lambda pr: (pr[0].name != f"{pr[1]['run_id']}.json", pr[0].name)):
        key = run_key(record)
        if key in kept:
            corrupt.append(DuplicateRecord(path, f"a copy of the run in {kept[key][0]} (same identity, code and seed "
                                                 f"{record['seed']}); counted once"))
        else:
            kept[key] = (path, record)
    return [r for _, r in sorted(kept.values(), key=lambda pr: pr[0].name)], corrupt


def run_key(record: dict) -> tuple:
    """What makes two records the same run: identity hash (seed included), code fingerprint and seed (a record
    without an identity hash: its run id and spec)."""
    identity = record.get("identity_hash") or json.dumps([record["run_id"], record["spec"]], sort_keys=True,
                                                         default=str)
    return identity, record.get("code_fingerprint"), record["seed"]


# ------------------------------------------------------------------------------------------------------ saved state
OWNER_FILE = "owner.json"
OWNER_KEYS = ("run_id", "identity_hash", "code_fingerprint", "started")


def _file_hashes(state: Path) -> dict[str, str]:
    """``{path relative to state: sha256}`` of every file of the state folder but its owner file."""
    return {p.relative_to(state).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(state.rglob("*")) if p.is_file() and p.name != OWNER_FILE}


def write_owner(state: str | Path, record: object) -> None:
    """Mark the state folder ``state`` as written by ``record`` (a RunRecord: :data:`OWNER_KEYS`), with the sha256
    of each file it holds (a file swapped for another run's afterwards is caught by :func:`state_dir`)."""
    owner = {k: getattr(record, k) for k in OWNER_KEYS} | {"files": _file_hashes(Path(state))}
    write_atomic(Path(state) / OWNER_FILE, json.dumps(owner, indent=1))


def state_dir(record_path: str | Path, record: dict) -> Path:
    """The saved state of the record read from ``record_path``: its ``state_dir`` relative to the record's results
    folder (absolute in records written before), checked to belong to the record, file by file; raises
    :class:`ForeignState`."""
    stored = record.get("state_dir")
    if not stored:
        raise ForeignState(record_path, f"no saved strategy state (status {record.get('status')}; only finished runs "
                                        f"of a strategy with save_state, such as taft_shards, model_soup and sisa, "
                                        f"have one)")
    folder = Path(record_path).resolve().parent.parent / stored
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        owner = None
    if not isinstance(owner, dict) or any(owner.get(k) != record.get(k) for k in OWNER_KEYS):
        found = "is missing" if not folder.is_dir() else "was written by another run" if isinstance(owner, dict) \
            else f"has no readable {OWNER_FILE} (saved before states were marked)"
        raise ForeignState(record_path, f"its saved state {folder} {found}; run it again (--force) to save its "
                                        f"own state")
    saved, now = owner.get("files"), _file_hashes(folder)
    if saved != now:
        known = saved if isinstance(saved, dict) else {}
        changed = sorted(f for f in set(known) | set(now) if known.get(f) != now.get(f))
        what = f"files {', '.join(changed)} differ from what the run saved (replaced, added or removed)" \
            if isinstance(saved, dict) else f"{OWNER_FILE} holds no file hashes (saved before states were hashed)"
        raise ForeignState(record_path, f"its saved state {folder}: {what}; run it again (--force) to save its own "
                                        f"state")
    return folder
