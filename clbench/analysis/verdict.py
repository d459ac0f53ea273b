"""The verdict of one comparison behind a paper's claim, computed from its paired statistic, never typed by hand.

A comparison is ``A − B`` on one metric over paired seeds (:mod:`clbench.analysis.paired`): its mean ``d̄`` and the
half-width ``h`` of its 95% Student-t interval ``[d̄ − h, d̄ + h]``, what the paper claims for it (``greater``:
A above B; ``less``: A below B; ``within``: A and B no further apart than the paper's own margin ``m``, a claim
of equivalence such as "differing on average only by 1.0%"), the adequacy flags of both rows
(:mod:`clbench.adequacy`) and whether the comparison is of the kind the paper states (its task form, loss, privacy
regime). The word, first rule that holds:

==================================  =====================================================================
not tested at the paper's setting   no records, or the comparison is not of the kind the paper states
flagged, not evidence               a row of the pair is flagged (``not learned`` / ``not converged``)
not shown                           fewer than 2 seeds (no interval), or the interval contains 0
reproduced                          the interval lies wholly on the paper's side of 0 (``within``: inside [−m, m])
reversed                            the interval lies wholly on the other side of 0 (``within``: outside [−m, m])
==================================  =====================================================================

So an interval that contains 0 is never ``reproduced`` and a flagged comparison is never evidence either way
(a relative reading also needs the absolute interval of the same differences on its side:
:attr:`clbench.analysis.claims.Measured.verdict`); a
comparison of another kind than the paper's says so first (its flags are still shown beside it). A
smaller scale than the paper's (less data, a smaller model, fewer epochs) does not change the word: the claims page
states both settings beside it (:mod:`clbench.analysis.claims`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    """The verdict words of the claims page."""

    FLAGGED = "flagged, not evidence"
    NOT_TESTED = "not tested at the paper's setting"
    NOT_SHOWN = "not shown"
    REPRODUCED = "reproduced"
    REVERSED = "reversed"


DIRECTIONS = {"greater": 1, "less": -1, "within": 0}
"""What a paper claims of ``A − B``, by the name a claims file uses: its sign, or 0 for ``within`` (no further from 0
than the comparison's ``margin``)."""


@dataclass(frozen=True)
class Comparison:
    """What a verdict is computed from (module docstring). ``mean`` and ``half_width`` are ``None`` when no
    committed record holds the comparison; ``half_width`` is NaN for one seed."""

    direction: str
    mean: float | None
    half_width: float | None
    flags_a: tuple[str, ...] = ()
    flags_b: tuple[str, ...] = ()
    at_papers_setting: bool = True
    margin: float | None = None

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction {self.direction!r}: one of {sorted(DIRECTIONS)}")
        if (self.direction == "within") != (self.margin is not None) or (self.margin is not None and
                                                                         not self.margin > 0):
            raise ValueError(f"direction {self.direction!r} with margin {self.margin!r}: 'within' needs a margin "
                             f"> 0, 'greater' and 'less' none")


def verdict(comparison: Comparison) -> Verdict:
    """The verdict word of ``comparison`` (the rules of the module docstring, in their order)."""
    if not comparison.at_papers_setting or comparison.mean is None or comparison.half_width is None:
        return Verdict.NOT_TESTED
    if comparison.flags_a or comparison.flags_b:
        return Verdict.FLAGGED
    if math.isnan(comparison.half_width):
        return Verdict.NOT_SHOWN
    if comparison.direction == "within":
        low, high, margin = (comparison.mean - comparison.half_width, comparison.mean + comparison.half_width,
                             comparison.margin)
        if -margin <= low and high <= margin:
            return Verdict.REPRODUCED
        if high < -margin or low > margin:
            return Verdict.REVERSED
        return Verdict.NOT_SHOWN
    sign = DIRECTIONS[comparison.direction]
    low, high = sorted((sign * (comparison.mean - comparison.half_width),
                        sign * (comparison.mean + comparison.half_width)))
    if low > 0:
        return Verdict.REPRODUCED
    if high < 0:
        return Verdict.REVERSED
    return Verdict.NOT_SHOWN


__all__ = ["DIRECTIONS", "Comparison", "Verdict", "verdict"]
