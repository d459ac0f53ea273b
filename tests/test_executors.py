"""The local executor with ``--jobs N``: runs in worker processes give the records of a sequential run; a run that
raises, a worker killed once (retried) and a worker killed every time (recorded failed) in one suite; Ctrl-C keeps
finished records and resume runs the rest; the worker pool itself, spawned and forked, and when it forks; ``plan``
and the CLI flags.

The Ray executor against a real local Ray cluster (one for the module: ``ray.init(num_cpus=2)``): the local
executor's records for the same seeds; a run that raises, a worker killed once (retried) and one killed every time
(recorded failed) in one suite; Ctrl-C cancels and resume runs the rest; ``--gpus-per-run`` reaches the tasks'
resource request; ``taft_shards`` trains its shards as nested tasks with the local result. Without Ray these skip,
saying how to install it.

Two stand-in tests remain (``tests._fakes.fake_ray``), for what a real cluster does not show: the exact sequence of
nested shard tasks and waits, and the message when Ray is not installed."""

from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
import tests._scale_fakes  # noqa: F401  (registers test_hold_or_crash)
from clbench import api, executors, tasks
from clbench.cli import main
from clbench.data import DatasetNotFound
from clbench.executors import EXECUTORS, LocalExecutor, RayExecutor, plan
from clbench.models.checkpoint import save_weights
from clbench.registry import SCENARIOS
from clbench.runner import RunRecord, record_path
from clbench.suite_file import parse_suite
from clbench.workers import WorkerLost, WorkerPool, start_method
from tests._cli import run_suite
from tests._fakes import fake_ray
from tests._scale_fakes import attempts

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = {"name": "synthetic", "args": {"train_per_class": 15, "test_per_class": 10}}


def _specs(strategies, seeds=(0,)):
    return parse_suite({"suite": "t", "seeds": list(seeds), "scenarios": [SCENARIO],
                        "strategies": strategies}).run_specs("cpu")


# ------------------------------------------------------------------------------------------------ worker pool
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_worker_pool_yields_results_reraises_errors_and_reports_dead_workers(method):
    """Standard-library functions only, so that the spawned workers start fast: ``os._exit(3)`` is a worker that
    dies during its job (exit code 3), ``math.sqrt(-1)`` a job that raises."""
    with WorkerPool(2, int, start_method=method) as pool:
        got = dict(pool.imap_unordered(abs, [-1, -2, -3, -4, -5]))
        assert got == {-1: 1, -2: 2, -3: 3, -4: 4, -5: 5}
        lost = dict(pool.imap_unordered(os._exit, [3], retries=2))
        assert lost == {3: WorkerLost(exitcode=3, attempts=3)}
        assert "died (exit code 3), 3 time(s) (retries: 2)" in lost[3].reason
        assert dict(pool.imap_unordered(abs, [-7])) == {-7: 7}          # the pool replaced its dead workers
        with pytest.raises(ValueError, match="math domain error"):
            list(pool.imap_unordered(math.sqrt, [4.0, -1.0]))
        workers = [w.process for w in pool.workers]
    assert workers and not any(p.is_alive() for p in workers)               # closed: no process left behind
    assert WorkerLost(exitcode=-9, attempts=2).reason.startswith(
        "WorkerLost: the worker process running this job died (killed by signal SIGKILL), 2 time(s)")


def test_fork_only_for_one_thread_cpu_workers_on_linux(monkeypatch):
    """More threads, an unset thread count, a GPU, CUDA initialized here or another system: spawn (a forked child
    hangs in OpenMP, loses its CUDA context or breaks macOS libraries)."""
    monkeypatch.setattr("sys.platform", "linux")
    assert start_method(1, accelerator=False) == "fork"
    assert [start_method(2, False), start_method(None, False), start_method(1, True)] == ["spawn"] * 3
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)           # CUDA used in this process
    assert start_method(1, accelerator=False) == "spawn"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr("sys.platform", "darwin")
    assert start_method(1, accelerator=False) == "spawn"


def _matmul_trace(n: int) -> float:
    x = torch.linspace(0, 1, n * n).reshape(n, n)
    return float(torch.relu(x @ x.T).sum() + torch.nn.functional.conv2d(x[None, None], torch.ones(1, 1, 3, 3)).sum())


