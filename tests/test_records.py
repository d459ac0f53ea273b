"""Records on disk and the code they name, unit by unit (no training): what makes two records the same run, which of
two copies ``load_dir`` keeps and what it says of the other, a saved state's owner file and every refusal of
:func:`clbench.records.state_dir` word for word. Written for the identity
group's mutants (``make mutation``).

One record read and checked, every record of an output folder, corrupt files reported by path."""

from __future__ import annotations

import hashlib
import json
import shutil
import types
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import records
from clbench import records as record_files
from clbench.cli import main
from clbench.records import CorruptRecord
from tests._cli import run_suite
from tests._records import sealed


def _record(run_id: str = "r", seed: int = 0, **extra) -> dict:
    return {"run_id": run_id, "status": "finished", "seed": seed, "metrics": {"last_acc": 50.0},
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
    run = sealed(_record(seed=2, code_fingerprint="c"))
    other = sealed(_record(seed=2, code_fingerprint="c", spec={"suite": "s", "scenario": {"name": "sc"},
                                                              "strategy": {"name": "st", "args": {"lr": 0.1}}}))
    assert run["run_id"] == other["run_id"] == "sc__st__s2"
    for name, record in (("b.json", run), ("sc__st__s2.json", run), ("q.json", other)):
        (runs / name).write_text(json.dumps(record))
    records, problems = record_files.load_dir(tmp_path)
    assert records == [other, run]
    (problem,) = problems
    assert type(problem) is record_files.DuplicateRecord and problem.path == runs / "b.json"
    assert str(problem) == (f"{runs / 'b.json'}: a copy of the run in {runs / 'sc__st__s2.json'} (same identity, "
                            f"code and seed 2); counted once")


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


def test_an_artifact_is_returned_only_as_the_file_its_run_wrote_word_for_word(tmp_path):
    """``artifact``: the folder ``artifacts/<run_id>`` beside ``runs/`` missing; no owner file; another run's owner;
    the file not among those the run wrote; the file changed since: each a ForeignState starting with the record's
    path; otherwise the file's path (other files of the folder may change: a redrawn plot)."""
    path, _, record = _state(tmp_path)
    folder = tmp_path.resolve() / "artifacts" / "r"
    again = "run it again (--force) to write its own"

    def refusal() -> str:
        with pytest.raises(record_files.ForeignState) as info:
            record_files.artifact(path, record, "model.pt")
        assert str(info.value).startswith(f"{path}: ")
        return str(info.value).removeprefix(f"{path}: ")

    assert refusal() == f"its artifacts folder {folder} is missing; {again}"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"M")
    assert refusal() == (f"its artifacts folder {folder} has no readable owner.json (saved before artifacts were "
                         f"marked); {again}")
    record_files.write_owner(folder, types.SimpleNamespace(**{**record, "started": "t1"}))
    assert refusal() == f"its artifacts folder {folder} was written by another run; {again}"
    (folder / "model.pt").unlink()
    record_files.write_owner(folder, types.SimpleNamespace(**record))
    (folder / "model.pt").write_bytes(b"M")
    assert refusal() == f"{folder / 'model.pt'} is not the file its run wrote (that run wrote none); {again}"
    record_files.write_owner(folder, types.SimpleNamespace(**record))
    (folder / "curve.png").write_bytes(b"redrawn")
    assert record_files.artifact(path, record, "model.pt") == folder / "model.pt"
    (folder / "model.pt").write_bytes(b"N")
    assert refusal() == f"{folder / 'model.pt'} is not the file its run wrote (changed since); {again}"
    (folder / "model.pt").unlink()
    assert refusal() == f"{folder / 'model.pt'} is not the file its run wrote (changed since); {again}"
    (folder / "model.pt").write_bytes(b"M")
    owner = json.loads((folder / "owner.json").read_text())
    (folder / "owner.json").write_text(json.dumps({**owner, "files": ["model.pt"]}))     # not the name -> hash map
    assert refusal() == f"{folder / 'model.pt'} is not the file its run wrote (that run wrote none); {again}"


