"""The claims table (each seed paper's claims, in its own words and numbers, against the reference runs) is printed
in README.md and results/REFERENCE.md; the two copies must not drift apart, every row must name its paper and where
the quoted number stands in it, and what it quotes must be in the paper's text (/work/shared/papers, where there)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
HEADING = "## Claims of the seed papers"
QUOTED_NUMBER = "paper's number"
COLUMNS = ["paper", "claim", QUOTED_NUMBER, "where", "verdict here", "suite rows", "statistic"]
PAPERS = ROOT.parent / "shared" / "papers"
TEXTS = {"TAFT": "000_75a76504e3e1cc2b.txt", "Ding et al.": "001_2500a084b8200389.txt",
         "DyTox": "002_4e7a94b97faf31ed.txt", "He et al.": "003_de3f72d6d35ad9ac.txt",
         "Dual form": "004_fa485a028659e108.txt"}
"""The five seed papers by the name a row's ``paper`` cell starts with -> their text (papers/README.md)."""
WHERE = re.compile(r"Table \d+|Sec\. \d+(\.\d+)*|Figure \d+|Appendix [A-Z](\.\d+)?|(slide|section) “[^”]+”")
"""A place in the text: a table, section, figure or appendix, or the title of a slide or summary section."""
QUOTED = re.compile(r"“([^”]+)”")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def claims_rows(path: Path) -> list[str]:
    """The table rows (lines starting with "|") of the section under :data:`HEADING`."""
    text = path.read_text()
    assert HEADING in text, f"{path.name} has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def rows() -> list[dict[str, str]]:
    header, _, *body = claims_rows(ROOT / "results" / "REFERENCE.md")
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    out = []
    for line in body:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(COLUMNS), line
        out.append(dict(zip(COLUMNS, cells)))
    return out


def normalized(text: str) -> str:
    """Whitespace collapsed, TeX dollars and backslashes dropped: a phrase quoted from ``$d=384$`` reads d=384."""
    return " ".join(text.replace("$", "").replace("\\", "").split())


def paper_of(row: dict[str, str]) -> str:
    name = next((name for name in TEXTS if row["paper"].startswith(name)), None)
    assert name, f"the paper cell must start with one of {sorted(TEXTS)}: {row['paper']!r}"
    return name


def test_readme_and_reference_hold_the_same_claims_table():
    reference = claims_rows(ROOT / "results" / "REFERENCE.md")
    assert len(reference) >= 2 + 20                      # header, rule, the claims of the five seed papers
    assert claims_rows(ROOT / "README.md") == reference, "copy the claims table of results/REFERENCE.md into README.md"


def test_every_claim_has_a_verdict_a_suite_and_names_its_source():
    for row in rows():
        paper_of(row)
        assert WHERE.search(row["where"]), f"say where the number stands (Table N, Sec. N, slide “...”): {row}"
        for column in (QUOTED_NUMBER, "verdict here", "suite rows", "statistic"):
            assert row[column] not in ("", "–", "-"), f"empty {column}: {row}"
        assert NUMBER.search(row[QUOTED_NUMBER]) or row[QUOTED_NUMBER].startswith("none"), \
            f"quote the paper's number, or say 'none (why)': {row}"


@pytest.mark.skipif(not PAPERS.exists(), reason="the papers' texts are not on this machine")
def test_every_quoted_number_and_phrase_occurs_in_the_papers_text():
    """Each number of the ``paper's number`` cell, each phrase in “quotes” of the ``claim`` cell and each quoted
    slide or section title of the ``where`` cell is in the paper's text: a misquoted number (DyTox's 71.5 / 57.8,
    which this text does not hold) fails."""
    for row in rows():
        text = normalized((PAPERS / TEXTS[paper_of(row)]).read_text())
        numbers = NUMBER.findall(row[QUOTED_NUMBER])
        missing = [n for n in numbers if n not in text]
        assert not missing, f"{missing} not in {TEXTS[paper_of(row)]}: {row[QUOTED_NUMBER]}"
        for phrase in QUOTED.findall(row["claim"]) + QUOTED.findall(row["where"]):
            assert normalized(phrase) in text, f"“{phrase}” not in {TEXTS[paper_of(row)]}"


