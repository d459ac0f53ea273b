"""Shared fixtures. Tests run offline on CPU; real datasets are found through $CLBENCH_DATA when it is set."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import yaml

warnings.filterwarnings("ignore", message="No loggers specified")


def pytest_configure(config):
    import clbench  # noqa: F401, I001  (sets OMP_WAIT_POLICY before torch loads OpenMP)
    import torch

    torch.set_num_threads(1)     # two xdist workers share the two cores
    # run_bench.py's --jobs default: one run at a time in the test process, as the tests that count calls or patch
    # clbench expect (the parallel local executor is tested in tests/test_executors.py)
    os.environ.setdefault("CLBENCH_JOBS", "1")


@pytest.fixture
def tiny_suite(tmp_path):
    """Write a suite YAML (synthetic scenario, given strategies) and return its path."""
    import yaml

    def make(strategies: list[dict], seeds=(0,), scenario_args: dict | None = None, name: str = "tiny"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "suite": name, "seeds": list(seeds),
            "scenarios": [{"name": "synthetic",
                           "args": scenario_args or {"train_per_class": 20, "test_per_class": 10}}],
            "strategies": strategies}))
        return path

    return make


@pytest.fixture
def float64():
    """Run a test in float64 (reference checks against torch.func.jvp); the default dtype is restored after."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def registered():
    """``registered(REGISTRY, name, factory)`` registers a test entry (checked as any registration is) and takes it
    back after the test, so that a test can run twice in one process (as mutation tools run them)."""
    added = []

    def register(registry, name, factory):
        registry.register(name)(factory)
        added.append((registry, name))
        return factory

    yield register
    for registry, name in added:
        registry._entries.pop(name, None)
        registry.origins.pop(name, None)


@pytest.fixture
def ctrl_c():
    """SIGINT handled as a terminal's Ctrl-C reaches a Python program (``KeyboardInterrupt``), whatever the test
    process inherited; put back after. A process started as a background job of a non-interactive shell (``make test
    > log &``, ``nohup ... &``) starts with SIGINT ignored, and Python then installs no handler of its own, so
    without this fixture both Ctrl-C tests see no KeyboardInterrupt in such a run (checked 2026-11-27: the executor
    test fails when pytest is started with ``bash -c '... & wait'`` and passes in the foreground; ``timeout`` resets
    SIGINT for its child, which is why a run under it passed)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def copied_results(tmp_path_factory):
    """A taft_shards run in ``original``, its results folder copied to ``archive``, then the original run made
    again with other settings (its state replaced). Used by tests/test_records.py and tests/test_commands_forget.py."""
    from tests._cli import run_suite

    root = tmp_path_factory.mktemp("copied")
    vit = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}

    def suite(n_shards):
        path = root / f"s{n_shards}.yaml"
        path.write_text(yaml.safe_dump({
            "suite": "s", "scenarios": [{"name": "synthetic", "args": {"train_per_class": 10, "test_per_class": 5}}],
            "strategies": [{"name": "taft_shards", "preset": "cpu",
                            "args": {"n_shards": n_shards, "epochs": 1, "model_args": vit}}]}))
        return path

    assert run_suite(suite(3), root / "original") == 0
    shutil.copytree(root / "original", root / "archive")
    assert run_suite(suite(2), root / "original") == 0
    return root


@pytest.fixture(autouse=True)
def plugins_stay_in_their_test():
    """A test that loads a plugin must take it back: ``load_plugin`` adds it to ``$CLBENCH_PLUGINS``, and every
    fresh process that a later test starts would import it (a leak of this kind made the index tests of
    test_suite_file.py fail only in some orders)."""
    before = os.environ.get("CLBENCH_PLUGINS")
    yield
    assert os.environ.get("CLBENCH_PLUGINS") == before, "this test left a plugin in $CLBENCH_PLUGINS: use monkeypatch"
