"""Shipped suites compare like with like: DER's accuracy table has baselines at DER's epochs per step and no
parameter-count-only rows (those are in der_params)."""

from clbench.config import build_config
from clbench.suite_file import load_suite


def _configs(suite):
    return {(e.label or e.name): (e.name, build_config(e.name, e.preset, e.args)) for e in load_suite(suite).strategies}


def test_der_suite_has_baselines_at_ders_epochs_and_no_parameter_only_rows():
    rows = _configs("der")
    name, der = rows["der_e6"]
    assert name == "der" and der.first_epochs == der.epochs
    for baseline in ("icarl", "replay", "der_dark"):
        other_name, other = rows[f"{baseline}_e6"]
        assert other_name == baseline and other.epochs == der.epochs and other.mem_size == der.mem_size
    assert not any(name == "dytox" for name, _ in rows.values())
    params = _configs("der_params")
    assert {name for name, _ in params.values()} == {"der", "dytox"}
    assert len(load_suite("der").seeds) == 3
