"""The Python API: build scenarios and strategies by name, run one in memory, get the record and its metrics.

::

    from clbench import api

    record = api.run("split_digits", "replay", preset="cpu", args={"mem_size": 200}, seed=0)
    record.metrics["avg_inc_acc"], record.accuracy_matrix          # summaries (percent) and R[i][j] (fractions)

    scenario = api.scenario("split_digits", seed=0, n_experiences=5)
    strategy = api.strategy("replay", scenario.info, preset="cpu", mem_size=200)
    for experience in scenario.train_stream:
        strategy.train(experience)
    scenario.evaluator(strategy, scenario, step=4, device=strategy.device).rows["accuracy"]

:func:`run` goes through the same runner as ``run_bench.py`` (same seeding, evaluation, metrics and checks) and
writes nothing unless ``out`` is given (then the record, callback artifacts and saved state go under it, as a suite
run's would, holding the folder's lock as a suite does: a suite or another run writing there refuses it, naming its
pid). Unknown names and hyperparameters raise :class:`~clbench.errors.ConfigError` /
:class:`~clbench.registry.UnknownNameError` with suggestions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clbench.config import build_config
from clbench.files import locked_folder
from clbench.protocol import Scenario, ScenarioInfo, StrategyBase
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.runner import RunRecord, execute
from clbench.runner import run as run_and_write
from clbench.suite_file import parse_suite


def scenario(name: str, seed: int = 0, **args: Any) -> Scenario:
    """The scenario ``name`` (a SCENARIOS entry) built with ``seed`` and keyword arguments ``args``."""
    return SCENARIOS.get(name)(seed=seed, **args)


def strategy(name: str, info: ScenarioInfo, preset: str | None = None, device: str = "cpu",
             **overrides: Any) -> StrategyBase:
    """The strategy ``name`` for a scenario's ``info``: its Config from defaults, ``preset`` and ``overrides``."""
    return STRATEGIES.get(name)(info, device, build_config(name, preset, overrides))


def run(scenario: str, strategy: str, *, scenario_args: dict | None = None, preset: str | None = None,
        args: dict | None = None, seed: int = 0, device: str = "auto", amp: bool = False,
        callbacks: Sequence[dict | str] = (), out: str | Path | None = None) -> RunRecord:
    """Train ``strategy`` on ``scenario`` with ``seed`` through the runner and return the :class:`RunRecord`
    (``status`` is ``"failed"`` with a ``reason`` if training broke). Arguments are validated as a suite file's
    are, ``amp`` (bf16 autocast, ``--amp``) as the command line's is (refused with dp and on mps); ``callbacks`` are
    ``{"name": ..., "args": {...}}`` entries (or bare names). With ``out``, the folder is held locked
    (:func:`clbench.files.locked_folder`) while the run writes there."""
    suite = parse_suite({"suite": "api", "scenarios": [{"name": scenario, "args": scenario_args or {}}],
                         "strategies": [{"name": strategy, "preset": preset, "args": args or {},
                                         "callbacks": list(callbacks)}], "seeds": [seed]},
                        source="clbench.api.run")
    spec = suite.run_specs(device, amp)[0]     # validated and built once, as a suite file's runs are
    if out is None:
        return execute(spec)
    with locked_folder(out, "clbench.api.run", "wait for it to end or pass another out"):
        return run_and_write(spec, out)


__all__ = ["run", "scenario", "strategy"]
