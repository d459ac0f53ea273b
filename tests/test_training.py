"""Training (:mod:`clbench.training`), the one fit loop and its schedules.

A strategy of one's own that calls :func:`clbench.training.fit` without ``callbacks=`` still fires the run's
callbacks (:func:`clbench.training.strategy_training`, entered by the runner around ``strategy.train``): its training
log and artifacts are written and a non-finite loss fails the run. Outside a run, ``fit`` fires none.

The learning rate of every optimizer step of each training family, recorded by a callback while the shipped
strategies train, against sequences computed here by hand from each recipe's formula (in the float operations the
recipes were written in, so equality is exact): the fit loop (NLFT's milestones, the sequence model's per-step
warm-up and linear decay), the phased template (DyTox's warm-up and cosine, DER's warm-up and milestones and its
re-training milestones, PETL's constant rate) and pretraining (torch's OneCycleLR, rate and β1). These tests only
drive the strategies through their public entry points: they held, unchanged, on the code before the one
``Schedule`` (see clbench/training.py), so the rates every shipped strategy trains with are the same bit for bit."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from clbench import api
from clbench.callbacks import Callback, CallbackList, CallbackSpec
from clbench.cl.data import experience_tensors
from clbench.config import build_config
from clbench.models.checkpoint import save_weights
from clbench.protocol import ParamCount, StrategyBase
from clbench.registry import CALLBACKS, MODELS, SCENARIOS, STRATEGIES
from clbench.scenarios.movielens import sequences_scenario
from clbench.training import FitSettings, fit, strategy_training
from clbench.typecheck import RangeChecked

SCENARIO = {"train_per_class": 10, "test_per_class": 5}


@dataclass
class ForgetfulConfig(RangeChecked):
    epochs: int = 2
    poison: bool = False        # a NaN in the loss from the first batch on


class Forgetful(StrategyBase):
    """A linear classifier trained by ``fit`` without ``callbacks=`` (the author forgot them)."""

    Config = ForgetfulConfig
    PRESETS = {"cpu": {}}

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), info.n_classes))

    def train(self, experience):
        x, y = experience_tensors(experience)
        poison = float("nan") if self.config.poison else 0.0
        fit(self.model, self.model, self.model.parameters(), x, y, lambda out, t: F.cross_entropy(out, t) + poison,
            FitSettings(self.config.epochs, 8, 0.01), seed=0)

    @torch.no_grad()
    def predict(self, x, task_labels):
        return self.model(x)

    def num_parameters(self):
        return ParamCount.of(self.model)


def test_fit_without_callbacks_writes_the_training_log_and_artifacts_of_the_run(registered, tmp_path):
    registered(STRATEGIES, "forgetful", Forgetful)
    record = api.run("synthetic", "forgetful", scenario_args=SCENARIO, callbacks=["hook_trace"], out=tmp_path)
    assert record.status == "finished", record.reason
    artifacts = tmp_path / "artifacts" / record.run_id
    rows = [json.loads(line) for line in (artifacts / "training_log.jsonl").read_text().splitlines()]
    experiences = len(record.accuracy_matrix)
    assert [(r["experience"], r["epoch"]) for r in rows] == [(e, k) for e in range(experiences) for k in range(2)]
    hooks = [json.loads(line)["hook"] for line in (artifacts / "hooks.jsonl").read_text().splitlines()]
    assert hooks.count("on_batch_start") == sum(r["batches"] for r in rows) > 0


def test_fit_without_callbacks_keeps_the_nan_guard(registered, tmp_path):
    registered(STRATEGIES, "forgetful", Forgetful)
    record = api.run("synthetic", "forgetful", scenario_args=SCENARIO, args={"poison": True}, out=tmp_path)
    assert record.status == "failed" and "non-finite" in record.reason.lower()


def test_fit_fires_the_innermost_strategy_callbacks_and_none_outside_a_run():
    class Count(Callback):
        def __init__(self) -> None:
            self.batches = 0

        def on_batch_start(self, x, y) -> None:
            self.batches += 1

    def train(callbacks=None) -> None:
        model = nn.Linear(2, 2)
        fit(model, model, model.parameters(), torch.zeros(6, 2), torch.zeros(6, dtype=torch.long),
            F.cross_entropy, FitSettings(1, 3, 0.1), seed=0, callbacks=callbacks)

    outer, inner = CallbackList(), CallbackList()
    outer.callbacks.append(Count())
    inner.callbacks.append(Count())
    train()                                           # outside a run: nothing to fire
    with strategy_training(outer):
        train()
        with strategy_training(inner):
            train()
        train(CallbackList())                         # passed explicitly: that list, not the strategy's
    train()
    assert (outer.callbacks[0].batches, inner.callbacks[0].batches) == (2, 2)


EVENTS: list[tuple] = []       # ("step", lr, momentum) after each optimizer step, ("epoch", e) after each epoch


class LrTrace(Callback):
    """The rate every parameter group trained with (all groups share it), β1 or the SGD momentum, and epoch ends."""

    def after_step(self, optimizer):
        rates = {group["lr"] for group in optimizer.param_groups}
        assert len(rates) == 1, rates
        group = optimizer.param_groups[0]
        EVENTS.append(("step", rates.pop(), group["betas"][0] if "betas" in group else group.get("momentum")))

    def on_epoch_end(self, epoch):
        EVENTS.append(("epoch", epoch))


def phases(events: list[tuple]) -> list[list[list[float]]]:
    """Recorded events -> phases (a training call: epoch indices restart at 0) -> epochs -> the rate of each step."""
    out, steps = [], []
    for event in events:
        if event[0] == "step":
            steps.append(event[1])
            continue
        if event[1] == 0:
            out.append([])
        assert steps, "an epoch without an optimizer step"
        out[-1].append(steps)
        steps = []
    assert not steps
    return out


def traced(strategy, experiences) -> list[list[list[float]]]:
    EVENTS.clear()
    strategy.callbacks.callbacks.append(LrTrace())
    for experience in experiences:
        strategy.train(experience)
    return phases(EVENTS)


def per_epoch(rates: list[float], recorded: list[list[float]]) -> list[list[float]]:
    """The expected rate of every recorded step when epoch ``e`` trains at ``rates[e]``."""
    assert len(recorded) == len(rates)
    return [[rate] * len(steps) for rate, steps in zip(rates, recorded)]


def step_decay(lr: float, epoch: int, milestones: tuple[int, ...], gamma: float) -> float:
    """torch's MultiStepLR: ``lr·γ^{|{m ≤ e}|}``."""
    return lr * gamma ** sum(m <= epoch for m in milestones)