def test_forked_one_thread_worker_runs_torch_after_the_parent_used_two_threads():
    """The case ``start_method`` allows: this thread used OpenMP with 2 threads, then forks (from the same thread:
    GNU OpenMP's pool belongs to the thread that used it) a worker set to one thread, which still runs matmul, an
    elementwise op and a convolution. With 2 threads in the worker this hangs (checked by hand); an alarm turns a
    hang into a failure after 120 s instead of blocking the test run."""
    def hung(*_):
        raise TimeoutError("the forked worker hung")

    before = torch.get_num_threads()
    previous = signal.signal(signal.SIGALRM, hung)
    torch.set_num_threads(2)
    try:
        expected = _matmul_trace(1024)
        signal.alarm(120)
        with WorkerPool(1, torch.set_num_threads, (1,), start_method="fork") as pool:
            assert dict(pool.imap_unordered(_matmul_trace, [1024])) == {1024: pytest.approx(expected, rel=1e-6)}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        torch.set_num_threads(before)


# --------------------------------------------------------------------------------------------------- executor
def test_jobs_2_gives_the_sequential_records_and_survives_failures_and_dead_workers(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    naive = {"name": "naive", "preset": "cpu", "args": {"epochs": 1}}
    diverges = {"name": "naive", "preset": "cpu", "label": "diverges",
                "args": {"epochs": 1, "optimizer": "sgd", "lr": 1e30, "momentum": 0.0}}
    crashing = {"name": "test_hold_or_crash", "args": {"marker_dir": str(markers), "crash_seeds": [1, 2],
                                                         "crash_times": 1}}
    always = {"name": "test_hold_or_crash", "label": "always_crashes",
              "args": {"marker_dir": str(markers / "always"), "crash_seeds": [0], "crash_times": 9}}
    (markers / "always").mkdir()
    specs = _specs([naive], seeds=(0, 1)) + _specs([diverges, always]) + _specs([crashing], seeds=(1, 2))
    sequential = LocalExecutor().run_all(_specs([naive], seeds=(0, 1)), tmp_path / "sequential")

    records = LocalExecutor(jobs=2, threads=1, retries=1).run_all(specs, tmp_path / "parallel")

    assert [r.run_id for r in records] == [s.run_id for s in specs]                      # in spec order
    by_id = {r.run_id: r for r in records}
    for r in sequential:                                                 # same seeds, same matrices, bit for bit
        assert by_id[r.run_id].status == "finished" and by_id[r.run_id].accuracy_matrix == r.accuracy_matrix
    assert by_id["synthetic__diverges__s0"].status == "failed"
    assert "non-finite" in by_id["synthetic__diverges__s0"].reason
    for seed in (1, 2):                                                  # killed once, retried once: finished
        assert by_id[f"synthetic__test_hold_or_crash__s{seed}"].status == "finished"
        assert attempts(markers, seed) == 2
    lost = by_id["synthetic__always_crashes__s0"]
    assert lost.status == "failed" and attempts(markers / "always", 0) == 2           # 1 + --retries attempts
    assert "(killed by signal SIGKILL), 2 time(s)" in lost.reason
    saved = RunRecord.load(record_path(tmp_path / "parallel", lost.run_id))            # written, with its identity
    assert saved.status == "failed" and saved.reason == lost.reason and saved.identity_hash == lost.identity_hash
    for r in records:
        assert RunRecord.load(record_path(tmp_path / "parallel", r.run_id)).status == r.status


WAITED = ("Ctrl-C came before seed 0 was recorded and seed 1 started (600 s): the workers did not start in time on "
          "this machine; rerun on a quieter one")


def _press_ctrl_c_once(ready, wait_s: float = 600.0) -> types.SimpleNamespace:
    """Sends SIGINT to this process, from a thread, once ``ready()`` holds (polled every 50 ms) or after ``wait_s``
    seconds; the returned namespace's ``reached`` says which (set before the signal). A loaded machine can take
    minutes to start the workers: pressing after a short fixed wait tests the wrong moment."""
    pressed = types.SimpleNamespace(reached=False)

    def press():
        deadline = time.monotonic() + wait_s
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        pressed.reached = bool(ready())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press, daemon=True).start()
    return pressed


