"""Split digits (scenarios/digits.py): the sizes it declares are the sizes it builds."""

from __future__ import annotations

import pytest

from clbench.registry import SCENARIOS


@pytest.mark.parametrize("args", [{}, {"test_fraction": 0.2, "n_experiences": 2}, {"n_experiences": 10},
                                  {"class_order": "random", "n_experiences": 5}])
def test_split_digits_declares_the_sizes_it_builds(args):
    """The sizes computed from the labels alone are those of the built stream (the smallest experience: for
    every class order when the order is random)."""
    factory = SCENARIOS.get("split_digits")
    sizes = factory.sizes(**args)
    smallest = []
    for seed in range(4):
        stream = factory(seed=seed, **args).train_stream
        lengths = [len(e.dataset) for e in stream]
        assert sizes["train_samples"] == sum(lengths)
        smallest.append(min(lengths))
    if args.get("class_order") == "random":
        assert sizes["experience_samples"] <= min(smallest)
    else:
        assert sizes["experience_samples"] == min(smallest)


def test_no_arguments_give_more_training_samples_than_the_declared_limit():
    """The stratified split tests one image of each digit at least: at test_fraction 10/1,797 the stream holds
    1,787 images, the declared limit, and no smaller fraction is accepted."""
    factory = SCENARIOS.get("split_digits")
    assert factory.sizes(test_fraction=0.00556)["train_samples"] == factory.size_limits["train_samples"] == 1787
    with pytest.raises(ValueError, match="greater or equal to the number of classes"):
        factory.sizes(test_fraction=0.005)      # 9 test images
