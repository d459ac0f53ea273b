"""Throughput of one epoch of clbench's training against a bare PyTorch loop a user would write, in one process.

For each shape, both sides train the same network (the bare side a copy of the strategy's model), on the same data
(the experience's tensors), with the same batch size, optimizer settings and augmentation, on ``--device``:

- clbench: ``strategy.train(experience)`` with ``epochs = 1`` and the callbacks the runner attaches (training log,
  NaN guard), as :func:`clbench.runner.execute` calls it;
- bare: ``for idx in randperm(n).split(B): x = augment(X[idx].to(device)); loss = CE(model(x), y); step`` (the
  random crop with zero padding and the horizontal flip drawn for the whole batch on the device,
  :meth:`clbench.augment.CropFlip.batch`). clbench's side applies the same: the scenario declares the crop and flip
  as its batch augmentation and the template bridge applies ``CropFlip.batch`` to each minibatch on the device
  (:meth:`clbench.callbacks.CallbackList.augment_batch`), so both sides pay for the same augmentation.

Epochs alternate (clbench, bare, clbench, ...) after one warm-up epoch each, and the ratio of the median epoch times
``clbench / bare`` is printed with each side's items per second (target for ``resnet32`` on CPU: <= 1.15).

Shapes (:data:`SHAPES`): ``resnet32`` and ``vit`` on split CIFAR-100 (10 classes, ``--images`` per class; naive,
the preset given), ``dytox`` (the paper's CIFAR model, dim 384, 5 SABs + TAB, its ``full`` preset: AdamW; the bare
side trains the same network with cross-entropy on its logits and without DyTox's extra losses), ``seqrec`` (the
paper's SeqRec on Amazon Games, ``--images`` user sequences, the packed every-position loss). Where the data are not
on the machine the images or item sequences are random of the real shape (throughput does not depend on pixel
values or item ids), so a GPU check needs no data transfer.

    python benchmarks/loop_throughput.py [--shape resnet32|vit|dytox|seqrec|all] [--device cpu|cuda]
        [--preset cpu|full] [--images N] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clbench.augment import CropFlip
from clbench.callbacks import CallbackContext
from clbench.cl.data import experience_tensors
from clbench.data import DatasetNotFound
from clbench.loggers import ALWAYS_ON
from clbench.protocol import hooks_checked
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.runner import seed_everything

sys.path.insert(0, str(Path(__file__).parent))
import gpu_check_cifar  # noqa: E402  (registers split_cifar100_subset)

CIFAR_CLASSES = 10


@dataclass(frozen=True)
class Side:
    """What one shape trains: the experience, the clbench strategy, and the bare loop's parts."""

    experience: object
    strategy: object
    inputs: Tensor                    # (n, ...) on CPU, eval transform
    targets: Tensor                   # (n,) or (n, L)
    loss: Callable[[nn.Module, Tensor, Tensor], Tensor]
    augment: Callable[[Tensor], Tensor]


def _cifar_arrays(per_class: int, data_root: Path) -> Path:
    """A CIFAR-100-shaped npz (``per_class`` train / 10 test images per class): the local data's first images, or
    random pixels when CIFAR-100 is not on the machine. Returns its path."""
    out = data_root / "cifar100_subset.npz"
    try:
        gpu_check_cifar.write_subset(out, per_class, 10)
        return out
    except DatasetNotFound:
        rng = np.random.default_rng(0)
        y_train, y_test = np.repeat(np.arange(100), per_class), np.repeat(np.arange(100), 10)
        np.savez(out, x_train=rng.integers(0, 256, (len(y_train), 32, 32, 3), dtype=np.uint8), y_train=y_train,
                 x_test=rng.integers(0, 256, (len(y_test), 32, 32, 3), dtype=np.uint8), y_test=y_test)
        print("  (CIFAR-100 not found: random pixels of its shape)")
        return out


def _logits_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    out = model(x)
    return F.cross_entropy(getattr(out, "logits", out), y)


def _strategy(name: str, info, device: torch.device, preset: str, args: dict):
    from clbench.config import build_config
    strategy = STRATEGIES.get(name)(info, device, build_config(name, preset, args))
    strategy.callbacks.attach(list(ALWAYS_ON), CallbackContext(run_id="throughput"))
    return strategy


def image_side(strategy_name: str, args: dict) -> Callable[..., Side]:
    def build(device: torch.device, preset: str, per_class: int, folder: Path) -> Side:
        path = _cifar_arrays(per_class, folder)
        scenario = SCENARIOS.get("split_cifar100_subset")(path=str(path), n_experiences=1, classes=CIFAR_CLASSES)
        experience = scenario.train_stream[0]
        strategy = _strategy(strategy_name, scenario.info, device, preset, {**args, "epochs": 1})
        x, y = experience_tensors(experience)
        return Side(experience, strategy, x, y, _logits_loss, CropFlip(32, padding=4).batch)
    return build


