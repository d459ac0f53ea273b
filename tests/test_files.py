"""Output folders and files (:mod:`clbench.files`): every writer of an output folder holds its lock, which names its
holder and is taken over from a process that died."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import files
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
    assert not [n for n in written if n.endswith(".tmp")] and not list((tmp_path / "out/runs").iterdir()), written
