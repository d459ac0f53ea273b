"""Executor scaling: wall time of the same 8-run CPU-bound suite on the local executor with ``--jobs 1`` and
``--jobs 2`` and on a local Ray cluster with 1 and 2 CPUs, one torch thread per run everywhere; and Ray's per-run
scheduling overhead over the local executor.

The suite: ``naive`` (cpu preset, MLP) on the ``synthetic`` scenario, 8 seeds (8 runs), sized by ``--size``:
``smoke`` (well under a second per run; checks the script, its timings mean little), ``full`` (4 epochs: 1.9 s per
run on the quiet 2-core development machine, 2026-11-25, earlier ~6 s under load) or ``long`` (16 epochs, 4x the
work per run, so that start-up costs weigh a quarter as much). Every configuration reruns all 8 runs (``force``)
into a fresh folder and is timed from submission to the last record, worker start-up included (processes for
``--jobs 2``, Ray workers; a Ray cluster's own start is not counted: it is started before and shut down after each
Ray measurement). The four configurations alternate within each of ``--repeats`` rounds, and the median per
configuration is reported, so that load from other jobs on a shared machine hits all of them alike. All 32 accuracy
matrices of a round must agree (same seeds, same matrices whatever the executor), or the script stops.

Prints the wall times and:

- local speed-up ``T(jobs 1) / T(jobs 2)`` and Ray speed-up ``T(ray, 1 CPU) / T(ray, 2 CPUs)`` (target >= 1.6 on
  2 cores);
- Ray's overhead per run ``(T(ray, 1 CPU) - T(jobs 1)) / 8`` (target <= 2 s): both run one run at a time.

    python benchmarks/executor_scaling.py --size full [--repeats 3]      # on a quiet machine (several minutes a round)
    python benchmarks/executor_scaling.py --size smoke --repeats 1       # does it work
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from clbench.executors import LocalExecutor, RayExecutor
from clbench.suite_file import parse_suite

SIZES = {"smoke": {"train_per_class": 20, "test_per_class": 10, "epochs": 1},
         "full": {"train_per_class": 2000, "test_per_class": 200, "epochs": 4},
         "long": {"train_per_class": 2000, "test_per_class": 200, "epochs": 16}}
RUNS = 8


def specs(size: str):
    s = SIZES[size]
    return parse_suite({
        "suite": "executor_scaling", "seeds": list(range(RUNS)),
        "scenarios": [{"name": "synthetic", "args": {"train_per_class": s["train_per_class"],
                                                     "test_per_class": s["test_per_class"], "image_size": 16}}],
        "strategies": [{"name": "naive", "preset": "cpu", "args": {"epochs": s["epochs"]}}]}).run_specs("cpu")


def local(jobs: int):
    return lambda: LocalExecutor(jobs=jobs, threads=1, force=True)


def ray_cluster(cpus: int):
    def make():
        import ray

        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        return RayExecutor(num_cpus=1, threads=1, force=True)
    return make


CONFIGS = {"local --jobs 1": local(1), "local --jobs 2": local(2), "ray, 1 CPU": ray_cluster(1),
           "ray, 2 CPUs": ray_cluster(2)}


def measure(name: str, work, folder: Path) -> tuple[float, dict]:
    executor = CONFIGS[name]()
    try:
        start = time.perf_counter()
        records = executor.run_all(work, folder / name.replace(" ", "_").replace(",", ""))
        wall = time.perf_counter() - start
    finally:
        if name.startswith("ray"):
            import ray

            ray.shutdown()
    if len(records) != RUNS or any(r.status != "finished" for r in records):
        raise SystemExit(f"{name}: {sum(r.status == 'finished' for r in records)} of {RUNS} runs finished")
    return wall, {r.run_id: r.accuracy_matrix for r in records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = specs(args.size)
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            matrices = {}
            for name in CONFIGS:
                wall, matrices[name] = measure(name, work, Path(tmp) / f"round{round_}")
                times[name].append(wall)
                print(f"round {round_ + 1}: {name:15s} {wall:7.1f} s", flush=True)
            first = next(iter(matrices.values()))
            if any(m != first for m in matrices.values()):
                raise SystemExit("the executors gave different accuracy matrices for the same seeds")
    t = {name: statistics.median(v) for name, v in times.items()}
    print(f"\n{RUNS} runs (naive on synthetic, size {args.size}), 1 torch thread per run, median of {args.repeats} "
          "round(s), worker start-up included; same accuracy matrices from all four: yes")
    for name, value in t.items():
        print(f"  {name:15s} {value:7.1f} s")
    print(f"local speed-up, jobs 1 / jobs 2:       {t['local --jobs 1'] / t['local --jobs 2']:.2f}x  (target >= 1.6)")
    print(f"ray speed-up, 1 CPU / 2 CPUs:         {t['ray, 1 CPU'] / t['ray, 2 CPUs']:.2f}x  (target >= 1.6)")
    print(f"ray overhead per run over local:      {(t['ray, 1 CPU'] - t['local --jobs 1']) / RUNS:+.2f} s  "
          "(target <= 2 s)")


if __name__ == "__main__":
    main()
