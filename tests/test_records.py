"""Records on disk and the code they name, unit by unit (no training): what makes two records the same run, which of
two copies ``load_dir`` keeps and what it says of the other, a saved state's owner file and every refusal of
:func:`clbench.records.state_dir` word for word; which files count as installed code, the source trees of the shipped
packages and the refusal of two, and the modules a plugin package's fingerprint follows. Written for the identity
group's mutants (``make mutation``)."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest

from clbench import fingerprint
from clbench import records as record_files
from clbench.errors import ConfigError


def _record(run_id: str = "r", seed: int = 0, **extra) -> dict:
    return {"run_id": run_id, "status": "finished", "seed": seed, "metrics": {},
            "spec": {"suite": "s", "scenario": {"name": "sc"}, "strategy": {"name": "st"}}, **extra}


# ------------------------------------------------------------------------------------------------------- run keys
def test_the_run_key_is_identity_code_and_seed_and_falls_back_to_run_id_and_spec():
    """With an identity hash: (hash, code fingerprint, seed); without: the run id and spec as sorted JSON (a path
    as its text) in the hash's place. Catches other keys read, an unsorted or unreadable fallback."""
    assert record_files.run_key(_record(seed=3, identity_hash="h", code_fingerprint="c")) == ("h", "c", 3)
    old = _record(seed=1)
    old["spec"] = {"suite": "s", "b": 1, "a": Path("x")}
    assert record_files.run_key(old) == ('["r", {"a": "x", "b": 1, "suite": "s"}]', None, 1)


def test_of_two_copies_the_file_named_after_the_run_is_kept_and_the_other_reported(tmp_path):
    """``b.json`` and ``r.json`` hold one run (same identity, code, seed): ``r.json``, named after its run id, is
    kept although ``b.json`` sorts first, and ``b.json`` is reported in the exact words; the records come back
    sorted by file name. Catches the wrong copy kept and a changed or lost report."""
    runs = tmp_path / "runs"
    runs.mkdir()
    run = _record("r", seed=2, identity_hash="h", code_fingerprint="c")
    other = _record("a", seed=2, identity_hash="h2", code_fingerprint="c")
    for name, record in (("b.json", run), ("r.json", run), ("q.json", other)):
        (runs / name).write_text(json.dumps(record))
    records, problems = record_files.load_dir(tmp_path)
    assert records == [other, run]
    (problem,) = problems
    assert type(problem) is record_files.DuplicateRecord and problem.path == runs / "b.json"
    assert str(problem) == (f"{runs / 'b.json'}: a copy of the run in {runs / 'r.json'} (same identity, code and "
                            f"seed 2); counted once")


# ---------------------------------------------------------------------------------------------------- saved state
def _state(tmp_path: Path) -> tuple[Path, Path, dict]:
    """A results folder with ``runs/r.json`` whose record names ``state/r`` holding ``a.pt`` and ``sub/b.pt``."""
    (tmp_path / "runs").mkdir()
    state = tmp_path / "state" / "r"
    (state / "sub").mkdir(parents=True)
    (state / "a.pt").write_bytes(b"A")
    (state / "sub" / "b.pt").write_bytes(b"B")
    record = _record(identity_hash="h", code_fingerprint="c", started="t0", state_dir="state/r")
    path = tmp_path / "runs" / "r.json"
    path.write_text(json.dumps(record))
    return path, state, record


def test_write_owner_marks_the_state_with_the_run_and_the_hash_of_each_file(tmp_path):
    """``owner.json``: run id, identity hash, code fingerprint, start time and the sha256 of every file below the
    folder by relative path (the owner file itself left out), indented by 1."""
    path, state, record = _state(tmp_path)
    (state / "owner.json").write_text("old")
    record_files.write_owner(state, types.SimpleNamespace(**record))
    owner = {"run_id": "r", "identity_hash": "h", "code_fingerprint": "c", "started": "t0",
             "files": {"a.pt": hashlib.sha256(b"A").hexdigest(), "sub/b.pt": hashlib.sha256(b"B").hexdigest()}}
    assert (state / "owner.json").read_text() == json.dumps(owner, indent=1)
    assert record_files.state_dir(path, record) == state.resolve()


def test_every_refusal_of_a_saved_state_word_for_word(tmp_path):
    """No state recorded; the folder missing; no owner file; another run's owner; an owner without file hashes; a
    file replaced, added or removed: each a ForeignState starting with the record's path."""
    path, state, record = _state(tmp_path)
    folder = state.resolve()
    again = "run it again (--force) to save its own state"

    def refusal(rec: dict) -> str:
        with pytest.raises(record_files.ForeignState) as info:
            record_files.state_dir(path, rec)
        assert str(info.value).startswith(f"{path}: ")
        return str(info.value).removeprefix(f"{path}: ")

    assert refusal({**record, "state_dir": None, "status": "failed"}) == (
        "no saved strategy state (status failed; only finished runs of a strategy with save_state, such as "
        "taft_shards, model_soup and sisa, have one)")
    assert refusal({**record, "state_dir": "state/gone"}) == (
        f"its saved state {tmp_path.resolve() / 'state' / 'gone'} is missing; {again}")
    assert refusal(record) == f"its saved state {folder} has no readable owner.json (saved before states were " \
                              f"marked); {again}"
    record_files.write_owner(state, types.SimpleNamespace(**{**record, "identity_hash": "other"}))
    assert refusal(record) == f"its saved state {folder} was written by another run; {again}"
    (state / "owner.json").write_text(json.dumps({"run_id": "r", "identity_hash": "h", "code_fingerprint": "c",
                                                  "started": "t0"}))
    assert refusal(record) == (f"its saved state {folder}: owner.json holds no file hashes (saved before states "
                               f"were hashed); {again}")
    record_files.write_owner(state, types.SimpleNamespace(**record))
    (state / "a.pt").write_bytes(b"other run")
    (state / "c.pt").write_bytes(b"C")
    (state / "sub" / "b.pt").unlink()
    assert refusal(record) == (f"its saved state {folder}: files a.pt, c.pt, sub/b.pt differ from what the run saved "
                               f"(replaced, added or removed); {again}")