@pytest.fixture(scope="module")
def digits():
    return SCENARIOS.get("split_digits")(seed=0, n_experiences=5)


@pytest.fixture(scope="module")
def synthetic():
    return SCENARIOS.get("synthetic")(seed=0, n_classes=4, n_experiences=2, train_per_class=24, test_per_class=8,
                                      separation=6.0)


# --------------------------------------------------------------------------------------------------- fit loop
def test_nlft_trains_each_epoch_at_its_milestone_rate(digits):
    config = build_config("nlft", None, {"model_args": {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4},
                                         "epochs": 3, "batch_size": 64, "lr": 0.003, "lr_milestones": [1, 2],
                                         "lr_decay": 0.3})
    torch.manual_seed(0)
    strategy = STRATEGIES.get("nlft")(digits.info, torch.device("cpu"), config)
    recorded = traced(strategy, list(digits.train_stream)[:2])
    assert len(recorded) == 2
    for phase, experience in zip(recorded, digits.train_stream):
        assert [len(steps) for steps in phase] == [math.ceil(len(experience.dataset) / 64)] * 3
        assert phase == per_epoch([0.003, 0.003 * 0.3, 0.003 * 0.3 ** 2], phase)


def test_sequence_model_warms_up_per_step_then_decays_linearly():
    """Ding et al.'s recipe: ``T = E·⌈n/B⌉`` steps, ``W = ⌈w·T⌉``, ``lr·(s+1)/W`` then ``lr·(T−s)/(T−W)``."""
    rows = [(u, (u + t) % 12 + 1, 1, 1000 * t + u) for u in range(40) for t in range(12)]
    scenario = sequences_scenario(np.array(rows), 1, max_len=6, n_items=12)
    config = build_config("seqrec", "cpu", {"epochs": 3, "batch_size": 16, "lr": 0.003, "warmup": 0.3, "dim": 8})
    torch.manual_seed(0)
    strategy = STRATEGIES.get("seqrec")(scenario.info, torch.device("cpu"), config)
    (phase,) = traced(strategy, scenario.train_stream)
    total = 3 * math.ceil(len(scenario.train_stream[0].dataset) / 16)
    warm = math.ceil(0.3 * total)
    expected = [0.003 * ((s + 1) / warm if s < warm else (total - s) / (total - warm)) for s in range(total)]
    assert [rate for steps in phase for rate in steps] == expected and total > warm > 1


