"""Cost of recording training patterns for the dual-form analysis (issue 12), measured in one run.

1. Training step time with the :class:`~clbench.analysis.dual_form.PatternRecorder` attached over the time without
   it (target <= 1.5 with float16 storage on disk), for the suite's MLP 784-800-800-10 (ReLU), SGD momentum 0.9,
   batch 128, every linear layer recorded, every sample kept (``--fraction 1``).
2. Bytes stored per sample per layer (the chunk files' bytes over the patterns they hold), next to the formula
   ``(d_in + d_out) · itemsize + 28`` (metadata 5 × int32, scales 2 × float32).

    python benchmarks/dual_form_cost.py --threads 1                    # float16, 30 blocks of 10 steps
    python benchmarks/dual_form_cost.py --dtype float32 --hidden 256 256

The two settings alternate in blocks of ``--block`` steps on the same model and data, so that load from other
processes on a shared machine hits both alike; the ratio is the median of the per-block ratios (and the ratio of
total times is printed too). Inputs are random tensors shaped like MNIST (data loading is not timed).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from clbench.analysis.dual_form import PatternRecorder
from clbench.analysis.store import DTYPES, PatternStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    parser.add_argument("--hidden", type=int, nargs="+", default=[800, 800])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=30, help="measured blocks per setting")
    parser.add_argument("--block", type=int, default=10, help="training steps per block")
    parser.add_argument("--fraction", type=float, default=1.0, help="kept sample fraction")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", default=None, help="folder for the pattern store (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    widths = [784, *args.hidden, 10]

    def mlp() -> nn.Sequential:
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            layers += [nn.Linear(a, b)] + ([nn.ReLU(inplace=True)] if i < len(widths) - 2 else [])
        return nn.Sequential(*layers)

    plain, recorded = mlp(), mlp()          # the same network twice: one trained with the recorder attached
    optimizers = {False: torch.optim.SGD(plain.parameters(), lr=3e-3, momentum=0.9),
                  True: torch.optim.SGD(recorded.parameters(), lr=3e-3, momentum=0.9)}
    models = {False: plain, True: recorded}
    names = [str(i) for i, m in enumerate(recorded) if isinstance(m, nn.Linear)]
    x = torch.randn(args.batch, 1, 28, 28)
    y = torch.randint(0, 10, (args.batch,))
    folder = Path(args.dir or tempfile.mkdtemp(prefix="dual_form_cost_"))
    recorder = PatternRecorder(recorded, optimizers[True], names, folder, dtype=args.dtype, fraction=args.fraction,
                               budget_bytes=50 * 10**9)

    def block(record: bool) -> float:
        model, optimizer = models[record], optimizers[record]
        start = time.perf_counter()
        for _ in range(args.block):
            if record:
                recorder.on_batch_start(x, y)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return time.perf_counter() - start

    times: dict[bool, list[float]] = {False: [], True: []}
    with recorder:
        block(False), block(True)                            # warm-up, not timed
        for i in range(args.blocks):
            for record in ((False, True) if i % 2 == 0 else (True, False)):
                times[record].append(block(record))
    store = PatternStore(folder / "patterns")
    ratios = [r / p for p, r in zip(times[False], times[True])]
    print(f"MLP {'-'.join(map(str, widths))}, batch {args.batch}, SGD momentum 0.9, {args.threads} thread(s), "
          f"{args.dtype} storage in {folder}, fraction {args.fraction}")
    print(f"step time without recording: {1e3 * statistics.median(times[False]) / args.block:.2f} ms (median)")
    print(f"step time with recording:    {1e3 * statistics.median(times[True]) / args.block:.2f} ms (median)")
    print(f"ratio with / without: median of {args.blocks} interleaved blocks {statistics.median(ratios):.3f}, "
          f"of total times {sum(times[True]) / sum(times[False]):.3f}  (target <= 1.5)")
    itemsize = torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
    for name, info in store.layers.items():
        files = [store.folder / name / c[k] for c in info["chunks"] for k in ("x", "g", "meta", "scale")]
        measured = sum(f.stat().st_size for f in files) / info["patterns"]
        print(f"layer {name} ({info['d_in']} -> {info['d_out']}): {measured:.1f} bytes per sample on disk "
              f"(formula {(info['d_in'] + info['d_out']) * itemsize + 28}; {info['patterns']} patterns)")
    print(f"store: {store.bytes_on_disk() / 1e6:.1f} MB for {store.manifest['samples_seen']} samples")


if __name__ == "__main__":
    main()
