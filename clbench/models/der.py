"""DER's network (Yan et al., "DER: Dynamically Expandable Representation for Class Incremental Learning",
CVPR 2021): a super-feature extractor that grows by one feature extractor per task, and one unified classifier.

After :meth:`DERNet.add_task` has been called for tasks ``1..t`` (``|C_1:t|`` classes seen, each extractor
``F_i: (B, *input_shape) -> (B, d)``)::

    u = Φ_t(x) = [F_1(x); ...; F_t(x)]                       (B, t·d)
    ŷ = W_H u                                                  (B, |C_1:t|),  W_H: (|C_1:t|, t·d), no bias

``F_t`` starts as a copy of ``F_{t-1}`` (weights and BatchNorm statistics, as the official ``load_state_dict``);
``F_1..F_{t-1}`` are frozen: no gradient, and eval mode whatever ``.train()`` is called with, so their BatchNorm
statistics never move either. ``W_H`` is rebuilt at every task (official initialization: Kaiming normal for a linear
layer, std ``1/√(t·d)``; no bias, the official ``use_bias: False``) and the old block ``W_H[:|C_1:t-1|, :(t-1)·d]``
is copied into it (``copy_old_classifier``; PyCIL's choice; the official CIFAR config leaves it off and re-learns).

The auxiliary classifier on ``F_t`` (``|C_t| + 1`` outputs) is a training-time head: the strategy owns it
(:mod:`clbench.strategies.der`), so parameter counts of the deployed network are extractors + ``W_H``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn


def der_linear(in_features: int, out_features: int) -> nn.Linear:
    """A bias-free linear layer with the official initialization: ``kaiming_normal_(W, nonlinearity="linear")``,
    i.e. ``W ~ N(0, 1/in_features)``."""
    layer = nn.Linear(in_features, out_features, bias=False)
    nn.init.kaiming_normal_(layer.weight, nonlinearity="linear")
    return layer


@dataclass
class DEROutput:
    """``logits`` ``(B, |C_1:t|)`` (column c = class c) and the features ``[F_1(x), ..., F_t(x)]``, each ``(B, d)``."""

    logits: Tensor
    features: list[Tensor]


class DERNet(nn.Module):
    """Extractors ``F_1..F_t`` and the unified classifier ``W_H``. It starts empty: call :meth:`add_task` with
    ``|C_t|`` when task ``t`` starts. ``factory()`` builds ``F_1`` (a features-without-head module whose
    ``out_features`` is ``d``, e.g. :func:`clbench.models.classifier.build_backbone`)."""

    def __init__(self, factory: Callable[[], nn.Module], copy_old_classifier: bool = True) -> None:
        super().__init__()
        self.factory = factory
        self.copy_old_classifier = copy_old_classifier
        self.extractors = nn.ModuleList()
        self.classifier: nn.Linear | None = None

    @property
    def n_tasks(self) -> int:
        return len(self.extractors)

    @property
    def out_dim(self) -> int:
        """``d``: the feature width of one extractor."""
        return int(self.extractors[0].out_features)

    @property
    def n_classes(self) -> int:
        return 0 if self.classifier is None else self.classifier.out_features

    def add_task(self, n_new: int) -> None:
        """Add ``F_t`` (a copy of ``F_{t-1}``, or ``factory()`` for the first task), freeze ``F_1..F_{t-1}`` and
        rebuild ``W_H`` with ``n_classes + n_new`` rows over ``t·d`` features, the old block copied in."""
        new = copy.deepcopy(self.extractors[-1]) if self.n_tasks else self.factory()
        for old in self.extractors:
            old.requires_grad_(False).eval()
        device = next(iter(self.extractors[-1].parameters())).device if self.n_tasks else None
        self.extractors.append(new.requires_grad_(True).to(device))
        old_classifier = self.classifier
        self.classifier = der_linear(self.out_dim * self.n_tasks, self.n_classes + n_new).to(device)
        if old_classifier is not None and self.copy_old_classifier:
            with torch.no_grad():
                rows, cols = old_classifier.weight.shape
                self.classifier.weight[:rows, :cols] = old_classifier.weight

    def features(self, x: Tensor) -> list[Tensor]:
        """``[F_1(x), ..., F_t(x)]``, each ``(B, d)``."""
        return [extractor(x) for extractor in self.extractors]

    def forward(self, x: Tensor) -> DEROutput:
        if self.classifier is None:
            raise RuntimeError("DERNet has no task yet: call add_task(n_classes) first.")
        features = self.features(x)
        return DEROutput(self.classifier(torch.cat(features, dim=1)), features)

    def train(self, mode: bool = True) -> DERNet:
        """As ``nn.Module.train``, but the frozen extractors ``F_1..F_{t-1}`` stay in eval mode."""
        super().train(mode)
        for old in list(self.extractors)[:-1]:
            old.eval()
        return self
