"""Paired differences over seeds (clbench/analysis/paired.py) against a hand computation, and the command."""

import pytest

from clbench.analysis.paired import paired
from clbench.cli import main
from tests._records import sealed


def _record(strategy, seed, value, scenario="s", status="finished"):
    return {"run_id": f"{scenario}__{strategy}__s{seed}", "status": status, "seed": seed,
            "spec": {"suite": "t", "scenario": {"name": scenario, "label": ""},
                     "strategy": {"name": "x", "label": strategy}},
            "metrics": {"last_acc": value}}


def test_paired_difference_and_interval_by_hand():
    # A − B per seed: 1, 2, 3 (seed 3 only in A: left out) -> mean 2, sd 1, t_{0.975,2} = 4.302653 -> 2.484138
    records = [_record("A", 0, 11.0), _record("A", 1, 12.0), _record("A", 2, 13.0), _record("A", 3, 99.0),
               _record("B", 0, 10.0), _record("B", 1, 10.0), _record("B", 2, 10.0),
               _record("B", 3, 0.0, status="failed")]
    (result,) = paired(records, "A", "B")
    assert result.seeds == (0, 1, 2) and result.differences == (1.0, 2.0, 3.0)
    assert result.mean == 2.0 and result.half_width == pytest.approx(4.302653 / 3 ** 0.5, abs=1e-5)
    # relative: 0.1, 0.2, 0.3 of B's 10 -> mean 0.2, half-width 0.2484138
    assert result.relatives == pytest.approx((0.1, 0.2, 0.3)) and result.relative_mean == pytest.approx(0.2)
    assert result.relative_half_width == pytest.approx(0.4302653 / 3 ** 0.5, abs=1e-6)
    assert result.verdict == "not shown"                       # 2 ± 2.48 includes 0
    (flipped,) = paired(records, "B", "A")
    assert flipped.mean == -2.0
    shown = [_record("A", s, 10.0 + 0.1 * s) for s in range(3)] + [_record("B", s, 9.0) for s in range(3)]
    assert paired(shown, "A", "B")[0].verdict == "A > B"


def test_a_relative_verdict_needs_both_intervals_on_one_side():
    """The same differences read two ways: d = -0.1, -1, -10 against B = 1, 10, 100 is r = -10% in every seed
    (its interval is -10% ± 0: below 0) while d̄ = -3.7 ± 12.6 holds 0: the relative reading is not shown either.
    Where both lie below 0, both say A < B."""
    wide = [_record("A", s, b + d) for s, (b, d) in enumerate(((1.0, -0.1), (10.0, -1.0), (100.0, -10.0)))] \
        + [_record("B", s, b) for s, b in enumerate((1.0, 10.0, 100.0))]
    (result,) = paired(wide, "A", "B")
    assert result.relative_half_width == pytest.approx(0.0, abs=1e-12) and result.relative_mean < 0
    assert (result.verdict, result.relative_verdict) == ("not shown", "not shown")
    narrow = [_record("A", s, 9.0 - 0.01 * s) for s in range(3)] + [_record("B", s, 10.0) for s in range(3)]
    (both,) = paired(narrow, "A", "B")
    assert (both.verdict, both.relative_verdict) == ("A < B", "A < B")
    alone = [_record("A", 0, 9.0), _record("B", 0, 10.0)]
    assert paired(alone, "A", "B")[0].relative_verdict == "one seed: no interval"


def test_a_row_without_the_metric_has_no_pairs_and_the_others_keep_theirs():
    # joint's avg_inc_acc is None (no incremental steps): its seeds pair with nothing, the other rows still pair
    records = [_record("A", s, 10.0 + s) for s in range(2)] + [_record("B", s, 9.0) for s in range(2)] \
        + [_record("joint", s, None) for s in range(2)]
    assert paired(records, "A", "joint") == []
    (result,) = paired(records, "A", "B")
    assert result.differences == (1.0, 2.0)


def test_paired_command_writes_the_table(tmp_path, capsys):
    import json
    (tmp_path / "runs").mkdir()
    for r in map(sealed, [_record("A", s, 10.0 + s) for s in range(2)] + [_record("B", s, 9.0) for s in range(2)]):
        (tmp_path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    assert main(["analyze", "paired", "--run", str(tmp_path), "--pairs", "A:B"]) == 0
    lines = (tmp_path / "paired.csv").read_text().splitlines()
    assert lines[0].split(",")[7:11] == ["verdict", "relative_mean", "relative_ci95_half_width", "relative_verdict"]
    assert lines[1].startswith("s,A,B,last_acc,2,1.5,6.35,not shown,0.167,0.706,not shown,+1 +2")


@pytest.mark.parametrize("analysis, extra", [("paired", ["--pairs", "a:b"]), ("dual-form", [])])
def test_analyses_of_a_run_refuse_no_run_in_one_line(analysis, extra, capsys):
    assert main(["analyze", analysis, *extra]) == 2
    assert capsys.readouterr().err == f"error: analyze {analysis} needs --run (see run_bench.py analyze --help).\n"
