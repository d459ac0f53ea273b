"""Speed ratios of the tangent transformer, all measured in one run on one machine (absolute seconds are not
reported: on shared machines only ratios are comparable).

    python benchmarks/tangent_speed.py [--dim 192 --depth 6 --heads 3 --batch 64 --threads 1 --only 1 4]

Prints, each as the median of back-to-back CPU-time ratios (see ``Ratio``; with ``--threads`` > 1 read the wall-clock
ratios printed beside), with the range over pairs so that the noise is visible (targets from the issue in brackets):
  1. linearized forward / plain forward, last 1 block and all blocks linearized     [<= 1.5, <= 3.0]
  2. our closed-form forward / torch.func.jvp of the same f + J·Δ (last 1 block)     [< 1]
  3. composed model of N=50 tangent models / N=1, next to output ensembling of N=50  [<= 1.05, ~N]
  4. one training epoch with the cached prefix / uncached (last 1 of 6 blocks)       [<= 0.35]
  5. forgetting one of 10 shards by subtraction / retraining the rest from scratch   [<= 0.01]

Floors of this formulation, counted in GEMM work (~80% of a plain block's time here). A tangent linear layer with
``Δ`` and ``ẋ`` runs three GEMMs (``W0x``, ``ΔWx``, ``W0ẋ``) and tangent attention six batched products per head
instead of two, so a linearized block costs ~3 plain blocks P: ratio 1 is ~(L−1+3)/L = 1.33 for the last block of
L=6 and ~3 for all blocks (the target sits on the floor). Ratio 4: the cached epoch runs the tangent block's
training step T, the uncached one also the L−1 frozen blocks (plain forwards, no graph). T ≈ 3P forward + 2P
backward (per linear layer ``∂/∂ΔW = gᵀx`` and ``∂/∂ẋ = g W0``), so cached / uncached ≈ 5/(5 + L−1) = 0.5 at L=6;
0.35 would need T ≤ 2.7P, below the tangent forward alone — it is reached from L≥11 (ViT-B, L=12: ~0.31 by this
count).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from timm.models.vision_transformer import VisionTransformer
from torch.func import functional_call, jvp

from clbench.tangent import ShardComposition, cache_prefix, compose, linearize, rescaled_square_loss, split_shards
from clbench.training import FitSettings, fit

CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def seconds(fn: Callable[[], object]) -> dict[str, float]:
    """CPU time of this process and wall-clock time of one call of ``fn``."""
    start = {name: clock() for name, clock in CLOCKS.items()}
    fn()
    return {name: clock() - start[name] for name, clock in CLOCKS.items()}


@dataclass(frozen=True)
class Ratio:
    """``t(numerator) / t(denominator)`` over pairs timed back to back (the order alternating), on both clocks.

    The number compared with a target is the median over pairs of the CPU-time ratio: time this process spends
    descheduled by other jobs on a shared machine does not count (with one thread, CPU time is the wall time of an
    idle machine); contention for caches and memory bandwidth still does, which the spread over pairs shows. Also
    printed: the CPU-time ratio of each side's fastest run (min/min) and the wall-clock ratios.
    """

    cpu: list[float]
    wall: list[float]
    cpu_of_minima: float

    def __str__(self) -> str:
        cpu, wall = self.cpu, self.wall
        if len(cpu) == 1:
            return f"{cpu[0]:.2f} (wall {wall[0]:.2f}; 1 pair)"
        return (f"{statistics.median(cpu):.2f} (CPU pairs {min(cpu):.2f}-{max(cpu):.2f}, min/min "
                f"{self.cpu_of_minima:.2f}; wall {statistics.median(wall):.2f}, pairs {min(wall):.2f}-{max(wall):.2f};"
                f" n={len(cpu)})")


def ratio(numerator: Callable[[], object], denominator: Callable[[], object], repeats: int,
          warmup: int = 1) -> Ratio:
    for _ in range(warmup):
        numerator()
        denominator()
    pairs = []
    for i in range(repeats):
        if i % 2:
            den = seconds(denominator)
            pairs.append((seconds(numerator), den))
        else:
            pairs.append((seconds(numerator), seconds(denominator)))
    per_pair = {clock: [n[clock] / d[clock] for n, d in pairs] for clock in CLOCKS}
    return Ratio(per_pair["cpu"], per_pair["wall"],
                 min(n["cpu"] for n, _ in pairs) / min(d["cpu"] for _, d in pairs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--img", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=512, help="training-set size for ratios 4 and 5")
    parser.add_argument("--repeats", type=int, default=15, help="timed pairs for the forward ratios 1-3")
    parser.add_argument("--epoch-repeats", type=int, default=5, help="timed pairs of training epochs (ratio 4)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="ratios to measure")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=args.img, patch_size=4, num_classes=100, embed_dim=args.dim, depth=args.depth,
                            num_heads=args.heads).eval()
    x = torch.randn(args.batch, 3, args.img, args.img)
    r = args.repeats
    print(f"ViT dim {args.dim}, depth {args.depth}, {args.heads} heads, {args.img}px patch 4, batch {args.batch}, "
          f"{args.threads} thread(s); float32. Each ratio: median over back-to-back pairs of CPU-time ratios")

    last1 = linearize(vit, last_blocks=1).randomize_deltas(0.01)
    if 1 in args.only:
        full = linearize(vit, last_blocks=args.depth).randomize_deltas(0.01)
        with torch.no_grad():
            print(f"1. linearized forward / plain forward, last 1 block: {ratio(lambda: last1(x), lambda: vit(x), r)}"
                  f"  [<= 1.5]\n   all {args.depth} blocks: {ratio(lambda: full(x), lambda: vit(x), r)}  [<= 3.0]")

    reference = copy.deepcopy(vit)
    for block in reference.blocks:
        block.attn.fused_attn = False
    w0 = {n: p.detach() for n, p in reference.named_parameters()}
    delta = last1.delta_state()
    tangents = {n: delta.get(n, torch.zeros_like(p)) for n, p in w0.items()}

    def with_jvp():
        y, yd = jvp(lambda w: functional_call(reference, w, (x,)), (w0,), (tangents,))
        return y + yd

    def ours():
        with torch.no_grad():
            return last1(x)

    if 2 in args.only:
        print(f"2. our forward / torch.func.jvp (last 1 block): {ratio(ours, with_jvp, r)}  [< 1]")

    if 3 in args.only:
        members = [copy.deepcopy(last1).randomize_deltas(0.01, seed=s) for s in range(50)]
        composed = compose(members)
        with torch.no_grad():
            print(f"3. composed inference N=50 / N=1: {ratio(lambda: composed(x), lambda: members[0](x), r)}"
                  f"  [<= 1.05]\n   output ensembling N=50 / N=1: "
                  f"{ratio(lambda: sum(m(x) for m in members) / 50, lambda: members[0](x), 1, warmup=0)}  [~50]")

    data = torch.randn(args.samples, 3, args.img, args.img)
    labels = torch.randint(0, 100, (args.samples,))
    settings = FitSettings(epochs=1, batch_size=args.batch, schedule=1e-3)
    student = linearize(vit, last_blocks=1)

    def objective(logits, y):
        return rescaled_square_loss(logits, y)

    def epoch(forward, inputs):
        return lambda: fit(student, forward, student.tangent_parameters(), inputs, labels, objective, settings, seed=0)

    if 4 in args.only:
        tokens = cache_prefix(student, data)
        cached = ratio(epoch(student.from_prefix, tokens), epoch(student, data), args.epoch_repeats)
        build = ratio(lambda: cache_prefix(student, data), epoch(student, data), 1, warmup=0)
        print(f"4. training epoch cached prefix / uncached (last 1 of {args.depth} blocks): {cached}  [<= 0.35]\n"
              f"   one-time cache build / uncached epoch: {build}")

    if 5 not in args.only:
        return
    shards = split_shards(args.samples, 10, seed=0)
    composition = ShardComposition()
    for key, local in enumerate(shards):
        composition.add(key, copy.deepcopy(student).randomize_deltas(0.01, seed=key).delta_state(), float(len(local)))
    deployed = copy.deepcopy(student)

    def subtract():
        trial = copy.deepcopy(composition)
        start = time.process_time()
        trial.subtract([3])
        deployed.load_delta(trial.delta())
        return time.process_time() - start

    def retrain():
        fresh = linearize(vit, last_blocks=1)
        kept = torch.cat([s for k, s in enumerate(shards) if k != 3]).sort().values
        inputs = cache_prefix(fresh, data[kept])
        for k, local in enumerate(shards):
            if k != 3:
                index = torch.searchsorted(kept, local)
                fit(fresh, fresh.from_prefix, fresh.tangent_parameters(), inputs[index], labels[local], objective,
                    settings, seed=k)

    subtract_s = statistics.median(subtract() for _ in range(r))
    print(f"5. forget 1 of 10 shards by subtraction / retraining the other 9 from scratch (1 epoch each): "
          f"{subtract_s / seconds(retrain)['cpu']:.5f}  [<= 0.01]")


if __name__ == "__main__":
    main()
