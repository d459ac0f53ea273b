"""DyTox's cost of expansion, measured in one run (issue 4).

1. Inference time with ``t`` task tokens over the time with one: the encoder runs once per image and the TAB once
   per token, so ``time(t) / time(1) ≈ 1 + (t - 1) · s`` where ``s`` = share of one TAB pass in a 1-token forward.
   Prints the measured ratio at ``t = --tasks`` next to the prediction from the measured ``s``.
2. Parameter growth per task in percent of the network without classifiers (a new task adds one token of ``D``
   parameters; the paper reports +0.004% per step for ``D = 384``).

    python benchmarks/dytox_cost.py                      # the paper's CIFAR model (dim 384, 5 SAB + 1 TAB)
    python benchmarks/dytox_cost.py --arch tiny --batch 128

Timings are medians over ``--repeats`` interleaved measurements on ``--threads`` CPU threads (or the GPU with
``--device cuda``); all ratios come from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from clbench.models.dytox import ARCHS, DyToxNet


def timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="cifar", choices=sorted(ARCHS))
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--classes-per-task", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    arch = ARCHS[args.arch]

    one = DyToxNet(arch, (3, args.image_size, args.image_size)).to(device).eval()
    one.add_task(args.classes_per_task)
    many = DyToxNet(arch, (3, args.image_size, args.image_size)).to(device).eval()
    many.load_state_dict(one.state_dict(), strict=False)
    for _ in range(args.tasks):
        many.add_task(args.classes_per_task)

    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
    with torch.no_grad():
        x_L = one.encoder(x)
        z = torch.cat((one.task_tokens[0].expand(args.batch, -1, -1), x_L), dim=1)
        runs = {"forward_1": lambda: one(x), f"forward_{args.tasks}": lambda: many(x),
                "encoder": lambda: one.encoder(x), "tab": lambda: one.tab(z)}
        for fn in runs.values():                                   # warm-up
            fn()
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.repeats):
            for name, fn in runs.items():
                times[name].append(timed(fn, device))
    med = {k: statistics.median(v) for k, v in times.items()}

    share = med["tab"] / med["forward_1"]
    ratio = med[f"forward_{args.tasks}"] / med["forward_1"]
    print(f"DyTox '{args.arch}' (D={arch.embed_dim}, {arch.depth} SAB + 1 TAB, {args.image_size}px, "
          f"patch {arch.patch_size}), batch {args.batch}, {args.threads} thread(s) on {device}, "
          f"median of {args.repeats}")
    for name, value in med.items():
        print(f"  {name:>12}: {1000 * value:8.2f} ms")
    print(f"inference time with {args.tasks} task tokens / with 1: {ratio:.3f}")
    print(f"share of one TAB pass in a 1-token forward: {share:.3f} "
          f"(predicted ratio 1 + {args.tasks - 1}·share = {1 + (args.tasks - 1) * share:.3f})")

    def without_classifiers(model: DyToxNet) -> int:
        return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("heads."))

    base = without_classifiers(one)
    per_task = (without_classifiers(many) - base) / (args.tasks - 1)
    print(f"parameters without classifiers: {base:,} with 1 task, {without_classifiers(many):,} with {args.tasks}")
    print(f"parameter growth per task (excluding classifiers): +{per_task:.0f} = "
          f"+{100 * per_task / base:.4f}% (paper: +0.004% for D=384)")


if __name__ == "__main__":
    main()