def test_ctrl_c_stops_the_workers_keeps_finished_records_and_resume_runs_the_rest(tmp_path, ctrl_c):
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "hold").write_text("")
    specs = _specs([{"name": "test_hold_or_crash", "args": {"marker_dir": str(markers), "hold_seeds": [1, 2, 3]}}],
                   seeds=(0, 1, 2, 3))
    out = tmp_path / "out"
    first = record_path(out, specs[0].run_id)

    pressed = _press_ctrl_c_once(lambda: first.exists() and attempts(markers, 1))
    with pytest.raises(KeyboardInterrupt):
        LocalExecutor(jobs=2, threads=1).run_all(specs, out)
    assert pressed.reached, WAITED
    assert multiprocessing.active_children() == []                       # the held worker was stopped
    assert sorted(p.name for p in (out / "runs").glob("*.json")) == [first.name]

    (markers / "hold").unlink()
    records = LocalExecutor().run_all(specs, out)                        # resume: the three others only
    assert [r.run_id for r in records] == [s.run_id for s in specs[1:]]
    assert all(r.status == "finished" for r in records) and attempts(markers, 0) == 1


class _Chosen(Exception):
    """Raised by the stand-in pool below with the start method the executor chose."""


def test_executor_forks_one_thread_cpu_runs_and_spawns_the_rest(monkeypatch):
    def pool(workers, setup, setup_args=(), start_method="spawn"):
        raise _Chosen(start_method)

    monkeypatch.setattr(executors, "WorkerPool", pool)
    monkeypatch.setattr("sys.platform", "linux")
    specs = _specs([{"name": "naive", "preset": "cpu"}], seeds=(0, 1))
    chosen = []
    for threads in (1, 2, None):
        with pytest.raises(_Chosen) as info:
            LocalExecutor(jobs=2, threads=threads, force=True).run_all(specs, "/nonexistent/clbench-test")
        chosen.append(info.value.args[0])
    assert chosen == ["fork", "spawn", "spawn"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)           # CUDA used in this process
    with pytest.raises(_Chosen, match="spawn"):
        LocalExecutor(jobs=2, threads=1, force=True).run_all(specs, "/nonexistent/clbench-test")


# ------------------------------------------------------------------------------------------------- plan, flags
def test_plan_fills_the_cores_with_one_thread_runs_by_default(monkeypatch):
    monkeypatch.setattr(executors, "available_cores", lambda: 8)
    assert plan(None, None, "cpu") == (8, 1)          # auto: a run per core, 1 thread each
    assert plan(None, 2, "cpu") == (4, 2)             # auto with --threads 2: a run per 2 cores
    assert plan(4, None, "cpu") == (4, 2)             # --jobs 4: the cores shared out
    assert plan(16, None, "cpu") == (16, 1)
    assert plan(1, None, "cpu") == (1, None)          # --jobs 1: torch's default, as before --jobs existed
    assert plan(3, 5, "cpu") == (3, 5)


def test_bad_jobs_flags_stop_before_the_first_run(tiny_suite, tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(executors, "run", lambda spec, out: calls.append(spec))
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    cases = [(["--jobs", "0"], "--jobs must be at least 1"),
             (["--retries", "-1"], "--retries must be at least 0"),
             (["--gpus-per-run", "1"], "--executor ray only"),
             (["--executor", "ray", "--cpus-per-run", "0"], "above 0"),
             (["--executor", "ray", "--jobs", "2"], "--jobs is for the local executor")]
    for flags, message in cases:
        capsys.readouterr()
        assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet", *flags]) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (flags, err)
    monkeypatch.setenv("CLBENCH_JOBS", "many")
    assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "$CLBENCH_JOBS: expected 'auto' or a number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--suite", str(suite), "--jobs", "two"])
    assert "expected 'auto' or a number of runs at once, got 'two'" in capsys.readouterr().err
    assert calls == []


def test_cli_jobs_2_runs_in_workers_with_one_thread_each(tiny_suite, tmp_path, capsys):
    markers = tmp_path / "markers"
    markers.mkdir()
    suite = tiny_suite([{"name": "test_hold_or_crash", "args": {"marker_dir": str(markers)}}], seeds=(0, 1))
    assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet", "--quiet-table", "--device", "cpu",
                 "--jobs", "2"]) == 0
    assert "2 runs (1 scenarios x 1 strategies x 2 seeds; 2 at once, 1 torch thread(s) each)" in \
        capsys.readouterr().err
    assert len(list((tmp_path / "o" / "runs").glob("*.json"))) == 2
    pids = {int((markers / f"{seed}.0").read_text()) for seed in (0, 1)}
    assert os.getpid() not in pids                          # trained in the worker processes, not here


