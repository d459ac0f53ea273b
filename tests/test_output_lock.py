"""Every writer of an output folder holds its lock (:func:`clbench.files.locked_folder`), not only ``run``: a second
writer through :func:`clbench.api.run`, and ``leaderboard`` / ``report`` while a suite holds the folder, are refused
in one line naming what holds it and its pid; the lock of a process that died is taken over. (Before, the API wrote
records and the two commands rewrote the suite's tables into a folder a suite was running in.) The holder here is a
lock held by this process, not a slow run: the refusal is the same, and names this process's pid."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import api, files
from clbench.cli import main
from tests._cli import one_error_line

SMALL = {"train_per_class": 20, "test_per_class": 10}
RECORD = Path("runs") / "synthetic__test_increasing_logits__s0.json"
HELD = "output folder {} is in use by {} (pid {}); "
"""The start of the refusal (folder, holder, pid); each writer ends it with what to do."""
SUITE = "the suite s (run)"
"""What a suite's lock names (``run`` writes ``the suite <name> (run)``)."""


def _api_run(out: Path):
    return api.run("synthetic", "test_increasing_logits", scenario_args=SMALL, device="cpu", out=out)


def _stale_lock(out: Path) -> int:
    """Leave ``out``'s lock file as a process that died while holding it does: its pid, no lock held. The pid."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / files.LOCK_FILE).write_text(dead.stdout)
    return int(dead.stdout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A folder with one finished record and no tables (what a suite part-way through holds)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    assert _api_run(out).status == "finished"
    return out


@pytest.fixture
def records(finished, tmp_path) -> Path:
    """A copy of :func:`finished` for one test to write into."""
    return Path(shutil.copytree(finished, tmp_path / "out"))


def test_a_second_api_run_into_the_folder_an_api_run_writes_is_refused_naming_its_pid(tmp_path, monkeypatch):
    out, write, refusals = tmp_path / "out", api.run_and_write, []

    def first(spec, folder):                # runs while the first api.run holds the folder
        monkeypatch.setattr(api, "run_and_write", write)
        with pytest.raises(files.FolderInUse) as info:
            _api_run(out)
        refusals.append(str(info.value))
        return write(spec, folder)

    monkeypatch.setattr(api, "run_and_write", first)
    assert _api_run(out).status == "finished"
    assert refusals == [HELD.format(out, "clbench.api.run", os.getpid()) + "wait for it to end or pass another out."]
    with files.locked_folder(out, SUITE):   # released when the run returned
        pass


def test_an_api_run_into_a_folder_a_suite_holds_is_refused_before_it_writes(tmp_path):
    out = tmp_path / "out"
    with files.locked_folder(out, SUITE):
        with pytest.raises(files.FolderInUse) as info:
            _api_run(out)
    assert str(info.value) == HELD.format(out, SUITE, os.getpid()) + "wait for it to end or pass another out."
    assert not (out / "runs").exists()


@pytest.mark.parametrize("command", [["leaderboard"], ["report"], ["report", "--html"]])
def test_leaderboard_and_report_are_refused_while_a_suite_holds_the_folder(command, records, capsys):
    with files.locked_folder(records, SUITE):
        assert main([*command, "--out", str(records)]) == 2
    assert one_error_line(capsys) == ("error: " + HELD.format(records, SUITE, os.getpid()) +
                                      "wait for it to end: it writes its leaderboard and report itself.")
    assert not any((records / name).exists() for name in ("leaderboard.csv", "report.md", "report.html"))


@pytest.mark.parametrize("command", [["leaderboard"], ["report"]])
def test_leaderboard_and_report_take_over_the_lock_of_a_dead_process(command, records):
    _stale_lock(records)
    assert main([*command, "--out", str(records), "--quiet-table"]) == 0
    assert (records / "leaderboard.csv").exists() and (records / "report.md").exists()
    assert (records / files.LOCK_FILE).read_text().strip() == f"{os.getpid()} {command[0]}"


def test_an_api_run_takes_over_the_lock_of_a_dead_process(tmp_path):
    out = tmp_path / "out"
    _stale_lock(out)
    assert _api_run(out).status == "finished" and (out / RECORD).exists()
    assert (out / files.LOCK_FILE).read_text().strip() == f"{os.getpid()} clbench.api.run"


def test_leaderboard_of_a_folder_without_records_makes_no_folder(tmp_path, capsys):
    missing = tmp_path / "typo"
    assert main(["leaderboard", "--out", str(missing)]) == 2
    assert one_error_line(capsys, "no run records in")
    assert not missing.exists()


def test_analyze_paired_is_refused_while_a_suite_holds_the_folder(records, capsys):
    """analyze paired reads the records a suite is still writing: refused, no paired.csv."""
    with files.locked_folder(records, SUITE):
        assert main(["analyze", "paired", "--run", str(records), "--pairs", "a:b"]) == 2
    assert one_error_line(capsys) == ("error: " + HELD.format(records, SUITE, os.getpid()) +
                                      "wait for it to end: its records are still being written.")
    assert not (records / "paired.csv").exists()
