"""Runner overhead: clbench's runner versus a plain Avalanche train + eval loop on the same run.

Both sides build the same scenario, model and Avalanche strategy with the same seed; the plain side trains each
experience and calls Avalanche's own ``eval`` on the test stream with experience accuracy (what a user of Avalanche
would write), the clbench side calls :func:`clbench.runner.run` (evaluation routine, parameter counts, peak-memory
probe, environment capture, atomic JSON record). Runs alternate and the median of ``--repeats`` is reported.

Prints the ratios ``clbench / avalanche`` of train+eval time and of whole-run wall time (target: <= 1.15 for both).

    python benchmarks/runner_overhead.py [--strategy replay] [--scenario split_digits] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training.plugins import EvaluationPlugin

import clbench.strategies.baselines as baselines
from clbench.config import build_config
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.runner import run, seed_everything
from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry


def plain_avalanche(spec: RunSpec) -> tuple[float, float]:
    """(train+eval seconds, wall seconds) of a hand-written Avalanche loop."""
    wall = time.perf_counter()
    seed_everything(spec.seed)
    scenario = SCENARIOS.get(spec.scenario.name)(seed=spec.seed, **spec.scenario.args)
    config = build_config(spec.strategy.name, spec.strategy.preset, spec.strategy.args)
    original = baselines.EvaluationPlugin
    baselines.EvaluationPlugin = lambda **_: EvaluationPlugin(accuracy_metrics(experience=True), loggers=[])
    try:
        template = STRATEGIES.get(spec.strategy.name)(scenario.info, torch.device("cpu"), config).template
    finally:
        baselines.EvaluationPlugin = original
    loop = time.perf_counter()
    for experience in scenario.train_stream:
        template.train(experience, num_workers=0)
        template.eval(scenario.test_stream, num_workers=0)
    end = time.perf_counter()
    return end - loop, end - wall


def clbench_runner(spec: RunSpec) -> tuple[float, float]:
    """(train+eval seconds, wall seconds) of clbench's runner."""
    with tempfile.TemporaryDirectory() as out:
        wall = time.perf_counter()
        record = run(spec, out)
        end = time.perf_counter()
    assert record.status == "finished", record.reason
    return record.metrics["train_s"] + record.metrics["eval_s"], end - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="replay")
    parser.add_argument("--scenario", default="split_digits")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    strategy = StrategyEntry(name=args.strategy, preset="cpu", args={"epochs": args.epochs})
    spec = RunSpec("bench", ScenarioEntry(args.scenario), strategy, 0, "cpu")
    plain, ours = [], []
    clbench_runner(spec)                                   # warm-up: imports, first-touch allocations
    for _ in range(args.repeats):
        plain.append(plain_avalanche(spec))
        ours.append(clbench_runner(spec))
    loop_ratio = statistics.median(o[0] for o in ours) / statistics.median(p[0] for p in plain)
    wall_ratio = statistics.median(o[1] for o in ours) / statistics.median(p[1] for p in plain)
    print(f"runner overhead ({args.scenario}, {args.strategy}, {args.epochs} epochs/step, median of "
          f"{args.repeats}, {torch.get_num_threads()} threads)")
    print(f"  train+eval time   clbench / avalanche = {loop_ratio:.3f}   (target <= 1.15)")
    print(f"  whole-run wall    clbench / avalanche = {wall_ratio:.3f}   (target <= 1.15)")


if __name__ == "__main__":
    main()
