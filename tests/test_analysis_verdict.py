"""The verdict of a comparison (clbench/analysis/verdict.py): each word, and the two rules no verdict may break."""

import math

import pytest

from clbench.analysis.verdict import Comparison, Verdict, verdict


@pytest.mark.parametrize(("direction", "mean", "half", "word"), [
    ("greater", 2.0, 1.0, Verdict.REPRODUCED),
    ("greater", -2.0, 1.0, Verdict.REVERSED),
    ("greater", 0.5, 1.0, Verdict.NOT_SHOWN),
    ("less", -2.0, 1.0, Verdict.REPRODUCED),
    ("less", 2.0, 1.0, Verdict.REVERSED),
    ("less", -0.71, 2.24, Verdict.NOT_SHOWN),          # the unlearning cost: contains 0
    ("greater", 1.0, 1.0, Verdict.NOT_SHOWN),           # the interval touches 0: 0 is in it
    ("greater", 3.0, math.nan, Verdict.NOT_SHOWN),      # one seed: no interval
])
def test_the_word_follows_the_interval_and_the_claimed_direction(direction, mean, half, word):
    assert verdict(Comparison(direction, mean, half)) is word


@pytest.mark.parametrize("flags", [{"flags_a": ("not converged",)}, {"flags_b": ("not learned",)}])
def test_a_flagged_comparison_is_never_evidence(flags):
    for mean in (-5.0, 0.0, 5.0):
        assert verdict(Comparison("greater", mean, 0.5, **flags)) is Verdict.FLAGGED


def test_a_comparison_of_another_kind_or_without_records_is_not_tested():
    assert verdict(Comparison("greater", 6.5, 2.2, at_papers_setting=False)) is Verdict.NOT_TESTED
    assert verdict(Comparison("greater", None, None)) is Verdict.NOT_TESTED
    flagged_and_other = Comparison("greater", 6.5, 2.2, flags_b=("not converged",), at_papers_setting=False)
    assert verdict(flagged_and_other) is Verdict.NOT_TESTED           # the kind first: it is no test of the claim


def test_no_interval_containing_0_is_ever_reproduced():
    for direction in ("greater", "less"):
        for mean in (-1.0, -0.3, 0.0, 0.3, 1.0):
            assert verdict(Comparison(direction, mean, 1.0)) is not Verdict.REPRODUCED


def test_an_unknown_direction_is_refused():
    with pytest.raises(ValueError, match="direction"):
        Comparison("above", 1.0, 0.5)


@pytest.mark.parametrize(("mean", "half", "word"), [
    (-0.4, 0.5, Verdict.REPRODUCED),        # [-0.9, 0.1] inside [-1, 1]: as close as the paper says
    (-6.0, 1.5, Verdict.REVERSED),          # [-7.5, -4.5]: further apart than the paper's margin
    (3.0, 1.0, Verdict.REVERSED),           # [2, 4] above +1
    (-1.0, 1.0, Verdict.NOT_SHOWN),         # [-2, 0] straddles -1
    (0.0, 3.0, Verdict.NOT_SHOWN),          # too wide to tell
    (0.2, math.nan, Verdict.NOT_SHOWN),     # one seed
])
def test_an_equivalence_claim_reads_the_interval_against_the_papers_margin(mean, half, word):
    """``within``: "about as well as", "differing only by m": reproduced only when the whole interval lies in
    [-m, m], reversed when it lies wholly outside (a larger difference than the paper's)."""
    assert verdict(Comparison("within", mean, half, margin=1.0)) is word


@pytest.mark.parametrize(("direction", "margin"), [("within", None), ("within", 0.0), ("greater", 1.0)])
def test_a_margin_goes_with_within_and_only_with_it(direction, margin):
    with pytest.raises(ValueError, match="margin"):
        Comparison(direction, 1.0, 0.5, margin=margin)
