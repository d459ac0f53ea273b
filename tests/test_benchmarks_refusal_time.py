"""benchmarks/refusal_time.py runs: the time a malformed suite takes to be refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_suite_files_refusal_benchmark_runs(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/refusal_time.py", "--repeat", "1"], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "duplicated key" in done.stdout and "error:" not in done.stdout
