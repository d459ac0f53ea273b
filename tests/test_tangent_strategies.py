"""TAFT strategies on split_digits: protocol, exact forgetting by subtraction (float64), retraining, state I/O."""

import pytest
import torch

from clbench.config import build_config
from clbench.registry import SCENARIOS, STRATEGIES
from clbench.tangent import average_deltas

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
