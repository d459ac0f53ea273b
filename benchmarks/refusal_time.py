"""Time from start to the refusal line for malformed suite files (issue #37: at most 1 s on a quiet machine).

Each file of :data:`tests.test_load_checks.MALFORMED` (a duplicated key, an unknown key, strategy, scenario or
callback, a ``dp:`` that is not a mapping, an entry given twice, a label that cannot be a file name, a negative
seed, text that is not YAML, nesting past the limit) and of :data:`tests.test_load_checks.VALUES`, whose mistake is
in a VALUE that only the strategy's ``Config`` or the scenario's sizes know (``epochs: -1``, ``mem_size`` above the
stream, an optimizer the Config does not offer): ``python -m clbench --suite FILE`` runs in a fresh process, timed
from before the process starts to its exit (the refusal is its last act), ``--repeat`` times; the median and the
worst are printed per file, with the refusal line.

Both kinds are refused without importing a strategy or scenario module, torch or Avalanche: the shape of a file is
checked from the registries' index, and so are the values, against what the index records of each shipped
strategy's Config and each scenario's sizes (:mod:`clbench.recorded`). What the index does not record (sizes for
scenario arguments no shipped suite gives, ``model_args``, a plugin's strategy) is refused by the full check, after
the imports (about 13 s on the 2-core machine).

    python benchmarks/refusal_time.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_load_checks import MALFORMED, VALUES  # noqa: E402 - the test's files, one list


def refusal(path: Path) -> tuple[float, str]:
    """Seconds from start to exit of ``python -m clbench --suite path``, and its last stderr line."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clbench", "--suite", str(path), "--out", str(path) + ".out"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "CLBENCH_JOBS": "1"})
    seconds = time.perf_counter() - start
    if done.returncode != 2:
        raise SystemExit(f"{path.name}: expected a refusal (exit 2), got exit {done.returncode}: {done.stderr}")
    return seconds, done.stderr.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"# {platform.node()}, {os.cpu_count()} cores, load average {load:.2f} at start; "
          f"python {sys.version.split()[0]}")
    print("| file | median s | worst s | refusal |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, text in {**MALFORMED, **{name: text for name, (text, _) in VALUES.items()}}.items():
            path = Path(folder) / f"{name.split(' (')[0].replace(' ', '_')}.yaml"
            path.write_text(text)
            runs = [refusal(path) for _ in range(args.repeat)]
            seconds = [s for s, _ in runs]
            line = runs[-1][1].removeprefix("error: ").replace(str(path), path.name)
            print(f"| {name} | {statistics.median(seconds):.2f} | {max(seconds):.2f} | {line[:110]} |")


if __name__ == "__main__":
    main()
