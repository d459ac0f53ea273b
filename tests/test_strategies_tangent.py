"""TAFT strategies on split_digits: protocol, exact forgetting by subtraction (float64), retraining, state I/O,
members trained on any task pool with bit-identical results."""

import sys

import pytest
import torch

from clbench import tasks
from clbench.config import build_config
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.tangent import average_deltas
from clbench.training import FitSettings, Schedule, fit
from tests._fakes import fake_ray

TINY = {"model_args": {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}, "epochs": 1}


@pytest.fixture(scope="module")
def scenario():
    return SCENARIOS.get("split_digits")(seed=0, n_experiences=2)


def build(name, scenario, **args):
    torch.manual_seed(0)
    return STRATEGIES.get(name)(scenario.info, torch.device("cpu"), build_config(name, None, {**TINY, **args}))


@pytest.mark.parametrize("name", ["taft", "taft_shards", "nlft", "model_soup", "sisa"])
def test_strategy_protocol(name, scenario):
    strategy = build(name, scenario, n_shards=1 if name in ("taft", "nlft") else 3)
    x = next(iter(torch.utils.data.DataLoader(scenario.test_stream[0].dataset.eval(), batch_size=8)))[0]
    for experience in scenario.train_stream:
        strategy.train(experience)
        logits = strategy.predict(x, None)
        assert logits.shape == (8, scenario.info.n_classes) and torch.isfinite(logits).all()
    count = strategy.num_parameters()
    assert 0 < count.trainable < count.total


def test_taft_deploys_the_composition_of_its_experience_models(float64, scenario):
    strategy = build("taft", scenario, weighting="samples")
    for experience in scenario.train_stream:
        strategy.train(experience)
    members = strategy.composition.deltas
    sizes = [len(local) for _, local in strategy.shards.values()]
    expected = average_deltas([members[k] for k in sorted(members)], sizes)
    got = strategy.deployed.delta_state()
    assert len(members) == 2 and max((got[n] - expected[n]).abs().max().item() for n in got) < 1e-12


def test_forget_by_subtraction_is_the_composition_of_the_remaining_shards(float64, scenario, tmp_path):
    strategy = build("taft_shards", scenario, n_shards=4)
    for experience in scenario.train_stream:
        strategy.train(experience)
    x = torch.randn(4, *scenario.info.input_shape)
    before = strategy.predict(x, None)
    strategy.save_state(tmp_path)
    members = dict(strategy.composition.deltas)
    shard_ids = strategy.shard_ids()
    ids = [shard_ids[1][0], shard_ids[6][-1], shard_ids[6][2]]
    record = strategy.forget(ids, mode="subtract")
    assert record.shards_touched == [1, 6] and record.shards_left == 6
    assert record.samples_dropped == len(shard_ids[1]) + len(shard_ids[6])
    assert record.hash_before != record.hash_after
    expected = average_deltas([members[k] for k in sorted(members) if k not in (1, 6)])
    got = strategy.deployed.delta_state()
    assert max((got[n] - expected[n]).abs().max().item() for n in got) < 1e-12

    torch.manual_seed(1)  # another random w0 before loading: the state must carry the linearization point
    restored = STRATEGIES.get("taft_shards")(scenario.info, torch.device("cpu"), strategy.config)
    restored.load_state(tmp_path)
    assert torch.equal(restored.predict(x, None), before)


@pytest.mark.parametrize("name", ["taft_shards", "sisa", "model_soup"])
def test_forget_by_retraining_keeps_the_other_samples(name, scenario):
    strategy = build(name, scenario, n_shards=3)
    experiences = list(scenario.train_stream)
    for experience in experiences:
        strategy.train(experience)
    untouched = {k: v for k, v in strategy.composition.deltas.items() if k != 0}
    ids = strategy.shard_ids()[0][:5]
    record = strategy.forget(ids, mode="retrain", experiences=experiences)
    assert record.shards_touched == [0] and record.samples_dropped == 5 and record.shards_left == 6
    assert not set(ids) & set(strategy.shard_ids()[0])
    assert all(all(torch.equal(strategy.composition.deltas[k][n], v[n]) for n in v) for k, v in untouched.items())


SHARDED = ["taft_shards", "model_soup", "sisa"]


def train_and_retrain(name, scenario):
    """Train on both experiences, then retrain the shards of 8 ids from two experiences: ``(composition, record)``."""
    strategy = build(name, scenario, n_shards=3)
    experiences = list(scenario.train_stream)
    for experience in experiences:
        strategy.train(experience)
    shard_ids = strategy.shard_ids()
    record = strategy.forget(shard_ids[0][:5] + shard_ids[4][:3], mode="retrain", experiences=experiences)
    return strategy.composition, record


