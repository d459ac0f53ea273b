"""What makes a record usable and a run's code the same code: ``clbench.records`` (one record read and checked,
every record of an output folder, corrupt files reported by path) and ``clbench.fingerprint`` (the modules a run
depends on, found by reading import statements, and the hash over their code), and which callbacks are part of a
run's identity (observers, such as loggers, are not: ``clbench.specs.identity_callbacks``).

The fingerprint tests build a small fake ``clbench`` package in a temporary folder (``_PACKAGE_DIR`` pointed at
it), so that every kind of import (absolute, ``from package import module``, relative at one and two levels, from a
package's ``__init__``, of a name that is not a module) has one known answer, computed by hand below. No run is
trained but by one test (a tiny run resumed with a logger added and removed): the others are fast enough to run once
per mutant.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import types
from pathlib import Path

import pytest

from clbench import fingerprint, records
from clbench.records import CorruptRecord
from tests._records import sealed


# ------------------------------------------------------------------------------------------------------ records
def _record(**changes) -> dict:
    """The smallest dict every reader of a record can use; ``changes`` replace or (with None) drop keys."""
    data = {"run_id": "syn__naive__s0", "status": "finished", "seed": 0, "metrics": {"last_acc": 50.0},
            "spec": {"suite": "s", "scenario": {"name": "synthetic"}, "strategy": {"name": "naive"}}}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def _labelled(label: str, seed: int, status: str) -> dict:
    """A sealed record (:func:`tests._records.sealed`) of run ``<label>__naive__s<seed>``."""
    return sealed(_record(status=status, seed=seed, spec={"suite": "s", "scenario": {"name": "synthetic",
                                                                                     "label": label},
                                                          "strategy": {"name": "naive"}}))


def _write(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_corrupt_record_error_starts_with_its_path_and_keeps_it():
    """The message is ``<path>: <reason>`` and ``.path`` is that path as a Path (a dropped path or reason, or a
    path kept as None, is caught)."""
    exc = CorruptRecord("runs/x.json", "broken")
    assert str(exc) == "runs/x.json: broken" and exc.path == Path("runs/x.json") and isinstance(exc, ValueError)


def test_a_valid_record_reads_back_as_the_dict_written(tmp_path):
    """Every key the readers need, with the right type, passes (a check of a misspelled key, or a negated check,
    would refuse every good record); finished and failed are both statuses; '.', '+', '-', '_' may be in a run id."""
    for status, label in (("finished", "syn"), ("failed", "a.b+c-d_e")):
        data = sealed(_record(status=status, spec={"suite": "s", "scenario": {"name": "synthetic", "label": label},
                                                   "strategy": {"name": "naive"}}))
        assert records.read(_write(tmp_path, "r.json", data)) == data
        assert records.read(str(tmp_path / "r.json")) == data                 # a str path reads too


LACKS = "its spec lacks suite, scenario or strategy"


@pytest.mark.parametrize("content, reason", [
    ("[1, 2]", "a JSON list, not an object"),
    ("null", "a JSON NoneType, not an object"),
    (_record(run_id=None), "missing or mistyped run_id"),
    (_record(status=None), "missing or mistyped status"),
    (_record(spec=None), "missing or mistyped spec"),
    (_record(seed=None), "missing or mistyped seed"),
    (_record(metrics=None), "missing or mistyped metrics"),
    (_record(seed="0", metrics=[]), "missing or mistyped seed, metrics"),
    (_record(run_id=3, spec="s"), "missing or mistyped run_id, spec"),
    (_record(spec={"scenario": {"name": "a"}, "strategy": {"name": "b"}}), LACKS),
    (_record(spec={"suite": 1, "scenario": {"name": "a"}, "strategy": {"name": "b"}}),
     LACKS),
    (_record(spec={"suite": "s", "scenario": {}, "strategy": {"name": "b"}}),
     LACKS),
    (_record(spec={"suite": "s", "scenario": {"name": "a"}, "strategy": {"label": "b"}}),
     LACKS),
    (_record(spec={"suite": "s", "scenario": "name", "strategy": {"name": "b"}}),
     LACKS),
    (_record(spec={"suite": "s", "scenario": {"name": "a"}}), LACKS),
    (_record(run_id="../../etc/x"), "run_id '../../etc/x' is not a file name"),
    (_record(run_id="a/b"), "run_id 'a/b' is not a file name"),
    (_record(run_id="a..b"), "run_id 'a..b' is not a file name"),
    (_record(run_id="_a"), "run_id '_a' is not a file name"),
    (_record(status="running"), "status 'running' is not one of finished, failed"),
])
def test_what_is_not_a_record_is_refused_with_its_reason(tmp_path, content, reason):
    """One exact line per kind of foreign JSON: not an object (named by its JSON type), each required key missing
    or mistyped (all of them named, in order), a spec without suite/scenario/strategy names, a run id that is not
    a plain file name (a path, '..', a leading '_'), a status other than finished/failed."""
    path = _write(tmp_path, "r.json", content)
    with pytest.raises(CorruptRecord) as info:
        records.read(path)
    assert str(info.value) == f"{path}: not a clbench run record ({reason})" and info.value.path == path


@pytest.mark.parametrize("content", ['{"run_id": "syn', b"\xff\xfe\x00binary", None])
def test_what_cannot_be_read_as_json_is_refused_with_the_readers_error(tmp_path, content):
    """A file cut short, binary bytes and a missing file: a CorruptRecord naming the path and the reader's own
    error (not a JSONDecodeError, UnicodeDecodeError or OSError escaping to the caller)."""
    path = tmp_path / "r.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(CorruptRecord) as info:
        records.read(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not a readable JSON file (") and message.endswith(")"), message
    assert info.value.path == path and len(message) > len(f"{path}: not a readable JSON file ()")


def test_load_dir_returns_records_sorted_by_file_name_and_corrupt_files_by_path(tmp_path):
    """Records of ``<out>/runs/*.json`` in file-name order, each corrupt file once as a CorruptRecord with its path;
    files not named ``*.json`` are not read."""
    runs = tmp_path / "runs"
    runs.mkdir()
    b = _labelled("b", 0, status="finished")
    a = _labelled("a", 1, status="failed")
    _write(runs, "b__naive__s0.json", b)
    _write(runs, "a__naive__s1.json", a)
    _write(runs, "c.json", "{cut")
    _write(runs, "notes.json", {"hello": "world"})
    _write(runs, "readme.txt", "not a record")
    found, corrupt = records.load_dir(tmp_path)
    assert found == [a, b]
    assert [c.path for c in corrupt] == [runs / "c.json", runs / "notes.json"]
    assert all(isinstance(c, CorruptRecord) for c in corrupt)
    assert records.load_dir(str(tmp_path))[0] == [a, b]


def test_load_dir_without_runs_says_to_run_a_suite_first(tmp_path):
    """A missing ``runs`` folder is one FileNotFoundError line that names the folder and the command."""
    with pytest.raises(FileNotFoundError) as info:
        records.load_dir(tmp_path)
    assert str(info.value) == (f"no run records in {tmp_path / 'runs'}: run a suite first "
                               "(python run_bench.py --suite NAME).")
    (tmp_path / "runs").mkdir()
    assert records.load_dir(tmp_path) == ([], [])


# -------------------------------------------------------------------------------------------------- fingerprint
FAKE = {
    "__init__.py": '"""The fake package."""\n',
    "a.py": "import os\nimport clbench.c\nfrom clbench import b\nfrom clbench import CONSTANT\n",
    "b.py": "from . import d\nfrom .sub import e\n",
    "c.py": "X = 1\n",
    "d.py": "def f(x):\n    return x + 1\n",
    "cli.py": "import clbench.c\n",
    "uses_cli.py": "import clbench.cli\nimport clbench.d\n",
    "sub/__init__.py": "from . import e\nfrom .. import c\n",
    "sub/e.py": "from . import f\nfrom ..d import f as g\nfrom .. import d\n",
    "sub/f.py": "import json\n",
}


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    """A fake ``clbench`` package under ``tmp_path`` that the fingerprint reads instead of the real one (``cli`` is
    in EXCLUDED, as in the real package)."""
    root = tmp_path / "clbench"
    for name, source in FAKE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    monkeypatch.setattr(fingerprint, "_PACKAGE_DIR", root)
    return root


def test_source_file_maps_package_modules_to_their_file_or_package_init(fake):
    """``clbench`` is the package's ``__init__``, ``clbench.x.y`` is ``x/y.py`` or ``x/y/__init__.py``, a name
    with no file is None (a wrong split of the dotted name, or a lookup outside the package, is caught)."""
    assert fingerprint._source_file("clbench") == fake / "__init__.py"
    assert fingerprint._source_file("clbench.a") == fake / "a.py"
    assert fingerprint._source_file("clbench.sub") == fake / "sub" / "__init__.py"
    assert fingerprint._source_file("clbench.sub.e") == fake / "sub" / "e.py"
    assert fingerprint._source_file("clbench.nope") is None
    assert fingerprint._source_file("clbench.sub.nope") is None


def test_source_file_follows_the_package_dir_mapping():
    """``clbench.strategies`` and ``clbench.scenarios`` live in the repository's top-level folders (setup.py maps
    them): the fingerprint reads their modules there."""
    repo = Path(fingerprint.__file__).parents[1]
    assert fingerprint._source_file("clbench.strategies.baselines") == repo / "strategies" / "baselines.py"
    assert fingerprint._source_file("clbench.scenarios") == repo / "scenarios" / "__init__.py"
    assert "clbench.strategies.baselines" in fingerprint.module_files(["clbench.strategies.baselines"])


def test_source_file_of_modules_outside_the_package(fake, tmp_path, monkeypatch):
    """Outside the package: an imported module by its ``__file__`` (even one no finder knows), a module not yet
    imported by its spec's origin, and None for a missing module, a built-in one and a compiled extension."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "fp_not_imported.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(outside))
    assert fingerprint._source_file("fp_not_imported") == outside / "fp_not_imported.py"
    virtual = types.ModuleType("fp_virtual")              # in sys.modules only: find_spec cannot find it
    virtual.__file__ = str(outside / "virtual.py")
    monkeypatch.setitem(sys.modules, "fp_virtual", virtual)
    assert fingerprint._source_file("fp_virtual") == outside / "virtual.py"
    compiled = types.ModuleType("fp_compiled")
    compiled.__file__ = str(outside / "compiled.so")
    monkeypatch.setitem(sys.modules, "fp_compiled", compiled)
    assert fingerprint._source_file("fp_compiled") is None
    assert fingerprint._source_file("fp_no_such_module_anywhere") is None
    assert fingerprint._source_file("sys") is None                   # built in: no __file__


def test_imports_resolve_absolute_relative_and_package_imports(fake):
    """Every import statement of a file, as module names: ``import x`` as written; ``from clbench import b`` as
    ``clbench.b`` when b is a module, else ``clbench``; ``from clbench.d import f`` as ``clbench.d``; relative
    imports against the file's package (its own name for an ``__init__``), one and two levels up; imports from
    outside the package (``from os import path``) are left out."""
    def imports(name):
        return fingerprint._imports(name, fingerprint._source_file(name))

    assert imports("clbench.a") == ["os", "clbench.c", "clbench.b", "clbench"]
    assert imports("clbench.b") == ["clbench.d", "clbench.sub.e"]
    assert imports("clbench.sub") == ["clbench.sub.e", "clbench.c"]
    assert imports("clbench.sub.e") == ["clbench.sub.f", "clbench.d", "clbench.d"]
    assert imports("clbench.d") == []


def test_imports_of_a_module_outside_the_package_keep_only_what_it_imports(tmp_path, fake):
    """A module outside ``clbench`` (a plugin strategy) yields its ``import`` names and its ``from clbench...``
    modules, not its ``from os import path``."""
    probe = tmp_path / "probe.py"
    probe.write_text("from os import path\nimport numpy\nfrom clbench.sub import e\nfrom clbench.d import f\n")
    assert fingerprint._imports("probe", probe) == ["numpy", "clbench.sub.e", "clbench.d"]


def test_module_files_is_the_import_closure_inside_the_package_minus_excluded(fake):
    """The closure of ``clbench.a`` follows absolute, relative and ``__init__`` imports, keeps the package's
    ``__init__`` (``from clbench import CONSTANT``) and no module outside the package (``os``, ``json``)."""
    expected = {"clbench.a": "a.py", "clbench.b": "b.py", "clbench.c": "c.py", "clbench.d": "d.py",
                "clbench": "__init__.py", "clbench.sub.e": "sub/e.py", "clbench.sub.f": "sub/f.py"}
    assert fingerprint.module_files(["clbench.a"]) == {k: fake / v for k, v in expected.items()}
    assert fingerprint.module_files(["clbench.sub"]) == {
        "clbench.sub": fake / "sub" / "__init__.py", "clbench.c": fake / "c.py", "clbench.d": fake / "d.py",
        "clbench.sub.e": fake / "sub" / "e.py", "clbench.sub.f": fake / "sub" / "f.py"}


def test_module_files_skips_excluded_missing_and_repeated_roots_and_goes_on(fake):
    """An excluded module (cli), a name without a file and a module seen before are skipped, and the roots after
    them are still followed (a skip that stopped the walk would drop them)."""
    assert fingerprint.module_files(["clbench.uses_cli"]) == {"clbench.uses_cli": fake / "uses_cli.py",
                                                              "clbench.d": fake / "d.py"}
    assert fingerprint.module_files(["clbench.c", "clbench.cli"]) == {"clbench.c": fake / "c.py"}
    assert fingerprint.module_files(["clbench.c", "clbench.nope"]) == {"clbench.c": fake / "c.py"}
    assert fingerprint.module_files(["clbench.c", "clbench.d", "clbench.d"]) == {"clbench.c": fake / "c.py",
                                                                                "clbench.d": fake / "d.py"}
    assert fingerprint.module_files([]) == {}


def test_fingerprint_of_is_sixteen_hex_digits_over_sorted_name_and_code_digest_lines(fake):
    """The fingerprint is sha256 over ``name:sha256(ast without docstrings)`` lines joined by a newline, sorted by
    module name, cut to 16 hex digits; computed here by hand for two modules."""
    def digest(source: str) -> str:
        import ast

        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module) and node.body and isinstance(node.body[0], ast.Expr):
                node.body = node.body[1:] or [ast.Pass()]
        return hashlib.sha256(ast.dump(tree).encode()).hexdigest()

    blob = "\n".join([f"clbench.c:{digest(FAKE['c.py'])}", f"clbench.d:{digest(FAKE['d.py'])}",
                      f"clbench.uses_cli:{digest(FAKE['uses_cli.py'])}"])           # sorted by module name
    expected = hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert fingerprint.fingerprint_of(["clbench.uses_cli", "clbench.c"]) == expected
    assert re.fullmatch(r"[0-9a-f]{16}", expected)
    assert fingerprint.code_digest(fake / "__init__.py") == digest(FAKE["__init__.py"])


def test_fingerprint_of_changes_with_code_and_not_with_a_docstring(fake):
    """Editing a module's expression changes the fingerprint of a module importing it; editing its docstring
    does not."""
    before = fingerprint.fingerprint_of(["clbench.b"])
    (fake / "d.py").write_text('"""Now with a docstring."""\n' + FAKE["d.py"])
    assert fingerprint.fingerprint_of(["clbench.b"]) == before
    (fake / "d.py").write_text(FAKE["d.py"].replace("x + 1", "x + 2"))
    assert fingerprint.fingerprint_of(["clbench.b"]) != before


# ------------------------------------------------------------------------------------------- observing callbacks
def _spec(*callbacks: dict):
    from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry

    return RunSpec("s", ScenarioEntry("synthetic"), StrategyEntry("naive", preset="cpu", callbacks=callbacks), 0)


def test_observing_callbacks_are_outside_the_run_identity_and_shaping_ones_stay_in():
    """Loggers and the hook trace declare ``observer = True``: a run with them has the identity (and hash) of the
    run without them; ``dual_form`` and ``dp`` stay in, in their order, next to observers too. A run without
    observers keeps the identity it had before observers were left out: its entry with its callbacks as written."""
    import dataclasses

    from clbench.config import config_dict, config_hash

    observers = [{"name": n, "args": {}} for n in ("tensorboard", "wandb", "training_log", "hook_trace")]
    shaping = [{"name": "dual_form", "args": {}}, {"name": "dp", "args": {"epsilon": 8.0}}]
    plain = _spec()
    assert config_hash(_spec(*observers).identity()) == config_hash(plain.identity())
    mixed = _spec(observers[0], shaping[0], observers[3], shaping[1])
    assert mixed.identity()["strategy"]["callbacks"] == tuple(shaping)
    assert config_hash(mixed.identity()) == config_hash(_spec(*shaping).identity()) != config_hash(plain.identity())
    for spec in (plain, _spec(*shaping)):           # the pre-observer formula: the entry as written
        before = {"suite": "s", "scenario": dataclasses.asdict(spec.scenario), "seed": 0,
                  "strategy": {**dataclasses.asdict(spec.strategy), "resolved": config_dict(spec.config())}}
        assert config_hash(spec.identity()) == config_hash(before)


def test_a_callback_name_no_registry_knows_stays_in_the_identity():
    """A record's plugin callback that is not loaded is not assumed to observe (leaderboard rows stay apart)."""
    from clbench.specs import identity_callbacks

    assert identity_callbacks([{"name": "not_loaded_anywhere", "args": {}}, {"name": "tensorboard", "args": {}}]) \
        == ({"name": "not_loaded_anywhere", "args": {}},)


def test_adding_or_removing_a_logger_resumes_the_finished_run(tiny_suite, tmp_path, capsys):
    """The one test here that trains (a tiny run): the suite run again with ``tensorboard`` added resumes (the record
    untouched, no event file written), and so does the suite with it removed again; the leaderboard keeps one row."""
    import pandas as pd

    from clbench.cli import main

    entry = {"name": "naive", "preset": "cpu", "args": {"epochs": 1}}
    out = tmp_path / "out"
    assert main(["--suite", str(tiny_suite([entry])), "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    record = out / "runs" / "synthetic__naive__s0.json"
    stamp, text = record.stat().st_mtime_ns, record.read_text()
    logged = tiny_suite([{**entry, "callbacks": [{"name": "tensorboard"}]}], name="tiny")
    for suite in (logged, tiny_suite([entry])):
        capsys.readouterr()
        assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table"]) == 0
        assert "resuming: 1 of 1 runs already finished" in capsys.readouterr().err
        assert (record.stat().st_mtime_ns, record.read_text()) == (stamp, text)
    assert not (out / "artifacts" / "synthetic__naive__s0" / "tensorboard").exists()
    assert len(pd.read_csv(out / "leaderboard.csv")) == 1
