"""clbench.escaping: code spans that hold any text literally, and the CSV rule against formula injection (a text cell
beginning with = + - @ tab or CR gets a leading ', numbers and numeric text never change), applied to
leaderboard.csv and paired.csv. (Markdown cells: tests/test_leaderboard.py and tests/test_suite_report.py.)"""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest

from clbench import leaderboard
from clbench.cli import main
from clbench.escaping import FORMULA_START, csv_cell, csv_table, markdown_code, markdown_text
from tests._records import sealed


@pytest.mark.parametrize("text, cell, expected", [
    ("naive", False, "`naive`"),                         # a name prints as before
    ("a`b", False, "``a`b``"),                           # fence longer than the longest run inside
    ("a``b`", False, "``` a``b` ```"),                   # padded where it ends with a backtick
    ("`a", False, "`` `a ``"),
    ("a|b", False, "`a|b`"),                             # outside a table a | is literal in a code span
    ("a|b", True, "`a\\|b`"),                            # in a table cell it would end the cell
    ("two\nlines", False, "`two lines`"),
])
def test_a_code_span_holds_any_text_literally(text, cell, expected):
    assert markdown_code(text, cell=cell) == expected


def test_markdown_text_is_the_leaderboards_cell_escaping():
    """One function, shared: the leaderboard uses this module's (no copy)."""
    assert leaderboard.markdown_text is markdown_text
    assert markdown_text(3) == "3" and markdown_text("a\r\nb") == "a b"


@pytest.mark.parametrize("value, expected", [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"),
    ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
    ("-x", "'-x"),
    ("@SUM(A1)", "'@SUM(A1)"),
    ("\tx", "'\tx"),
    ("\rx", "'\rx"),
    ("+1 +2", "'+1 +2"),                                 # a spreadsheet would add them up
    ("-0.25", "-0.25"),                                  # numeric text: a negative number stays a number
    ("+3", "+3"),
    ("-1e-05", "-1e-05"),
    ("-inf", "-inf"),
    ("naive", "naive"),
    ("a=b", "a=b"),                                      # only the first character matters
    ("", ""),
    (-0.25, -0.25),
    (None, None),
])
def test_csv_cells_that_would_be_formulas_get_a_quote_and_numbers_do_not(value, expected):
    assert csv_cell(value) == expected
    assert FORMULA_START == ("=", "+", "-", "@", "\t", "\r")


def test_csv_table_guards_text_columns_and_names_and_keeps_numeric_columns():
    table = pd.DataFrame({"strategy": ["=x", "-0.5", "ok"], "bwt": [-1.5, -0.25, 2.0], "=name": [1, 2, 3]})
    safe = csv_table(table)
    assert list(safe.columns) == ["strategy", "bwt", "'=name"]
    assert safe["strategy"].tolist() == ["'=x", "-0.5", "ok"]
    assert safe["bwt"].tolist() == [-1.5, -0.25, 2.0] and safe["bwt"].dtype == float
    assert table["strategy"].tolist() == ["=x", "-0.5", "ok"]          # the table itself is left as it was


def _record(label: str, seed: int, last: float) -> dict:
    return sealed({"status": "finished", "seed": seed, "metrics": {"last_acc": last, "avg_inc_acc": last + 10},
                   "spec": {"suite": "s", "scenario": {"name": "synthetic"},
                            "strategy": {"name": "naive", "label": label}}})


def test_leaderboard_csv_labels_cannot_be_formulas_and_negative_scores_stay_numbers(tmp_path):
    """A strategy label ``=1+1`` is written ``'=1+1``; the negative bwt stays a number in the file."""
    leaderboard.write(tmp_path, [_record("=1+1", 0, 40.0)])
    (row,) = csv.DictReader((tmp_path / "leaderboard.csv").open())
    assert row["strategy"] == "'=1+1"
    assert float(row["bwt"]) < 0 and row["bwt"].startswith("-")


def test_paired_csv_labels_cannot_be_formulas_and_the_numbers_are_written_as_they_are(tmp_path):
    """Strategy labels ``-A`` and ``+B`` (a run id lets a strategy label start with them) get a leading quote in
    paired.csv; the mean difference ``-1.5`` stays a number."""
    (tmp_path / "runs").mkdir()
    for r in [_record("-A", s, 10.0) for s in range(2)] + [_record("+B", s, 11.0 + s) for s in range(2)]:
        (tmp_path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    assert main(["analyze", "paired", "--run", str(tmp_path), "--pairs=-A:+B"]) == 0
    (row,) = csv.DictReader((tmp_path / "paired.csv").open())
    assert (row["A"], row["B"], row["mean_A_minus_B"]) == ("'-A", "'+B", "-1.5")