def test_a_record_of_another_suite_is_refused_before_any_run_even_with_force(tmp_path):
    """Run ids do not name the suite: a finished record of suite ``other`` where suite ``t`` would write its run is
    refused before the first run (with and without --force), naming the file, both suites and the fix; the record
    is left as it was."""
    import json

    from clbench.errors import ConfigError
    from tests._records import sealed

    (spec,) = _specs(["naive"])
    path = record_path(tmp_path, spec.run_id)
    path.parent.mkdir(parents=True)
    theirs = sealed({"status": "finished", "seed": 0, "metrics": {"last_acc": 50.0},
                     "spec": {**spec.to_dict(), "suite": "other"}})
    path.write_text(json.dumps(theirs))
    before = path.read_text()
    for force in (False, True):
        with pytest.raises(ConfigError) as info:
            LocalExecutor(force=force).run_all([spec], tmp_path)
        assert str(info.value) == (f"{path} holds a run of the suite 'other', not of 't' (1 such record(s) in "
                                   f"{tmp_path / 'runs'}), and this suite would replace it: pass another --out (one "
                                   f"folder per suite), or move those records away first.")
    assert path.read_text() == before
    assert executors.record_status(spec, tmp_path) == "suite"


def test_resume_names_the_file_and_field_of_an_edited_record_and_runs_it_again(tmp_path, capsys):
    """A finished record whose avg_inc_acc was edited (issue #52) is not counted as done: resume says, in one line,
    the file and the field that disagree (it said only '1 with an unreadable record'), and runs it again."""
    from tests._records import sealed

    (spec,) = _specs(["naive"])
    path = record_path(tmp_path, spec.run_id)
    path.parent.mkdir(parents=True)
    record = sealed({"status": "finished", "seed": 0, "metrics": {"avg_inc_acc": 60.0, "last_acc": 50.0},
                     "spec": spec.to_dict()})
    record["metrics"]["avg_inc_acc"] = 99.99
    path.write_text(json.dumps(record))
    assert executors.pending([spec], tmp_path) == [spec]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"not a result, run again: {path}: metrics.avg_inc_acc is 99.99 but its stored data give "
                        f"60.0; the record was edited or damaged after its run; restore it or run it again (--force)")
    assert lines[1].startswith(f"resuming: 0 of 1 runs already finished in {tmp_path}; running 1: 1 with an "
                               f"unreadable or edited record")


def test_a_rerun_with_another_configuration_keeps_the_earlier_outputs_aside_and_writes_through_no_link(tmp_path,
                                                                                                        capsys):
    """The suite run again with another learning rate: the earlier record (still readable, its own identity) and
    its artifacts are moved to ``replaced/<stamp>__<run>/`` before the run, one stderr line says so; the run's
    ``artifacts/<run>`` made a link to a folder outside is moved as a link, and that folder keeps its files."""
    import json

    from clbench import records

    (before,) = LocalExecutor().run_all(_specs(["naive"]), tmp_path / "o")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "training_log.jsonl").write_text("precious")
    artifacts = tmp_path / "o" / "artifacts" / before.run_id
    artifacts.rename(tmp_path / "o" / "old_artifacts")
    os.symlink(outside, artifacts)
    capsys.readouterr()
    (after,) = LocalExecutor().run_all(_specs([{"name": "naive", "args": {"lr": 0.002}}]), tmp_path / "o")
    (kept,) = (tmp_path / "o" / "replaced").iterdir()
    err = capsys.readouterr().err
    assert f"replacing {before.run_id}: its earlier record, artifacts kept in {kept}\n" in err
    old = records.read(kept / "runs" / f"{before.run_id}.json")
    assert old["identity_hash"] == before.identity_hash != after.identity_hash
    assert (kept / "artifacts" / before.run_id).is_symlink()
    assert os.listdir(outside) == ["training_log.jsonl"] and (outside / "training_log.jsonl").read_text() == "precious"
    assert not artifacts.is_symlink() and (artifacts / "training_log.jsonl").exists()
    assert json.loads(record_path(tmp_path / "o", after.run_id).read_text())["identity_hash"] == after.identity_hash


