"""GPU-hour estimates of the *_full suites (clbench/estimates.py), by hand from the stated formula."""

import importlib.resources

from clbench import estimates


def test_cifar100_full_by_hand():
    """96 runs x (70 x 5,000 + 9 x 70 x (5,000 + 2,000)) images at min(0.25 x 989e12 / (3 x 0.138e9), 6,000) / s."""
    passes = 70 * 5000 + 9 * 70 * 7000
    assert estimates.gpu_hours("cifar100_full") == 96 * passes / 6000 / 3600


def test_every_shipped_full_suite_has_an_estimate_and_only_those_print_on_cpu():
    shipped = {p.name.removesuffix(".yaml") for p in importlib.resources.files("clbench").joinpath("suites").iterdir()
               if p.name.endswith("_full.yaml")}
    assert shipped == set(estimates.SUITES)
    assert "GPU hours" in estimates.notice("dytox_full", "cpu")
    assert estimates.notice("dytox_full", "cuda") is None and estimates.notice("quick", "cpu") is None
