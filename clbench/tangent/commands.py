"""``run_bench.py pretrain`` (the linearization point) and ``run_bench.py forget`` (exact data removal).

::

    # a ViT trained on CIFAR-100 classes 50-99 (experience 1 of a fixed-order 2-step split), for --init
    python run_bench.py pretrain --scenario split_cifar100 \\
        --scenario-args '{"n_experiences": 2, "class_order": "fixed"}' --experiences 1 \\
        --model-args '{"embed_dim": 128, "depth": 4, "num_heads": 4}' --epochs 4 --out checkpoints/vit128_c100_upper.pt

    # remove samples from a finished taft_shards / model_soup / sisa run (its state was saved by the runner)
    python run_bench.py forget --run results/unlearning/runs/<run_id>.json --ids ids.txt --mode subtract
    python run_bench.py forget --run ... --touch 1 5 half --mode subtract retrain   # ids drawn from k shards
    python run_bench.py forget --run ... --touch half --mode retrain --shard-workers 2   # retrain shards in parallel

``forget`` writes one removal record per request to ``<suite out>/removals/<run_id>__<mode>__<tag>.json`` (shards
touched, the ids asked, ``removed_ids``: exactly the samples dropped — whole shards with ``subtract`` —, weight
hashes before/after, seconds, accuracy before/after) and appends a row to ``<suite out>/removals.md``. Ids that are
not training samples of the run, an empty ids file or a shard count out of range are refused before any work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from clbench import records as record_files
from clbench import tasks
from clbench.cli import Command
from clbench.config import ConfigError, RunSpec, check_path_name
from clbench.environment import resolve_device
from clbench.models.checkpoint import save_weights
from clbench.registry import COMMANDS, MODELS, SCENARIOS
from clbench.training import FitSettings


# ------------------------------------------------------------------------------------------------------- pretrain
def _add_pretrain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, help="a SCENARIOS name providing the source data")
    p.add_argument("--scenario-args", default="{}", help="JSON keyword arguments of the scenario")
    p.add_argument("--experiences", nargs="+", type=int, required=True,
                   help="training experiences used as the source (choose ones disjoint from your target)")
    p.add_argument("--model-args", default="{}", help="JSON keyword arguments of the 'vit' model")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="checkpoint path (.pt or .safetensors)")


def _accuracy(model: nn.Module, datasets: list, classes: torch.Tensor) -> float:
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for dataset in datasets:
            for x, y, *_ in DataLoader(dataset.eval(), batch_size=512):
                pred = classes[model(x)[:, classes].argmax(1)]
                correct += int((pred == y).sum())
                total += len(y)
    return correct / total


def pretrain(args: argparse.Namespace) -> int:
    """Train a ``vit`` with cross-entropy (AdamW, scenario's train augmentation) on the chosen experiences."""
    torch.manual_seed(args.seed)
    scenario = SCENARIOS.get(args.scenario)(seed=args.seed, **json.loads(args.scenario_args))
    model = MODELS.get("vit")(scenario.info, **json.loads(args.model_args))
    train = torch.utils.data.ConcatDataset([scenario.train_stream[t].dataset.train() for t in args.experiences])
    classes = torch.tensor([c for t in args.experiences for c in scenario.info.class_range(t)])
    settings = FitSettings(args.epochs, args.batch_size, args.lr, "adamw", args.weight_decay)
    optimizer = settings.make_optimizer(model.parameters())
    steps = args.epochs * -(-len(train) // args.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=steps, pct_start=0.1)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        loader = DataLoader(train, batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed + epoch))
        for x, y, *_ in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        test = [scenario.test_stream[t].dataset for t in args.experiences]
        print(f"epoch {epoch + 1}/{args.epochs}: source test accuracy {100 * _accuracy(model, test, classes):.1f}% "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    meta = {"scenario": args.scenario, "scenario_args": args.scenario_args, "experiences": str(args.experiences),
            "model_args": args.model_args, "epochs": str(args.epochs)}
    print(save_weights(model, args.out, metadata=meta))
    return 0


# --------------------------------------------------------------------------------------------------------- forget
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
    record_files.read(args.run)                     # a corrupt or foreign file: one line, exit code 2
    record = RunRecord.load(args.run)
    if not record.state_dir:
        raise ConfigError(f"{args.run} has no saved strategy state (status {record.status}; only finished runs of "
                          f"a strategy with save_state, such as taft_shards, model_soup and sisa, have one).")
    spec = RunSpec.from_dict(record.spec)
    seed_everything(spec.seed)
    scenario = build_scenario(spec)
    experiences = list(scenario.train_stream)
    last = len(experiences) - 1
    probe = build_strategy(spec, scenario.info, device)
    probe.load_state(record.state_dir)
    shard_ids = probe.shard_ids()
    if args.ids:
        requests = _ids_request(args.ids, {i for ids in shard_ids.values() for i in ids})
    else:
        requests = _touch_requests(shard_ids, args.touch, args.per_shard, spec.seed)
    out = Path(args.run).parent.parent
    before = _overall(record.accuracy_matrix[-1], record.test_sizes)
    with tasks.using(tasks.make_pool("process", args.shard_workers)):
        for tag, ids in requests.items():
            for mode in args.mode:
                seed_everything(spec.seed)
                strategy = build_strategy(spec, scenario.info, device)
                strategy.load_state(record.state_dir)
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


COMMANDS.register("pretrain")(Command("train a ViT on a source dataset and save the checkpoint used by --init",
                                      _add_pretrain_arguments, pretrain))
COMMANDS.register("forget")(Command("remove training samples from a finished taft_shards/model_soup/sisa run",
                                    _add_forget_arguments, forget))
