"""Pretraining: a ``vit`` trained with cross-entropy on chosen experiences of a scenario, the starting point that
``--init`` / ``init:`` load (the linearization point of the tangent strategies, the frozen backbone of PETL and of
private fine-tuning).

It trains through the one loop, :func:`clbench.training.fit_dataset` (the scenario's train augmentation PER SAMPLE,
AdamW, the one-cycle :class:`~clbench.training.Schedule` per minibatch with 10% warm-up: torch's ``OneCycleLR``
rates and β1), so every callback reaches it: the non-finite
loss guard always, and any :data:`~clbench.callbacks.CALLBACKS` entry given (loggers, ``hook_trace``, ``dual_form``).
After each epoch the source test accuracy (the experiences' test sets, predicted among their own classes) is
reported. ``run_bench.py pretrain`` (:mod:`clbench.commands.pretrain`) is its command line.

Augmentation: pretraining keeps the per-sample path on purpose. The image scenarios declare their crop and flip as
a batch augmentation (``info.batch_augment``, which continual runs apply per minibatch); here it is put back on
each training dataset as a per-sample transform (:class:`clbench.augment.AugmentedSamples`, ``CropFlip.__call__``
in the data loader, the draws and output of torchvision v2's crop and flip bit for bit), and the loop's callbacks
carry no batch augmentation. The draws are those the scenario's per-sample dataset transform made, in the same
order, so a checkpoint is bit-identical to one made before the batched path existed (``checkpoints/
vit64_c100_upper.pt``, sha256 ``3428fe79f73ad28e...``, which committed records reference).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader

from clbench.augment import AugmentedSamples
from clbench.callbacks import Callback, CallbackContext, CallbackList, CallbackSpec
from clbench.registry import MODELS, SCENARIOS
from clbench.training import FitSettings, Schedule, fit_dataset

WARMUP_FRACTION = 0.1      # the share of the steps spent warming up to ``lr`` (OneCycleLR's pct_start)


@dataclass(frozen=True)
class Pretraining:
    """What to pretrain: the ``vit`` built with ``model_args`` on the training experiences ``experiences`` of the
    scenario ``scenario`` (built with ``seed`` and ``scenario_args``), ``epochs`` of minibatches of ``batch_size``,
    AdamW with peak ``lr`` (one cycle) and ``weight_decay``; ``seed`` also seeds the model and the minibatch order."""

    scenario: str
    experiences: tuple[int, ...]
    scenario_args: dict = field(default_factory=dict)
    model_args: dict = field(default_factory=dict)
    epochs: int = 4
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    seed: int = 0

    def settings(self) -> FitSettings:
        return FitSettings(self.epochs, self.batch_size,
                           Schedule(self.lr, per="step", warmup=WARMUP_FRACTION, decay="one_cycle"), "adamw",
                           self.weight_decay)


def source_accuracy(model: nn.Module, datasets: Iterable, classes: Tensor) -> float:
    """Accuracy of ``model`` on ``datasets`` (eval transforms, batches of 512), each sample predicted among
    ``classes`` only: ``classes[argmax(logits[:, classes])]``."""
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for dataset in datasets:
            for x, y, *_ in DataLoader(dataset.eval(), batch_size=512):
                pred = classes[model(x)[:, classes].argmax(1)]
                correct += int((pred == y).sum())
                total += len(y)
    return correct / total


class SourceAccuracy(Callback):
    """After each epoch: ``report`` the source test accuracy, then put the model back in training mode."""

    def __init__(self, model: nn.Module, datasets: list, classes: Tensor, epochs: int,
                 report: Callable[[str], None]) -> None:
        self.model, self.datasets, self.classes, self.epochs, self.report = model, datasets, classes, epochs, report
        self.start = time.perf_counter()
        self.accuracies: list[float] = []

    def on_epoch_end(self, epoch: int) -> None:
        self.accuracies.append(source_accuracy(self.model, self.datasets, self.classes))
        self.report(f"epoch {epoch + 1}/{self.epochs}: source test accuracy {100 * self.accuracies[-1]:.1f}% "
                    f"({time.perf_counter() - self.start:.0f} s)")
        self.model.train()


def pretrain(setup: Pretraining, callbacks: Iterable[CallbackSpec] = (), artifacts: Path | None = None,
             report: Callable[[str], None] = print) -> tuple[nn.Module, list[float]]:
    """Train the model of ``setup`` (on CPU); returns it and the source test accuracy after each epoch. The
    ``callbacks`` are built with the model as their module ``"model"`` and ``artifacts`` as their folder."""
    torch.manual_seed(setup.seed)
    scenario = SCENARIOS.get(setup.scenario)(seed=setup.seed, **setup.scenario_args)
    model = MODELS.get("vit")(scenario.info, **setup.model_args)
    augment = getattr(scenario.info, "batch_augment", None)         # per sample here (module docstring)
    train = ConcatDataset([AugmentedSamples(scenario.train_stream[t].dataset.train(), augment)
                           for t in setup.experiences])
    classes = torch.tensor([c for t in setup.experiences for c in scenario.info.class_range(t)])
    context = CallbackContext(run_id="pretrain", artifacts=artifacts, modules=lambda: {"model": model},
                              n_train=len(train))
    hooks = CallbackList.build(callbacks, context)
    accuracy = SourceAccuracy(model, [scenario.test_stream[t].dataset for t in setup.experiences], classes,
                              setup.epochs, report)
    hooks.callbacks.append(accuracy)

    model.train()
    fit_dataset(model, model, model.parameters(), train, nn.functional.cross_entropy, setup.settings(), setup.seed,
                hooks)
    hooks.close()
    return model, accuracy.accuracies


__all__ = ["Pretraining", "SourceAccuracy", "pretrain", "source_accuracy"]
