"""Time from start to the refusal line for malformed suite files (at most 1 s on a quiet machine).

Each file of :data:`tests.test_suite_file.MALFORMED` (a duplicated key, an unknown key, strategy, scenario or
callback, a ``dp:`` that is not a mapping, an entry given twice, a label that cannot be a file name, a negative
seed, text that is not YAML, nesting past the limit) and of :data:`tests.test_suite_file.VALUES`, whose mistake is
in a VALUE that only the strategy's ``Config`` or the scenario's sizes know (``epochs: -1``, ``mem_size`` above the
stream, an optimizer the Config does not offer, a dp budget out of range or that no noise reaches, ViT heads or
patches that do not divide the width or the image): ``python -m clbench --suite FILE`` runs in a fresh process, timed
from before the process starts to its exit (the refusal is its last act), ``--repeat`` times; the median and the
worst are printed per file, with the refusal line.

Both kinds are refused without importing a strategy or scenario module, torch or Avalanche: the shape of a file is
checked from the registries' index, and so are the values, against what the index records of each shipped
strategy's Config, each scenario's sizes and input shape and each model's declared divisibility rules
(:mod:`clbench.recorded`; the dp budget from the torch-free :mod:`clbench.privacy.config`). What the index does not
record (sizes and shapes for scenario arguments no shipped suite gives, other ``model_args`` values, a plugin's
strategy) is refused by the full check, after the imports (about 13 s on the 2-core machine).

The command line's own refusals (:func:`tests.test_preflight.command_line_cases`: ``--jobs 0``, ``$CLBENCH_JOBS``,
``--out ''``, an unwritable or locked output folder, ``ulimit -f``, ``--device cuda`` without a GPU, a missing
``--init``) are timed the same way, and so is a dataset that no data root holds
(:func:`tests.test_preflight.dataset_case`). Every kind is timed twice: as is, and with a plugin package installed (a
distribution with a ``clbench.plugins`` entry point on ``PYTHONPATH``, as pip installs one), which used to send
even ``optimizer: sgdd`` to the full check. ``dp:`` on a strategy that cannot train privately needs every
strategy's ``private`` flag (the refusal lists the private ones): the package's are read from its code, not
imported, so no plugin index cache is written and every start is the package's first; that very first refusal,
before anything else ran, is also printed after the table.

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

from clbench.files import locked_folder  # noqa: E402
from tests._plugin_dist import STRATEGY_MODULE, installed_package  # noqa: E402
from tests.test_preflight import command_line_cases, dataset_case  # noqa: E402
from tests.test_suite_file import MALFORMED, VALUES  # noqa: E402 - the test's files, one list


def refusal(argv: list[str], env: dict[str, str], fsize: int = 0) -> tuple[float, str]:
    """Seconds from start to exit of ``python -m clbench ARGV`` (under the file size limit ``fsize`` when not 0),
    and its last stderr line."""
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clbench", *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "CLBENCH_JOBS": "1", **env}, preexec_fn=limit if fsize else None)
    seconds = time.perf_counter() - start
    if done.returncode != 2:
        raise SystemExit(f"{argv}: expected a refusal (exit 2), got exit {done.returncode}: {done.stderr}")
    return seconds, done.stderr.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"# {platform.node()}, {os.cpu_count()} cores, load average {load:.2f} at start; "
          f"python {sys.version.split()[0]}")
    print("| kind | median s | worst s | with a plugin installed: median s | worst s | refusal |\n"
          "|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        site = installed_package(folder / "site", "bench-plugin", "bench_plugin_methods", STRATEGY_MODULE)
        plugin = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
                  "CLBENCH_CACHE": str(folder / "cache")}
        kinds = {}
        for kind, text in {**MALFORMED, **{kind: text for kind, (text, _) in VALUES.items()}}.items():
            path = folder / f"{kind.split(' (')[0].replace(' ', '_')}.yaml"
            path.write_text(text)
            kinds[kind] = (["--suite", str(path), "--out", str(path) + ".out"], {}, 0)
        kinds.update({kind: tuple(case[:3]) for kind, case in command_line_cases(folder).items()})
        argv, env, _ = dataset_case(folder)
        kinds["dataset missing"] = (argv, env, 0)
        first = "dp: a strategy that cannot train privately"
        written, _ = refusal(kinds[first][0], {**kinds[first][1], **plugin})
        with locked_folder(folder / "locked", "the benchmark"):
            for kind, (argv, env, fsize) in kinds.items():
                plain = [refusal(argv, env, fsize) for _ in range(args.repeat)]
                with_plugin = [refusal(argv, {**env, **plugin}, fsize) for _ in range(args.repeat)]
                times = [[s for s, _ in runs] for runs in (plain, with_plugin)]
                line = plain[-1][1].removeprefix("error: ").replace(str(folder), "TMP")
                print(f"| {kind} | " + " | ".join(f"{statistics.median(t):.2f} | {max(t):.2f}" for t in times) +
                      f" | {line[:100]} |")
    print(f"\nThe first refusal with the package installed (dp on a strategy that cannot train privately; the "
          f"package's `private` flags read from its code, nothing cached): {written:.2f} s.")

if __name__ == "__main__":
    main()
