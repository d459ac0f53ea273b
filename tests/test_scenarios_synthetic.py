"""The synthetic scenario (scenarios/synthetic.py): the sizes it declares are the sizes it builds."""

from __future__ import annotations

from clbench.registry import SCENARIOS


def test_synthetic_declares_the_sizes_it_builds():
    args = {"n_classes": 6, "n_experiences": 2, "train_per_class": 7}
    lengths = [len(e.dataset) for e in SCENARIOS.get("synthetic")(seed=0, **args).train_stream]
    assert SCENARIOS.get("synthetic").sizes(**args) == {"train_samples": sum(lengths),
                                                        "experience_samples": min(lengths)}
