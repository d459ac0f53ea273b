"""Startup cost of the command line, measured in fresh processes on this machine (no timed unit test: the numbers
depend on the machine and its load; tests/test_imports.py checks what is imported).

Prints, for each case, the wall time and the peak resident memory (``ru_maxrss`` of the child process):

- ``clbench list`` in this environment (no plugin package installed);
- ``clbench list`` in a fresh virtual environment with ``examples/clbench-example-plugin`` installed (it reuses this
  environment's packages through a ``.pth`` line, as tests/test_example_plugin.py does): the first listing (names and
  summaries read from the plugin's code), ``list --check`` (imports every plugin module: their index is cached,
  :func:`clbench.plugins.cache_file`), and a listing after it;
- a one-run suite, from the process start to its first training batch (the first ``on_batch_start``, where the
  process exits): TAFT on split_digits (the quick suite's row; the scenario builds an Avalanche benchmark, and
  ``avalanche.benchmarks`` imports ``avalanche.training`` itself) and the sequence model on MovieLens-100k (the
  dp_seqrec suite's ``nonprivate`` row; needs the data under ``$CLBENCH_DATA``), with whether ``avalanche.training``
  was imported by then. Runs in-process (``CLBENCH_JOBS=1``), as ``--jobs 1``.

Usage: ``python benchmarks/startup.py [--repeat N]`` (the best of N runs per case, default 3).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "clbench-example-plugin"
FIRST_BATCH = '''"""Ends the process at the first training batch: time, peak RSS, avalanche.training imported."""
import json, os, resource, sys, time
from clbench.callbacks import CallbackList


def first_batch(self, x, y):
    with open(os.environ["STARTUP_FIRST_BATCH"], "w") as f:
        json.dump({"t": time.time(), "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   "avalanche_training": "avalanche.training" in sys.modules}, f)
    os._exit(0)


CallbackList.on_batch_start = first_batch
'''
MEASURE = ("import resource, subprocess, sys, time\nt = time.perf_counter()\n"
           "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
           "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.returncode)")


def measure(command: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, float]:
    """``(seconds, peak RSS in MB)`` of ``command`` run to its end in a fresh process."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, env=env,
                         cwd=cwd, check=True).stdout.split()
    if out[2] != "0":
        raise RuntimeError(f"{' '.join(command)} exited {out[2]}")
    return float(out[0]), int(out[1]) / 1024


def best(repeat: int, run) -> tuple[float, float]:
    results = [run() for _ in range(repeat)]
    return min(r[0] for r in results), min(r[1] for r in results)


def plugin_venv(base: Path) -> Path:
    """A fresh venv that sees this environment's packages, with the example plugin installed; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    python = base / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "reuse.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    shutil.copytree(EXAMPLE, base / "example", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", str(base / "example")], check=True, capture_output=True)
    return python


def first_batch(base: Path, args: list[str], env: dict) -> dict:
    """Seconds from the process start to the first batch of the one-run suite ``args``, peak RSS (MB) by then."""
    plugin, marker = base / "startup_first_batch.py", base / "first_batch.json"
    plugin.write_text(FIRST_BATCH)
    marker.unlink(missing_ok=True)
    out = base / "out"
    shutil.rmtree(out, ignore_errors=True)
    start = time.time()
    subprocess.run([sys.executable, "-m", "clbench", "--plugins", str(plugin), *args, "--out", str(out), "--quiet",
                    "--quiet-table", "--device", "cpu"], capture_output=True, text=True, cwd=base,
                   env={**env, "STARTUP_FIRST_BATCH": str(marker), "CLBENCH_JOBS": "1"})
    if not marker.exists():
        raise RuntimeError(f"no batch reached: clbench {' '.join(args)}")
    data = json.loads(marker.read_text())
    return {"s": data["t"] - start, "mb": data["rss_kb"] / 1024, "avalanche_training": data["avalanche_training"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        env["XDG_CACHE_HOME"] = str(base / "cache")
        rows = [("clbench list (no plugin package)",
                 best(repeat, lambda: measure([sys.executable, "-m", "clbench", "list"], env, base)))]
        python = plugin_venv(base)
        rows.append(("clbench list, example plugin installed, first listing (read from its code)",
                     measure([str(python), "-m", "clbench", "list"], env, base)))
        rows.append(("clbench list --check, example plugin installed (imports every plugin module, caches its index)",
                     measure([str(python), "-m", "clbench", "list", "--check"], env, base)))
        rows.append(("clbench list, example plugin installed, index cached",
                     best(repeat, lambda: measure([str(python), "-m", "clbench", "list"], env, base))))
        rows.append(("python -c 'import torch' (for scale)",
                     best(repeat, lambda: measure([sys.executable, "-c", "import torch"], env, base))))
        for label, args in (("taft on split_digits (quick)", ["--suite", "quick", "--scenario", "split_digits",
                                                              "--strategy", "taft", "--seeds", "0"]),
                            ("seqrec on MovieLens-100k (dp_seqrec nonprivate)",
                             ["--suite", "dp_seqrec", "--strategy", "nonprivate", "--seeds", "0"])):
            try:
                runs = [first_batch(base, args, env) for _ in range(repeat)]
            except RuntimeError as exc:
                print(f"{label}: skipped ({exc}; is $CLBENCH_DATA set?)")
                continue
            rows.append((f"one-run suite to its first batch: {label}; avalanche.training imported: "
                         f"{runs[0]['avalanche_training']}", (min(r["s"] for r in runs), min(r["mb"] for r in runs))))
    print(f"{'case':100s} {'seconds':>8s} {'peak MB':>8s}   (best of {repeat} where repeated)")
    for label, (seconds, mb) in rows:
        print(f"{label:100s} {seconds:8.2f} {mb:8.0f}")


if __name__ == "__main__":
    main()
