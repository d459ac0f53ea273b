"""The claims page generator (clbench/analysis/claims.py): statistics, flags and verdicts read from the committed
records, the setting here from them, notes that may not contradict the computed verdicts, and the three copies of
the table (results/claims.md, results/REFERENCE.md, README.md where it holds one) equal to what the records give.

The claims of the seed papers (results/claims.yaml, rendered by clbench/analysis/claims.py): every row names its
paper and where the quoted number stands in it, states the paper's setting, and what it quotes is in the paper's
text (/work/shared/papers, where there). The statistics, flags and
verdicts are computed (the first tests of this file)."""

import re
from pathlib import Path

import pytest
import yaml

from clbench.analysis.claims import (
    Claim,
    ComparisonSpec,
    claims_markdown,
    contradictions,
    load_claims,
    measure,
    setting_here,
)
from clbench.analysis.reference_tables import BLOCK
from clbench.analysis.verdict import Verdict

ROOT = Path(__file__).parents[1]
RECORDS = ROOT / "results" / "reference"


def _write(tmp_path: Path, claims: list[dict]) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": claims}, allow_unicode=True))
    return path


BASE = {"paper": "TAFT (x)", "claim": "c", "number": "1", "where": "Sec. 1", "papers_setting": "p",
        "papers_setting_run": False, "budget": "b"}


def test_a_comparison_reads_its_statistic_flags_and_verdict_from_the_records():
    clean = measure(ComparisonSpec("unlearning", "c100_0-49_joint", "taft_shards_N25", "sisa_N25"), RECORDS)
    assert clean.statistic is not None and len(clean.statistic.seeds) == 3
    assert clean.flags == {"taft_shards_N25": (), "sisa_N25": ()}
    assert clean.verdict is Verdict.REPRODUCED and f"{clean.mean:+.2f} ± {clean.half_width:.2f}" == "+1.33 ± 0.15"
    flagged = measure(ComparisonSpec("tangent", "c100_0-49_5steps", "taft", "nlft"), RECORDS)
    assert "not converged" in flagged.flags["nlft"] and flagged.verdict is Verdict.FLAGGED
    removal = measure(ComparisonSpec("unlearning", "c100_0-49_joint", "taft_shards_N25", kind="removal",
                                     request="touchhalf", mode="subtract", direction="less"), RECORDS)
    assert removal.verdict is Verdict.NOT_SHOWN and f"{removal.mean:+.2f} ± {removal.half_width:.2f}" == "-0.71 ± 2.24"


def test_a_relative_reading_whose_absolute_interval_holds_0_is_not_shown():
    """Measured.verdict of a relative comparison: its relative interval alone below 0 would read "reversed"; where
    the absolute interval of the same differences holds 0, it is not shown. Where both agree, the word stands."""
    from clbench.analysis.claims import Measured
    from clbench.analysis.paired import Paired

    spec = ComparisonSpec("s", "games", "a", "b", relative=True)
    disagree = Measured(spec, Paired("games", "a", "b", "m", (0, 1, 2), (-0.1, -1.0, -10.0), (1.0, 10.0, 100.0)))
    assert disagree.half_width == pytest.approx(0.0, abs=1e-9) and disagree.verdict is Verdict.NOT_SHOWN
    assert "-10.00% ± 0.00 (3 seeds) → **not shown**; the absolute interval of the same differences, -3.7e+00 ± " \
           "1.4e+01, holds 0" in disagree.text()
    agree = Measured(spec, Paired("games", "a", "b", "m", (0, 1, 2), (-1.0, -1.1, -1.2), (10.0, 10.0, 10.0)))
    assert agree.verdict is Verdict.REVERSED and "absolute interval" not in agree.text()
    absolute = Measured(ComparisonSpec("s", "games", "a", "b"), disagree.statistic)
    assert absolute.verdict is Verdict.NOT_SHOWN


def test_a_missing_suite_is_not_tested_and_another_kind_of_comparison_is_said():
    missing = measure(ComparisonSpec("no_such_suite", "s", "a", "b", at_papers_setting=False, why="one task"),
                      RECORDS)
    assert missing.verdict is Verdict.NOT_TESTED and "no committed record" in missing.text()
    other = measure(ComparisonSpec("tangent", "c100_0-49_5steps", "taft", "taft_ce", at_papers_setting=False,
                                   why="class-incremental here"), RECORDS)
    assert other.verdict is Verdict.NOT_TESTED and "class-incremental here" in other.text()


def test_a_note_that_contradicts_its_computed_verdict_is_refused(tmp_path):
    flagged = {"suite": "tangent", "scenario": "c100_0-49_5steps", "a": "taft", "b": "nlft"}
    says_reproduced = _write(tmp_path, [{**BASE, "comparisons": [flagged], "note": "reproduced on CIFAR"}])
    with pytest.raises(ValueError, match="says 'reproduced'"):
        claims_markdown(RECORDS, says_reproduced)
    explains = _write(tmp_path, [{**BASE, "comparisons": [flagged], "note": "nlft is flagged: its loss still falls"}])
    assert "**flagged, not evidence**" in claims_markdown(RECORDS, explains)


