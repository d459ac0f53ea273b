"""Run records on disk: one read and checked, or every one of an output folder, corrupt files reported.

A record is the JSON file a :class:`~clbench.runner.RunRecord` writes to ``<out>/runs/<run_id>.json``. A file there
that cannot be read as JSON (cut short, binary), that is not a record (the JSON of something else), or whose
``run_id`` could name a path outside ``runs/``, is a :class:`CorruptRecord`: the leaderboard and the end of a
``run`` report it by path and go on without it; resume runs the run again. A second record of a run already read
(the same identity hash, code fingerprint and seed: a copy under another file name) is a :class:`DuplicateRecord`,
reported and skipped the same way, so that no run counts twice in a mean over seeds.

Every read checks that the record is still what its run wrote (:func:`check`): its ``run_id`` and ``seed`` are
those of its ``spec``, its ``identity_hash`` is the hash of the identity rebuilt from the spec, the resolved
hyperparameters (``strategy_config``, which must hold each of the spec's ``args``) and the checkpoints' hashes it
stores, and every summary of a finished record (``avg_inc_acc``... per metric, ``params_M``..., ``train_s``) is the one
recomputed from the stored matrices (:mod:`clbench.metrics`), test sizes, parameter counts and step times. A record that
disagrees is a :class:`CorruptRecord` naming the field (an edited record is never shown as a result; resume runs it
again). Two shapes of records written before are read as what they are: a spec whose strategy has no ``callbacks``
(written before callbacks existed: none entered the identity) and a finished record with ``accuracy_matrix`` but no
``matrices``/``metric_specs`` (written before evaluators named their metrics: classification accuracy).

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
import math
import re
from pathlib import Path
from typing import Any

from clbench import metrics
from clbench.config import config_hash
from clbench.files import write_atomic
from clbench.specs import RunSpec

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
    check(path, data)
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


EDITED = "the record was edited or damaged after its run; restore it or run it again (--force)"
"""What a refusal of :func:`check` tells to do."""


def check(path: str | Path, data: dict) -> None:
    """Refuse (:class:`CorruptRecord`, naming ``path`` and the field) a record whose run id, seed, identity hash or
    summaries are not those recomputed from its spec, resolved hyperparameters and stored matrices."""
    spec = _spec(path, data["spec"])
    for field, stored, recomputed in (("run_id", data["run_id"], spec.run_id), ("seed", data["seed"], spec.seed)):
        if stored != recomputed:
            raise CorruptRecord(path, f"{field} {stored!r} is not its spec's ({recomputed!r}); {EDITED}")
    resolved = data.get("strategy_config")
    if not isinstance(resolved, dict):
        raise CorruptRecord(path, f"strategy_config is missing or not an object; {EDITED}")
    differs = sorted(k for k, v in spec.strategy.args.items() if k not in resolved or resolved[k] != v)
    if differs:
        raise CorruptRecord(path, f"strategy_config.{differs[0]} is not the spec's args.{differs[0]}; {EDITED}")
    if data.get("identity_hash") != config_hash(identity(data, spec)):
        raise CorruptRecord(path, f"identity_hash {data.get('identity_hash')!r} is not the hash of its spec, "
                                  f"strategy_config and checkpoints; {EDITED}")
    if data["status"] == "finished":
        for field, stored, recomputed in _summaries(path, data):
            if not _same(stored, recomputed):
                raise CorruptRecord(path, f"{field} is {stored!r} but its stored data give {recomputed!r}; {EDITED}")


def _spec(path: str | Path, spec: dict) -> RunSpec:
    try:
        return RunSpec.from_dict(spec)
    except (KeyError, TypeError) as exc:
        raise CorruptRecord(path, f"spec cannot be read as a run's ({type(exc).__name__}: {exc}); {EDITED}") from None


def identity(data: dict, spec: RunSpec) -> dict:
    """The identity :meth:`RunSpec.identity` gives the record's spec with its stored resolved hyperparameters and
    checkpoint hashes (the files may have changed since: the run read what the record stores). A spec written before
    callbacks existed has none in its identity."""
    found = spec.identity(data["strategy_config"])
    found.pop("checkpoints", None)
    if data.get("checkpoints"):
        found["checkpoints"] = data["checkpoints"]
    if "callbacks" not in data["spec"]["strategy"]:
        del found["strategy"]["callbacks"]
    return found


def _summaries(path: str | Path, data: dict) -> list[tuple[str, Any, Any]]:
    """``(field, stored value, recomputed value)`` for every summary a finished record stores."""
    specs, matrices = _matrices(path, data)
    stored, sizes = data["metrics"], data.get("test_sizes") or []
    found = []
    for spec in specs:
        readings = [_summarized(path, spec, matrices[spec.name], sizes, offline) for offline in _readings(
            matrices[spec.name])]
        for column, value in readings[0].items():
            value = next((r[column] for r in readings if _same(stored.get(column), r[column])), value)
            found.append((f"metrics.{column}", stored.get(column), value))
    counts = data.get("params_per_step") or []
    derived = {"params_M": lambda: counts[-1]["total"] / 1e6,
               "trainable_params_M": lambda: counts[-1]["trainable"] / 1e6,
               "params_added_M": lambda: (counts[-1]["total"] - counts[0]["total"]) / 1e6,
               "train_s": lambda: math.fsum(data.get("step_train_s") or [])}
    for column, value in derived.items():
        if column in stored:
            try:
                found.append((f"metrics.{column}", stored[column], value()))
            except (IndexError, KeyError, TypeError):
                raise CorruptRecord(path, f"metrics.{column} cannot be recomputed (params_per_step or step_train_s "
                                          f"missing or malformed); {EDITED}") from None
    return found


def _readings(matrix: Any) -> tuple[bool, ...]:
    """The ``offline`` values a matrix may have been summarized with: a square one online, a single row offline;
    a 1 x 1 matrix either way (one experience: nothing tells an offline run from another)."""
    rows = len(matrix) if isinstance(matrix, list) else 0
    columns = len(matrix[0]) if rows and isinstance(matrix[0], list) else 0
    return (False, True) if rows == columns == 1 else (rows != columns,)


def _summarized(path: str | Path, spec: metrics.MetricSpec, matrix: Any, sizes: list, offline: bool) -> dict:
    try:
        return metrics.summarize_matrix(matrix, sizes, spec, offline=offline)
    except (TypeError, ValueError) as exc:
        raise CorruptRecord(path, f"matrices.{spec.name}: {exc}; {EDITED}") from None


def _matrices(path: str | Path, data: dict) -> tuple[list[metrics.MetricSpec], dict]:
    """The record's metric specs and matrices; a record written before evaluators named their metrics holds only
    ``accuracy_matrix`` (classification accuracy). ``accuracy_matrix`` beside ``matrices`` must be their accuracy."""
    kept = data.get("metric_specs")
    if not kept and not data.get("matrices"):
        return [metrics.ACCURACY], {metrics.ACCURACY.name: data.get("accuracy_matrix") or []}
    try:
        specs = [metrics.MetricSpec(**s) for s in kept]
    except TypeError as exc:
        raise CorruptRecord(path, f"metric_specs cannot be read ({exc}); {EDITED}") from None
    matrices = data.get("matrices") if isinstance(data.get("matrices"), dict) else {}
    missing = [s.name for s in specs if s.name not in matrices]
    if not specs or missing:
        raise CorruptRecord(path, f"matrices lack {', '.join(missing) or 'every metric'} of its metric_specs; {EDITED}")
    if "accuracy_matrix" in data and data["accuracy_matrix"] != matrices.get(metrics.ACCURACY.name, []):
        raise CorruptRecord(path, f"accuracy_matrix is not its matrices.accuracy; {EDITED}")
    return specs, matrices


def _same(stored: Any, recomputed: Any) -> bool:
    """Equal, numbers to a relative 1e-9 (what a JSON round trip keeps); ``None`` only to ``None``."""
    if isinstance(stored, bool) or isinstance(recomputed, bool) or stored is None or recomputed is None:
        return stored is recomputed
    if isinstance(stored, (int, float)) and isinstance(recomputed, (int, float)):
        return math.isclose(stored, recomputed, rel_tol=1e-9, abs_tol=1e-9)
    return False


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
    saved, now = _owner(record_path, record, folder, "state").get("files"), _file_hashes(folder)
    if saved != now:
        known = saved if isinstance(saved, dict) else {}
        changed = sorted(f for f in set(known) | set(now) if known.get(f) != now.get(f))
        what = f"files {', '.join(changed)} differ from what the run saved (replaced, added or removed)" \
            if isinstance(saved, dict) else f"{OWNER_FILE} holds no file hashes (saved before states were hashed)"
        raise ForeignState(record_path, f"its saved state {folder}: {what}; run it again (--force) to save its own "
                                        f"state")
    return folder


def artifact(record_path: str | Path, record: dict, name: str) -> Path:
    """The file ``name`` of the artifacts folder ``<results>/artifacts/<run_id>/`` of the record read from
    ``record_path``, checked to be the one its run wrote: the folder's owner file (written by
    :func:`clbench.runner.run` when the run ended) names the record and holds the file's sha256. Raises
    :class:`ForeignState` (e.g. a ``model.pt`` an earlier run left, or one copied in since)."""
    folder = Path(record_path).resolve().parent.parent / "artifacts" / record["run_id"]
    owner = _owner(record_path, record, folder, "artifacts")
    path = folder / name
    saved = owner.get("files") if isinstance(owner.get("files"), dict) else {}
    if name not in saved or not path.is_file() or saved[name] != hashlib.sha256(path.read_bytes()).hexdigest():
        why = "changed since" if name in saved else "that run wrote none"
        raise ForeignState(record_path, f"{path} is not the file its run wrote ({why}); run it again (--force) to "
                                        f"write its own")
    return path


OWNED = {"state": ("saved state", "states", "save its own state"),
         "artifacts": ("artifacts folder", "artifacts", "write its own")}
"""The folders that carry an owner file -> how a refusal names the folder, what was once not marked, what to do."""


def _owner(record_path: str | Path, record: dict, folder: Path, kind: str) -> dict:
    """The owner file of ``folder`` (:func:`write_owner`; ``kind``: a key of :data:`OWNED`), checked to name the record
    read from ``record_path`` (:data:`OWNER_KEYS`); raises :class:`ForeignState`."""
    what, marked, own = OWNED[kind]
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        owner = None
    if not isinstance(owner, dict) or any(owner.get(k) != record.get(k) for k in OWNER_KEYS):
        found = "is missing" if not folder.is_dir() else "was written by another run" if isinstance(owner, dict) \
            else f"has no readable {OWNER_FILE} (saved before {marked} were marked)"
        raise ForeignState(record_path, f"its {what} {folder} {found}; run it again (--force) to {own}")
    return owner