def test_the_ray_driver_keeps_the_earlier_record_aside_before_submitting(tmp_path, monkeypatch, capsys):
    """Ray (stand-in: tasks run at submission): the driver moves the earlier record to replaced/ itself before it
    submits the run, as a worker on another filesystem would find nothing to move (the worker's own set-aside is
    disabled here), and then writes the new record."""
    import sys
    import types

    from clbench import records
    from clbench.executors import RayExecutor
    from tests._fakes import fake_ray

    monkeypatch.setitem(sys.modules, "ray", fake_ray({}))
    (before,) = RayExecutor().run_all(_specs(["naive"]), tmp_path)
    monkeypatch.setattr("clbench.runner.replaced", types.SimpleNamespace(set_aside=lambda out, run_id: None))
    capsys.readouterr()
    (after,) = RayExecutor().run_all(_specs([{"name": "naive", "args": {"lr": 0.002}}]), tmp_path)
    (kept,) = (tmp_path / "replaced").iterdir()
    assert f"replacing {before.run_id}: its earlier record, artifacts kept in {kept}\n" in capsys.readouterr().err
    assert records.read(kept / "runs" / f"{before.run_id}.json")["identity_hash"] == before.identity_hash
    assert records.read(record_path(tmp_path, after.run_id))["identity_hash"] == after.identity_hash


# ------------------------------------------------------------------------------------------------ corrupt dataset
SCENARIO_CALLS = []


@SCENARIOS.register("test_corrupt_dataset")
def corrupt_dataset(*, seed: int = 0, path: str = "") -> None:
    """A scenario whose data file fails its checksum."""
    from clbench.data.checksums import verify

    SCENARIO_CALLS.append(seed)
    verify(__import__("pathlib").Path(path), "0" * 32)


# ---------------------------------------------------------------------------------------------------- staleness
def test_resume_reruns_records_made_by_other_code_and_says_so(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}], seeds=(0, 1))
    assert run_suite(suite, out) == 0
    path = out / "runs" / "synthetic__test_increasing_logits__s0.json"
    record = json.loads(path.read_text())
    assert len(record["code_fingerprint"]) >= 12
    record["code_fingerprint"] = "0" * 12             # as if made before the strategy's code changed
    path.write_text(json.dumps(record))
    capsys.readouterr()

    assert run_suite(suite, out) == 0                          # no -v: the resume line is printed anyway
    err = capsys.readouterr().err
    assert "resuming: 1 of 2 runs already finished" in err and "1 made by other code" in err
    assert json.loads(path.read_text())["code_fingerprint"] != "0" * 12

    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    assert run_suite(suite, out) == 0
    assert "resuming: 2 of 2 runs already finished" in capsys.readouterr().err
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}
    assert run_suite(suite, out, "--force") == 0               # --force reruns everything
    assert all(p.stat().st_mtime_ns != t for p, t in stamps.items())


