"""The claims page: each seed paper's claims (``results/claims.yaml``) against the committed reference records.

A claim in the file holds the paper's words and number, where they stand, the paper's setting, whether that setting
was run here, how the budgets here were chosen, an optional note, and its comparisons. A comparison names a suite
folder under the results root, a scenario, rows ``a`` and ``b``, a metric and the sign the paper claims for
``a − b`` (``greater`` / ``less``; ``within`` with ``margin``: no further apart than the paper's own margin);
``relative: true`` reads ``(a − b) / b`` in percent; ``kind: removal`` reads
``accuracy after − before`` of row ``a``'s ``run_bench.py forget`` records (``request``, ``mode``);
``at_papers_setting: false`` (with ``why``) marks a comparison of another kind than the paper's (its task form,
loss or privacy regime); ``paper_value`` is the paper's own ``a − b`` in the same units, placed against the interval.

From the records, :func:`claims_markdown` computes each comparison's paired statistic
(:mod:`clbench.analysis.paired`), both rows' adequacy flags and the verdict word
(:func:`clbench.analysis.verdict.verdict`), and writes the setting here (data, model size, pre-trained or not,
epochs, memory: from the records' specs and configs) beside the paper's. A note may explain a verdict but never
contradict it: a note that uses a verdict word no comparison of its claim computed is refused
(:func:`contradictions`). ``python -m clbench.analysis.claims [--out results/claims.md]`` prints or writes the page.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import yaml

from clbench import records as record_files
from clbench.analysis.paired import (
    Paired,
    decimals,
    flag_kinds,
    paired,
    removal_change,
    removals,
    row_label,
    scenario_label,
)
from clbench.analysis.verdict import Comparison, Verdict, verdict

RESULTS = Path(__file__).resolve().parents[2] / "results"
CLAIMS_FILE = RESULTS / "claims.yaml"


@dataclass(frozen=True)
class ComparisonSpec:
    """One comparison of a claim (module docstring)."""

    suite: str
    scenario: str
    a: str
    b: str = ""
    metric: str = "last_acc"
    direction: str = "greater"
    relative: bool = False
    kind: str = "paired"
    request: str = ""
    mode: str = ""
    paper_value: float | None = None
    at_papers_setting: bool = True
    why: str = ""
    margin: float | None = None

    def __post_init__(self) -> None:
        try:
            Comparison(self.direction, None, None, margin=self.margin)     # its direction and margin rules
        except ValueError as exc:
            raise ValueError(f"{self.suite}: {self.a} − {self.b}: {exc}") from None
        if self.kind not in KINDS:
            raise ValueError(f"{self.suite}: {self.a}: kind {self.kind!r}, one of {sorted(KINDS)}")
        if not self.at_papers_setting and not self.why:
            raise ValueError(f"{self.suite}: {self.a} − {self.b}: at_papers_setting false needs its 'why'")

    @property
    def label(self) -> str:
        if self.kind == "removal":
            return f"{self.a}: accuracy after − before ({self.mode}, {self.request})"
        return f"{self.a} − {self.b}"


@dataclass(frozen=True)
class Claim:
    """One row of the claims page (module docstring)."""

    paper: str
    claim: str
    number: str
    where: str
    papers_setting: str
    papers_setting_run: bool
    budget: str
    comparisons: tuple[ComparisonSpec, ...] = ()
    evidence: str = ""
    note: str = ""


@dataclass(frozen=True)
class Measured:
    """A comparison read from the records: its statistic (``None`` when no record holds it), flags and verdict."""

    spec: ComparisonSpec
    statistic: Paired | None
    flags: dict[str, tuple[str, ...]] = field(default_factory=dict)
    digits: int = 2

    @property
    def mean(self) -> float | None:
        if self.statistic is None:
            return None
        return 100 * self.statistic.relative_mean if self.spec.relative else self.statistic.mean

    @property
    def half_width(self) -> float | None:
        if self.statistic is None:
            return None
        return 100 * self.statistic.relative_half_width if self.spec.relative else self.statistic.half_width

    @property
    def verdict(self) -> Verdict:
        """The verdict of the interval shown; a relative reading whose absolute interval holds 0 while the relative
        one does not (or the other way round) is not shown (:attr:`Paired.relative_verdict`)."""
        word = verdict(Comparison(self.spec.direction, self.mean, self.half_width,
                                  self.flags.get(self.spec.a, ()), self.flags.get(self.spec.b, ()),
                                  self.spec.at_papers_setting, self.spec.margin))
        return Verdict.NOT_SHOWN if word in (Verdict.REPRODUCED, Verdict.REVERSED) and self._absolute_disagrees \
            else word

    @property
    def _absolute_disagrees(self) -> bool:
        """A directional relative reading whose absolute interval is not on the same side of 0."""
        return self.spec.relative and self.spec.margin is None and self.statistic is not None \
            and self.statistic.relative_verdict == "not shown"

    def text(self) -> str:
        """``scenario: a − b metric +1.23 ± 0.45 (3 seeds) → verdict[; flags][; the paper's value ...]``."""
        spec = self.spec
        head = f"{spec.suite}/{spec.scenario}: {spec.label}" + ("" if spec.kind == "removal" else f", {spec.metric}")
        if self.statistic is None or self.mean is None or self.half_width is None:
            return f"{head}: no committed record → **{self.verdict}** ({spec.why})"
        unit = "%" if spec.relative else ""
        half = "no interval" if math.isnan(self.half_width) else f"{self.half_width:.{self.digits}f}"
        parts = [f"{head}{' relative' if spec.relative else ''}: {self.mean:+.{self.digits}f}{unit} ± {half} "
                 f"({len(self.statistic.seeds)} seeds) → **{self.verdict}**"]
        flagged = [f"{row} {', '.join(kinds)}" for row, kinds in self.flags.items() if kinds]
        if flagged:
            parts.append(f"flagged: {'; '.join(flagged)}")
        if self._absolute_disagrees and self.verdict is Verdict.NOT_SHOWN and not (
                self.mean - self.half_width <= 0 <= self.mean + self.half_width):
            parts.append(f"the absolute interval of the same differences, {self.statistic.mean:+.1e} ± "
                         f"{self.statistic.half_width:.1e}, holds 0")
        if not spec.at_papers_setting:
            parts.append(spec.why)
        if spec.paper_value is not None and not math.isnan(self.half_width):
            low, high = self.mean - self.half_width, self.mean + self.half_width
            place = "inside" if low <= spec.paper_value <= high else "above" if spec.paper_value > high else "below"
            parts.append(f"the paper's {spec.paper_value:+g}{unit} is {place} the interval")
        return "; ".join(parts)


@functools.lru_cache(maxsize=32)
def _suite_records(suite_dir: Path) -> list[dict]:
    """The records of a suite folder (read and checked once per process); a damaged record is an error."""
    found, problems = record_files.load_dir(suite_dir)
    if problems:
        raise ValueError(f"{suite_dir}: {[str(p) for p in problems]}")
    return found


def _paired_statistic(spec: ComparisonSpec, root: Path) -> tuple[Paired | None, dict[str, tuple[str, ...]], int]:
    suite_dir = root / spec.suite
    found = _suite_records(suite_dir)
    digits = 1 if spec.relative else decimals(found, spec.metric)
    results = [p for p in paired(found, spec.a, spec.b, spec.metric) if p.scenario == spec.scenario]
    flags = {row: flag_kinds(found, spec.scenario, row, str(suite_dir)) for row in (spec.a, spec.b)}
    return (results[0] if results else None), flags, digits


def _removal_statistic(spec: ComparisonSpec, root: Path) -> tuple[Paired | None, dict[str, tuple[str, ...]], int]:
    suite_dir = root / spec.suite
    members = removals(suite_dir).get((spec.a, spec.request, spec.mode))
    found = _suite_records(suite_dir)
    flags = {spec.a: flag_kinds(found, spec.scenario, spec.a, str(suite_dir))}
    return (removal_change(spec.a, spec.request, members) if members else None), flags, 2


KINDS: dict[str, Callable[[ComparisonSpec, Path], tuple[Paired | None, dict[str, tuple[str, ...]], int]]] = {
    "paired": _paired_statistic, "removal": _removal_statistic}
"""Comparison kinds: ``(spec, results root) -> (statistic or None, flag kinds per row, decimals)``."""


def measure(spec: ComparisonSpec, root: Path) -> Measured:
    """The comparison ``spec`` read from the records under ``root``."""
    if not (root / spec.suite / "runs").is_dir():
        return Measured(spec, None)
    statistic, flags, digits = KINDS[spec.kind](spec, root)
    return Measured(spec, statistic, flags, digits)


def load_claims(path: str | Path = CLAIMS_FILE) -> list[Claim]:
    """The claims of ``path`` (unknown keys refused: a misspelt field is an error, not a silent default)."""
    entries = yaml.safe_load(Path(path).read_text())["claims"]
    names = {f.name for f in fields(Claim)}
    spec_names = {f.name for f in fields(ComparisonSpec)}
    out = []
    for entry in entries:
        unknown = set(entry) - names
        if unknown:
            raise ValueError(f"{path}: claim {entry.get('claim', '?')!r}: unknown keys {sorted(unknown)}")
        comparisons = []
        for c in entry.get("comparisons", []):
            if set(c) - spec_names:
                raise ValueError(f"{path}: comparison {c}: unknown keys {sorted(set(c) - spec_names)}")
            comparisons.append(ComparisonSpec(**c))
        out.append(Claim(**{**entry, "comparisons": tuple(comparisons)}))
    return out


VERDICT_WORDS = {word: re.compile(rf"\b{re.escape(word.value.split(',')[0])}\b", re.I) for word in Verdict}
"""Each verdict word as prose would write it (``flagged, not evidence`` as ``flagged``)."""


def contradictions(claim: Claim, measured: list[Measured]) -> list[str]:
    """The verdict words the claim's note uses that none of its comparisons computed (a note may explain its
    verdicts, never say another one)."""
    computed = {m.verdict for m in measured}
    return [f"{claim.paper}: {claim.claim[:60]}…: the note says '{word.value}', computed: "
            f"{sorted(v.value for v in computed) or 'none'}"
            for word, pattern in VERDICT_WORDS.items() if pattern.search(claim.note) and word not in computed]


def _record_setting(records: list[dict], scenario: str, row: str) -> str:
    """The setting of one row here, from its records: model size, pre-trained or not, epochs, memory."""
    members = [r for r in records if scenario_label(r) == scenario and row_label(r) == row and
               r["status"] == "finished"]
    if not members:
        return f"{row}: no records"
    r = members[0]
    config = r.get("strategy_config") or {}
    last = (r.get("params_per_step") or [{}])[-1]
    parts = []
    if last.get("total"):
        trained = "" if last.get("trainable") in (None, last["total"]) else f", {last['trainable'] / 1e6:.3f} M trained"
        parts.append(f"{last['total'] / 1e6:.3f} M params{trained}")
    init = config.get("init") or (config.get("model_args") or {}).get("init")
    parts.append("pre-trained" if init else "from scratch")
    if config.get("epochs") is not None:
        parts.append(f"{config['epochs']} epochs a step")
    if config.get("mem_size"):
        parts.append(f"memory {config['mem_size']}")
    return f"{row} ({', '.join(parts)}; {len(members)} seeds)"


def _scenario_setting(records: list[dict], scenario: str) -> str:
    """The data of one scenario here: classes and steps, training items a class, test items."""
    r = next((r for r in records if scenario_label(r) == scenario), None)
    if r is None:
        return f"{scenario}: no records"
    info, args = r.get("scenario_info") or {}, r["spec"]["scenario"].get("args") or {}
    parts = []
    per_step = info.get("classes_per_experience")
    if per_step:
        parts.append(f"{info.get('n_classes')} classes in {len(per_step)} step{'s' * (len(per_step) > 1)}"
                     + (f" ({'+'.join(map(str, per_step))})" if len(set(per_step)) > 1 else ""))
    if args.get("max_per_class"):
        parts.append(f"at most {args['max_per_class']} training images a class")
    if r.get("test_sizes"):
        parts.append(f"{int(np.sum(r['test_sizes']))} test items")
    return f"{scenario}" + (f" ({', '.join(parts)})" if parts else "")


def setting_here(claim: Claim, root: Path) -> str:
    """Data, model size, pre-trained or not, epochs and memory of the rows the claim's comparisons read, the way
    their budgets were chosen, and "the paper's setting was not run" where true."""
    parts: list[str] = []
    for suite in dict.fromkeys(c.suite for c in claim.comparisons):
        if not (root / suite / "runs").is_dir():
            continue
        found = _suite_records(root / suite)
        specs = [c for c in claim.comparisons if c.suite == suite]
        for scenario in dict.fromkeys(c.scenario for c in specs):
            rows = dict.fromkeys(row for c in specs if c.scenario == scenario for row in (c.a, c.b) if row)
            parts.append(f"{suite}: {_scenario_setting(found, scenario)}: "
                         + ", ".join(_record_setting(found, scenario, row) for row in rows))
    parts.append(f"budget: {claim.budget}")
    if not claim.papers_setting_run:
        parts.append("**the paper's setting was not run**")
    return "; ".join(parts)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def claims_markdown(results_root: str | Path = RESULTS / "reference", claims_file: str | Path = CLAIMS_FILE) -> str:
    """The claims page's body: one section per claim of ``claims_file`` (a numbered heading with the paper and the
    claim, then the paper's number, where it stands, both settings, each comparison computed from the records under
    ``results_root`` with its verdict, and the note). Raises ``ValueError`` on a note that contradicts its computed
    verdicts."""
    root = Path(results_root)
    sections, problems = [], []
    for number, claim in enumerate(load_claims(claims_file), start=1):
        measured = [measure(c, root) for c in claim.comparisons]
        problems += contradictions(claim, measured)
        comparisons = ([f"    - {_one_line(m.text())}" for m in measured]
                       or [f"    - no paired comparison: {_one_line(claim.evidence)}"])
        sections.append("\n".join([
            f"### {number}. {_one_line(claim.claim).split(': “')[0]}", "",
            f"**{_one_line(claim.paper)}**: {_one_line(claim.claim)}", "",
            f"- *The paper's number*: {_one_line(claim.number)} ({_one_line(claim.where)})",
            f"- *The paper's setting*: {_one_line(claim.papers_setting)}",
            f"- *The setting here*: {_one_line(setting_here(claim, root))}",
            "- *Comparisons* (A − B: mean ± 95% half-width → verdict):", *comparisons,
            *([f"- *Note*: {_one_line(claim.note)}"] if claim.note else [])]))
    if problems:
        raise ValueError("notes that contradict their computed verdicts: " + " | ".join(problems))
    return "\n\n".join(sections) + "\n"


LEGEND = """Each section quotes a seed paper's claim and its own number, where it stands in the text clbench
follows, the paper's setting and the setting here (from the records: data, model size, pre-trained or not, epochs a
step, memory; how the budgets were chosen), and for each comparison `A − B` the mean over seeds of the per-seed
difference with its 95% Student-t half-width (`run_bench.py analyze paired`) and the verdict computed from it
(`clbench/analysis/verdict.py`): **not tested at the paper's setting** when the comparison is of another kind than
the paper's (or no record holds it); **flagged, not evidence** when either row is flagged by the training-adequacy
checks; else **reproduced** / **reversed** when the interval lies wholly on the paper's / the other side of 0 (for a
claim of equivalence: inside / outside the paper's own margin), and **not shown** otherwise. A smaller scale than
the paper's does not change the word; the setting beside it says how far the runs are from the paper's. The
sections are generated from `results/claims.yaml` and the committed records (`python -m clbench.analysis.claims`).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clbench.analysis.claims",
                                     description="Print (or --out) the claims page from results/claims.yaml.")
    parser.add_argument("--root", default=str(RESULTS / "reference"), help="folder of the suites' records")
    parser.add_argument("--claims", default=str(CLAIMS_FILE), help="the claims file (default: %(default)s)")
    parser.add_argument("--out", default=None, help="write a standalone page here (e.g. results/claims.md)")
    args = parser.parse_args(argv)
    table = claims_markdown(args.root, args.claims)
    page = f"# Claims of the seed papers\n\n{LEGEND}\n{table}"
    if args.out:
        Path(args.out).write_text(page)
    else:
        sys.stdout.write(page)
    return 0


__all__ = ["Claim", "ComparisonSpec", "Measured", "claims_markdown", "contradictions", "load_claims", "main",
           "measure", "setting_here"]


if __name__ == "__main__":
    sys.exit(main())