# ------------------------------------------------------------------------------------------- records checked on read
REFERENCE = Path(__file__).parents[1] / "results" / "reference" / "quick" / "runs" / "split_digits__agem__s0.json"
EDITED = "the record was edited or damaged after its run; restore it or run it again (--force)"


def _refusal(tmp_path: Path, record: dict) -> str:
    """What :func:`clbench.records.read` says of ``record`` written to ``runs/x.json``, after the path."""
    path = tmp_path / "x.json"
    path.write_text(json.dumps(record))
    with pytest.raises(record_files.CorruptRecord) as info:
        record_files.read(path)
    assert str(info.value).startswith(f"{path}: ")
    return str(info.value).removeprefix(f"{path}: ")


def test_a_committed_record_reads_back_as_it_is():
    """A reference record (quick suite, agem seed 0) passes every check unchanged."""
    assert record_files.read(REFERENCE) == json.loads(REFERENCE.read_text())


def test_an_edited_summary_is_refused_naming_the_field(tmp_path):
    """avg_inc_acc 99.99 under an untouched matrix; params_M, trainable_params_M, params_added_M and train_s that
    their stored counts and step times do not give: each refused in one line with the stored and recomputed value."""
    record = json.loads(REFERENCE.read_text())
    avg = record["metrics"]["avg_inc_acc"]
    assert _refusal(tmp_path, {**record, "metrics": {**record["metrics"], "avg_inc_acc": 99.99}}) == (
        f"metrics.avg_inc_acc is 99.99 but its stored data give {avg!r}; {EDITED}")
    for column, value in (("params_M", 0.085002), ("trainable_params_M", 0.085002), ("params_added_M", 0.002056),
                          ("train_s", record["metrics"]["train_s"])):
        assert record["metrics"][column] == value
        edited = {**record, "metrics": {**record["metrics"], column: value + 0.001}}
        assert _refusal(tmp_path, edited) == (f"metrics.{column} is {value + 0.001!r} but its stored data give "
                                              f"{value!r}; {EDITED}")
    missing = {**record, "metrics": {k: v for k, v in record["metrics"].items() if k != "bwt"}}
    bwt = record["metrics"]["bwt"]
    assert _refusal(tmp_path, missing) == f"metrics.bwt is None but its stored data give {bwt!r}; {EDITED}"


def test_an_edited_matrix_or_test_size_is_refused(tmp_path):
    """A matrix entry changed (the summaries no longer follow), a test size changed, ``accuracy_matrix`` apart from
    ``matrices.accuracy``, a matrix that is not one, and params_per_step cut: each refused."""
    record = json.loads(REFERENCE.read_text())
    R = [row[:] for row in record["matrices"]["accuracy"]]
    R[0][0] = 0.5
    edited = {**record, "matrices": {"accuracy": R}, "accuracy_matrix": R}
    assert _refusal(tmp_path, edited).startswith("metrics.avg_inc_acc is 55.59592447045445 but its stored data give ")
    assert _refusal(tmp_path, {**record, "test_sizes": [1, 108, 109, 108, 106]}).startswith("metrics.avg_inc_acc is ")
    assert _refusal(tmp_path, {**record, "accuracy_matrix": R}) == (
        f"accuracy_matrix is not its matrices.accuracy; {EDITED}")
    assert _refusal(tmp_path, {**record, "matrices": {"accuracy": [[2.0]]}, "accuracy_matrix": [[2.0]]}) == (
        f"matrices.accuracy: accuracy matrix entries must be fractions in [0, 1].; {EDITED}")
    assert _refusal(tmp_path, {**record, "matrices": {}}) == f"matrices lack accuracy of its metric_specs; {EDITED}"
    assert _refusal(tmp_path, {**record, "metric_specs": [{"nom": "x"}]}).startswith("metric_specs cannot be read (")
    assert _refusal(tmp_path, {**record, "params_per_step": []}) == (
        f"metrics.params_M cannot be recomputed (params_per_step or step_train_s missing or malformed); {EDITED}")