def test_a_checksum_mismatch_stops_the_suite_once(tmp_path, capsys):
    data = tmp_path / "data.bin"
    data.write_bytes(b"not the official file")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"suite": "s", "seeds": [0, 1],
                                     "scenarios": [{"name": "test_corrupt_dataset", "args": {"path": str(data)}}],
                                     "strategies": ["test_increasing_logits", "naive"]}))
    SCENARIO_CALLS.clear()
    assert run_suite(suite, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "content md5" in err and SCENARIO_CALLS == [0]
    assert not list((tmp_path / "out").rglob("*.json"))


DIGITS = {"suite": "s", "seeds": [0], "scenarios": [{"name": "split_digits"}],
          "strategies": [{"name": "naive", "preset": "cpu"}]}


# ------------------------------------------------------------------------------------------- driver killed
def _driver(tmp_path, markers, seeds=(0, 1, 2, 3)):
    """A suite of held runs started with --jobs 2 in a separate driver process."""
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({
        "suite": "s", "seeds": list(seeds),
        "scenarios": [{"name": "synthetic", "args": {"train_per_class": 5, "test_per_class": 5}}],
        "strategies": [{"name": "test_hold_or_crash",
                        "args": {"marker_dir": str(markers), "hold_seeds": [1, 2, 3]}}]}))
    code = ("import sys, tests._scale_fakes; from clbench.cli import main; "
            f"sys.exit(main(['--suite', {str(suite)!r}, '--out', {str(tmp_path / 'out')!r}, '--quiet', "
            "'--quiet-table', '--device', 'cpu', '--jobs', '2']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ------------------------------------------------------------------------------------------------ checkpoints
def test_overwriting_an_init_checkpoint_makes_resume_run_again(tmp_path, capsys):
    scenario = api.scenario("split_digits")
    strategy = api.strategy("naive", scenario.info, preset="cpu")
    checkpoint = tmp_path / "w0.pt"
    save_weights(strategy.model.feature_extractor, checkpoint)
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({**DIGITS, "strategies": [{"name": "naive", "preset": "cpu",
                                                              "args": {"init": str(checkpoint), "epochs": 1}}]}))
    out = tmp_path / "out"
    assert run_suite(suite, out) == 0
    first = json.loads((out / "runs/split_digits__naive__s0.json").read_text())
    assert first["checkpoints"] == {"init": first["checkpoints"]["init"]} and len(first["checkpoints"]["init"]) == 16
    with torch.no_grad():
        for p in strategy.model.feature_extractor.parameters():
            p.add_(0.5)
    save_weights(strategy.model.feature_extractor, checkpoint)           # another pretraining, same path
    capsys.readouterr()
    assert run_suite(suite, out) == 0
    assert "1 made with another configuration" in capsys.readouterr().err
    second = json.loads((out / "runs/split_digits__naive__s0.json").read_text())
    assert second["checkpoints"] != first["checkpoints"]
    assert second["identity_hash"] != first["identity_hash"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_driver_leaves_no_worker_behind(tmp_path, how):
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "hold").write_text("")
    driver = _driver(tmp_path, markers)
    try:
        deadline, workers = time.monotonic() + 240, set()
        while len(workers) < 2 and time.monotonic() < deadline:          # both workers in a run
            time.sleep(0.1)
            workers = {int(text) for p in markers.glob("[0-9]*.*") if (text := p.read_text())}
        assert len(workers) == 2 and driver.pid not in workers
        time.sleep(0.5)
        driver.send_signal(how)
        _, err = driver.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers), "a worker outlived its driver"
    finally:
        (markers / "hold").unlink(missing_ok=True)
        driver.kill()
    if how == signal.SIGTERM:
        lines = [line for line in err.strip().splitlines() if "suite s:" not in line]
        assert driver.returncode == 143, err
        assert len(lines) == 1 and "interrupted (SIGTERM)" in lines[0] and "rerun the same command" in lines[0], err
        assert [p.name for p in (tmp_path / "out/runs").glob("*.json")] == ["synthetic__test_hold_or_crash__s0.json"]


def test_sigterm_in_process_keeps_finished_records_and_says_how_to_resume(tiny_suite, tmp_path, capsys,
                                                                           monkeypatch):
    real_run, started = executors.run, []

    def terminated_at_the_second_run(spec, out):
        started.append(spec)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGTERM)       # the first run is recorded
        return real_run(spec, out)

    monkeypatch.setattr(executors, "run", terminated_at_the_second_run)
    suite = tiny_suite([{"name": "test_increasing_logits"}], seeds=(0, 1))
    before = signal.getsignal(signal.SIGTERM)       # SIG_DFL, or e.g. Ray's when a Ray test ran in this process
    assert run_suite(suite, tmp_path / "out") == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("interrupted (SIGTERM): 1 finished records are kept") and len(err) == 2, err
    assert len(list((tmp_path / "out/runs").glob("*.json"))) == 1
    assert signal.getsignal(signal.SIGTERM) is before      # the suite's handler is taken back


TINY_SHARDS = {"name": "taft_shards", "preset": "cpu",
               "args": {"n_shards": 3, "epochs": 1,
                        "model_args": {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}}}


INSTALL = "Ray is not installed: pip install 'clbench[dev]' (or pip install 'ray[default]') to run these tests"


def _ray_specs(strategies, seeds=(0,)):
    return parse_suite({"suite": "t", "seeds": list(seeds),
                        "scenarios": [{"name": "synthetic", "args": {"train_per_class": 20, "test_per_class": 10}}],
                        "strategies": strategies}).run_specs("cpu")


