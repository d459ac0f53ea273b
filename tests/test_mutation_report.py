"""tests/mutation_report.py's own bookkeeping: the minutes a group's score cost, over every sitting of its run."""

from __future__ import annotations

import math

from tests.mutation_report import minutes_spent, summary_row


def test_the_minutes_column_sums_every_sitting_of_a_resumed_run(tmp_path):
    assert math.isnan(minutes_spent(tmp_path, None))             # --collect before any timed sitting
    assert minutes_spent(tmp_path, 600.0) == 10.0                # first sitting
    assert minutes_spent(tmp_path, 300.0) == 15.0                # --resume: added, not replaced
    assert minutes_spent(tmp_path, None) == 15.0                 # --collect reads the sum, adds nothing
    row, score = summary_row("g", {"a": "killed", "b": "timeout", "c": "survived", "d": "no tests"}, 15.0)
    assert row == "| g | 4 | 2 | 1 | 1 | 0 | 50.0% | 15.0 |" and score == 50.0