def test_an_edited_spec_identity_run_id_or_seed_is_refused(tmp_path):
    """The spec's epochs changed under the old identity, the resolved value changed, an argument the resolved
    hyperparameters do not hold, another identity hash, a run id or seed that is not the spec's, a spec that is
    not a run's: each refused naming the field."""
    record = json.loads(REFERENCE.read_text())
    spec = record["spec"]
    args = {**spec["strategy"]["args"], "epochs": 5}
    edited = {**record, "spec": {**spec, "strategy": {**spec["strategy"], "args": args}},
              "strategy_config": {**record["strategy_config"], "epochs": 5}}
    identity = (f"identity_hash {record['identity_hash']!r} is not the hash of its spec, strategy_config and "
                f"checkpoints; {EDITED}")
    assert _refusal(tmp_path, edited) == identity
    assert _refusal(tmp_path, {**record, "strategy_config": {**record["strategy_config"], "epochs": 5}}) == identity
    assert _refusal(tmp_path, {**record, "checkpoints": {"init": "0" * 16}}) == identity
    assert _refusal(tmp_path, {**edited, "strategy_config": record["strategy_config"]}) == (
        f"strategy_config.epochs is not the spec's args.epochs; {EDITED}")
    assert _refusal(tmp_path, {**record, "strategy_config": None}) == (
        f"strategy_config is missing or not an object; {EDITED}")
    assert _refusal(tmp_path, {**record, "identity_hash": "0" * 12}) == identity.replace(
        repr(record["identity_hash"]), repr("0" * 12))
    assert _refusal(tmp_path, {**record, "run_id": "split_digits__naive__s0"}) == (
        f"run_id 'split_digits__naive__s0' is not its spec's ('split_digits__agem__s0'); {EDITED}")
    assert _refusal(tmp_path, {**record, "seed": 1}) == f"seed 1 is not its spec's (0); {EDITED}"
    assert _refusal(tmp_path, {**record, "spec": {k: v for k, v in spec.items() if k != "seed"}}) == (
        f"spec cannot be read as a run's (KeyError: 'seed'); {EDITED}")


def test_a_record_that_read_a_checkpoint_is_checked_with_the_hash_it_stored(tmp_path):
    """The identity hash of a run that read ``init`` holds the checkpoint's hash at run time
    (:meth:`RunSpec.identity`): the record still reads once the file has changed, and a record without stored
    hashes (written before checkpoints were hashed) has none in its identity although its file exists now."""
    from clbench.config import config_hash
    from clbench.specs import RunSpec

    checkpoint = tmp_path / "w.pt"
    checkpoint.write_bytes(b"weights read by the run")
    record = json.loads(REFERENCE.read_text())
    spec = record["spec"]
    spec = {**spec, "strategy": {**spec["strategy"], "args": {**spec["strategy"]["args"], "init": str(checkpoint)}}}
    config = {**record["strategy_config"], "init": str(checkpoint)}
    at_run = RunSpec.from_dict(spec).identity(config)                   # what the runner hashed
    record = {**record, "spec": spec, "strategy_config": config, "checkpoints": at_run["checkpoints"],
              "identity_hash": config_hash(at_run)}
    checkpoint.write_bytes(b"overwritten since")
    path = tmp_path / "x.json"
    path.write_text(json.dumps(record))
    assert record_files.read(path) == record
    assert record_files.identity(record, RunSpec.from_dict(spec))["checkpoints"] == at_run["checkpoints"]
    older = {k: v for k, v in record.items() if k != "checkpoints"}
    assert "checkpoints" not in record_files.identity(older, RunSpec.from_dict(spec))


