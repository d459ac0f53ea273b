"""GPU hours of a paper-scale (``*_full``) suite, estimated before it starts.

A run's training work is ``image passes = sum over steps t of epochs_t * n_t`` (``n_t``: the step's training
items, new data plus the memory) and its time ``passes / throughput``, with the throughput (training items per
second on one GPU) of the run's network from :data:`THROUGHPUT`. Evaluation and the work around training are left
out (a few percent at these epoch counts), and so is private training's per-sample work. The suite's estimate is
the sum over its runs.

:data:`THROUGHPUT` holds figures DERIVED, not measured: no GPU was lent when they were written. Each is the network's
training FLOPs per item (forward and backward of one training step, 2 per multiply-add), COUNTED on CPU with
``torch.utils.flop_counter.FlopCounterMode`` on the suites' own networks at their real shapes (DER's per step, with
the step's frozen backbones: forward only), divided by an H200's dense bf16 throughput at an assumed 25% utilization
(:data:`H200_BF16_FLOPS`, :data:`UTILIZATION`), capped by the data path (:data:`DATA_PATH_CAP`: the per-sample
fetch and collation of the training dataset in the main process; the crop and flip are batched on the device).
``benchmarks/gpu_check.sh`` measures them when a device is lent (``benchmarks/loop_throughput.py --device cuda``);
docs/gpu_check.md says which figures are in use.
"""

from __future__ import annotations

from dataclasses import dataclass

H200_BF16_FLOPS = 989e12
"""An H200's dense bf16 tensor throughput (FLOP/s)."""
UTILIZATION = 0.25
"""Assumed fraction of it that small-image training reaches (kernel launches, small batches, fp32 parts)."""
DATA_PATH_CAP = 15_000.0
"""Images per second one core feeds through a split CIFAR-100 experience's training ``DataLoader`` (Avalanche's
per-sample indexing and the collation, batch 128, no augmentation: that is batched on the device,
:meth:`clbench.augment.CropFlip.batch`): 10,000-20,000 measured on the 2-core VM under load, three passes."""


@dataclass(frozen=True)
class Network:
    """A network's training GFLOPs per item (one forward and backward, counted on CPU) and the items per second
    derived from it."""

    train_gflops: float
    data_bound: bool = True            # images through the per-sample DataLoader path

    @property
    def items_per_s(self) -> float:
        compute = H200_BF16_FLOPS * UTILIZATION / (self.train_gflops * 1e9)
        return min(compute, DATA_PATH_CAP) if self.data_bound else compute


RESNET18_W64_FORWARD = 1.111
"""GFLOPs of one CIFAR ResNet-18 width 64 forward per 32 x 32 image (counted)."""


def _der_train_gflops(steps: int = 10, epochs: int = 170, first_epochs: int = 200, retrain_epochs: int = 30,
                      images: int = 50_000, memory: int = 2000) -> float:
    """DER's training GFLOPs per item pass, averaged over der_full's passes. Counted on the real DERNet: step ``t``
    (1-based) costs ``(t + 2) F`` an item (``t`` backbone forwards, the new one's backward ``2F``; F the ResNet-18's
    forward) and its classifier re-training ``t F`` (forward only)."""
    f, per_step = RESNET18_W64_FORWARD, images / steps
    work = passes = first_epochs * per_step
    work *= 3 * f
    for t in range(2, steps + 1):
        work += epochs * (per_step + memory) * (t + 2) * f + retrain_epochs * memory * t * f
        passes += epochs * (per_step + memory) + retrain_epochs * memory
    return work / passes


THROUGHPUT: dict[str, Network] = {
    "resnet32": Network(0.414),                  # CIFAR ResNet-32, 32 x 32 (0.47M parameters)
    "der": Network(_der_train_gflops()),         # one CIFAR ResNet-18 width 64 (11.2M) per task
    "dytox": Network(3.62),                      # DyTox CIFAR model: dim 384, 5 SABs + TAB, one task (10.7M)
    # SeqRec d 64, 2 blocks, length 50, 23,715 items, the packed loss at a user's 9 real positions (the mean user)
    "seqrec": Network(0.108, data_bound=False),
}
"""Network name -> derived throughput (module docstring)."""


@dataclass(frozen=True)
class SuiteCost:
    """One ``*_full`` suite: its runs, training item passes per run and the network that dominates them."""

    runs: int
    passes_per_run: float
    network: str

    @property
    def gpu_hours(self) -> float:
        return self.runs * self.passes_per_run / THROUGHPUT[self.network].items_per_s / 3600


def _class_incremental_passes(steps: int, epochs: int, images: int = 50_000, memory: int = 2000,
                              first_epochs: int | None = None) -> float:
    """``sum_t epochs_t * (images / steps + memory)`` (no memory at the first step)."""
    per_step = images / steps
    first = (first_epochs or epochs) * per_step
    return first + (steps - 1) * epochs * (per_step + memory)


SUITES: dict[str, SuiteCost] = {
    # 8 strategies x 4 scenarios (B0 10/20/50 steps, B50 10) x 3 seeds, 70 epochs a step; the B0 10-step cost
    # stands for each scenario (every scenario passes over the 50,000 images once per epoch, plus the memory)
    "cifar100_full": SuiteCost(96, _class_incremental_passes(10, 70), "resnet32"),
    # 3 class orders, 10 steps, 200 epochs on the first step and 170 on the others (+30 of re-training on the memory)
    "der_full": SuiteCost(3, _class_incremental_passes(10, 170, first_epochs=200) + 9 * 30 * 2000, "der"),
    # 2 strategies x 3 orders, 500 epochs a step (+20 of balanced fine-tuning on the memory)
    "dytox_full": SuiteCost(6, _class_incremental_passes(10, 500) + 9 * 20 * 2000, "dytox"),
    # 9 rows x 5 seeds (the two popularity rows train nothing), 100 epochs over 31,013 user sequences
    "dp_seqrec_games_full": SuiteCost(35, 100 * 31_013, "seqrec"),
}


def gpu_hours(suite: str) -> float | None:
    """The estimated GPU hours of a shipped ``*_full`` suite (None for any other suite)."""
    cost = SUITES.get(suite)
    return None if cost is None else cost.gpu_hours


def notice(suite: str, device: str) -> str | None:
    """The line printed when a ``*_full`` suite starts on a CPU (None otherwise)."""
    hours = gpu_hours(suite)
    if hours is None or device.startswith("cuda"):
        return None
    return (f"{suite} is a paper-scale suite: about {hours:,.1f} GPU hours on one H200 (derived from FLOP counts, "
            f"not measured; docs/gpu_check.md), far more on this CPU. Run it with --device cuda.")


__all__ = ["SUITES", "THROUGHPUT", "Network", "SuiteCost", "gpu_hours", "notice"]
