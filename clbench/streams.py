"""Build an Avalanche benchmark from in-memory tensors, with class splits and orders computed by continuum.

Every scenario ends here: it loads ``(x_train, y_train, x_test, y_test)`` (already normalized float tensors),
chooses a class order and the number of classes per experience, and :func:`class_incremental` returns a
:class:`~clbench.protocol.Scenario` whose labels are renumbered by position in the class order (continuum's
convention), so experience ``t`` holds the contiguous range ``info.class_range(t)``.

Task labels: ``0`` for every sample of a class-incremental scenario (Avalanche's ``nc_benchmark`` convention),
``t`` for experience ``t`` of a task-incremental one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch
from avalanche.benchmarks.scenarios import benchmark_from_datasets, with_classes_timeline, with_task_labels
from avalanche.benchmarks.utils.classification_dataset import _make_taskaware_tensor_classification_dataset
from continuum import ClassIncremental
from continuum.datasets import InMemoryDataset
from continuum.tasks import TaskType
from torch import Tensor

from clbench.evaluation import AccuracyEvaluator
from clbench.protocol import ClassificationInfo, Scenario

Transform = Callable[[Tensor], Tensor] | None


def seeded_class_order(n_classes: int, seed: int) -> list[int]:
    """A random permutation of ``range(n_classes)`` drawn from ``seed`` (numpy's PCG64)."""
    return np.random.default_rng(seed).permutation(n_classes).tolist()


def increments_for(n_classes: int, n_experiences: int, initial: int = 0) -> list[int]:
    """Classes per experience: ``initial`` classes first (B-protocol, 0 = none), the rest split evenly."""
    rest, steps = n_classes - initial, n_experiences - (1 if initial else 0)
    if steps <= 0 or rest % steps:
        raise ValueError(f"{n_classes} classes cannot be split into {n_experiences} experiences with "
                         f"{initial} initial classes (the remaining {rest} must divide evenly into {steps} steps).")
    return ([initial] if initial else []) + [rest // steps] * steps


def _split(x: Tensor, y: Tensor, increments: Sequence[int], class_order: Sequence[int]):
    """continuum's class-incremental split: list of ``(x_t, y_t)`` with labels renumbered by the class order."""
    dataset = InMemoryDataset(x.numpy(), y.numpy().astype(np.int64), data_type=TaskType.TENSOR)
    split = ClassIncremental(dataset, increment=list(increments), class_order=list(class_order))
    out = []
    for taskset in split:
        xs, ys, _ = taskset.get_raw_samples()
        out.append((torch.as_tensor(xs), torch.as_tensor(ys, dtype=torch.long)))
    return out


def experience_dataset(x: Tensor, y: Tensor, task: int, train_transform: Transform, eval_transform: Transform,
                       train: bool):
    """An Avalanche classification dataset over tensors with ``train``/``eval`` transform groups."""
    return _make_taskaware_tensor_classification_dataset(
        x, y, transform_groups={"train": (train_transform, None), "eval": (eval_transform, None)},
        initial_transform_group="train" if train else "eval",
        task_labels=task, targets=y.tolist())


def class_incremental(info: ClassificationInfo, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor,
                      class_order: Sequence[int], train_transform: Transform = None,
                      eval_transform: Transform = None) -> Scenario:
    """Split train and test tensors by ``info.classes_per_experience`` in ``class_order`` and wrap the
    experiences as an Avalanche benchmark (``with_classes_timeline``, ``with_task_labels``).

    ``info.class_order`` is filled in from ``class_order``. The benchmark also carries ``n_classes_per_exp`` and
    ``classes_order`` (renumbered), which Avalanche's iCaRL reads.
    """
    if sorted(class_order) != sorted(set(int(c) for c in y_train.unique().tolist())):
        raise ValueError(f"{info.name}: class_order must be a permutation of the {info.n_classes} labels present.")
    train_parts = _split(x_train, y_train, info.classes_per_experience, class_order)
    test_parts = _split(x_test, y_test, info.classes_per_experience, class_order)
    task_of = (lambda t: t) if info.task_aware else (lambda t: 0)
    train = [experience_dataset(x, y, task_of(t), train_transform, eval_transform, True)
             for t, (x, y) in enumerate(train_parts)]
    test = [experience_dataset(x, y, task_of(t), train_transform, eval_transform, False)
            for t, (x, y) in enumerate(test_parts)]
    return wrap_benchmark(dataclasses.replace(info, class_order=tuple(int(c) for c in class_order)), train, test)


def wrap_benchmark(info: ClassificationInfo, train: list, test: list) -> Scenario:
    """Avalanche benchmark from per-experience datasets, with the attributes Avalanche's strategies expect."""
    benchmark = with_task_labels(with_classes_timeline(benchmark_from_datasets(train=train, test=test)))
    benchmark.n_classes = info.n_classes
    benchmark.n_classes_per_exp = list(info.classes_per_experience)
    benchmark.classes_order = list(range(info.n_classes))
    for stream in (benchmark.train_stream, benchmark.test_stream):
        for experience in stream:
            experience.benchmark = benchmark          # iCaRL reads experience.benchmark.n_classes_per_exp
    return Scenario(info=info, train_stream=benchmark.train_stream, test_stream=benchmark.test_stream,
                    evaluator=AccuracyEvaluator(), benchmark=benchmark)