def test_a_record_of_other_metrics_is_checked_with_their_own_specs(tmp_path):
    """A record scored by NDCG@10 and Hit@10 (a sequence scenario: ``accuracy_matrix`` empty) reads back, its
    summaries recomputed under each metric's own columns; its matrices without ``metric_specs``, a matrix list
    instead of an object and both matrices missing are refused in one line each."""
    ndcg = {"name": "ndcg@10", "unit": "", "higher_is_better": True, "primary": True, "columns": {}}
    hit = {**ndcg, "name": "hit@10", "primary": False}
    record = sealed({"run_id": "", "status": "finished", "seed": 0,
                     "spec": {"suite": "s", "scenario": {"name": "sc"}, "strategy": {"name": "st"}},
                     "metric_specs": [ndcg, hit], "accuracy_matrix": [], "test_sizes": [3, 5],
                     "matrices": {"ndcg@10": [[0.3, 0.0], [0.2, 0.4]], "hit@10": [[0.6, 0.1], [0.5, 0.7]]}})
    assert record["metrics"]["ndcg@10_last"] == pytest.approx((3 * 0.2 + 5 * 0.4) / 8)
    path = tmp_path / "x.json"
    path.write_text(json.dumps(record))
    assert record_files.read(path) == record
    assert _refusal(tmp_path, {**record, "metric_specs": None}).startswith("metric_specs cannot be read (")
    assert _refusal(tmp_path, {**record, "matrices": ["ndcg@10", "hit@10"]}) == (
        f"matrices lack ndcg@10, hit@10 of its metric_specs; {EDITED}")


def test_records_of_older_shapes_are_checked_as_what_they_are(tmp_path):
    """A committed record written before callbacks and metric specs existed (no ``callbacks`` in its spec, only
    ``accuracy_matrix``) reads back; with ``callbacks: []`` added it is another identity, and its matrix edited
    gives other summaries: both refused. A failed record's summaries are not checked (it has none)."""
    path = REFERENCE.parents[2] / "dytox" / "runs" / "split_mnist__der_dark__s0.json"
    old = json.loads(path.read_text())
    assert "callbacks" not in old["spec"]["strategy"] and "matrices" not in old
    assert record_files.read(path) == old
    spec = {**old["spec"], "strategy": {**old["spec"]["strategy"], "callbacks": []}}
    assert _refusal(tmp_path, {**old, "spec": spec}).startswith("identity_hash ")
    R = [row[:] for row in old["accuracy_matrix"]]
    R[-1][-1] = 0.0
    assert _refusal(tmp_path, {**old, "accuracy_matrix": R}).startswith("metrics.avg_inc_acc is ")
    failed = json.loads(REFERENCE.read_text()) | {"status": "failed", "metrics": {"traceback": "..."}}
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    assert record_files.read(tmp_path / "failed.json") == failed


def test_a_one_by_one_matrix_reads_as_an_offline_run_or_a_single_step():
    """One experience: avg_inc_acc None (offline) or equal to last_acc (online) both read back; another value is
    refused."""
    base = {"run_id": "sc__st__s0", "status": "finished", "seed": 0,
            "spec": {"suite": "s", "scenario": {"name": "sc"}, "strategy": {"name": "st"}},
            "metrics": {"avg_inc_acc": None, "last_acc": 50.0}, "accuracy_matrix": [[0.5]], "test_sizes": [4]}
    online = sealed(base)
    assert online["metrics"]["avg_inc_acc"] == 50.0
    offline = {**online, "metrics": {**online["metrics"], "avg_inc_acc": None}}
    wrong = {**offline, "metrics": {**offline["metrics"], "avg_inc_acc": 40.0}}
    for record in (offline, online):
        record_files.check("p", record)
    with pytest.raises(record_files.CorruptRecord, match=r"^p: metrics.avg_inc_acc is 40.0 but its stored data "
                                                         r"give 50.0; "):
        record_files.check("p", wrong)


@pytest.mark.parametrize("stored, recomputed, same", [
    (0.0, 1e-10, True), (1e6, 1e6 * (1 + 1e-10), True), (1.0, 1.001, False),      # absolute and relative 1e-9
    (None, None, True), (None, 0.0, False), (0.0, None, False),
    (1, True, False), (True, 1, False), (True, True, True),                        # a bool only to itself
    (1.0, "1.0", False), ("a", "a", False), ("a", 1.0, False),                     # text is never a number
])
def test_a_stored_summary_is_the_recomputed_one_only_within_a_json_round_trip(stored, recomputed, same):
    assert record_files._same(stored, recomputed) is same