def test_contradictions_reads_each_verdict_word():
    claim = Claim(**BASE, note="not shown here, and reversed there")
    measured = [measure(ComparisonSpec("unlearning", "c100_0-49_joint", "taft_shards_N10", "sisa_N10"), RECORDS)]
    assert measured[0].verdict is Verdict.NOT_SHOWN
    assert [p.split("says ")[1].split(",")[0] for p in contradictions(claim, measured)] == ["'reversed'"]


def test_unknown_keys_and_directions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown keys"):
        load_claims(_write(tmp_path, [{**BASE, "verdict": "reproduced"}]))
    with pytest.raises(ValueError, match="direction"):
        load_claims(_write(tmp_path, [{**BASE, "comparisons": [{"suite": "s", "scenario": "x", "a": "a", "b": "b",
                                                                "direction": "above"}]}]))
    with pytest.raises(ValueError, match="why"):
        ComparisonSpec("s", "x", "a", "b", at_papers_setting=False)


def test_the_setting_here_comes_from_the_records():
    claim = Claim(**{**BASE, "comparisons": (ComparisonSpec("dytox", "cifar100_b50_5steps", "dytox", "icarl_e30"),)})
    text = setting_here(claim, RECORDS)
    assert "at most 50 training images a class" in text and "0.214 M params" in text
    assert "30 epochs a step" in text and "memory 500" in text and "from scratch" in text
    assert "the paper's setting was not run" in text


@pytest.fixture(scope="module")
def generated() -> str:
    return claims_markdown(RECORDS)


@pytest.mark.parametrize("document", ["results/REFERENCE.md", "results/claims.md", "README.md"])
def test_every_copy_of_the_claims_table_is_the_generated_one(document, generated):
    text = (ROOT / document).read_text()
    blocks = [m.group("body") for m in BLOCK.finditer(text) if "table=claims" in m.group("options")]
    if document == "results/claims.md":
        assert generated in text, "regenerate: python -m clbench.analysis.claims --out results/claims.md"
        return
    if document == "README.md" and not blocks:
        assert "results/claims.md" in text, "README.md neither holds the claims table nor links to results/claims.md"
        return
    assert blocks == [generated], f"{document}: run python -m clbench.analysis.reference_tables {document}"


def test_every_claim_row_has_a_verdict_or_says_why_not(generated):
    sections = generated.split("\n### ")
    assert len(sections) == len(load_claims())
    for section in sections:
        assert "→ **" in section or "no paired comparison:" in section, section


PAPERS = ROOT.parent / "shared" / "papers"


TEXTS = {"TAFT": "000_75a76504e3e1cc2b.txt", "Ding et al.": "001_2500a084b8200389.txt",
         "DyTox": "002_4e7a94b97faf31ed.txt", "He et al.": "003_de3f72d6d35ad9ac.txt",
         "Dual form": "004_fa485a028659e108.txt"}


WHERE = re.compile(r"Table \d+|Sec\. \d+(\.\d+)*|Figure \d+|Appendix [A-Z](\.\d+)?|(slide|section) “[^”]+”")


QUOTED = re.compile(r"“([^”]+)”")


NUMBER = re.compile(r"\d+(?:\.\d+)?")


def normalized(text: str) -> str:
    """Whitespace collapsed, TeX dollars and backslashes dropped: a phrase quoted from ``$d=384$`` reads d=384."""
    return " ".join(text.replace("$", "").replace("\\", "").split())


def paper_of(paper: str) -> str:
    name = next((name for name in TEXTS if paper.startswith(name)), None)
    assert name, f"the paper must start with one of {sorted(TEXTS)}: {paper!r}"
    return name


def test_every_claim_names_its_source_its_setting_and_what_it_rests_on():
    claims = load_claims()
    assert len(claims) >= 20                              # the claims of the five seed papers
    for claim in claims:
        paper_of(claim.paper)
        assert WHERE.search(claim.where), f"say where the number stands (Table N, Sec. N, slide “...”): {claim}"
        assert claim.papers_setting and claim.budget, f"state the paper's setting and the budget: {claim}"
        assert claim.comparisons or claim.evidence, f"a claim rests on comparisons or says its evidence: {claim}"
        assert NUMBER.search(claim.number) or claim.number.startswith("none"), \
            f"quote the paper's number, or say 'none (why)': {claim}"


@pytest.mark.skipif(not PAPERS.exists(), reason="the papers' texts are not on this machine")
def test_every_quoted_number_and_phrase_occurs_in_the_papers_text():
    """Each number of the paper's number, each phrase in “quotes” of the claim and each quoted slide or section
    title of ``where`` is in the paper's text: a misquoted number (DyTox's 71.5 / 57.8, which this text does not
    hold) fails."""
    for claim in load_claims():
        name = TEXTS[paper_of(claim.paper)]
        text = normalized((PAPERS / name).read_text())
        missing = [n for n in NUMBER.findall(claim.number) if n not in text]
        assert not missing, f"{missing} not in {name}: {claim.number}"
        for phrase in QUOTED.findall(claim.claim) + QUOTED.findall(claim.where):
            assert normalized(phrase) in text, f"“{phrase}” not in {name}"


def test_the_quote_check_catches_a_misquote():
    text = normalized((PAPERS / TEXTS["DyTox"]).read_text()) if PAPERS.exists() else "73.66 ± 0.02 / 60.67"
    assert "73.66" in text and "71.5" not in text
