"""The claims of the seed papers (results/claims.yaml, rendered by clbench/analysis/claims.py): every row names its
paper and where the quoted number stands in it, states the paper's setting, and what it quotes is in the paper's
text (/work/shared/papers, where there). The statistics, flags and verdicts are computed (tests/test_claims.py)."""

import re
from pathlib import Path

import pytest

from clbench.analysis.claims import load_claims

ROOT = Path(__file__).parents[1]
PAPERS = ROOT.parent / "shared" / "papers"
TEXTS = {"TAFT": "000_75a76504e3e1cc2b.txt", "Ding et al.": "001_2500a084b8200389.txt",
         "DyTox": "002_4e7a94b97faf31ed.txt", "He et al.": "003_de3f72d6d35ad9ac.txt",
         "Dual form": "004_fa485a028659e108.txt"}
"""The five seed papers by the name a claim's ``paper`` starts with -> their text (papers/README.md)."""
WHERE = re.compile(r"Table \d+|Sec\. \d+(\.\d+)*|Figure \d+|Appendix [A-Z](\.\d+)?|(slide|section) “[^”]+”")
"""A place in the text: a table, section, figure or appendix, or the title of a slide or summary section."""
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