@pytest.mark.parametrize("matrix, readings", [
    ([[0.5]], (False, True)),                    # one experience: online or offline alike
    ([[0.5, 0.1], [0.4, 0.6]], (False,)),        # square: online
    ([[0.5, 0.6]], (True,)),                     # one row: offline
    ([0.5], (True,)),                            # not a list of rows: read as offline, refused when summarized
    (None, (False,)), ("x", (False,)), ([], (False,)),
])
def test_the_offline_readings_a_matrix_allows(matrix, readings):
    assert record_files._readings(matrix) == readings


# ------------------------------------------------------------------------------------------------ corrupt records
def test_corrupt_and_foreign_records_are_reported_and_skipped(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}], seeds=(0, 1))
    assert run_suite(suite, out) == 0
    runs = out / "runs"
    (runs / "synthetic__test_increasing_logits__s1.json").write_text('{"run_id": "synthetic__te')   # cut short
    (runs / "notes.json").write_text('{"hello": "world"}')
    (runs / "list.json").write_text("[1, 2]")
    capsys.readouterr()

    assert main(["leaderboard", "--out", str(out)]) == 2          # the table is still written from the rest
    err = capsys.readouterr().err
    for name in ("synthetic__test_increasing_logits__s1.json", "notes.json", "list.json"):
        assert str(runs / name) in err
    assert "Traceback" not in err
    table = pd.read_csv(out / "leaderboard.csv")
    assert list(table["n_seeds"]) == [1]

    assert run_suite(suite, out) == 0                                  # the run reruns the corrupt one, skips foreign
    assert "notes.json" in capsys.readouterr().err
    assert list(pd.read_csv(out / "leaderboard.csv")["n_seeds"]) == [2]


# ------------------------------------------------------------------------------------- state, --out, pre-flight
def test_a_state_file_swapped_for_another_run_s_is_refused(tmp_path):
    record = SimpleNamespace(run_id="r", identity_hash="h", code_fingerprint="c", started="t")
    state = tmp_path / "out" / "state" / "r"
    state.mkdir(parents=True)
    (state / "strategy.pt").write_bytes(b"mine")
    record_files.write_owner(state, record)
    path = tmp_path / "out" / "runs" / "r.json"
    as_read = {**vars(record), "state_dir": "state/r", "status": "finished"}
    assert record_files.state_dir(path, as_read) == state.resolve()
    (state / "strategy.pt").write_bytes(b"another run's")
    with pytest.raises(record_files.ForeignState, match="files strategy.pt differ from what the run saved"):
        record_files.state_dir(path, as_read)


