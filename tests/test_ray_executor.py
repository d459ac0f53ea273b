"""Executors and task pools: the Ray executor's driver logic (submission, resume, records written by the driver),
shard members as nested Ray tasks, and the pool each executor installs around its runs. Ray runs against the
stand-in module of ``tests._fakes`` (tasks run synchronously, arguments and results pickled)."""

import sys

import pytest

from clbench import executors, tasks
from clbench.config import parse_suite
from clbench.executors import EXECUTORS
from clbench.runner import RunRecord, record_path
from tests._fakes import fake_ray

TINY_SHARDS = {"name": "taft_shards", "preset": "cpu",
               "args": {"n_shards": 3, "epochs": 1,
                        "model_args": {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}}}


def _suite(strategy: dict, seeds=(0,)):
    return parse_suite({"suite": "t", "seeds": list(seeds),
                        "scenarios": [{"name": "synthetic", "args": {"train_per_class": 20, "test_per_class": 10}}],
                        "strategies": [strategy]})


def test_ray_executor_runs_pending_specs_and_writes_records(tmp_path, monkeypatch):
    calls = {}
    monkeypatch.setitem(sys.modules, "ray", fake_ray(calls))
    suite = _suite({"name": "test_increasing_logits"}, seeds=(0, 1))
    executor = EXECUTORS.get("ray")(address="auto", num_cpus=2)
    assert calls["init"]["address"] == "auto" and calls["resources"] == {"num_cpus": 2, "num_gpus": 0}
    records = executor.run_all(suite.run_specs("cpu"), tmp_path)
    assert sorted(r.run_id for r in records) == ["synthetic__test_increasing_logits__s0",
                                                  "synthetic__test_increasing_logits__s1"]
    assert all(record_path(tmp_path, r.run_id).exists() and r.status == "finished" for r in records)
    assert executor.run_all(suite.run_specs("cpu"), tmp_path) == []          # resume


def test_ray_executor_trains_shard_members_as_nested_tasks_with_the_local_result(tmp_path, monkeypatch):
    specs = _suite(TINY_SHARDS).run_specs("cpu")
    local = EXECUTORS.get("local")().run_all(specs, tmp_path / "local")[0]
    calls = {}
    monkeypatch.setitem(sys.modules, "ray", fake_ray(calls))
    remote = EXECUTORS.get("ray")(shard_workers=2).run_all(specs, tmp_path / "ray")[0]
    steps = len(local.accuracy_matrix)
    # one run task, 3 nested member tasks per experience, at most 2 in flight: before submitting the 3rd member,
    # wait until one of the first two is done (the last wait is the driver's, for the run)
    assert calls["tasks"] == ["_run_remote"] + ["train_delta"] * 3 * steps
    assert calls["waits"] == [1] * steps + [1]
    assert remote.status == local.status == "finished"
    assert remote.accuracy_matrix == local.accuracy_matrix
    saved = RunRecord.load(record_path(tmp_path / "ray", remote.run_id))
    assert saved.accuracy_matrix == local.accuracy_matrix


def test_local_executor_installs_its_process_pool_around_the_runs(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(executors, "run", lambda spec, out: seen.append(tasks.current()))
    EXECUTORS.get("local")(shard_workers=3).run_all(_suite({"name": "test_increasing_logits"}).run_specs("cpu"),
                                                     tmp_path)
    assert [type(p).__name__ for p in seen] == ["ProcessPool"] and seen[0].workers == 3
    assert isinstance(tasks.current(), tasks.SequentialPool)                  # uninstalled after the runs
    EXECUTORS.get("local")().run_all(_suite({"name": "test_increasing_logits"}).run_specs("cpu"), tmp_path / "b")
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