def seqrec_side(device: torch.device, preset: str, users: int, folder: Path) -> Side:
    from clbench.models.seqrec import target_loss
    try:
        scenario = SCENARIOS.get("games_seqrec")(max_len=50, windows="last")
        data = scenario.train_stream[0].dataset
        x, y, info = data.x[:users], data.y[:users], scenario.info
    except DatasetNotFound:
        from clbench.protocol import ScenarioInfo
        print("  (Amazon Games not found: random item sequences of its shape)")
        n_items, g = 23_715, torch.Generator().manual_seed(0)
        x = torch.randint(1, n_items + 1, (users, 50), generator=g)
        x[:, :41] = 0                                       # padding: the median user has ~9 items
        y = torch.roll(x, -1, 1)
        y[:, -1] = torch.randint(1, n_items + 1, (users,), generator=g)
        info = ScenarioInfo(name="games_synthetic", n_experiences=1, input_shape=(50,), extra={"n_items": n_items})
    experience = SimpleNamespace(dataset=SimpleNamespace(x=x, y=y), current_experience=0)
    strategy = _strategy("seqrec", info, device, preset, {"epochs": 1})
    return Side(experience, strategy, x, y, lambda m, xb, yb: target_loss(m(xb, targets=yb)), lambda xb: xb)


SHAPES: dict[str, Callable[..., Side]] = {
    "resnet32": image_side("naive", {"model": "resnet32"}),
    "vit": image_side("naive", {"model": "vit"}),
    "dytox": image_side("dytox", {"mem_size": 0, "warmup_epochs": 0, "finetune_epochs": 0, "augment": ()}),
    "seqrec": seqrec_side,
}
"""Shape name -> ``build(device, preset, items, folder) -> Side``."""

PRESETS = {"dytox": "full"}
"""Shapes whose strategy is always trained at this preset (DyTox at paper size)."""


def bare_optimizer(config, params) -> torch.optim.Optimizer:
    """The optimizer a user would build from the strategy's settings (DyTox's ``lr`` scaled by batch / 512)."""
    lr = config.lr * (config.batch_size / 512 if hasattr(config, "arch") else 1)
    name = getattr(config, "optimizer", "adamw")
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay)
    return {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name](params, lr=lr,
                                                                       weight_decay=config.weight_decay)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clbench_epoch(side: Side, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    with hooks_checked(side.strategy, 0):
        side.strategy.train(side.experience)
    _sync(device)
    return time.perf_counter() - start


def bare_epoch(side: Side, model: nn.Module, optimizer: torch.optim.Optimizer, batch: int,
               device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    model.train()
    inputs = side.inputs.pin_memory() if device.type == "cuda" else side.inputs
    for idx in torch.randperm(len(side.targets)).split(batch):
        x = side.augment(inputs[idx].to(device, non_blocking=True))
        loss = side.loss(model, x, side.targets[idx].to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    _sync(device)
    return time.perf_counter() - start


def measure(shape: str, device: torch.device, preset: str, items: int, repeats: int) -> tuple[float, float, int]:
    """``(median clbench epoch s, median bare epoch s, items per epoch)``, epochs interleaved."""
    seed_everything(0)
    with tempfile.TemporaryDirectory() as folder:
        side = SHAPES[shape](device, PRESETS.get(shape, preset), items, Path(folder))
    clbench_epoch(side, device)                                       # warm-up (and the head's first growth)
    model = copy.deepcopy(side.strategy.model).to(device)
    optimizer = bare_optimizer(side.strategy.config, model.parameters())
    batch = side.strategy.config.batch_size
    bare_epoch(side, model, optimizer, batch, device)
    ours, bare = [], []
    for _ in range(repeats):
        ours.append(clbench_epoch(side, device))
        bare.append(bare_epoch(side, model, optimizer, batch, device))
    return statistics.median(ours), statistics.median(bare), len(side.targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="resnet32", choices=[*SHAPES, "all"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", default="cpu", choices=["cpu", "full"],
                        help="the strategy's preset (batch, optimizer); dytox always trains at 'full'")
    parser.add_argument("--images", type=int, default=100,
                        help="images per class (10 classes), or user sequences for seqrec (default 100)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = list(SHAPES) if args.shape == "all" else [args.shape]
    print(f"loop throughput ({args.device}, preset {args.preset}, median of {args.repeats} interleaved epochs, "
          f"{torch.get_num_threads()} threads)")
    for shape in shapes:
        ours, bare, n = measure(shape, device, args.preset, args.images, args.repeats)
        print(f"  {shape:9s} {n:6d} items/epoch   clbench {n / ours:9.1f}/s   bare {n / bare:9.1f}/s   "
              f"epoch s {ours:.3f} / {bare:.3f}   clbench / bare = {ours / bare:.3f}"
              + ("   (target <= 1.15)" if shape == "resnet32" else ""), flush=True)


if __name__ == "__main__":
    main()
