"""``run_bench.py forget``: exact data removal from a finished ``taft_shards`` / ``model_soup`` / ``sisa`` run
(:meth:`clbench.strategies.tangent.ShardedFineTuning.forget` on the state the runner saved).

::

    # remove samples from a finished taft_shards / model_soup / sisa run (its state was saved by the runner)
    python run_bench.py forget --run results/unlearning/runs/<run_id>.json --ids ids.txt --mode subtract
    python run_bench.py forget --run ... --touch 1 5 half --mode subtract retrain   # ids drawn from k shards
    python run_bench.py forget --run ... --touch half --mode retrain --shard-workers 2   # retrain shards in parallel

One removal record per request is written to ``<suite out>/removals/<run_id>__<mode>__<tag>.json`` (shards touched,
the ids asked, ``removed_ids``: exactly the samples dropped — whole shards with ``subtract`` —, weight hashes
before/after, seconds, accuracy before/after) and a row is appended to ``<suite out>/removals.md``. Ids that are not
training samples of the run, an empty ids file or a shard count out of range are refused before any work.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from clbench import records as record_files
from clbench import tasks
from clbench.commands import Command
from clbench.environment import resolve_device
from clbench.errors import ConfigError
from clbench.files import locked_folder
from clbench.names import check_path_name
from clbench.registry import COMMANDS
from clbench.specs import RunSpec


def _add_forget_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="a run record (<out>/runs/<run_id>.json) with a saved state")
    ids = p.add_mutually_exclusive_group(required=True)
    ids.add_argument("--ids", help="file of global training-sample ids to remove (whitespace separated)")
    ids.add_argument("--touch", nargs="+",
                     help="draw ids from K random shards (integers or 'half'); one request per value")
    p.add_argument("--per-shard", type=int, default=10, help="with --touch: ids drawn from each touched shard")
    p.add_argument("--mode", nargs="+", default=["subtract"], choices=["subtract", "retrain"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--shard-workers", type=int, default=1,
                   help="retrain up to N touched shards at once in spawned processes (same result as 1)")


def _touch_requests(shard_ids: dict[int, list[int]], values: list[str], per_shard: int,
                    seed: int) -> dict[str, list[int]]:
    """``{tag: ids}``: ``per_shard`` random ids from each of K random shards, for every K in ``values`` (an integer
    from 1 to the number of shards, or ``half``)."""
    keys = sorted(shard_ids)
    generator = torch.Generator().manual_seed(seed)
    requests = {}
    for value in values:
        k = len(keys) // 2 if value == "half" else int(value) if value.lstrip("-").isdigit() else 0
        if not 1 <= k <= len(keys):
            raise ConfigError(f"--touch {value}: the run has {len(keys)} shards; give a number of shards from 1 to "
                              f"{len(keys)}, or 'half' (at least 2 shards).")
        chosen = [keys[i] for i in torch.randperm(len(keys), generator=generator)[:k].tolist()]
        ids = []
        for key in chosen:
            pool = shard_ids[key]
            ids += [pool[i] for i in torch.randperm(len(pool), generator=generator)[:per_shard].tolist()]
        requests[f"touch{value}"] = ids
    return requests


def _overall(accuracies: list[float], sizes: list[int]) -> float:
    return 100.0 * sum(a * n for a, n in zip(accuracies, sizes)) / sum(sizes)


def _ids_request(path: str, held: set[int]) -> dict[str, list[int]]:
    """``{file stem: ids}`` from a file of whitespace-separated ids, each a training sample the run still holds."""
    tag = check_path_name("--ids", "file name", Path(path).stem)
    ids = []
    for token in Path(path).read_text().split():
        if not token.lstrip("-").isdigit():
            raise ConfigError(f"--ids {path}: {token!r} is not an integer sample id.")
        ids.append(int(token))
    if not ids:
        raise ConfigError(f"--ids {path}: no sample ids in the file; nothing to remove.")
    unknown = sorted(set(ids) - held)
    if unknown:
        raise ConfigError(f"--ids {path}: {len(unknown)} id(s) not in the training set of the run (ids 0 to "
                          f"{max(held)} held by its shards): {', '.join(map(str, unknown[:10]))}"
                          f"{' ...' if len(unknown) > 10 else ''}.")
    return {tag: ids}


def forget(args: argparse.Namespace) -> int:
    """Rebuild the run's scenario and strategy, load its saved state, remove the ids, re-evaluate, record.
    Every request is checked before the first is served: unknown ids, an empty ids file, a number of shards out of
    range or a bad flag is one line and exit code 2, and nothing is written."""
    from clbench.runner import RunRecord, build_scenario, build_strategy, seed_everything

    for flag in ("per_shard", "shard_workers"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}.")
    device = resolve_device(args.device)
    # a corrupt or foreign file, no saved state or a state written by another run: one line, exit code 2
    state = record_files.state_dir(args.run, record_files.read(args.run))
    record = RunRecord.load(args.run)
    spec = RunSpec.from_dict(record.spec)
    seed_everything(spec.seed)
    scenario = build_scenario(spec)
    experiences = list(scenario.train_stream)
    last = len(experiences) - 1
    probe = build_strategy(spec, scenario.info, device)
    probe.load_state(state)
    shard_ids = probe.shard_ids()
    if args.ids:
        requests = _ids_request(args.ids, {i for ids in shard_ids.values() for i in ids})
    else:
        requests = _touch_requests(shard_ids, args.touch, args.per_shard, spec.seed)
    out = Path(args.run).parent.parent
    before = _overall(record.accuracy_matrix[-1], record.test_sizes)
    # removals.md is appended to: a suite writing the folder, or a second forget, would interleave its lines
    with locked_folder(out, "forget", "wait for it to end, then forget again"), \
            tasks.using(tasks.make_pool("process", args.shard_workers)):
        for tag, ids in requests.items():
            for mode in args.mode:
                seed_everything(spec.seed)
                strategy = build_strategy(spec, scenario.info, device)
                strategy.load_state(state)
                removal = strategy.forget(ids, mode, experiences)
                scores = scenario.evaluator(strategy, scenario, last, device)
                accuracies, sizes = scores.rows["accuracy"], scores.sizes
                row = {"run_id": record.run_id, "strategy": spec.strategy.key, "request": tag, **removal.to_dict(),
                       "accuracy_before": before, "accuracy_after": _overall(accuracies, sizes)}
                path = out / "removals" / f"{record.run_id}__{mode}__{tag}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(row, indent=1))
                _append_markdown(out / "removals.md", row)
                print(f"{record.run_id} {tag} {mode}: shards touched {len(removal.shards_touched)}, dropped "
                      f"{removal.samples_dropped} samples, accuracy {before:.2f} -> {row['accuracy_after']:.2f} "
                      f"({removal.seconds:.3f} s) -> {path}")
    return 0


MARKDOWN_HEADER = ("| run | request | mode | shards touched | ids | samples dropped | shards left | accuracy before | "
                   "accuracy after | seconds | hash before -> after |\n|---|---|---|---|---|---|---|---|---|---|---|\n")


def _append_markdown(path: Path, row: dict) -> None:
    if not path.exists():
        path.write_text(MARKDOWN_HEADER)
    with path.open("a") as f:
        f.write(f"| {row['run_id']} | {row['request']} | {row['mode']} | {len(row['shards_touched'])} | "
                f"{len(row['ids'])} | {row['samples_dropped']} | {row['shards_left']} | {row['accuracy_before']:.2f} "
                f"| {row['accuracy_after']:.2f} | {row['seconds']:.3f} | {row['hash_before']} -> "
                f"{row['hash_after']} |\n")


COMMANDS.register("forget")(Command("remove training samples from a finished taft_shards/model_soup/sisa run",
                                    _add_forget_arguments, forget))
