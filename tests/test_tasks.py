"""Task pools stopped mid-work: Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM to a
process whose shard members are training leaves no member training and does not wait for them (once, the driver
waited 9 minutes on a worker that kept training: ``concurrent.futures``' shutdown waited for every queued member)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

SCRIPT = """
import os, sys, time
from pathlib import Path
from clbench import tasks

FOLDER = Path(sys.argv[1])


def train_member(k):
    (FOLDER / f"{os.getpid()}.pid").write_text("")
    time.sleep(120)
    return k


with tasks.using(tasks.ProcessPool(2, threads=1)) as pool:
    pool.map(train_member, range(5))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                    # a zombie (exited, not reaped by its parent) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_pool_leaves_no_member_training(tmp_path, how):
    script = tmp_path / "members.py"
    script.write_text(SCRIPT)
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              # as a terminal starts it: a test process started in the background of a
                              # non-interactive shell ignores SIGINT, and its children would inherit that
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert time.monotonic() < deadline and driver.poll() is None, "the members never started"
            time.sleep(0.2)
        members = [int(p.stem) for p in tmp_path.glob("*.pid")]
        if how == "ctrl-c":
            os.killpg(driver.pid, signal.SIGINT)
        else:
            driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=20)             # was: until every queued member had trained (here 2 x 120 s)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in members) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in members if _alive(pid)]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
