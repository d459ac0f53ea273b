"""Pretraining (:mod:`clbench.pretraining`) on the one loop: callbacks and the non-finite loss guard reach it, and it
reports the source accuracy per epoch."""

import pytest
import torch

from clbench.callbacks import CallbackSpec
from clbench.errors import NonFiniteLossError
from clbench.pretraining import Pretraining, pretrain

TINY_VIT = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}


def test_pretraining_is_guarded_against_a_non_finite_loss(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda logits, y: logits.sum() * float("nan"))
    setup = Pretraining("synthetic", (0,), {"train_per_class": 4}, TINY_VIT, epochs=1, batch_size=8)
    with pytest.raises(NonFiniteLossError):
        pretrain(setup, report=lambda line: None)


def test_pretraining_reports_the_source_accuracy_per_epoch():
    setup = Pretraining("synthetic", (0, 1), {"train_per_class": 4}, TINY_VIT, epochs=2, batch_size=8)
    lines = []
    model, accuracies = pretrain(setup, [CallbackSpec("hook_trace")], report=lines.append)
    assert len(accuracies) == len(lines) == 2 and all(0.0 <= a <= 1.0 for a in accuracies)
    assert lines[1].startswith("epoch 2/2: source test accuracy") and model.training
