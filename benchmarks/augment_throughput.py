"""Images per second of the CIFAR train augmentation (random crop with 4-pixel zero padding, horizontal flip), three
ways, interleaved in one process on one thread: torchvision's v2 pair per image (what the scenarios' datasets applied
before), :class:`clbench.augment.CropFlip` per image (what they apply now: the same draws and output bit for bit)
and :meth:`CropFlip.batch` on batches of 128 (one gather on the batch's device). Prints each rate and its ratio to
v2's; :data:`clbench.estimates.DATA_PATH_CAP` is the per-image rate.

    python benchmarks/augment_throughput.py [--images 4096] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchvision.transforms import v2

from clbench.augment import CropFlip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    images = torch.randn(args.images, 3, 32, 32)
    on_device = images.to(args.device)
    torchvision_pair = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])
    crop_flip = CropFlip(32, padding=4)

    def sync() -> None:
        if on_device.device.type == "cuda":
            torch.cuda.synchronize()

    ways = {"v2 per image": lambda: [torchvision_pair(x) for x in images],
            "CropFlip per image": lambda: [crop_flip(x) for x in images],
            f"CropFlip.batch ({args.device})": lambda: [crop_flip.batch(b) for b in on_device.split(128)]}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            sync()
            start = time.perf_counter()
            way()
            sync()
            seconds[name].append(time.perf_counter() - start)
    base = statistics.median(seconds["v2 per image"])
    print(f"crop+flip throughput ({args.images} CIFAR images, median of {args.repeats} interleaved, 1 thread)")
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"  {name:28s} {args.images / median:10.0f} images/s   {base / median:5.2f}x v2")


if __name__ == "__main__":
    main()
