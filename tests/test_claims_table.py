"""The claims table (each seed paper's headline claim → reproduced / not reproduced / cannot be tested here) is
printed in two places, README.md and results/REFERENCE.md; the two copies must not drift apart."""

from pathlib import Path

ROOT = Path(__file__).parents[1]
HEADING = "## Claims of the seed papers"


def claims_rows(path: Path) -> list[str]:
    """The table rows (lines starting with "|") of the section under :data:`HEADING`."""
    text = path.read_text()
    assert HEADING in text, f"{path.name} has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_readme_and_reference_hold_the_same_claims_table():
    reference = claims_rows(ROOT / "results" / "REFERENCE.md")
    assert len(reference) >= 2 + 8                      # header, rule, one row per claim of the seven seed families
    assert claims_rows(ROOT / "README.md") == reference, "copy the claims table of results/REFERENCE.md into README.md"


def test_every_claim_has_a_verdict_and_a_suite():
    header, _, *rows = claims_rows(ROOT / "results" / "REFERENCE.md")
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:4] == ["paper", "claim", "verdict here", "suite rows"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == len(columns), row
        assert cells[2] not in ("", "–"), f"no verdict: {row}"
        assert cells[3] not in ("", "–"), f"no suite row behind the verdict: {row}"
