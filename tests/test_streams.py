"""Issue 33's validation holdout for classification scenarios (:class:`clbench.streams.Holdout`): with
``holdout: valid`` each class's training samples are split (a fixed seed) into training and validation parts, the
validation part is what the evaluator scores and the test data are in no stream; sizes, refusals and the run identity
follow."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from clbench import suite_file
from clbench.data.catalog import SplitArrays
from clbench.data.tensors import image_class_incremental
from clbench.errors import ConfigError
from clbench.protocol import ClassificationInfo
from clbench.registry import SCENARIOS
from clbench.streams import Holdout, held_out, validation_split

SYNTHETIC = {"n_classes": 4, "n_experiences": 2, "train_per_class": 20, "test_per_class": 10}


def _rows(stream) -> Counter:
    """The samples of every experience of ``stream`` as a multiset of ``(label, pixels)``."""
    out: Counter = Counter()
    for experience in stream:
        dataset = experience.dataset.eval()
        for i in range(len(dataset)):
            x, y, _ = dataset[i]
            out[(int(y), tuple(x.flatten().tolist()))] += 1
    return out


def _labels(stream) -> list[Counter]:
    return [Counter(int(y) for _, y, _ in experience.dataset.eval()) for experience in stream]


def test_the_validation_split_is_disjoint_stratified_and_covers_the_training_data():
    y = torch.tensor([0] * 30 + [1] * 11 + [2] * 7)
    train, valid = validation_split(y, 0.2)
    assert set(train.tolist()).isdisjoint(valid.tolist())
    assert sorted(train.tolist() + valid.tolist()) == list(range(len(y)))
    assert Counter(y[valid].tolist()) == {0: 6, 1: 2, 2: 1}          # 0.2 * n rounded half up, per class
    assert [held_out(n, 0.25) for n in (2, 6, 10)] == [1, 2, 3]      # 0.5 -> 1, 1.5 -> 2, 2.5 -> 3


def test_the_scenario_scores_the_validation_part_of_its_training_data_and_never_its_test_data():
    test_run = SCENARIOS.get("synthetic")(**SYNTHETIC)
    valid_run = SCENARIOS.get("synthetic")(**SYNTHETIC, holdout="valid", valid_fraction=0.25)
    trained, scored = _rows(valid_run.train_stream), _rows(valid_run.test_stream)
    assert not trained & scored
    assert trained + scored == _rows(test_run.train_stream)          # train + valid = the original training set
    assert not scored & _rows(test_run.test_stream)                   # no test sample is scored
    assert _labels(valid_run.test_stream) == [{0: 5, 1: 5}, {2: 5, 3: 5}]      # stratified, per experience
    assert _labels(valid_run.train_stream) == [{0: 15, 1: 15}, {2: 15, 3: 15}]
    assert valid_run.info.extra == {"holdout": "valid", "valid_fraction": 0.25}
    assert test_run.info.extra == {}


def test_the_split_is_the_same_for_every_run_seed_and_global_random_state():
    def scored(seed: int) -> Counter:
        """The scored images (labels are renumbered by each seed's class order)."""
        torch.manual_seed(seed)
        np.random.seed(seed)
        scenario = SCENARIOS.get("synthetic")(**SYNTHETIC, seed=seed, shuffle_classes=True, holdout="valid")
        return Counter(pixels for (_, pixels), n in _rows(scenario.test_stream).items() for _ in range(n))

    assert scored(0) == scored(1) == scored(7)


def test_image_scenarios_hold_out_from_the_training_images_kept_by_max_per_class():
    rng = np.random.default_rng(0)
    arrays = SplitArrays(x_train=rng.integers(0, 255, (60, 4, 4, 1), dtype=np.uint8),
                         y_train=np.repeat(np.arange(3), 20),
                         x_test=rng.integers(0, 255, (30, 4, 4, 1), dtype=np.uint8), y_test=np.repeat(np.arange(3), 10))
    info = ClassificationInfo(name="fake", n_classes=3, classes_per_experience=(2, 1), input_shape=(1, 4, 4),
                              mean=(0.5,), std=(0.25,))
    scenario = image_class_incremental(info, arrays, [2, 0, 1], max_per_class=10, holdout=Holdout("valid", 0.2))
    assert [len(e.dataset) for e in scenario.train_stream] == [16, 8]
    assert [len(e.dataset) for e in scenario.test_stream] == [4, 2]
    capped = image_class_incremental(info, arrays, [2, 0, 1], max_per_class=10)
    assert _rows(scenario.train_stream) + _rows(scenario.test_stream) == _rows(capped.train_stream)


@pytest.mark.parametrize(("name", "args"), [("split_digits", {"n_experiences": 5}), ("synthetic", SYNTHETIC)])
def test_declared_sizes_count_the_training_part_only(name, args):
    factory = SCENARIOS.get(name)
    scenario = factory(**args, holdout="valid", valid_fraction=0.3)
    lengths = [len(e.dataset) for e in scenario.train_stream]
    assert factory.sizes(**args, holdout="valid", valid_fraction=0.3) == {"train_samples": sum(lengths),
                                                                           "experience_samples": min(lengths)}
    assert factory.sizes(**args)["train_samples"] > sum(lengths)


def _refusal(scenario: dict, strategy: object = "naive") -> str:
    with pytest.raises(ConfigError) as info:
        suite_file.parse_suite({"suite": "s", "scenarios": [scenario], "strategies": [strategy]}, "s.yaml")
    return str(info.value)


@pytest.mark.parametrize(("scenario", "expected"), [
    ({"name": "split_digits", "args": {"holdout": "train"}},
     "s.yaml: scenarios[0] (split_digits): args.holdout: 'train' is not one of 'test', 'valid'"),
    ({"name": "split_cifar100", "args": {"holdout": "valid", "valid_fraction": 1.0}},
     "s.yaml: scenarios[0] (split_cifar100): args.valid_fraction: 1.0 is out of range: valid_fraction must be in "
     "(0, 1)"),
    ({"name": "split_mnist", "args": {"valid_fraction": 0.2}},
     "s.yaml: scenarios[0] (split_mnist): args: valid_fraction is used only with holdout: valid (this entry's "
     "holdout is 'test'), so it would change nothing; remove it or set holdout: valid."),
    ({"name": "synthetic", "args": {"train_per_class": 4, "holdout": "valid"}},
     "s.yaml: scenarios[0] (synthetic): args: valid_fraction 0.1 leaves class 0 (4 training samples) without a "
     "validation sample; set valid_fraction in [0.125, 0.875)."),
    ({"name": "cifar100_transfer", "args": {"max_per_class": 5, "holdout": "valid", "valid_fraction": 0.95}},
     "s.yaml: scenarios[0] (cifar100_transfer): args: valid_fraction 0.95 leaves class 0 (5 training samples) "
     "without a training sample; set valid_fraction in [0.1, 0.9)."),
    ({"name": "mnist_fmnist", "args": {"max_per_class": 1, "holdout": "valid", "valid_fraction": 0.5}},
     "s.yaml: scenarios[0] (mnist_fmnist): args: valid_fraction 0.5 leaves class 0 (1 training samples) without a "
     "training sample; no fraction can split one sample; use holdout: test or more samples per class."),
])
def test_a_holdout_it_would_refuse_when_built_is_refused_at_load_in_one_line(scenario, expected):
    assert _refusal(scenario) == expected


def test_a_memory_is_checked_against_the_smaller_training_set_of_a_validation_holdout():
    digits = {"name": "split_digits", "args": {"holdout": "valid"}}
    message = _refusal(digits, {"name": "replay", "args": {"mem_size": 1200}})
    assert "args.mem_size 1,200 is more than the 1,130 training samples in the whole stream" in message
    suite_file.parse_suite({"suite": "s", "scenarios": ["split_digits"],
                            "strategies": [{"name": "replay", "args": {"mem_size": 1200}}]}, "s.yaml")


def test_a_fraction_that_empties_a_class_is_refused_when_built():
    with pytest.raises(ValueError, match="leaves class 0 \\(4 training samples\\) without a validation sample"):
        SCENARIOS.get("synthetic")(train_per_class=4, holdout="valid", valid_fraction=0.1)


def test_the_holdout_enters_the_run_identity():
    suite = suite_file.parse_suite({"suite": "s", "scenarios": [
        {"name": "split_digits", "label": "test"}, {"name": "split_digits", "label": "valid",
                                                      "args": {"holdout": "valid"}}],
        "strategies": ["naive"]}, "s.yaml")
    test_spec, valid_spec = suite.run_specs()
    identity = valid_spec.identity()
    assert identity["scenario"]["args"] == {"holdout": "valid"}
    assert {**identity, "scenario": {}} == {**test_spec.identity(), "scenario": {}}


def test_split_cifar100_check_reads_classes_null_as_all_classes():
    """``classes: null`` is split_cifar100's own default (every class): its load check counts 100 classes."""
    from clbench.scenarios.cifar import split_cifar100

    split_cifar100.check_args(classes=None, max_per_class=2, holdout="valid", valid_fraction=0.5)
    with pytest.raises(ValueError):
        split_cifar100.check_args(classes=None, max_per_class=1, holdout="valid", valid_fraction=0.5)
