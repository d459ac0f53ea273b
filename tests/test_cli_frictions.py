"""Small frictions of the command line: ``--strategy`` picks rows exactly, a suite refused before its first run
leaves no output folder, and ``clbench --help`` says where the suite's flags are."""

from __future__ import annotations

import pytest

from clbench.cli import main
from clbench.errors import ConfigError
from clbench.specs import ScenarioEntry, StrategyEntry, SuiteSpec
from clbench.suite_file import load_suite


def _keys(suite: SuiteSpec) -> list[str]:
    return [e.key for e in suite.strategies]


def test_strategy_filter_picks_a_row_by_its_exact_label_or_name():
    """In the quick suite ``naive`` is a row and ``naive_dp_eps8`` another row of strategy naive: each word picks its
    own row only. A name no row is labelled with picks every row of it; an unknown word is refused."""
    quick = load_suite("quick")
    assert _keys(quick.select(strategies=["naive"])) == ["naive"]
    assert _keys(quick.select(strategies=["naive_dp_eps8"])) == ["naive_dp_eps8"]
    assert _keys(quick.select(strategies=["naive", "naive_dp_eps8"])) == ["naive", "naive_dp_eps8"]
    labelled = SuiteSpec("s", (ScenarioEntry("synthetic"),), (StrategyEntry("replay", label="replay_m50"),
                                                              StrategyEntry("replay", label="replay_m200"),
                                                              StrategyEntry("naive")))
    assert _keys(labelled.select(strategies=["replay"])) == ["replay_m50", "replay_m200"]
    with pytest.raises(ConfigError, match="has no strategy 'replya'. Did you mean 'replay'"):
        labelled.select(strategies=["replya"])


def test_a_suite_refused_before_its_first_run_leaves_no_output_folder(tmp_path, capsys):
    """A checkpoint that does not exist is refused after the output folder was checked: nothing is created."""
    out = tmp_path / "deep" / "out"
    assert main(["--suite", "quick", "--strategy", "taft", "--init", str(tmp_path / "nope.pt"), "--out", str(out),
                 "--quiet"]) == 2
    assert "checkpoint file(s) not found" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_output_folder_is_still_refused_before_the_first_run(tmp_path, capsys):
    """Nothing is created, yet ``--out`` under a file (not a folder) is refused by the probe of the nearest folder."""
    (tmp_path / "file").write_text("")
    assert main(["--suite", "quick", "--strategy", "naive", "--out", str(tmp_path / "file" / "out"), "--quiet"]) == 2
    assert "cannot be written to" in capsys.readouterr().err


def test_top_level_help_says_where_the_suite_flags_are(capsys):
    with pytest.raises(SystemExit):
        main(["--help"], prog="clbench")
    text = " ".join(capsys.readouterr().out.split())
    assert "`clbench --suite quick` is `clbench run --suite quick`" in text and "`clbench run --help`" in text
