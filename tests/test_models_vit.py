"""The ViT factory (:mod:`clbench.models.vit`): shapes timm would refuse inside each run are refused when the suite
loads."""

from __future__ import annotations

import pytest

from clbench.errors import ConfigError
from clbench.suite_file import parse_suite


def _suite(strategy: dict, scenario: str = "synthetic") -> dict:
    return {"suite": "s", "scenarios": [{"name": scenario}], "strategies": [strategy]}


def test_vit_heads_that_do_not_divide_the_width_are_refused_at_load():
    """timm would fail inside each run; the model's check_args refuses it when the suite loads, with the default
    width filled in."""
    with pytest.raises(ConfigError, match=r"strategies\[0\] \(naive\): model_args: num_heads 5 does not divide "
                                          r"embed_dim 64 .* set num_heads to a divisor of 64"):
        parse_suite(_suite({"name": "naive", "args": {"model": "vit", "model_args": {"num_heads": 5}}}))
    parse_suite(_suite({"name": "naive", "args": {"model": "vit", "model_args": {"num_heads": 8}}}))
