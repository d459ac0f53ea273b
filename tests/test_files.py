"""Output folders and files (:mod:`clbench.files`): every writer of an output folder holds its lock, which names its
holder and is taken over from a process that died.

Every writer of an output folder holds its lock (:func:`clbench.files.locked_folder`), not only ``run``: a second
writer through :func:`clbench.api.run`, and ``leaderboard`` / ``report`` while a suite holds the folder, are refused
in one line naming what holds it and its pid; the lock of a process that died is taken over. (Before, the API wrote
records and the two commands rewrote the suite's tables into a folder a suite was running in.) The holder here is a
lock held by this process, not a slow run: the refusal is the same, and names this process's pid."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import api, files
from clbench.cli import main
from tests._cli import one_error_line, run_suite

ROOT = Path(__file__).resolve().parents[1]


PYTHON = sys.executable


def _python(code: str, cwd: Path = ROOT, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLBENCH_JOBS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, **kwargs)


# ------------------------------------------------------------------------------------------- one folder, one suite
HOLD = """
import sys, time
from clbench.files import locked_folder
with locked_folder(sys.argv[1], "the suite other (run)"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_suite_into_a_held_folder_is_refused_naming_the_holder_and_a_dead_holder_s_lock_is_taken_over(
        tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    holder = subprocess.Popen([PYTHON, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_suite(suite, out) == 2
        one_error_line(capsys, str(out), f"in use by the suite other (run) (pid {holder.pid})", "--out")
        assert not (out / "runs" / "synthetic__test_increasing_logits__s0.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / files.LOCK_FILE).read_text().strip() == f"{holder.pid} the suite other (run)"   # stays, stale
    assert run_suite(suite, out) == 0                                                # and is taken over
    assert (out / "runs" / "synthetic__test_increasing_logits__s0.json").exists()


def test_the_lock_is_released_when_the_suite_ends(tiny_suite, tmp_path):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    assert run_suite(suite, out) == 0
    with files.locked_folder(out, "test"):  # would raise FolderInUse if the finished suite still held it
        pass


def test_a_lock_file_of_an_older_clbench_holding_only_a_pid_is_refused_naming_that_pid(tmp_path):
    """Lock files written before they named their holder hold ``<pid>`` alone: still refused, as another process."""
    import fcntl

    path = tmp_path / files.LOCK_FILE
    path.write_text("4242\n")
    with open(path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(files.FolderInUse) as info:
            with files.locked_folder(tmp_path, "report", "wait"):
                pass
    assert str(info.value) == f"output folder {tmp_path} is in use by another clbench process (pid 4242); wait."


def test_the_lock_file_holds_the_holder_s_pid_and_name_while_held(tmp_path):
    with files.locked_folder(tmp_path, "leaderboard"):
        assert (tmp_path / files.LOCK_FILE).read_text().strip() == f"{os.getpid()} leaderboard"
        started = time.monotonic()
        result = _python("""
            import sys
            from clbench.files import FolderInUse, locked_folder
            try:
                with locked_folder(sys.argv[1], "report"):
                    print("taken")
            except FolderInUse as exc:
                print(exc)
        """.replace("sys.argv[1]", repr(str(tmp_path))))
        assert f"in use by leaderboard (pid {os.getpid()})" in result.stdout, result
        assert time.monotonic() - started < 60            # refused at once, not waited for


# ------------------------------------------------------------------------------------------------ disk full
def _disk_full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_writing_a_record_is_one_line_and_leaves_no_temporary_file(tiny_suite, tmp_path, capsys,
                                                                                    monkeypatch):
    real_write = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if self.name.endswith(".tmp"):
            real_write(self, "")                        # the file exists, empty, when the disk fills up
            _disk_full()
        return real_write(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert run_suite(tiny_suite([{"name": "test_increasing_logits"}]), tmp_path / "out") == 2
    one_error_line(capsys, "No space left on device", "free some space")
    written = [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()]
    # the first atomic write of the run (its artifacts' owner file, before the record) fails: nothing under runs/
    assert not [n for n in written if n.endswith(".tmp")] and not list((tmp_path / "out").glob("runs/*")), written


SMALL = {"train_per_class": 20, "test_per_class": 10}


RECORD = Path("runs") / "synthetic__test_increasing_logits__s0.json"


HELD = "output folder {} is in use by {} (pid {}); "


SUITE = "the suite s (run)"


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