# ------------------------------------------------------------------------------------------- phased template
def test_dytox_warms_up_then_follows_the_cosine_and_fine_tunes_at_a_constant_rate(digits):
    """timm's per-epoch recipe: ``warmup_lr + e·(lr − warmup_lr)/W`` for ``e < W``, then ``min_lr + ½(lr −
    min_lr)(1 + cos(π e/E))``; the balanced fine-tuning phase at ``finetune_lr·B/512``."""
    config = build_config("dytox", "micro", {"epochs": 5, "first_epochs": 5, "finetune_epochs": 2, "mem_size": 30,
                                             "warmup_epochs": 2, "warmup_lr": 1e-4, "min_lr": 1e-5, "lr": 8e-3,
                                             "finetune_lr": 8e-4, "augment": [],
                                             "arch_overrides": {"embed_dim": 8, "depth": 1, "num_heads": 2,
                                                                "patch_size": 4}})
    torch.manual_seed(0)
    strategy = STRATEGIES.get("dytox")(digits.info, "cpu", config)
    recorded = traced(strategy, list(digits.train_stream)[:2])
    lr, ft, low, start = 8e-3 * config.batch_size / 512, 8e-4 * config.batch_size / 512, 1e-5, 1e-4
    task = [start + e * (lr - start) / 2 if e < 2 else low + 0.5 * (lr - low) * (1 + math.cos(math.pi * e / 5))
            for e in range(5)]
    assert len(recorded) == 3                           # task 0; task 1 and its balanced fine-tuning
    assert recorded[0] == per_epoch(task, recorded[0]) and recorded[1] == per_epoch(task, recorded[1])
    assert recorded[2] == per_epoch([ft, ft], recorded[2])
    assert len(set(task)) == 5


def test_der_warms_up_decays_at_its_milestones_and_retrains_with_its_own(digits):
    config = build_config("der", "micro", {"model": "cnn", "model_args": {"width": 4}, "mem_size": 30,
                                           "first_epochs": 2, "first_milestones": [1], "epochs": 3,
                                           "warmup_epochs": 1, "milestones": [2], "lr_decay": 0.5, "lr": 0.05,
                                           "retrain_epochs": 2, "retrain_lr": 0.02, "retrain_milestones": [1]})
    torch.manual_seed(0)
    strategy = STRATEGIES.get("der")(digits.info, "cpu", config)
    recorded = traced(strategy, list(digits.train_stream)[:2])
    assert len(recorded) == 3                           # task 0; task 1 and the classifier's re-training
    assert recorded[0] == per_epoch([step_decay(0.05, e, (1,), 0.5) for e in range(2)], recorded[0])
    warm_then_steps = [0.0 + 0 * (0.05 - 0.0) / 1] + [step_decay(0.05, e, (2,), 0.5) for e in (1, 2)]
    assert recorded[1] == per_epoch(warm_then_steps, recorded[1]) and warm_then_steps == [0.0, 0.05, 0.025]
    assert recorded[2] == per_epoch([step_decay(0.02, e, (1,), 0.5) for e in range(2)], recorded[2])


def test_petl_trains_at_its_constant_rate(synthetic, tmp_path):
    vit = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}
    torch.manual_seed(5)
    checkpoint = save_weights(MODELS.get("vit")(synthetic.info, **vit), tmp_path / "vit.pt")
    config = build_config("lora", "cpu", {"model_args": vit, "size": 2, "epochs": 2, "batch_size": 16, "lr": 0.004,
                                          "init": str(checkpoint)})
    torch.manual_seed(0)
    strategy = STRATEGIES.get("lora")(synthetic.info, "cpu", config)
    recorded = traced(strategy, synthetic.train_stream)
    assert len(recorded) == 2 and all(phase == per_epoch([0.004, 0.004], phase) for phase in recorded)


# ------------------------------------------------------------------------------------------------ pretraining
def test_pretraining_follows_torch_one_cycle_in_rate_and_beta1(synthetic, registered):
    """The reference is torch's OneCycleLR itself (max_lr, total_steps T = E·⌈n/B⌉, pct_start 0.1, its defaults)
    on an AdamW, read before each of the T steps."""
    from clbench.pretraining import Pretraining, pretrain

    registered(CALLBACKS, "test_lr_trace", LrTrace)
    setup = Pretraining("synthetic", (0, 1), {"n_classes": 4, "n_experiences": 2, "train_per_class": 24},
                        {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}, epochs=3, batch_size=8,
                        lr=2e-3)
    EVENTS.clear()
    pretrain(setup, [CallbackSpec("test_lr_trace")], report=lambda line: None)
    recorded = [(e[1], e[2]) for e in EVENTS if e[0] == "step"]
    total = 3 * math.ceil(4 * 24 / 8)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 2e-3, total_steps=total, pct_start=0.1)
    expected = []
    for _ in range(total):
        expected.append((optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["betas"][0]))
        optimizer.step()
        scheduler.step()
    assert recorded == expected and len({rate for rate, _ in expected}) > total // 2