def test_the_quote_check_catches_a_misquote():
    text = normalized((PAPERS / TEXTS["DyTox"]).read_text()) if PAPERS.exists() else "73.66 ± 0.02 / 60.67"
    assert "73.66" in text and "71.5" not in text


def test_every_statistic_with_an_interval_is_one_the_records_give():
    """Each ``a ± b`` of the statistic column (a paired mean and half-width, a relative one in %, or a mean ± std)
    occurs in a table REFERENCE.md generates from the records (tests/test_reference_tables.py keeps those equal to
    the records): a number typed by hand, or left behind when the records changed, fails."""
    from clbench.analysis.reference_tables import BLOCK

    text = (ROOT / "results" / "REFERENCE.md").read_text()
    generated = " ".join(m.group("body") for m in BLOCK.finditer(text)).replace("−", "-")
    for row in rows():
        for mean, half in re.findall(r"([+\-−]?\d+(?:\.\d+)?%?) ± (\d+(?:\.\d+)?)", row["statistic"]):
            statistic = f"{mean.replace('−', '-')} ± {half}"
            assert statistic in generated, f"{statistic} is in no generated table: {row['paper']}: {row['claim']}"


def unmarked_citations(reference: str, claims: list[dict[str, str]]) -> list[str]:
    """``"<paper>: <statistic> (<flags>)"`` for each paired statistic a claims row cites whose generated line is
    marked ``(flagged: <row> <flags>)`` (clbench/analysis/reference_tables.py) while the row's verdict and statistic
    cells do not name each flag kind ("not learned", "not converged")."""
    from clbench.analysis.reference_tables import BLOCK, FLAGGED

    paired_lines = [line.replace("−", "-") for m in BLOCK.finditer(reference) if "table=paired" in m.group("options")
                    for line in m.group("body").splitlines() if FLAGGED in line]
    missing = []
    for row in claims:
        said = f"{row['verdict here']} {row['statistic']}"
        for mean, half in re.findall(r"([+\-−]?\d+(?:\.\d+)?%?) ± (\d+(?:\.\d+)?)", row["statistic"]):
            statistic = f"{mean.replace('−', '-')} ± {half}"
            for line in paired_lines:
                if f"| {statistic} |" not in line and f"| {statistic}" not in line.split(" | ", 4)[-1]:
                    continue
                marks = line.split(FLAGGED, 1)[1]
                kinds = [k for k in ("not learned", "not converged") if k in marks]
                if not all(k in said for k in kinds):
                    missing.append(f"{row['paper']}: {statistic} ({', '.join(kinds)})")
    return missing


def test_no_claim_reads_a_comparison_with_a_flagged_row_as_evidence():
    """A claims row citing a paired statistic one of whose rows did not learn or had not converged (marked in the
    generated table) must say so in its verdict or statistic cell."""
    missing = unmarked_citations((ROOT / "results" / "REFERENCE.md").read_text(), rows())
    assert not missing, f"claims that cite a flagged comparison without saying so: {missing}"


def test_the_flag_check_catches_an_unmarked_citation():
    reference = ("<!-- generated: suite=s table=paired pairs=a:b -->\n| scenario | A − B | metric | seeds | "
                 "mean ± 95% half-width | verdict |\n|---|---|---|---|---|---|\n| sc | a − b | last_acc | 3 | "
                 "+12.96 ± 1.37 | A > B (flagged: b not learned) |\n<!-- end generated -->\n")
    claim = {"paper": "DyTox", "verdict here": "reproduced", "statistic": "last_acc a − b +12.96 ± 1.37"}
    assert unmarked_citations(reference, [claim]) == ["DyTox: +12.96 ± 1.37 (not learned)"]
    marked = {**claim, "verdict here": "no evidence: b not learned"}
    assert unmarked_citations(reference, [marked]) == []