@pytest.fixture(scope="module")
def ray_cluster():
    """A real local Ray cluster with 2 CPUs for the whole module (about 20-30 s to start here)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip(INSTALL)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------------------------------- real Ray
def test_same_records_as_the_local_executor_and_resume(ray_cluster, tmp_path):
    specs = _ray_specs([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}}], seeds=(0, 1))
    local = {r.run_id: r for r in LocalExecutor().run_all(specs, tmp_path / "local")}
    remote = RayExecutor().run_all(specs, tmp_path / "ray")
    assert sorted(r.run_id for r in remote) == sorted(local)
    for r in remote:
        assert r.status == "finished" and r.accuracy_matrix == local[r.run_id].accuracy_matrix
        assert RunRecord.load(record_path(tmp_path / "ray", r.run_id)).accuracy_matrix == r.accuracy_matrix
    assert RayExecutor().run_all(specs, tmp_path / "ray") == []                         # resume: nothing to do


def test_failed_runs_and_dead_workers_are_recorded_while_the_others_finish(ray_cluster, tmp_path):
    markers = tmp_path / "markers"
    (markers / "always").mkdir(parents=True)
    diverges = {"name": "naive", "preset": "cpu", "label": "diverges",
                "args": {"epochs": 1, "optimizer": "sgd", "lr": 1e30, "momentum": 0.0}}
    once = {"name": "test_hold_or_crash", "args": {"marker_dir": str(markers), "crash_seeds": [1], "crash_times": 1}}
    always = {"name": "test_hold_or_crash", "label": "always_crashes",
              "args": {"marker_dir": str(markers / "always"), "crash_seeds": [0], "crash_times": 9}}
    specs = _ray_specs([diverges, always]) + _ray_specs([once], seeds=(1, 2))
    records = {r.run_id: r for r in RayExecutor(retries=1).run_all(specs, tmp_path / "out")}
    assert records["synthetic__diverges__s0"].status == "failed"
    assert "non-finite" in records["synthetic__diverges__s0"].reason
    assert records["synthetic__test_hold_or_crash__s1"].status == "finished" and attempts(markers, 1) == 2
    assert records["synthetic__test_hold_or_crash__s2"].status == "finished" and attempts(markers, 2) == 1
    lost = records["synthetic__always_crashes__s0"]
    assert lost.status == "failed" and attempts(markers / "always", 0) == 2              # 1 + retries
    assert lost.reason.startswith("WorkerCrashedError: ") and lost.reason.endswith("(tried 2 time(s))")
    saved = RunRecord.load(record_path(tmp_path / "out", lost.run_id))
    assert saved.status == "failed" and saved.reason == lost.reason and saved.identity_hash == lost.identity_hash


def test_a_missing_dataset_stops_the_suite_on_the_driver(ray_cluster, tmp_path):
    """As with the local executor: a set-up error every run would repeat is raised, not recorded per run."""
    specs = parse_suite({"suite": "t", "seeds": [0, 1], "scenarios": [{"name": "test_missing_dataset"}],
                         "strategies": [{"name": "test_increasing_logits"}]}).run_specs("cpu")
    with pytest.raises(DatasetNotFound, match="this stops the suite"):
        RayExecutor().run_all(specs, tmp_path)
    assert not list(tmp_path.rglob("*.json"))


def test_ctrl_c_cancels_pending_and_running_tasks_keeps_finished_records_and_resumes(ray_cluster, tmp_path, ctrl_c):
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "hold").write_text("")
    specs = _ray_specs([{"name": "test_hold_or_crash", "args": {"marker_dir": str(markers), "hold_seeds": [1, 2, 3]}}],
                   seeds=(0, 1, 2, 3))
    out = tmp_path / "out"
    first = record_path(out, specs[0].run_id)

    pressed = _press_ctrl_c_once(lambda: first.exists() and attempts(markers, 1))
    with pytest.raises(KeyboardInterrupt):
        RayExecutor().run_all(specs, out)
    assert pressed.reached, WAITED
    assert sorted(p.name for p in (out / "runs").glob("*.json")) == [first.name]
    held = [int(p.read_text()) for p in markers.glob("[123].*")]
    deadline = time.monotonic() + 30
    while any(_signalable(pid) for pid in held) and time.monotonic() < deadline:               # force-cancelled
        time.sleep(0.2)
    assert held and not any(_signalable(pid) for pid in held)

    (markers / "hold").unlink()
    records = RayExecutor().run_all(specs, out)                       # resume: the three others only
    assert sorted(r.run_id for r in records) == [s.run_id for s in specs[1:]]
    assert all(r.status == "finished" for r in records) and attempts(markers, 0) == 1
    assert len(list((out / "runs").glob("*.json"))) == 4


def test_resource_flags_reach_the_task_options(ray_cluster, tiny_suite, tmp_path, monkeypatch):
    made = []
    def run_all(self, specs, out):                         # no run: the folder a real executor creates, no records
        made.append(self)
        (out / "runs").mkdir(parents=True, exist_ok=True)
        return []

    monkeypatch.setattr(RayExecutor, "run_all", run_all)
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet", "--quiet-table", "--executor",
                 "ray", "--gpus-per-run", "0.5", "--cpus-per-run", "2", "--retries", "3"]) == 0
    options = made[0].remote._default_options              # what every run's task asks the scheduler for
    assert (options["num_gpus"], options["num_cpus"], options["max_retries"]) == (0.5, 2, 3)
    assert made[0].threads == 2                            # torch threads follow --cpus-per-run
    assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet", "--quiet-table",
                 "--executor", "ray"]) == 0
    options = made[1].remote._default_options
    assert (options["num_gpus"], options["num_cpus"], options["max_retries"]) == (0, 1, 1)


def test_taft_shards_trains_shards_as_nested_ray_tasks_with_the_local_result(ray_cluster, tmp_path):
    specs = _ray_specs([TINY_SHARDS])
    local = LocalExecutor().run_all(specs, tmp_path / "local")[0]
    (remote,) = RayExecutor(shard_workers=2).run_all(specs, tmp_path / "ray")
    assert remote.status == local.status == "finished"
    assert remote.accuracy_matrix == local.accuracy_matrix


# ------------------------------------------------------------------------------------------ stand-in (fake) Ray
def test_shard_members_are_nested_tasks_at_most_shard_workers_in_flight(tmp_path, monkeypatch):
    """The exact task and wait sequence, which a real cluster does not expose."""
    specs = _ray_specs([TINY_SHARDS])
    calls = {}
    monkeypatch.setitem(sys.modules, "ray", fake_ray(calls))
    remote = EXECUTORS.get("ray")(shard_workers=2).run_all(specs, tmp_path / "ray")[0]
    steps = len(remote.accuracy_matrix)
    # one run task, 3 nested member tasks per experience, at most 2 in flight: before submitting the 3rd member,
    # wait until one of the first two is done (the last wait is the driver's, for the run)
    assert calls["tasks"] == ["_run_remote"] + ["train_delta"] * 3 * steps
    assert calls["waits"] == [1] * steps + [1]


def test_local_executor_installs_its_process_pool_around_the_runs(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(executors, "run", lambda spec, out: seen.append(tasks.current()))
    EXECUTORS.get("local")(shard_workers=3).run_all(_ray_specs([{"name": "test_increasing_logits"}]), tmp_path)
    assert [type(p).__name__ for p in seen] == ["ProcessPool"] and seen[0].workers == 3
    assert isinstance(tasks.current(), tasks.SequentialPool)                  # uninstalled after the runs
    EXECUTORS.get("local")().run_all(_ray_specs([{"name": "test_increasing_logits"}]), tmp_path / "b")
    assert isinstance(seen[-1], tasks.SequentialPool)


def test_make_pool_is_sequential_for_one_worker():
    assert isinstance(tasks.make_pool("ray", 1), tasks.SequentialPool)     # no Ray needed for one worker
    assert tasks.make_pool("process", 4).workers == 4
    with pytest.raises(ValueError, match="at least 1"):
        tasks.make_pool("process", 0)


def test_missing_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(RuntimeError, match=r"pip install 'clbench\[ray\]'"):
        EXECUTORS.get("ray")()
    with pytest.raises(RuntimeError, match=r"pip install 'clbench\[ray\]'"):
        tasks.make_pool("ray", 2)
