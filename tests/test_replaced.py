"""clbench.replaced: what a run wrote before is moved, as it is, to ``<out>/replaced/<stamp>__<run_id>/`` (itself a
results folder) before the run writes again; links in a results folder are never written through. No run is trained
here (tests/test_executors.py runs a suite twice)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from clbench import records, replaced
from clbench.errors import OutputError
from tests._records import sealed

RUN = "synthetic__naive__s0"


def _outputs(out: Path, run_id: str = RUN) -> dict:
    """A record, an artifacts folder and a saved state of ``run_id`` in ``out``, as a run leaves them."""
    record = sealed({"status": "finished", "seed": 0, "metrics": {"last_acc": 50.0, "avg_inc_acc": 60.0},
                     "spec": {"suite": "s", "scenario": {"name": "synthetic"}, "strategy": {"name": "naive"}},
                     "code_fingerprint": "c", "started": "t0", "state_dir": f"state/{run_id}"})
    (out / "runs").mkdir(parents=True)
    (out / "runs" / f"{run_id}.json").write_text(json.dumps(record))
    (out / "artifacts" / run_id).mkdir(parents=True)
    (out / "artifacts" / run_id / "training_log.jsonl").write_text("{}\n")
    (out / "state" / run_id).mkdir(parents=True)
    (out / "state" / run_id / "memory.pt").write_bytes(b"m")
    owner = type("Owner", (), {k: record.get(k) for k in records.OWNER_KEYS})
    records.write_owner(out / "state" / run_id, owner)
    return record


def test_every_output_of_the_run_moves_to_one_results_folder_under_replaced(tmp_path):
    """Record, artifacts and state move under the same relative paths to ``replaced/<UTC stamp>__<run_id>/``, which
    reads back as a results folder (its record checked, its state still its own); other runs' files stay."""
    record = _outputs(tmp_path)
    (tmp_path / "runs" / "other__naive__s0.json").write_text("{}")
    kept = replaced.set_aside(tmp_path, RUN)
    assert kept.run_id == RUN and kept.moved == ("record", "artifacts", "state")
    assert kept.folder.parent == tmp_path / "replaced"
    assert re.fullmatch(r"\d{8}T\d{6}Z__synthetic__naive__s0", kept.folder.name)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        [f"replaced/{kept.folder.name}/{p}" for p in (f"runs/{RUN}.json", f"artifacts/{RUN}/training_log.jsonl",
                                                      f"state/{RUN}/memory.pt", f"state/{RUN}/owner.json")]
        + ["runs/other__naive__s0.json"])
    assert records.load_dir(kept.folder) == ([record], [])
    assert records.load_dir(tmp_path)[0] == []                    # the folder's readers do not see replaced/
    moved = kept.folder / "runs" / f"{RUN}.json"
    assert records.state_dir(moved, records.read(moved)) == (kept.folder / "state" / RUN).resolve()
    assert kept.line() == f"replacing {RUN}: its earlier record, artifacts, state kept in {kept.folder}"


def test_nothing_there_moves_nothing_and_a_second_replacement_gets_its_own_folder(tmp_path):
    """No earlier output: ``None`` and no ``replaced/`` folder. Two replacements: two folders, each with only what
    existed, named in ``moved``."""
    assert replaced.set_aside(tmp_path, RUN) is None and not (tmp_path / "replaced").exists()
    (tmp_path / "artifacts" / RUN).mkdir(parents=True)
    first = replaced.set_aside(tmp_path, RUN)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / f"{RUN}.json").write_text("{cut")
    second = replaced.set_aside(tmp_path, RUN)
    assert first.moved == ("artifacts",) and second.moved == ("record",) and first.folder != second.folder
    assert (second.folder / "runs" / f"{RUN}.json").read_text() == "{cut"
    assert (first.folder / "artifacts" / RUN).is_dir()


def test_a_third_replacement_in_the_same_second_counts_on(tmp_path, monkeypatch):
    """The stamp is fixed here: the folders are ``<stamp>__<run>``, ``-2``, ``-3``."""
    class Frozen:
        @staticmethod
        def now(tz):
            from datetime import datetime
            return datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(replaced, "datetime", Frozen)
    names = []
    for _ in range(3):
        (tmp_path / "artifacts" / RUN).mkdir(parents=True)
        names.append(replaced.set_aside(tmp_path, RUN).folder.name)
    assert names == [f"20260102T030405Z__{RUN}", f"20260102T030405Z__{RUN}-2", f"20260102T030405Z__{RUN}-3"]


def test_a_link_in_the_runs_own_place_is_moved_as_a_link_and_its_target_is_untouched(tmp_path):
    """``artifacts/<run>`` and ``runs/<run>.json`` linking outside the results folder: the links themselves move
    (a dangling one too); the files they point to keep their content and place."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "training_log.jsonl").write_text("precious")
    out = tmp_path / "out"
    (out / "artifacts").mkdir(parents=True)
    (out / "runs").mkdir()
    os.symlink(outside, out / "artifacts" / RUN)
    os.symlink(tmp_path / "gone.json", out / "runs" / f"{RUN}.json")
    kept = replaced.set_aside(out, RUN)
    assert kept.moved == ("record", "artifacts")
    assert (kept.folder / "artifacts" / RUN).is_symlink() and (kept.folder / "runs" / f"{RUN}.json").is_symlink()
    assert not os.path.lexists(out / "artifacts" / RUN) and not os.path.lexists(out / "runs" / f"{RUN}.json")
    assert (outside / "training_log.jsonl").read_text() == "precious" and os.listdir(outside) == ["training_log.jsonl"]


@pytest.mark.parametrize("folder", replaced.FOLDERS)
def test_a_linked_folder_of_the_results_folder_is_refused_in_one_line_naming_it(tmp_path, folder):
    """``runs/``, ``artifacts/``, ``state/`` or ``replaced/`` linking elsewhere: one OutputError line naming the link
    and its target, and nothing moved."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(elsewhere, out / folder)
    if folder != "artifacts":
        (out / "artifacts" / RUN).mkdir(parents=True)
    with pytest.raises(OutputError) as info:
        replaced.set_aside(out, RUN)
    assert str(info.value) == (f"{out / folder} is a symbolic link (to {elsewhere}): a run writes only inside its "
                               f"results folder {out}; replace the link by a folder, or pass another --out.")
    assert os.listdir(elsewhere) == [] and (folder == "artifacts" or (out / "artifacts" / RUN).is_dir())
