"""Split MNIST and Fashion-MNIST (scenarios/mnist.py): the sizes they declare are the sizes they build (skipped where
the data are missing)."""

from __future__ import annotations

import pytest

from clbench.registry import SCENARIOS


@pytest.mark.parametrize(("name", "args"), [("split_mnist", {}), ("split_fmnist", {"max_per_class": 700,
                                                                                  "n_experiences": 2})])
def test_split_mnist_and_fmnist_declare_the_sizes_they_build(name, args):
    from clbench.data.errors import DatasetNotFound

    try:
        stream = SCENARIOS.get(name)(seed=0, **args).train_stream
    except DatasetNotFound:
        pytest.skip(f"{name}: its data are not here ($CLBENCH_DATA)")
    lengths = [len(e.dataset) for e in stream]
    assert SCENARIOS.get(name).sizes(**args) == {"train_samples": sum(lengths), "experience_samples": min(lengths)}