@pytest.fixture(scope="module")
def sequential(scenario):
    return {name: train_and_retrain(name, scenario) for name in SHARDED}


def assert_identical(got, expected):
    (composition, record), (composition0, record0) = got, expected
    assert composition.shards == composition0.shards and composition.weights == composition0.weights
    for key, state in composition0.deltas.items():
        assert all(torch.equal(composition.deltas[key][n], v) for n, v in state.items())
    assert all(torch.equal(composition.total[n], v) for n, v in composition0.total.items())
    assert (record.shards_touched, record.hash_after) == (record0.shards_touched, record0.hash_after)


def test_members_trained_in_worker_processes_are_bit_identical(scenario, sequential):
    with tasks.using(tasks.ProcessPool(2)):
        for name in SHARDED:
            assert_identical(train_and_retrain(name, scenario), sequential[name])


def test_members_trained_as_ray_tasks_are_bit_identical(scenario, sequential, monkeypatch):
    calls = {}
    monkeypatch.setitem(sys.modules, "ray", fake_ray(calls))
    with tasks.using(tasks.make_pool("ray", 2)):
        for name in SHARDED:
            assert_identical(train_and_retrain(name, scenario), sequential[name])
    # per strategy: 3 members for each of 2 experiences, then the 2 touched shards retrained
    assert calls["tasks"] == ["train_delta"] * 8 + ["train_tail"] * 16


def test_non_linear_members_have_no_tangent_cls_token():
    with pytest.raises(ValueError, match="tangent models only"):
        build_config("sisa", None, {"linearize_cls": True})


def test_step_schedule_follows_the_official_formula():
    """lr_e = lr · decay^{|{m : m ≤ e}|} (0-based epochs, torch's MultiStepLR): the full preset's milestone 26 decays
    epochs 26-29 of 30, as the released code's "after epoch 25" does."""
    schedule = build_config("taft", "full").fit_settings.schedule
    assert [schedule.lr_at(e, 30) for e in (0, 25, 26, 29)] == pytest.approx([1e-3, 1e-3, 1e-4, 1e-4])
    assert FitSettings(epochs=3, batch_size=8, schedule=0.5).schedule.lr_at(2, 3) == 0.5


def test_fit_applies_the_schedule_per_epoch():
    """Adam moves a parameter by exactly lr per step under a constant gradient: 2 steps at lr 1.0 (epoch 0), then 2
    at 0.1 (epoch 1, from milestone 1 on) give w = 2.2."""
    w = torch.nn.Parameter(torch.zeros(()))
    settings = FitSettings(epochs=2, batch_size=2, schedule=Schedule(1.0, milestones=(1,), gamma=0.1), optimizer="adam")
    steps = fit(torch.nn.ParameterList([w]), lambda x: x.sum(1) * w, [w], torch.ones(4, 1), torch.zeros(4),
                lambda out, y: -out.mean(), settings, seed=0)
    assert steps == 4 and float(w) == pytest.approx(2.2, rel=1e-6)


def test_full_preset_carries_the_released_taft_setting():
    config = build_config("taft", "full")
    assert (config.epochs, config.batch_size, config.lr, config.lr_milestones, config.ridge) == (30, 32, 1e-3, (26,),
                                                                                                  1e-5)
    assert build_config("taft", "cpu", {"lr_milestones": [3]}).lr_milestones == (3,)


def test_nlft_authors_optimizer_preset_and_the_tangent_suite_loss_rows():
    """nlft's cpu_sgd preset is the authors' optimizer (SGD lr 1e-2, weight decay 1e-4) and trains with it; the
    tangent suite runs taft with its rescaled square loss AND with cross-entropy (the loss finding)."""
    from clbench.suite_file import load_suite
    from clbench.training import OPTIMIZERS
    config = build_config("nlft", "cpu_sgd", {})
    assert (config.optimizer, config.lr, config.weight_decay, config.loss) == ("sgd", 1e-2, 1e-4, "ce")
    optimizer = OPTIMIZERS.get(config.optimizer)([torch.nn.Parameter(torch.zeros(1))], lr=config.lr,
                                                 weight_decay=config.weight_decay)
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["weight_decay"] == 1e-4
    rows = {(e.label or e.name): build_config(e.name, e.preset, e.args) for e in load_suite("tangent").strategies}
    assert rows["taft"].loss == "mse" and rows["taft_ce"].loss == "ce" and rows["nlft_sgd"].optimizer == "sgd"
