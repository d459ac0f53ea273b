"""REFERENCE.md's tables are generated from the committed records (clbench/analysis/reference_tables.py): a committed
table that differs from what results/reference/*/runs give fails here, and so does a table written by hand outside
the generated blocks (except the two hand-written ones: the claims and the suite costs)."""

import json
import shutil
from pathlib import Path

import pytest

from clbench.analysis.reference_tables import BLOCK, main, regenerate, render, stale_blocks

ROOT = Path(__file__).parents[1]
RECORDS = ROOT / "results" / "reference"
HAND_WRITTEN = ("## Suite costs (for the next session)",)
"""Sections whose tables are not made from the records (the claims table is generated too:
tests/test_analysis_claims.py)."""


@pytest.mark.parametrize("document", ["results/REFERENCE.md"])
def test_every_generated_table_equals_what_the_records_give(document):
    """Every block, the claims table's included (``<!-- generated: table=claims -->``, no ``suite=``)."""
    text = (ROOT / document).read_text()
    assert BLOCK.search(text), f"{document} has no generated block"
    stale = stale_blocks(text, RECORDS)
    assert not stale, f"{document}: stale tables {stale}; run `python -m clbench.analysis.reference_tables " \
                      f"{document}` after committing records"


def test_every_suite_with_records_has_its_leaderboard_and_a_budget_line():
    text = (ROOT / "results" / "REFERENCE.md").read_text()
    generated = {(o.get("suite"), o.get("table")) for o in
                 (dict(item.split("=", 1) for item in m.group("options").split()) for m in BLOCK.finditer(text))}
    suites = sorted(p.name for p in RECORDS.iterdir() if (p / "runs").is_dir())
    missing = [s for s in suites if (s, "leaderboard") not in generated and s != "der_params"]
    assert not missing, f"suites with records but no generated leaderboard in REFERENCE.md: {missing}"
    sections = text.split("\n## ")[1:]
    without = [s.splitlines()[0] for s in sections if "<!-- generated:" in s and "Budget" not in s]
    assert not without, f"sections that do not say how their budget was chosen: {without}"


def test_no_table_is_written_by_hand_outside_the_generated_blocks():
    text = BLOCK.sub("", (ROOT / "results" / "REFERENCE.md").read_text())
    for section in text.split("\n## ")[1:]:
        if any(section.startswith(h[3:]) for h in HAND_WRITTEN):
            continue
        tables = [line for line in section.splitlines() if line.startswith("|")]
        assert not tables, f"hand-written table in '{section.splitlines()[0]}': {tables[0]}"


@pytest.fixture
def two_suites(tmp_path):
    """A copy of two small reference suites' records."""
    for suite in ("der_params", "dp_seqrec_continual"):
        shutil.copytree(RECORDS / suite / "runs", tmp_path / suite / "runs")
    return tmp_path


def test_a_changed_record_makes_its_tables_stale_and_regeneration_fixes_them(two_suites):
    document = ("intro\n<!-- generated: suite=dp_seqrec_continual table=leaderboard -->\n<!-- end generated -->\n"
                "prose\n<!-- generated: suite=dp_seqrec_continual table=paired "
                "pairs=dp_eps8_reattention:dp_eps8_vanilla metric=ndcg@10_last relative=yes -->\n"
                "<!-- end generated -->\n<!-- generated: suite=der_params table=leaderboard -->\n"
                "<!-- end generated -->\n")
    assert len(stale_blocks(document, two_suites)) == 3                 # empty bodies: all stale
    fresh = regenerate(document, two_suites)
    assert stale_blocks(fresh, two_suites) == [] and fresh.startswith("intro\n") and "\nprose\n" in fresh
    assert "| dp_eps8_reattention − dp_eps8_vanilla | ndcg@10_last | 3 |" in fresh
    record = sorted((two_suites / "dp_seqrec_continual" / "runs").glob("*dp_eps8_vanilla__s0.json"))[0]
    record.unlink()                                     # one seed fewer (an edited record is refused on read)
    stale = stale_blocks(fresh, two_suites)
    assert len(stale) == 2 and all("dp_seqrec_continual" in s for s in stale)


