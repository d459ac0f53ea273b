"""Value ranges have one home (:data:`clbench.typecheck.RANGES` and its suffix/prefix rules) and one check
(:func:`clbench.typecheck.check_range`): a value out of range is refused the same way whether it comes from a suite
file or from a ``Config`` built in Python, for every ranged field of every shipped strategy."""

from __future__ import annotations

import dataclasses
import math

import pytest

from clbench.config import build_config
from clbench.errors import ConfigError
from clbench.registry import STRATEGIES
from clbench.typecheck import Range, RangeChecked, range_of

SHIPPED = [n for n in STRATEGIES.names() if STRATEGIES.get(n).__module__.startswith("clbench.")]


def _outside(allowed: Range) -> float:
    """A value just outside ``allowed`` (below its low end, else above its high end)."""
    if allowed.low is not None:
        return allowed.low if allowed.open_low else allowed.low - 1
    return allowed.high if allowed.open_high else allowed.high + 1


def _ranged_fields() -> list[tuple[str, str, float]]:
    """``(strategy, field, bad value)`` for every numeric field with a range, once per Config class."""
    cases, seen = [], set()
    for name in SHIPPED:
        config_cls = STRATEGIES.get(name).Config
        for f in dataclasses.fields(config_cls):
            allowed = range_of(f.name)
            if allowed is None or (config_cls, f.name) in seen or "int" not in str(f.type) and "float" not in \
                    str(f.type) or "tuple" in str(f.type):
                continue
            seen.add((config_cls, f.name))
            bad = _outside(allowed)
            cases.append((name, f.name, float(bad) if "float" in str(f.type) else int(bad)))
    return cases


CASES = _ranged_fields()


def test_every_shipped_config_is_range_checked_at_construction():
    assert [n for n in SHIPPED if not issubclass(STRATEGIES.get(n).Config, RangeChecked)] == []


def test_the_cases_cover_the_ranges_the_configs_checked_themselves_before():
    covered = {field for _, field, _ in CASES}
    assert {"epochs", "batch_size", "mem_size", "lr", "prune_s_max", "prune_init", "retrain_temperature",
            "sigma_dp", "prior_noise", "warmup", "loss_positions", "route_holdout", "n_shards", "last_blocks",
            "size", "prefix_length", "prefix_reparam", "scale", "lora_alpha", "first_epochs",
            "retrain_epochs"} <= covered


@pytest.mark.parametrize(("strategy", "field", "bad"), CASES, ids=[f"{s}.{f}" for s, f, _ in CASES])
def test_an_out_of_range_value_is_refused_alike_from_a_suite_and_from_python(strategy, field, bad):
    with pytest.raises(ConfigError) as loaded:
        build_config(strategy, None, {field: bad})
    with pytest.raises(ValueError) as built:
        STRATEGIES.get(strategy).Config(**{field: bad})
    message = f"{field}: {bad!r} is out of range: {field} must be {range_of(field)}"
    assert message in str(loaded.value) and str(built.value) == message


@pytest.mark.parametrize(("field", "inside", "outside"), [
    ("prune_s_max", 1.0001, 1.0), ("warmup", 0.0, 1.0), ("retrain_temperature", 1e-9, 0.0),
    ("prefix_reparam", 0, -1), ("lora_alpha", 1e-9, 0.0), ("sigma_dp", 0.0, -1e-9)])
def test_the_edges_of_the_ranges_that_moved_into_typecheck(field, inside, outside):
    allowed = range_of(field)
    assert inside in allowed and outside not in allowed and not math.isnan(inside)
