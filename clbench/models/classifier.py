"""Backbone + classification head, shaped the way Avalanche's strategies expect
(``model.feature_extractor`` and ``model.classifier``; multi-task models take ``(x, task_labels)``)."""

from __future__ import annotations

from collections.abc import Callable

from avalanche.models import IncrementalClassifier, MultiHeadClassifier, MultiTaskModule
from torch import Tensor, nn

from clbench.protocol import ClassificationInfo
from clbench.registry import MODELS

HEADS: dict[str, Callable[[int, ClassificationInfo], nn.Module]] = {
    # grows with the classes seen (Avalanche masks not-yet-seen units with -1000)
    "incremental": lambda d, info: IncrementalClassifier(d, initial_out_features=info.classes_per_experience[0]),
    # all classes from the start (e.g. dark experience replay, which stores logits of a fixed width)
    "fixed": lambda d, info: nn.Linear(d, info.n_classes),
    # one head per task label (task-incremental)
    "multi": lambda d, info: MultiHeadClassifier(d, initial_out_features=info.classes_per_experience[0]),
}


class FeatureClassifier(nn.Module):
    """``logits = classifier(feature_extractor(x))``: ``(B, *input_shape) -> (B, D) -> (B, C)``."""

    def __init__(self, feature_extractor: nn.Module, classifier: nn.Module) -> None:
        super().__init__()
        self.feature_extractor = feature_extractor
        self.classifier = classifier

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.feature_extractor(x))


class MultiTaskFeatureClassifier(MultiTaskModule):
    """Shared features, one head per task: ``logits = classifier(feature_extractor(x), task_label)``."""

    def __init__(self, feature_extractor: nn.Module, classifier: MultiHeadClassifier) -> None:
        super().__init__()
        self.feature_extractor = feature_extractor
        self.classifier = classifier

    def forward_single_task(self, x: Tensor, task_label: int) -> Tensor:
        return self.classifier(self.feature_extractor(x), task_labels=task_label)


def build_backbone(info: ClassificationInfo, name: str = "auto", args: dict | None = None) -> nn.Module:
    """``MODELS.get(name)(info, **args)`` as a feature extractor with ``out_features`` set.

    ``name="auto"`` takes ``info.default_model``. A timm model (one with ``reset_classifier``) has its head removed.
    """
    backbone = MODELS.get(info.default_model if name == "auto" else name)(info, **(args or {}))
    if hasattr(backbone, "reset_classifier"):
        backbone.reset_classifier(0)
        backbone.out_features = backbone.num_features
    return backbone


def build_classifier(info: ClassificationInfo, name: str = "auto", args: dict | None = None,
                     head: str = "incremental") -> nn.Module:
    """A backbone from :data:`MODELS` with a head from :data:`HEADS` (``multi`` gives a multi-task model)."""
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {sorted(HEADS)}.")
    backbone = build_backbone(info, name, args)
    classifier = HEADS[head](backbone.out_features, info)
    cls = MultiTaskFeatureClassifier if isinstance(classifier, MultiTaskModule) else FeatureClassifier
    return cls(backbone, classifier)