# ---------------------------------------------------------------------------------------------- counted twice
def test_a_copied_record_counts_once_whatever_its_file_name_and_is_reported_by_path(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_suite(tiny_suite([{"name": "test_increasing_logits", "args": {"extra": 2.0}}], seeds=(0, 1)), out) == 0
    runs = out / "runs"
    original = runs / "synthetic__test_increasing_logits__s0.json"
    shutil.copy(original, runs / "synthetic__test_increasing_logits__s0 (copy).json")
    shutil.copy(original, runs / "synthetic__test_increasing_logits__s5.json")          # holds seed 0
    capsys.readouterr()
    assert main(["leaderboard", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "s0 (copy).json" in err and "__s5.json" in err and str(original) in err
    table = pd.read_csv(out / "leaderboard.csv")
    assert list(table["n_seeds"]) == [2]
    records, problems = record_files.load_dir(out)
    assert sorted(r["seed"] for r in records) == [0, 1] and len(problems) == 2


# ------------------------------------------------------------------------------------------------ saved state
def test_records_store_paths_relative_to_their_results_folder(copied_results):
    record = json.loads((copied_results / "archive/runs/synthetic__taft_shards__s0.json").read_text())
    assert record["state_dir"] == "state/synthetic__taft_shards__s0"
    assert str(copied_results) not in json.dumps(record)


def test_a_record_with_an_absolute_state_dir_still_reads(copied_results):
    """Records written before this change (absolute state_dir) load: leaderboards and resume read them."""
    record = json.loads((copied_results / "archive/runs/synthetic__taft_shards__s0.json").read_text())
    record["state_dir"] = "/tmp/quickref/state/x"
    path = copied_results / "abs/runs/synthetic__taft_shards__s0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    assert record_files.read(path)["state_dir"] == "/tmp/quickref/state/x"
    with pytest.raises(record_files.ForeignState, match="is missing"):
        record_files.state_dir(path, record)


# ------------------------------------------------------------------------------------------------------ records
def _minimal(**changes) -> dict:
    """The smallest dict every reader of a record can use; ``changes`` replace or (with None) drop keys."""
    data = {"run_id": "syn__naive__s0", "status": "finished", "seed": 0, "metrics": {"last_acc": 50.0},
            "spec": {"suite": "s", "scenario": {"name": "synthetic"}, "strategy": {"name": "naive"}}}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def _labelled(label: str, seed: int, status: str) -> dict:
    """A sealed record (:func:`tests._records.sealed`) of run ``<label>__naive__s<seed>``."""
    return sealed(_minimal(status=status, seed=seed, spec={"suite": "s", "scenario": {"name": "synthetic",
                                                                                     "label": label},
                                                          "strategy": {"name": "naive"}}))


def _write(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


LACKS = "its spec lacks suite, scenario or strategy"


def test_a_corrupt_record_error_starts_with_its_path_and_keeps_it():
    """The message is ``<path>: <reason>`` and ``.path`` is that path as a Path (a dropped path or reason, or a
    path kept as None, is caught)."""
    exc = CorruptRecord("runs/x.json", "broken")
    assert str(exc) == "runs/x.json: broken" and exc.path == Path("runs/x.json") and isinstance(exc, ValueError)


def test_a_valid_record_reads_back_as_the_dict_written(tmp_path):
    """Every key the readers need, with the right type, passes (a check of a misspelled key, or a negated check,
    would refuse every good record); finished and failed are both statuses; '.', '+', '-', '_' may be in a run id."""
    for status, label in (("finished", "syn"), ("failed", "a.b+c-d_e")):
        data = sealed(_minimal(status=status, spec={"suite": "s", "scenario": {"name": "synthetic", "label": label},
                                                   "strategy": {"name": "naive"}}))
        assert records.read(_write(tmp_path, "r.json", data)) == data
        assert records.read(str(tmp_path / "r.json")) == data                 # a str path reads too


@pytest.mark.parametrize("content, reason", [
    ("[1, 2]", "a JSON list, not an object"),
    ("null", "a JSON NoneType, not an object"),
    (_minimal(run_id=None), "missing or mistyped run_id"),
    (_minimal(status=None), "missing or mistyped status"),
    (_minimal(spec=None), "missing or mistyped spec"),
    (_minimal(seed=None), "missing or mistyped seed"),
    (_minimal(metrics=None), "missing or mistyped metrics"),
    (_minimal(seed="0", metrics=[]), "missing or mistyped seed, metrics"),
    (_minimal(run_id=3, spec="s"), "missing or mistyped run_id, spec"),
    (_minimal(spec={"scenario": {"name": "a"}, "strategy": {"name": "b"}}), LACKS),
    (_minimal(spec={"suite": 1, "scenario": {"name": "a"}, "strategy": {"name": "b"}}),
     LACKS),
    (_minimal(spec={"suite": "s", "scenario": {}, "strategy": {"name": "b"}}),
     LACKS),
    (_minimal(spec={"suite": "s", "scenario": {"name": "a"}, "strategy": {"label": "b"}}),
     LACKS),
    (_minimal(spec={"suite": "s", "scenario": "name", "strategy": {"name": "b"}}),
     LACKS),
    (_minimal(spec={"suite": "s", "scenario": {"name": "a"}}), LACKS),
    (_minimal(run_id="../../etc/x"), "run_id '../../etc/x' is not a file name"),
    (_minimal(run_id="a/b"), "run_id 'a/b' is not a file name"),
    (_minimal(run_id="a..b"), "run_id 'a..b' is not a file name"),
    (_minimal(run_id="_a"), "run_id '_a' is not a file name"),
    (_minimal(status="running"), "status 'running' is not one of finished, failed"),
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
