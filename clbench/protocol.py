"""The contracts between the runner, scenarios and strategies.

The runner never reaches inside a strategy: it only calls :class:`Strategy`'s three methods, and it only reads a
scenario through :class:`Scenario` (an Avalanche benchmark plus its :class:`ScenarioInfo`).

Label convention (enforced by every scenario): class labels are renumbered by their position in the class order, so
experience ``t`` holds the contiguous label range ``info.class_ranges[t]`` and after experience ``t`` the seen
classes are ``0 .. info.n_seen(t) - 1``. A strategy's ``predict`` returns logits whose column ``c`` is class ``c``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of a strategy after a training step (numbers of scalars, not millions)."""

    total: int
    trainable: int

    @classmethod
    def of(cls, *modules: torch.nn.Module) -> ParamCount:
        params = {id(p): p for m in modules for p in m.parameters()}.values()
        return cls(total=sum(p.numel() for p in params),
                   trainable=sum(p.numel() for p in params if p.requires_grad))


@dataclass(frozen=True)
class ScenarioInfo:
    """What a strategy may know about a scenario before training.

    ``classes_per_experience[t]`` is the number of classes experience ``t`` introduces. In task-incremental
    scenarios (``task_aware``) the task label of each sample is given at train and test time and predictions are
    made among that task's classes only. ``domain_incremental`` scenarios reuse the same labels in every
    experience (``classes_per_experience[t]`` then counts the labels of that experience, all of them shared).
    """

    name: str
    n_classes: int
    classes_per_experience: tuple[int, ...]
    input_shape: tuple[int, ...]                 # (C, H, W) for images, (D,) for vectors
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    task_aware: bool = False
    domain_incremental: bool = False
    default_model: str = "mlp"                  # backbone used when a strategy's config says model="auto"
    class_order: tuple[int, ...] = ()           # original label of renumbered class c (for reports)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_experiences(self) -> int:
        return len(self.classes_per_experience)

    def class_range(self, t: int) -> range:
        """Renumbered labels introduced by experience ``t``."""
        if self.domain_incremental:
            return range(self.classes_per_experience[t])
        start = sum(self.classes_per_experience[:t])
        return range(start, start + self.classes_per_experience[t])

    def n_seen(self, t: int) -> int:
        """Number of classes seen after training experiences ``0..t``."""
        if self.domain_incremental:
            return max(self.classes_per_experience[: t + 1])
        return sum(self.classes_per_experience[: t + 1])


@dataclass
class Scenario:
    """A built scenario: an Avalanche benchmark (``train_stream``, ``test_stream``) and its description."""

    benchmark: Any
    info: ScenarioInfo

    @property
    def train_stream(self):
        return self.benchmark.train_stream

    @property
    def test_stream(self):
        return self.benchmark.test_stream


@runtime_checkable
class Strategy(Protocol):
    """What the runner relies on. ``offline`` strategies (joint training) receive the list of all training
    experiences in a single ``train`` call and are evaluated once."""

    offline: ClassVar[bool]

    def train(self, experience: Any) -> None: ...

    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        """Logits ``(B, C)`` whose column ``c`` scores renumbered class ``c`` (``C`` >= classes seen so far)."""
        ...

    def num_parameters(self) -> ParamCount: ...