def test_the_command_checks_and_writes(two_suites, tmp_path, capsys):
    path = tmp_path / "doc.md"
    path.write_text("<!-- generated: suite=der_params table=leaderboard -->\n<!-- end generated -->\n")
    assert main([str(path), "--root", str(two_suites), "--check"]) == 1
    assert "stale: <!-- generated: suite=der_params table=leaderboard -->" in capsys.readouterr().out
    assert main([str(path), "--root", str(two_suites)]) == 0
    assert main([str(path), "--root", str(two_suites), "--check"]) == 0
    assert "| der_params | cifar100_b0_10steps | der_params |" in path.read_text()


def test_a_bad_marker_gets_one_line(two_suites):
    with pytest.raises(ValueError, match="unknown table 'leaderbord'; one of"):
        regenerate("<!-- generated: suite=der_params table=leaderbord -->\n<!-- end generated -->\n", two_suites)
    with pytest.raises(ValueError, match="lacks \\['suite'\\]"):
        regenerate("<!-- generated: table=leaderboard -->\n<!-- end generated -->\n", two_suites)


def test_the_diag_table_reads_the_diagonal_of_the_accuracy_matrix(two_suites):
    """der_params' records: R[i, i] per step by hand from one record's matrix (a single seed: 'n=1')."""
    record = json.loads(sorted((two_suites / "der_params" / "runs").glob("split_mnist__der_params__s0.json"))[0]
                        .read_text())
    steps = " / ".join(f"{100 * record['accuracy_matrix'][i][i]:.1f}" for i in range(5))
    table = render({"suite": "der_params", "table": "diag"}, two_suites)
    assert "| split_mnist | der_params | 1 |" in table and steps in table


def test_the_removals_table_pairs_each_seeds_accuracy_after_with_before(tmp_path):
    shutil.copytree(RECORDS / "unlearning", tmp_path / "unlearning", ignore=shutil.ignore_patterns("plots"))
    removals = [json.loads(p.read_text()) for p in
                sorted((tmp_path / "unlearning" / "removals").glob("*taft_shards_N25__s*__subtract__touchhalf.json"))]
    change = [r["accuracy_after"] - r["accuracy_before"] for r in removals]
    table = render({"suite": "unlearning", "table": "removals"}, tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| taft_shards_N25 | touchhalf | subtract |"))
    assert len(removals) == 3 and f"| {sum(change) / 3:+.2f} ± " in row


def test_a_relative_table_says_a_verdict_only_where_both_intervals_agree():
    """d = -1, -1.1, -1.2 (A < B: -1.10 ± 0.25) against B = 1, 100, 100: r = -100%, -1.1%, -1.2%, whose interval
    holds 0; the relative table says not shown, the absolute one A < B."""
    from clbench.analysis.reference_tables import paired_table

    def record(label, seed, value):
        return {"run_id": f"s__{label}__s{seed}", "status": "finished", "seed": seed,
                "spec": {"suite": "t", "scenario": {"name": "s", "label": ""},
                         "strategy": {"name": "x", "label": label}}, "metrics": {"last_acc": value}}

    records = [record("B", s, b) for s, b in enumerate((1.0, 100.0, 100.0))] + \
        [record("A", s, b + d) for s, (b, d) in enumerate(((1.0, -1.0), (100.0, -1.1), (100.0, -1.2)))]
    absolute = paired_table(records, {"pairs": "A:B"})
    relative = paired_table(records, {"pairs": "A:B", "relative": "yes"})
    assert absolute.splitlines()[2].endswith("| A < B |")
    assert relative.splitlines()[2].endswith("| not shown |") and "% ± " in relative.splitlines()[2]
