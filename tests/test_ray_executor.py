"""The Ray executor's driver logic (submission, resume, records written by the driver), against a stand-in
``ray`` module that runs tasks synchronously: Ray itself is an optional extra and not installed in CI."""

import sys
import types

import pytest

import tests._fakes  # noqa: F401
from clbench.config import parse_suite
from clbench.executors import EXECUTORS
from clbench.runner import record_path


class _Ref:
    def __init__(self, value):
        self.value = value


def _fake_ray(calls):
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: bool(calls.get("init"))
    ray.init = lambda **kw: calls.update(init=kw)

    def remote(**resources):
        calls["resources"] = resources
        return lambda fn: types.SimpleNamespace(remote=lambda *a: _Ref(fn(*a)))

    ray.remote = remote
    ray.wait = lambda refs, num_returns: (refs[:num_returns], refs[num_returns:])
    ray.get = lambda ref: ref.value
    return ray


def test_ray_executor_runs_pending_specs_and_writes_records(tmp_path, monkeypatch):
    calls = {}
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(calls))
    suite = parse_suite({"suite": "t", "seeds": [0, 1], "scenarios": [{"name": "synthetic"}],
                         "strategies": [{"name": "test_increasing_logits"}]})
    executor = EXECUTORS.get("ray")(address="auto", num_cpus=2)
    assert calls["init"]["address"] == "auto" and calls["resources"] == {"num_cpus": 2, "num_gpus": 0}
    records = executor.run_all(suite.run_specs("cpu"), tmp_path)
    assert sorted(r.run_id for r in records) == ["synthetic__test_increasing_logits__s0",
                                                  "synthetic__test_increasing_logits__s1"]
    assert all(record_path(tmp_path, r.run_id).exists() and r.status == "finished" for r in records)
    assert executor.run_all(suite.run_specs("cpu"), tmp_path) == []          # resume


def test_missing_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(RuntimeError, match=r"pip install 'clbench\[ray\]'"):
        EXECUTORS.get("ray")()
