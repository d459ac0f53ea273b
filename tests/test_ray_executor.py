"""The Ray executor against a real local Ray cluster (one for the module: ``ray.init(num_cpus=2)``): the local
executor's records for the same seeds; a run that raises, a worker killed once (retried) and one killed every time
(recorded failed) in one suite; Ctrl-C cancels and resume runs the rest; ``--gpus-per-run`` reaches the tasks'
resource request; ``taft_shards`` trains its shards as nested tasks with the local result. Without Ray these skip,
saying how to install it.

Two stand-in tests remain (``tests._fakes.fake_ray``), for what a real cluster does not show: the exact sequence of
nested shard tasks and waits, and the message when Ray is not installed."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time

import pytest

import tests._scale_fakes  # noqa: F401  (registers test_hold_or_crash; Ray workers import it too)
from clbench import executors, tasks
from clbench.cli import main
from clbench.data import DatasetNotFound
from clbench.executors import EXECUTORS, LocalExecutor, RayExecutor
from clbench.runner import RunRecord, record_path
from clbench.suite_file import parse_suite
from tests._fakes import fake_ray
from tests._scale_fakes import attempts

TINY_SHARDS = {"name": "taft_shards", "preset": "cpu",
               "args": {"n_shards": 3, "epochs": 1,
                        "model_args": {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}}}
INSTALL = "Ray is not installed: pip install 'clbench[dev]' (or pip install 'ray[default]') to run these tests"


def _specs(strategies, seeds=(0,)):
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


# --------------------------------------------------------------------------------------------------- real Ray
def test_same_records_as_the_local_executor_and_resume(ray_cluster, tmp_path):
    specs = _specs([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}}], seeds=(0, 1))
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
    specs = _specs([diverges, always]) + _specs([once], seeds=(1, 2))
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_cancels_pending_and_running_tasks_keeps_finished_records_and_resumes(ray_cluster, tmp_path, ctrl_c):
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "hold").write_text("")
    specs = _specs([{"name": "test_hold_or_crash", "args": {"marker_dir": str(markers), "hold_seeds": [1, 2, 3]}}],
                   seeds=(0, 1, 2, 3))
    out = tmp_path / "out"
    first = record_path(out, specs[0].run_id)

    def press_ctrl_c():                        # once seed 0 is recorded and seed 1 is held in its worker
        deadline = time.monotonic() + 120
        while not (first.exists() and attempts(markers, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        RayExecutor().run_all(specs, out)
    assert sorted(p.name for p in (out / "runs").glob("*.json")) == [first.name]
    held = [int(p.read_text()) for p in markers.glob("[123].*")]
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in held) and time.monotonic() < deadline:               # force-cancelled
        time.sleep(0.2)
    assert held and not any(_alive(pid) for pid in held)

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
    specs = _specs([TINY_SHARDS])
    local = LocalExecutor().run_all(specs, tmp_path / "local")[0]
    (remote,) = RayExecutor(shard_workers=2).run_all(specs, tmp_path / "ray")
    assert remote.status == local.status == "finished"
    assert remote.accuracy_matrix == local.accuracy_matrix


# ------------------------------------------------------------------------------------------ stand-in (fake) Ray
def test_shard_members_are_nested_tasks_at_most_shard_workers_in_flight(tmp_path, monkeypatch):
    """The exact task and wait sequence, which a real cluster does not expose."""
    specs = _specs([TINY_SHARDS])
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
    EXECUTORS.get("local")(shard_workers=3).run_all(_specs([{"name": "test_increasing_logits"}]), tmp_path)
    assert [type(p).__name__ for p in seen] == ["ProcessPool"] and seen[0].workers == 3
    assert isinstance(tasks.current(), tasks.SequentialPool)                  # uninstalled after the runs
    EXECUTORS.get("local")().run_all(_specs([{"name": "test_increasing_logits"}]), tmp_path / "b")
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
