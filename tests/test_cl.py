"""Shared continual-learning parts (clbench.cl): memories and their budget, herding, class balance, reservoir
inclusion probabilities, MixUp, the balanced fine-tuning phase on an Avalanche template, data loops."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from clbench.callbacks import Callback, CallbackList
from clbench.cl import (
    MEMORIES,
    BudgetExceeded,
    ClassBalancedMemory,
    HerdingMemory,
    Phase,
    PhasedTemplate,
    Reservoir,
    ReservoirMemory,
    balanced_finetuning,
    balanced_quotas,
    build_memory,
    dataset_features,
    dataset_loader,
    experience_loader,
    experience_tensors,
    herding_order,
    label_smoothing,
    mixup,
    soft_targets,
)
from clbench.cl.per_class import PerClassMemory
from clbench.config import build_config
from clbench.errors import ConfigError
from clbench.registry import SCENARIOS, UnknownNameError
from clbench.streams import experience_dataset
from clbench.training import FitSettings, Schedule, build_optimizer, fit


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def dataset_of(labels: list[int], start: int = 0, dim: int = 2):
    """A training dataset whose sample ``i`` is the constant image ``start + i`` (its stream position)."""
    y = torch.tensor(labels)
    x = (start + torch.arange(len(labels), dtype=torch.float32)).view(-1, 1, 1, 1).expand(-1, 1, dim, dim)
    return experience_dataset(x.clone(), y, 0, None, None, train=True)


def positions(data) -> list[int]:
    """The stream positions stored in a dataset built by :func:`dataset_of`."""
    return [int(data[i][0][0, 0, 0]) for i in range(len(data))] if data is not None else []


features = partial(dataset_features, feature_fn=lambda x: torch.randn(len(x), 3), batch_size=64)   # φ for herding


def kinds():
    return [("reservoir", {}), ("class_balanced", {"selection": "random"}),
            ("class_balanced", {"selection": "first"}), ("herding", {})]


# ------------------------------------------------------------------------------------------------ budget
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(0, 25), stream=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4),
                                                  min_size=1, max_size=4))
def test_no_memory_ever_exceeds_its_budget(budget, stream):
    """Over a stream of experiences with random class counts (list of per-class sample counts per experience),
    every kind stays within ``K`` after every update; kinds that can fill the budget do."""
    for kind, options in kinds():
        memory = build_memory(kind, budget, **options)
        next_class, seen = 0, 0
        for sizes in stream:
            labels = [next_class + c for c, n in enumerate(sizes) for _ in range(n)]
            next_class += len(sizes)
            memory.update(dataset_of(labels, seen), features)
            seen += len(labels)
            assert len(memory) <= budget
            assert sum(memory.counts().values()) == len(memory)
            if kind != "herding":                       # herding leaves K mod |C_1:t| unused
                assert len(memory) == min(budget, seen)


def test_an_update_over_the_budget_raises_instead_of_truncating():
    class Greedy(PerClassMemory):                   # every class keeps K samples: over budget from 2 classes on
        def quotas(self, available):
            return dict.fromkeys(available, self.budget)

        def select(self, class_data, quota, features):
            return torch.arange(min(quota, len(class_data)))

    memory = Greedy(budget=4)
    memory.update(dataset_of([0] * 5))
    assert len(memory) == 4
    with pytest.raises(BudgetExceeded, match="8 samples .* budget of 4"):
        memory.update(dataset_of([1] * 5))


def test_memories_are_built_by_name_and_configs_refer_to_them():
    assert {"reservoir", "class_balanced", "herding"} <= set(MEMORIES.names())
    assert isinstance(build_memory("herding", 10), HerdingMemory)
    assert build_memory("class_balanced", 10, selection="first").budget == 10
    with pytest.raises(UnknownNameError, match="herding"):
        build_memory("herdin", 10)
    assert build_config("dytox", "micro", {"memory": "reservoir"}).memory == "reservoir"
    with pytest.raises(ConfigError, match="args.memory: unknown memory 'herdin'. Did you mean 'herding'"):
        build_config("dytox", "micro", {"memory": "herdin"})


# ----------------------------------------------------------------------------------------------- herding
def test_herding_order_matches_a_hand_computed_example():
    """a = (1, 0), b = (0, 1), c = (0.6, 0.8) (unit norm), μ = (0.533, 0.6).
    k = 1: ‖μ - a‖ = 0.760, ‖μ - b‖ = 0.667, ‖μ - c‖ = 0.211 -> c.
    k = 2: ‖μ - (c + a)/2‖ = ‖(-0.267, 0.2)‖ = 0.333, ‖μ - (c + b)/2‖ = ‖(0.233, -0.3)‖ = 0.380 -> a; then b.
    Sorting by distance to μ would give c, b, a instead."""
    feats = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    assert herding_order(feats, 3).tolist() == [2, 0, 1]
    assert herding_order(feats * torch.tensor([[10.0], [1.0], [3.0]]), 3).tolist() == [2, 0, 1]   # L2-normalized
    assert herding_order(feats, 2).tolist() == [2, 0]
    assert herding_order(feats, 10).tolist() == [2, 0, 1]


def test_herding_memory_keeps_floor_quota_per_class_and_truncates_in_herding_order():
    memory = HerdingMemory(budget=20)
    tasks = [[0] * 9 + [1] * 12, [2] * 10 + [3] * 10 + [4] * 10, [5] * 3 + [6] * 10]
    available: dict[int, int] = {}
    seen = 0
    for labels in tasks:
        before = {c: positions(d) for c, d in memory.per_class.items()}
        memory.update(dataset_of(labels, seen), features)
        seen += len(labels)
        available.update({c: labels.count(c) for c in set(labels)})
        quota = 20 // len(available)                                      # ⌊K / |C_1:t|⌋
        assert memory.counts() == {c: min(quota, n) for c, n in available.items()}
        for c, old in before.items():                                     # old classes: prefix of their order
            assert positions(memory.per_class[c]) == old[:len(memory.per_class[c])]
    assert memory.counts() == {0: 2, 1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2}
    assert len(memory.dataset()) == 14


def test_herding_memory_selects_by_the_features_it_is_given():
    data = dataset_of([0] * 3)                                   # images 0, 1, 2
    hand = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])   # the hand-computed example: order 2, 0, 1
    memory = HerdingMemory(budget=2)
    memory.update(data, lambda d: hand[torch.tensor(positions(d))])
    assert positions(memory.dataset()) == [2, 0]
    with pytest.raises(ValueError, match="features"):
        HerdingMemory(budget=2).update(data)


# ---------------------------------------------------------------------------------------------- balanced
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(available=st.dictionaries(st.integers(0, 30), st.integers(0, 40), min_size=1, max_size=12),
       budget=st.integers(0, 120))
def test_balanced_quotas_are_max_min_fair(available, budget):
    quotas = balanced_quotas(available, budget)
    assert set(quotas) == set(available)
    assert sum(quotas.values()) == min(budget, sum(available.values()))        # the budget is used
    assert all(0 <= quotas[c] <= available[c] for c in available)
    full = [quotas[c] for c in available if quotas[c] < available[c]]           # classes with samples to spare
    if full:
        assert max(full) - min(full) <= 1                                         # differ by at most 1
        assert all(quotas[c] <= max(full) for c in available)                   # and no class gets more


@pytest.mark.parametrize("selection", ["random", "first"])
def test_class_balanced_counts_differ_by_at_most_one(selection):
    memory = ClassBalancedMemory(budget=23, selection=selection, seed=1)
    seen = 0
    for labels in ([0] * 30 + [1] * 30, [2] * 30 + [3] * 30 + [4] * 30, [5] * 30):
        before = {c: positions(d) for c, d in memory.per_class.items()}
        memory.update(dataset_of(labels, seen))
        seen += len(labels)
        counts = list(memory.counts().values())
        assert len(memory) == 23 and max(counts) - min(counts) <= 1
        for c, old in before.items():                                           # shrinking keeps a prefix
            assert positions(memory.per_class[c]) == old[:len(memory.per_class[c])]
    assert memory.counts() == {0: 4, 1: 4, 2: 4, 3: 4, 4: 4, 5: 3}             # 23 = 6 x 3 + 5 (lowest ids)


def test_class_balanced_selection_first_keeps_arrival_order_and_random_is_seeded():
    labels = [0] * 20
    first = ClassBalancedMemory(budget=5, selection="first")
    first.update(dataset_of(labels))
    assert positions(first.dataset()) == [0, 1, 2, 3, 4]
    draws = []
    for seed in (0, 0, 1):
        memory = ClassBalancedMemory(budget=5, selection="random", seed=seed)
        memory.update(dataset_of(labels))
        draws.append(positions(memory.dataset()))
    assert draws[0] == draws[1] and draws[0] != draws[2]
    assert draws[0] != [0, 1, 2, 3, 4] and len(set(draws[0])) == 5
    with pytest.raises(ValueError, match="selection"):
        ClassBalancedMemory(budget=5, selection="last")


# --------------------------------------------------------------------------------------------- reservoir
def test_reservoir_includes_every_stream_item_with_probability_k_over_n():
    """Inclusion frequency of each of N = 12 items offered in chunks (4, 6, 2) with K = 3, over R = 6000 seeds:
    p = K/N = 0.25, σ = √(p(1-p)/R) = 0.0056. A tolerance of 5σ fails a correct implementation with probability
    below 12 · 5.7e-7 ≈ 7e-6 (normal tails, Bonferroni over items); the seeds are fixed, so the test is
    deterministic. Drawing j from {0..i-1} instead of {0..i} (off by one) deviates by ~12σ, restarting the
    count in every chunk by ~150σ."""
    k, chunks, trials = 3, (4, 6, 2), 6000
    n = sum(chunks)
    counts = np.zeros(n)
    for seed in range(trials):
        reservoir = Reservoir(k, seed=seed)
        for size in chunks:
            reservoir.offer(size)
        assert len(reservoir.slots) == k and len(set(reservoir.slots)) == k
        counts[reservoir.slots] += 1
    p = k / n
    sigma = (p * (1 - p) / trials) ** 0.5
    assert np.abs(counts / trials - p).max() < 5 * sigma


def test_reservoir_memory_stores_the_samples_at_the_sampled_positions():
    memory = ReservoirMemory(budget=7, seed=3)
    seen = 0
    for labels in ([0] * 5 + [1] * 5, [2] * 8, [3] * 4):
        memory.update(dataset_of(labels, seen))
        seen += len(labels)
        assert sorted(positions(memory.dataset())) == sorted(memory.reservoir.slots)
    assert len(memory) == 7 and memory.reservoir.seen == 22
    assert sum(memory.counts().values()) == 7


# -------------------------------------------------------------------------------------------------- mixing
def test_mixup_mixes_images_and_targets_with_the_same_lambda_in_reverse_order():
    targets = soft_targets(torch.tensor([0, 1, 2, 3]), 4)
    x = targets.clone().view(4, 1, 2, 2)                  # each image equals its target row
    torch.manual_seed(5)
    mixed_x, mixed_y, lam = mixup(x, targets, alpha=0.8)
    torch.manual_seed(5)
    assert lam == float(torch.distributions.Beta(0.8, 0.8).sample())      # λ ~ Beta(α, α), global generator
    assert 0 < lam < 1
    assert torch.equal(mixed_x.view(4, 4), mixed_y)                        # same λ, same pairing
    assert torch.allclose(mixed_y[0], lam * targets[0] + (1 - lam) * targets[3])     # row b with row B-1-b
    assert torch.allclose(mixed_y.sum(1), torch.ones(4))


def test_label_smoothing_and_soft_targets():
    t = soft_targets(torch.tensor([1]), 4, smoothing=0.1)
    assert torch.allclose(t, torch.tensor([[0.025, 0.925, 0.025, 0.025]]))
    assert torch.equal(soft_targets(torch.tensor([2, 0]), 3), torch.eye(3)[[2, 0]])
    soft = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    assert torch.allclose(label_smoothing(soft, 0.2), torch.tensor([[0.45, 0.45, 0.05, 0.05]]))


# ------------------------------------------------------------------------------------------ fine-tuning phase
class TinyTemplate(PhasedTemplate):
    """A plain classifier ``classifier(extractor(x))`` trained through phases."""

    def __init__(self, model: nn.Sequential, memory) -> None:
        super().__init__(model=model, memory=memory, phase=Phase(epochs=1, schedule=Schedule(0.1)), batch_size=16,
                         eval_batch_size=16, device=torch.device("cpu"))
        self.seen_lrs: list[float] = []
        self.trained_on: list[int] = []

    def feature_extractor(self) -> nn.Module:
        return self.model.extractor

    def make_optimizer(self, **kwargs) -> None:
        self.optimizer = build_optimizer("sgd", [p for p in self.model.parameters() if p.requires_grad],
                                         self.phase.schedule)

    def criterion(self) -> torch.Tensor:
        return nn.functional.cross_entropy(self.mb_output, self.mb_y)

    def _before_training_epoch(self, **kwargs) -> None:
        super()._before_training_epoch(**kwargs)
        self.seen_lrs.append(self.optimizer.param_groups[0]["lr"])
        self.trained_on.append(len(self.adapted_dataset))


@pytest.fixture(scope="module")
def synthetic():
    return SCENARIOS.get("synthetic")(n_classes=4, n_experiences=2, train_per_class=20, test_per_class=5)


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed(before: dict, module: nn.Module) -> bool:
    return any(not torch.equal(v, before[k]) for k, v in module.state_dict().items())


def test_balanced_finetuning_trains_the_classifier_on_the_memory_with_the_extractor_frozen(synthetic):
    model = nn.Sequential()
    model.add_module("extractor", nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU()))
    model.add_module("classifier", nn.Linear(16, 4))
    memory = build_memory("class_balanced", 12)
    template = TinyTemplate(model, memory)
    exps = list(synthetic.train_stream)
    finetune = balanced_finetuning(epochs=2, schedule=Schedule(0.05))
    assert not template.run_phase(finetune, exps[0])                       # nothing to balance after task 1
    for exp in exps:
        template.run_phase(Phase(epochs=1, schedule=Schedule(0.1)), exp)
        memory.update(exp.dataset)
    extractor, classifier = state(model.extractor), state(model.classifier)
    template.seen_lrs, template.trained_on = [], []
    assert template.run_phase(finetune, exps[1])
    assert not changed(extractor, model.extractor)        # weights AND BatchNorm statistics (eval mode)
    assert changed(classifier, model.classifier)
    assert template.trained_on == [len(memory)] * 2 == [12, 12]            # the memory only, every epoch
    assert template.seen_lrs == [0.05, 0.05]
    assert not any(p.requires_grad for p in model.extractor.parameters())  # as trained, until the next phase
    template.run_phase(Phase(epochs=1, schedule=Schedule(0.1)), exps[1])   # the next phase unfreezes it
    assert changed(extractor, model.extractor)
    assert all(p.requires_grad for p in model.extractor.parameters())


def test_phase_learning_rate_schedule():
    phase = Phase(epochs=10, schedule=Schedule(1.0, warmup=2, warmup_lr=0.0, decay="cosine", min_lr=0.1))
    assert [phase.lr_at(e) for e in (0, 1)] == [0.0, 0.5]
    assert phase.lr_at(2) == pytest.approx(0.1 + 0.45 * (1 + np.cos(np.pi * 0.2)))
    assert phase.lr_at(10) == pytest.approx(0.1)
    assert balanced_finetuning(3, Schedule(0.01)).lr_at(2) == 0.01


# ---------------------------------------------------------------------------------------------------- data
def test_seeded_shuffle_is_reproducible_and_leaves_the_global_generator_alone(synthetic):
    exp = synthetic.train_stream[0]

    def order(seed):
        return torch.cat([x.flatten(1)[:, 0] for x, *_ in experience_loader(exp, 8, shuffle=True, seed=seed)])

    rng = torch.get_rng_state()
    first, again, other = order(1), order(1), order(2)
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(first, again) and not torch.equal(first, other)
    plain = torch.cat([x.flatten(1)[:, 0] for x, *_ in experience_loader(exp, 8)])
    assert not torch.equal(first, plain) and torch.equal(first.sort().values, plain.sort().values)


def test_loaders_use_train_or_eval_transforms_and_tensors_come_in_order():
    y = torch.tensor([0, 1, 0])
    x = torch.arange(3.0).view(3, 1, 1, 1)
    data = experience_dataset(x, y, 0, lambda v: v + 100, None, train=True)
    assert next(iter(dataset_loader(data, 3, train=True)))[0].flatten().tolist() == [100, 101, 102]
    assert next(iter(dataset_loader(data, 3)))[0].flatten().tolist() == [0, 1, 2]

    class Exp:
        dataset = data

    xs, ys = experience_tensors(Exp(), batch_size=2)
    assert xs.flatten().tolist() == [0, 1, 2] and ys.tolist() == [0, 1, 0] and ys.dtype == torch.long
    feats = dataset_features(data, lambda v: torch.cat([v.flatten(1), -v.flatten(1)], 1), batch_size=2)
    assert feats.tolist() == [[0, 0], [1, -1], [2, -2]]


def test_dytox_takes_its_memory_by_name(synthetic):
    from clbench.registry import STRATEGIES
    config = build_config("dytox", "micro", {"memory": "class_balanced", "mem_size": 10, "epochs": 1,
                                             "finetune_epochs": 1,
                                             "arch_overrides": {"embed_dim": 8, "depth": 1, "num_heads": 2,
                                                                "patch_size": 4}})
    strategy = STRATEGIES.get("dytox")(synthetic.info, "cpu", config)
    assert isinstance(strategy.memory, ClassBalancedMemory)
    for exp in synthetic.train_stream:
        strategy.train(exp)
    assert strategy.memory.counts() == {0: 3, 1: 3, 2: 2, 3: 2}


def test_one_step_schedule_matches_torch_multisteplr_in_both_loops():
    """The one Schedule's milestones: the lr drops AT each milestone epoch, as torch's MultiStepLR stepped once per
    epoch does (the reference here), in a phase (templates) and in FitSettings (training.fit) alike."""
    milestones, epochs = (0, 2, 3, 5), 7
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(milestones), gamma=0.5)
    reference = []
    for _ in range(epochs):
        reference.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    schedule = Schedule(0.4, milestones=milestones, gamma=0.5)
    phase = Phase(epochs=epochs, schedule=schedule)
    settings = FitSettings(epochs=epochs, batch_size=1, schedule=schedule)
    assert [phase.lr_at(e) for e in range(epochs)] == reference
    assert [settings.schedule.lr_at(e, epochs) for e in range(epochs)] == reference
    assert reference[2] == pytest.approx(0.1)                          # milestone 2: epoch 2 already decayed


# ------------------------------------------------------------------------------------------------ schedule
def test_schedule_by_hand_per_epoch_and_per_step():
    """Per epoch (timm): warm-up from warmup_lr, the ramp at the epoch's start; per step (Ding et al.): the ramp at
    the step's end, W = ⌈w·T⌉; the decays after it."""
    assert [Schedule(1.0, warmup=4, warmup_lr=0.2).lr_at(e, 6) for e in range(6)] == pytest.approx(
        [0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    linear = Schedule(0.8, per="step", warmup=0.2, decay="linear")           # T = 6: W = ⌈1.2⌉ = 2
    assert [linear.lr_at(s, 6) for s in range(6)] == pytest.approx([0.4, 0.8, 0.8, 0.6, 0.4, 0.2])
    cosine = Schedule(1.0, per="step", decay="cosine", min_lr=0.5)
    assert [cosine.lr_at(s, 4) for s in range(4)] == pytest.approx([1.0, 0.5 + 0.25 * (1 + 0.5 ** 0.5), 0.75,
                                                                    0.5 + 0.25 * (1 - 0.5 ** 0.5)])
    assert Schedule(0.3, per="step", milestones=(2,), gamma=0.5).lr_at(2, 4) == 0.15
    assert linear.momentum_at(0, 6) is None


def test_one_cycle_is_torch_one_cycle_in_rate_and_momentum_for_adam_and_sgd():
    for name, key in (("adamw", "betas"), ("sgd", "momentum")):
        for total in (7, 30, 41):
            mine = build_optimizer(name, [nn.Parameter(torch.zeros(1))], Schedule(0.5))
            theirs = build_optimizer(name, [nn.Parameter(torch.zeros(1))], Schedule(0.5))
            scheduler = torch.optim.lr_scheduler.OneCycleLR(theirs, 0.5, total_steps=total, pct_start=0.1)
            schedule = Schedule(0.5, per="step", warmup=0.1, decay="one_cycle")
            for step in range(total):
                schedule.apply(mine, step, total)
                assert mine.param_groups[0]["lr"] == theirs.param_groups[0]["lr"]
                assert mine.param_groups[0][key] == theirs.param_groups[0][key]
                theirs.step()
                scheduler.step()


def test_fit_sets_the_rate_before_every_step_and_refuses_more_steps_than_planned():
    rates = []

    class Rates(Callback):
        def after_step(self, optimizer):
            rates.append(optimizer.param_groups[0]["lr"])

    callbacks = CallbackList()
    callbacks.callbacks.append(Rates())
    model = nn.Linear(2, 1)
    data = torch.randn(10, 2), torch.randn(10, 1)
    schedule = Schedule(0.8, per="step", warmup=0.2, decay="linear")
    assert fit(model, model, model.parameters(), *data, lambda out, y: (out - y).pow(2).mean(),
               FitSettings(2, 4, schedule, "sgd"), 0, callbacks) == 6
    assert rates == [schedule.lr_at(s, 6) for s in range(6)]

    class MorePlan(Callback):
        def batch_sampler(self, n, batch_size, epochs):
            return lambda generator: [torch.tensor([0, 1]), torch.tensor([2])]

    callbacks.callbacks.append(MorePlan())          # 2 minibatches per epoch where ⌈10/16⌉ = 1 was planned
    with pytest.raises(ValueError, match="step 1 of a pass planned for 1 steps"):
        fit(model, model, model.parameters(), *data, lambda out, y: (out - y).pow(2).mean(),
            FitSettings(1, 16, schedule, "sgd"), 0, callbacks)


@pytest.mark.parametrize("values, message", [
    ({"per": "batch"}, "per is 'epoch' or 'step'"),
    ({"decay": "exp"}, "decay is one of"),
    ({"per": "step", "warmup": 1.0}, r"fraction of the steps in \[0, 1\)"),
    ({"warmup": 2.5}, "whole number of epochs"),
    ({"decay": "cosine", "milestones": (2,)}, "milestones are for decay 'step'"),
    ({"decay": "one_cycle"}, "'one_cycle' is per step"),
])
def test_schedule_refuses_settings_that_mean_nothing(values, message):
    with pytest.raises(ValueError, match=message):
        Schedule(0.1, **values)
