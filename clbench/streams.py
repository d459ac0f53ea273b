"""Build an Avalanche benchmark from in-memory tensors, with class splits and orders computed by continuum.

Every scenario ends here: it loads ``(x_train, y_train, x_test, y_test)`` (already normalized float tensors),
chooses a class order and the number of classes per experience, and :func:`class_incremental` returns a
:class:`~clbench.protocol.Scenario` whose labels are renumbered by position in the class order (continuum's
convention), so experience ``t`` holds the contiguous range ``info.class_range(t)``.

Task labels: ``0`` for every sample of a class-incremental scenario (Avalanche's ``nc_benchmark`` convention),
``t`` for experience ``t`` of a task-incremental one.

**What is scored** (:class:`Holdout`, the scenario arguments ``holdout`` and ``valid_fraction``, the names and values
of the recommendation scenarios'): ``holdout: test`` (the default) scores the test set; ``holdout: valid`` splits the
training set per class into training and validation parts (:func:`validation_split`, a FIXED seed: every strategy
and run seed gets the same split), trains on the first and scores the second in place of the test stream: the test
data are never read, so budgets chosen on that score are chosen without the test data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch
from torch import Tensor

from clbench.evaluation import AccuracyEvaluator
from clbench.protocol import ClassificationInfo, Scenario
from clbench.typecheck import Range

Transform = Callable[[Tensor], Tensor] | None

HoldoutName = Literal["test", "valid"]
"""A classification scenario's ``holdout`` argument: what its evaluator scores (see the module docstring)."""
ValidFraction = Annotated[float, Range(0, 1, open_low=True, open_high=True)]
"""A classification scenario's ``valid_fraction`` argument: the part of each class's training samples held out."""
VALIDATION_SEED = 20_240_033
"""The seed of every validation split, independent of the run's seed."""


def held_out(n: int, fraction: float) -> int:
    """Validation samples of a class with ``n`` training samples: ``fraction * n`` rounded half up."""
    return int(fraction * n + 0.5)


def check_validation_counts(counts: Mapping[int, int], fraction: float) -> None:
    """Refuse a ``fraction`` that leaves some class (label -> training samples in ``counts``) without a validation
    or without a training sample, naming the first such class and the fractions that would do."""
    for label, n in counts.items():
        if 0 < held_out(n, fraction) < n:
            continue
        part = "validation" if held_out(n, fraction) == 0 else "training"
        fix = (f"set valid_fraction in [{1 / (2 * n):.3g}, {1 - 1 / (2 * n):.3g})" if n > 1 else
               "no fraction can split one sample; use holdout: test or more samples per class")
        raise ValueError(f"valid_fraction {fraction:g} leaves class {label} ({n} training samples) without a {part} "
                         f"sample; {fix}.")


def check_holdout(counts: Mapping[int, int], args: Mapping[str, object]) -> None:
    """What a scenario's ``check_args`` refuses about ``args["holdout"]``/``args["valid_fraction"]`` (the arguments a
    suite gives) for classes with ``counts`` training samples: ``valid_fraction`` without ``holdout: valid`` (it
    would change nothing), and a fraction leaving a class without a training or a validation sample."""
    holdout = args.get("holdout", "test")
    if holdout != "valid":
        if "valid_fraction" in args:
            raise ValueError(f"valid_fraction is used only with holdout: valid (this entry's holdout is {holdout!r}), "
                             f"so it would change nothing; remove it or set holdout: valid.")
        return
    check_validation_counts(counts, float(args.get("valid_fraction", Holdout.fraction)))


def capped_counts(per_class: Sequence[int], max_per_class: int | None) -> list[int]:
    """Training samples per class after ``max_per_class`` (the first ``max_per_class`` of each class; ``None``: all),
    before any validation holdout."""
    return [min(n, max_per_class) if max_per_class is not None else n for n in per_class]


def check_capped_holdout(per_class: Sequence[int], args: Mapping[str, object]) -> None:
    """:func:`check_holdout` for classes ``0, 1, ...`` with ``per_class`` official training samples, capped by
    ``args["max_per_class"]`` when the suite gives one (the ``check_args`` of the image scenarios)."""
    counts = capped_counts(per_class, args.get("max_per_class"))
    check_holdout(dict(enumerate(counts)), args)