# ------------------------------------------------------------------------------------------------ code fingerprint
def test_installed_code_is_the_standard_library_and_any_site_or_dist_packages_folder(tmp_path):
    """The standard library (under an installed root, its path without "site-packages") and any file below a
    folder named site-packages or dist-packages count as installed; a project file does not."""
    assert fingerprint.installed(Path(json.__file__))
    assert fingerprint.installed(tmp_path / "env" / "site-packages" / "m.py")
    assert fingerprint.installed(tmp_path / "usr" / "dist-packages" / "m.py")
    assert not fingerprint.installed(tmp_path / "project" / "site" / "m.py")


def test_source_trees_follow_each_packages_imported_folder(tmp_path, monkeypatch):
    """Each shipped package's tree is the folder above where it is imported from (the checkout's root for
    ``clbench`` and a package mapped below it or beside it); a package imported from another folder names that
    tree, one without a ``__path__`` and one not imported fall back to the package's own folders, and two trees
    are refused in one line naming each package's."""
    root = Path(fingerprint.__file__).resolve().parents[1]
    assert fingerprint.source_trees() == dict.fromkeys(fingerprint.SHIPPED, root)
    fingerprint.check_one_tree()
    (tmp_path / "other" / "strategies").mkdir(parents=True)
    elsewhere = types.ModuleType("clbench.strategies")
    elsewhere.__path__ = [str(tmp_path / "other" / "strategies")]
    monkeypatch.setitem(sys.modules, "clbench.strategies", elsewhere)
    monkeypatch.delitem(sys.modules, "clbench.scenarios", raising=False)
    trees = fingerprint.source_trees()
    assert trees == {"clbench": root, "clbench.strategies": (tmp_path / "other").resolve(), "clbench.scenarios": root}
    with pytest.raises(ConfigError) as info:
        fingerprint.check_one_tree()
    assert str(info.value) == (
        f"clbench's code comes from more than one source tree (clbench from {root}; clbench.strategies from "
        f"{(tmp_path / 'other').resolve()}; clbench.scenarios from {root}): run from the tree that is installed, or "
        f"install this one (pip install -e .).")
    monkeypatch.setitem(sys.modules, "clbench.strategies", types.ModuleType("clbench.strategies"))   # no __path__
    assert fingerprint.source_trees()["clbench.strategies"] == root


def test_an_installed_plugin_package_is_followed_and_other_installed_code_is_not(tmp_path, monkeypatch):
    """A plugin package installed in site-packages (``fpplug``): its modules imported from one another are
    followed (``from fpplug.sub import b``, ``import fpplug.sub.c``), so are local helpers beside the project
    (``fphelper``), not another installed package (``fpother``) nor the standard library."""
    site = tmp_path / "site-packages"
    (site / "fpplug" / "sub").mkdir(parents=True)
    (site / "fpother").mkdir()
    (tmp_path / "local").mkdir()
    for path, text in ((site / "fpplug" / "__init__.py", ""), (site / "fpplug" / "sub" / "__init__.py", ""),
                       (site / "fpplug" / "sub" / "a.py", "import json\nimport fpother\nimport fphelper\n"
                                                          "import fpplug.sub.c\nfrom fpplug.sub import b\n"),
                       (site / "fpplug" / "sub" / "b.py", "B = 1\n"), (site / "fpplug" / "sub" / "c.py", "C = 1\n"),
                       (site / "fpother" / "__init__.py", ""), (tmp_path / "local" / "fphelper.py", "H = 1\n")):
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "local"))
    monkeypatch.syspath_prepend(str(site))
    found = fingerprint.module_files(["fpplug.sub.a"])
    assert set(found) == {"fpplug.sub.a", "fpplug.sub.b", "fpplug.sub.c", "fphelper"}
    assert found["fphelper"] == tmp_path / "local" / "fphelper.py"


def test_a_pinned_fingerprint_is_answered_as_pinned(monkeypatch):
    """A worker process answers the fingerprints its driver took (``pin``) instead of computing them again, for
    exactly the (strategy, scenario) pinned."""
    monkeypatch.setattr(fingerprint, "_PINNED", {})
    fingerprint.pin([("fp_strategy", "fp_scenario", "f" * 16), ("fp_other", "fp_scenario", "e" * 16)])
    assert fingerprint.code_fingerprint("fp_strategy", "fp_scenario") == "f" * 16
    assert fingerprint.code_fingerprint("fp_other", "fp_scenario") == "e" * 16