def validation_split(y: Tensor, fraction: float) -> tuple[Tensor, Tensor]:
    """``(train, valid)``: sorted indices into ``y`` that split every class ``c`` of ``n_c`` samples into
    ``held_out(n_c, fraction)`` validation samples and the rest, the validation ones drawn uniformly by a generator
    seeded with ``(VALIDATION_SEED, c)`` (so a class's split depends on its own samples only)."""
    labels = y.numpy()
    classes, counts = np.unique(labels, return_counts=True)
    check_validation_counts(dict(zip(classes.tolist(), counts.tolist())), fraction)
    valid = np.zeros(len(labels), dtype=bool)
    for c, n in zip(classes.tolist(), counts.tolist()):
        members = np.flatnonzero(labels == c)
        chosen = np.random.default_rng([VALIDATION_SEED, c]).permutation(n)[:held_out(n, fraction)]
        valid[members[chosen]] = True
    return torch.from_numpy(np.flatnonzero(~valid)), torch.from_numpy(np.flatnonzero(valid))


@dataclass(frozen=True)
class Holdout:
    """What a classification scenario scores: its test set (``name="test"``) or a ``fraction`` of each class's
    training samples (``"valid"``, :func:`validation_split`)."""

    name: HoldoutName = "test"
    fraction: float = 0.1

    def select(self, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(x_train, y_train, x_scored, y_scored)``: the data as given (``test``), or the training part and the
        validation part of the training data (``valid``; the test tensors are not read)."""
        if self.name == "test":
            return x_train, y_train, x_test, y_test
        train, valid = validation_split(y_train, self.fraction)
        return x_train[train], y_train[train], x_train[valid], y_train[valid]

    def train_counts(self, counts: Sequence[int]) -> list[int]:
        """Training samples per class left after the holdout, from the classes' training ``counts``."""
        return [n - held_out(n, self.fraction) if self.name == "valid" else n for n in counts]

    def described(self, info: ClassificationInfo) -> ClassificationInfo:
        """``info`` with ``extra["holdout"]`` and ``extra["valid_fraction"]`` for a validation holdout (unchanged
        for ``test``: the records of test runs stay as they were)."""
        if self.name == "test":
            return info
        return dataclasses.replace(info, extra={**info.extra, "holdout": "valid", "valid_fraction": self.fraction})


TEST_SET = Holdout()
"""The default: the test set is scored."""


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
    from continuum import ClassIncremental  # continuum and Avalanche: when data are split, not when a suite
    from continuum.datasets import InMemoryDataset  # file is parsed (1.7 + 8.5 s, issue 53)
    from continuum.tasks import TaskType

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
    from avalanche.benchmarks.utils.classification_dataset import _make_taskaware_tensor_classification_dataset

    return _make_taskaware_tensor_classification_dataset(
        x, y, transform_groups={"train": (train_transform, None), "eval": (eval_transform, None)},
        initial_transform_group="train" if train else "eval",
        task_labels=task, targets=y.tolist())


def class_incremental(info: ClassificationInfo, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor,
                      class_order: Sequence[int], train_transform: Transform = None,
                      eval_transform: Transform = None, holdout: Holdout = TEST_SET) -> Scenario:
    """Split train and test tensors by ``info.classes_per_experience`` in ``class_order`` and wrap the
    experiences as an Avalanche benchmark (``with_classes_timeline``, ``with_task_labels``). With a validation
    ``holdout`` the validation part of the training tensors takes the test tensors' place (:meth:`Holdout.select`).

    ``info.class_order`` is filled in from ``class_order``. The benchmark also carries ``n_classes_per_exp`` and
    ``classes_order`` (renumbered), which Avalanche's iCaRL reads.
    """
    if sorted(class_order) != sorted(set(int(c) for c in y_train.unique().tolist())):
        raise ValueError(f"{info.name}: class_order must be a permutation of the {info.n_classes} labels present.")
    x_train, y_train, x_test, y_test = holdout.select(x_train, y_train, x_test, y_test)
    info = holdout.described(info)
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
    from avalanche.benchmarks.scenarios import benchmark_from_datasets, with_classes_timeline, with_task_labels

    benchmark = with_task_labels(with_classes_timeline(benchmark_from_datasets(train=train, test=test)))
    benchmark.n_classes = info.n_classes
    benchmark.n_classes_per_exp = list(info.classes_per_experience)
    benchmark.classes_order = list(range(info.n_classes))
    for stream in (benchmark.train_stream, benchmark.test_stream):
        for experience in stream:
            experience.benchmark = benchmark          # iCaRL reads experience.benchmark.n_classes_per_exp
    return Scenario(info=info, train_stream=benchmark.train_stream, test_stream=benchmark.test_stream,
                    evaluator=AccuracyEvaluator(), benchmark=benchmark)
