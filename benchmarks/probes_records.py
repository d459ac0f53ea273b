"""The records and refusal probes, run as a user (and an adversary) would: from the command line, on current code.

Each probe prints one line, ``<probe>: <class> (<seconds>s) <the line the command printed>``, and a count by class
ends the output:

- ``held``: refused in one line that says what to do (before the heavy imports where it can: no torch imported, at
  most 1 s), or handled correctly (the record kept aside, the edited value never shown, the worker gone);
- ``late``: refused, but only after importing torch (or after more than 1 s of the command's CPU time, user +
  system: on a loaded machine its wall time also counts the waits for a core, so both are printed, with the load at
  the top, and ``[torch imported]`` when it was);
- ``silent``: accepted and wrong (an edited record shown as a result, an unescaped label, a worker left training);
- ``lost``: a finished record or a file outside the results folder destroyed;
- ``traceback``: a Python traceback instead of a line.

The probes: records edited after their run (metrics, spec, matrix; a consistent spec + hyperparameters edit) read by
``leaderboard``, ``report --html``, ``analyze paired``, ``forget`` and resume; markdown/HTML/CSV injection through a
suite's description and a record's free-text fields; another suite run into the same ``--out``; a rerun with a
changed configuration and without ``model_snapshot`` (``load_snapshot`` afterwards); ``--force`` with
``artifacts/<run>``, ``artifacts/`` or a record a symbolic link to outside the folder; the plugin index cache edited to
claim ``naive``, to hide an installed name and to invent one; refusal times of suite and command-line mistakes with a
plugin package installed; ``batch_size: 10^12``; ImageNet's flat ``val/`` with and without its ground-truth file;
images of mixed sizes; a logger attached to a finished run; Ctrl-C (SIGINT to the process group, as a terminal sends
it, and to the driver alone) during a ``--jobs 2`` suite.

The fixtures are tiny (split_digits in 2 steps, 1 epoch; 8x8 images), so the whole list takes about 5 minutes on a
2-core machine; everything is written under a temporary folder (``--keep DIR`` to keep it)::

    CLBENCH_DATA=/path/to/data python benchmarks/probes_records.py [--only WORD] [--keep DIR]

Only the standard library is imported here: every probe is a ``python -m clbench ...`` (or ``run_bench.py``)
subprocess, plus one ``load_snapshot`` call as a user's analysis script would make it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests._plugin_dist import installed_package  # noqa: E402 - standard library only

LIMIT_S = 1.0                       # a refusal within 1 s, before the heavy imports
HEAVY = ("torch", "avalanche", "numpy")
RUN = "split_digits__naive__s0"
OTHER = "split_digits__replay__s0"
CLASSES = ("held", "late", "silent", "lost", "traceback")


@dataclass
class Done:
    rc: int
    out: str
    err: str
    seconds: float
    heavy: list[str]
    cpu: float = 0.0        # the command's user + system CPU seconds (the process and what it waited for)

    @property
    def text(self) -> str:
        return self.out + self.err

    def last(self) -> str:
        """The last line printed on stderr (else stdout) that is not a progress or import-time line."""
        lines = [line for line in (self.err or self.out).strip().splitlines() if line.strip()]
        return lines[-1].strip() if lines else "(nothing printed)"

    def naming(self, *words: str) -> str | None:
        """The first printed line holding every one of ``words``."""
        return next((line.strip() for line in self.text.splitlines() if all(w in line for w in words)), None)


def clbench(argv: list[str], env: dict | None = None, timeout: float = 300, script: str = "-m clbench") -> Done:
    """``python -m clbench ARGV`` (or ``python run_bench.py ARGV``) in a fresh process, timed from before its start
    to its exit; the heavy modules it imported (``-X importtime``) are kept apart from its output."""
    command = [sys.executable, "-X", "importtime", *script.split(), *argv]
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "CLBENCH_JOBS": "1", **(env or {})})
    seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu
    err, heavy = [], []
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[-1].strip()
            if name in HEAVY:
                heavy.append(name)
        else:
            err.append(line)
    return Done(done.returncode, done.stdout, "\n".join(err), seconds, heavy, cpu)


def _children_cpu() -> float:
    """User + system CPU seconds of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def python(code: str) -> Done:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return Done(done.returncode, done.stdout, done.stderr, time.perf_counter() - start, [])


RESULTS: list[tuple[str, str]] = []


def report(name: str, kind: str, seconds: float, line: str) -> None:
    RESULTS.append((name, kind))
    print(f"{name}: {kind} ({seconds:.2f}s) {' '.join(line.split())[:300]}", flush=True)


def refusal(name: str, done: Done, expect: str = "", limit: float = LIMIT_S) -> None:
    """A command that must be refused in one line (exit 2) holding ``expect``, within ``limit`` CPU seconds and
    without the heavy imports."""
    line = done.last()
    if "Traceback" in done.text:
        kind = "traceback"
    elif done.rc == 0 or (expect and expect not in done.text):
        kind = "silent"
    elif done.heavy or done.cpu > limit:
        kind = "late"
        line += " [torch imported]" if "torch" in done.heavy else ""
    else:
        kind = "held"
    report(name, kind, done.seconds, f"[cpu {done.cpu:.2f}s] {line}")


# --- fixtures ------------------------------------------------------------------------------------------------------

def suite(path: Path, name: str, strategies: str, seeds: str = "[0]", scenario: str = "split_digits",
          scenario_args: str = "{n_experiences: 2}", extra: str = "") -> Path:
    path.write_text(f"suite: {name}\n{extra}seeds: {seeds}\nscenarios:\n"
                    f"  - {{name: {scenario}, args: {scenario_args}}}\nstrategies:\n{strategies}")
    return path


NAIVE = "  - {name: naive, preset: cpu, args: {epochs: 1}, callbacks: [model_snapshot]}\n"
REPLAY = "  - {name: replay, preset: cpu, args: {epochs: 1, mem_size: 20}}\n"
HOSTILE = "<script>alert(1)</script> | =HYPERLINK(\"http://x\") @cmd"


def run(suite_file: Path, out: Path, *more: str, timeout: float = 300) -> Done:
    return clbench(["--suite", str(suite_file), "--out", str(out), "--jobs", "1", "--quiet", "--quiet-table", *more],
                   timeout=timeout)


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1))


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def png(path: Path, width: int, height: int, shade: int) -> None:
    """A grey RGB PNG written with zlib (no imaging library needed)."""
    row = b"\x00" + bytes([shade, shade, shade]) * width
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data +  # noqa: E731
                                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
                     chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


def imagenet(root: Path, flat: bool, truth: bool, mixed: bool = False) -> Path:
    """A 2-class ImageNet-style folder of 8x8 PNGs: ``train/<wnid>/``, and ``val/`` either with class folders or
    flat (ImageNet's official layout) with ``LOC_val_solution.csv`` beside it when ``truth``."""
    wnids = ["n01440764", "n01443537"]
    rows = ["ImageId,PredictionString"]
    for c, wnid in enumerate(wnids):
        (root / "train" / wnid).mkdir(parents=True)
        for i in range(6):
            size = 8 + (2 * (i % 2) if mixed else 0)
            png(root / "train" / wnid / f"{wnid}_{i}.png", size, size, 40 + 150 * c + i)
        val = root / "val" if flat else root / "val" / wnid
        val.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            image = f"ILSVRC2012_val_{c * 3 + i:08d}"
            png(val / f"{image}.png", 8, 8, 40 + 150 * c + i)
            rows.append(f"{image},{wnid} 0 0 8 8")
    if flat and truth:
        (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    return root


PLUGIN = """from dataclasses import dataclass

import torch

from clbench.protocol import ParamCount, StrategyBase
from clbench.registry import STRATEGIES


@dataclass
class ProbeConfig:
    lr: float = 0.1


@STRATEGIES.register("probe_plugin_nm")
class ProbePlugin(StrategyBase):
    \"\"\"A strategy of an installed package.\"\"\"

    Config = ProbeConfig
    PRESETS = {"cpu": {"lr": 0.01}}

    def train(self, experience):
        pass

    def predict(self, x, task_labels):
        return torch.zeros(len(x), 4)

    def num_parameters(self):
        return ParamCount(1, 1)
"""


def plugin_site(folder: Path) -> tuple[Path, str]:
    """An installed distribution ``probe-plugin 0.1`` whose entry point names a module registering the strategy
    ``probe_plugin_nm``; returns the site folder and the module's sha256."""
    site = installed_package(folder, "probe-plugin", "probe_plugin_methods", PLUGIN)
    return site, hashlib.sha256((site / "probe_plugin_methods.py").read_bytes()).hexdigest()


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- the probes ----------------------------------------------------------------------------------------------------

def probe_base(w: Path) -> Path:
    """The fixture: naive (with model_snapshot) and replay, seed 0; the suite's description is hostile markdown."""
    base = w / "A"
    done = run(suite(w / "a.yaml", "probe_a", NAIVE + REPLAY, extra=f"description: '{HOSTILE}'\n"), base)
    if done.rc != 0 or not (base / "runs" / f"{RUN}.json").exists():
        raise SystemExit(f"the fixture run failed (exit {done.rc}):\n{done.text[-3000:]}")
    report_md = (base / "report.md").read_text() + (base / "leaderboard.md").read_text()
    raw = "<script>" in report_md or "| =HYPERLINK" in report_md
    report("injection: hostile suite description in report.md/leaderboard.md", "silent" if raw else "held",
           done.seconds, "copied unescaped" if raw else "escaped or not copied")
    return base


EDITS = {
    "metrics avg_inc_acc 99.99": (lambda d: d["metrics"].__setitem__("avg_inc_acc", 99.99), "metrics.avg_inc_acc"),
    "spec epochs 5 under epochs 1's identity": (lambda d: d["spec"]["strategy"]["args"].__setitem__("epochs", 5),
                                                "epochs"),
    "matrix cell 0.9999 (both copies)": (lambda d: [m[0].__setitem__(0, 0.9999) for m in
                                                   (d["accuracy_matrix"], d["matrices"]["accuracy"])], "metrics."),
    "accuracy_matrix only": (lambda d: d["accuracy_matrix"][1].__setitem__(0, 99.99), "accuracy_matrix"),
    "spec + strategy_config epochs 5 (identity hash kept)": (
        lambda d: (d["spec"]["strategy"]["args"].__setitem__("epochs", 5),
                   d["strategy_config"].__setitem__("epochs", 5)), "identity_hash"),
    "last_acc 99.99 and avg_inc_acc kept": (lambda d: d["metrics"].__setitem__("last_acc", 99.99), "metrics.last_acc"),
}


def edited_copy(base: Path, folder: Path, change) -> Path:
    shutil.copytree(base, folder, symlinks=True)
    edit(folder / "runs" / f"{RUN}.json", change)
    return folder / "runs" / f"{RUN}.json"


def leaked(done: Done, record: Path) -> bool:
    """Whether the edited value 99.99 is printed anywhere but in the line refusing the record."""
    return any("99.99" in line and record.name not in line for line in done.text.splitlines())


def shown(folder: Path, done: Done, record: Path) -> bool:
    """Whether the edited naive record counts as a result: a naive row in leaderboard.csv, or 99.99 printed."""
    csv = folder / "leaderboard.csv"
    rows = csv.read_text().splitlines()[1:] if csv.exists() else []
    return any(",naive," in row for row in rows) or leaked(done, record)


def probe_edits(w: Path, base: Path) -> Path:
    first = None
    for i, (what, (change, field)) in enumerate(EDITS.items()):
        folder = w / f"edit{i}"
        record = edited_copy(base, folder, change)
        for name in ("leaderboard.csv", "leaderboard.md", "report.md"):
            (folder / name).unlink(missing_ok=True)
        done = clbench(["leaderboard", "--out", str(folder), "--quiet-table"])
        line = done.naming(str(record), field) or done.naming(record.name) or done.last()
        kind = ("traceback" if "Traceback" in done.text else "silent" if shown(folder, done, record) or
                not done.naming(record.name, field) else "held")
        report(f"edited record, {what}: leaderboard", kind, done.seconds, line)
        first = first or (folder, record)
    folder, record = first
    field = "metrics.avg_inc_acc"
    done = clbench(["report", "--out", str(folder), "--html", "--quiet-table"])
    pages = "".join((folder / n).read_text() for n in ("report.md", "report.html") if (folder / n).exists())
    kind = ("traceback" if "Traceback" in done.text else "silent" if "99.99" in pages or leaked(done, record) or
            not done.naming(record.name, field) else "held")
    report("edited record (metrics): report --html", kind, done.seconds, done.naming(record.name, field) or done.last())
    done = clbench(["analyze", "paired", "--run", str(folder), "--pairs", "naive:replay"], script="run_bench.py")
    kind = ("traceback" if "Traceback" in done.text else "silent" if leaked(done, record) or
            not done.naming(record.name, field) else "held")
    report("edited record (metrics): run_bench.py analyze paired", kind, done.seconds,
           done.naming(record.name, field) or done.last())
    done = clbench(["forget", "--run", str(record), "--touch", "1"], script="run_bench.py")
    kind = ("traceback" if "Traceback" in done.text else "silent" if done.rc == 0 or
            not done.naming(record.name, field) else "held")
    report("edited record (metrics): run_bench.py forget", kind, done.seconds,
           done.naming(record.name, field) or done.last())
    before = record.read_text()
    done = run(w / "a.yaml", folder, "--strategy", "naive")
    now = json.loads(record.read_text())
    kept = list((folder / "replaced").glob(f"*__{RUN}/runs/{RUN}.json"))
    kind = ("traceback" if "Traceback" in done.text else "silent" if now["metrics"]["avg_inc_acc"] == 99.99 or
            done.rc != 0 else "lost" if not any(k.read_text() == before for k in kept) else
            "held" if done.naming(record.name, field) else "silent")
    report("edited record (metrics): resume reruns it", kind, done.seconds,
           done.naming(record.name, field) or done.last())
    return folder


def probe_injection(w: Path, base: Path) -> None:
    """Free-text fields that are not part of a record's identity (the machine's name, a failed run's reason) set to
    hostile markdown/HTML/CSV: every table escapes them."""
    folder = w / "inject"
    shutil.copytree(base, folder)
    edit(folder / "runs" / f"{OTHER}.json", lambda d: d["env"].__setitem__("cpu_model", HOSTILE))

    def failed(d):
        d["status"], d["reason"] = "failed", HOSTILE
    edit(folder / "runs" / f"{RUN}.json", failed)
    done = clbench(["report", "--out", str(folder), "--html", "--quiet-table"])
    markdown = "".join((folder / n).read_text() for n in ("report.md", "leaderboard.md") if (folder / n).exists())
    csv = (folder / "leaderboard.csv").read_text() if (folder / "leaderboard.csv").exists() else ""
    html = (folder / "report.html").read_text() if (folder / "report.html").exists() else ""
    wrong = [where for where, bad in (("markdown <script>", "<script>" in markdown),
                                      ("markdown bare |", "</script> | =" in markdown),
                                      ("csv formula", any(cell.startswith(("=", "@")) for line in csv.splitlines()
                                                          for cell in line.split(","))),
                                      ("html <script>", "<script>alert" in html)) if bad]
    kind = "traceback" if "Traceback" in done.text else "silent" if wrong else "held"
    report("injection: hostile env.cpu_model and failed reason in report.md/.html/leaderboard.csv", kind,
           done.seconds, f"unescaped: {', '.join(wrong)}" if wrong else "escaped everywhere")


def probe_other_suite(w: Path, base: Path) -> None:
    folder = w / "shared"
    shutil.copytree(base, folder)
    before = (folder / "runs" / f"{RUN}.json").read_text()
    done = run(suite(w / "b.yaml", "probe_b", "  - {name: naive, preset: cpu, args: {epochs: 1}}\n"), folder)
    records = [json.loads(p.read_text()) for p in (folder / "runs").glob("*.json")]
    kept = any(p.read_text() == before for p in (folder / "runs").glob("*.json"))
    suites = sorted({r["spec"]["suite"] for r in records})
    kind = ("traceback" if "Traceback" in done.text else "lost" if not kept else
            "held" if done.rc == 2 or "probe_b" in suites else "silent")
    report("another suite run into the same --out", kind, done.seconds,
           f"first suite's naive record {'kept' if kept else 'NOT in runs/'}; suites in runs/: {suites}; "
           f"{done.last()}")


def probe_changed_config(w: Path, base: Path) -> None:
    folder = w / "changed"
    shutil.copytree(base, folder)
    before = (folder / "runs" / f"{RUN}.json").read_text()
    changed = suite(w / "c.yaml", "probe_a", "  - {name: naive, preset: cpu, args: {epochs: 2}}\n" + REPLAY)
    done = run(changed, folder, "--strategy", "naive")
    kept = [p for p in (folder / "replaced").glob(f"*__{RUN}/runs/{RUN}.json") if p.read_text() == before]
    line = done.naming("replacing", RUN) or done.last()
    kind = ("traceback" if "Traceback" in done.text else "lost" if not kept else
            "held" if done.naming("replacing", RUN) else "silent")
    report("rerun with a changed configuration keeps the old record aside", kind, done.seconds, line)
    artifacts = folder / "artifacts" / RUN
    got = python(f"from clbench.snapshots import load_snapshot\nload_snapshot({str(artifacts)!r})\nprint('LOADED')")
    line = (got.err.strip().splitlines() or ["(nothing)"])[-1]
    kind = ("silent" if "LOADED" in got.out else "traceback" if not any(
        e in line for e in ("FileNotFoundError", "ForeignState")) else "held")
    report("run redone without model_snapshot: load_snapshot", kind, got.seconds,
           "returned the old model.pt" if kind == "silent" else line.split(": ", 1)[-1])


def probe_links(w: Path, base: Path) -> None:
    cases = {"artifacts/<run> a link to outside": f"artifacts/{OTHER}",
             "artifacts/ a link to outside": "artifacts",
             "runs/<run>.json a link to an outside file": f"runs/{OTHER}.json"}
    for i, (what, relative) in enumerate(cases.items()):
        folder, outside = w / f"link{i}", w / f"outside{i}"
        shutil.copytree(base, folder)
        target = folder / relative
        outside.mkdir()
        shutil.move(target, outside / target.name)
        target.symlink_to(outside / target.name, target_is_directory=(outside / target.name).is_dir())
        before = digest(outside)
        done = run(w / "a.yaml", folder, "--force", "--strategy", "replay")
        after = digest(outside)
        kind = ("traceback" if "Traceback" in done.text else "lost" if after != before else
                "late" if done.rc == 2 and done.heavy else
                "held" if done.rc == 2 or (folder / "runs" / f"{OTHER}.json").is_file() else "silent")
        report(f"--force with {what}", kind, done.seconds,
               ("outside files changed: " if after != before else "") + done.last())


def probe_logger(w: Path, base: Path) -> None:
    folder = w / "logger"
    shutil.copytree(base, folder)
    logged = suite(w / "l.yaml", "probe_a", "  - {name: naive, preset: cpu, args: {epochs: 1}, "
                                            "callbacks: [model_snapshot, tensorboard]}\n" + REPLAY)
    done = run(logged, folder, "--strategy", "naive")
    line = done.naming("logged nothing") or done.last()
    kind = ("traceback" if "Traceback" in done.text else "held" if done.naming("logged nothing") and
            ("--force" in line or "rerun" in line or "run again" in line) else "silent")
    report("a logger attached to a finished run", kind, done.seconds, line)


def probe_cache(w: Path) -> None:
    site, sha = plugin_site(w / "site_cache")
    env_base = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    cases = {
        "claims naive": ({"probe_plugin_nm": "", "naive": "Not the shipped naive."}, "naive", None),
        "hides the installed name": ({}, None, "probe_plugin_nm"),
        "invents a name": ({"probe_plugin_nm": "", "probe_invented": "Invented."}, "probe_invented", None),
    }
    for what, (entries, absent_as_plugin, present) in cases.items():
        cache_root = w / f"cache_{what.split()[0]}"
        cache = cache_root / "plugin_index" / "probe-plugin-0.1.json"
        cache.parent.mkdir(parents=True)
        cache.write_text(json.dumps({"modules": {"probe_plugin_methods": {"sha256": sha,
                                                                          "entries": {"strategy": entries}}}}))
        env = {**env_base, "CLBENCH_CACHE": str(cache_root)}
        done = clbench(["list"], env=env)
        lines = done.out.splitlines()
        lie = ((absent_as_plugin and any(line.split()[:1] == [absent_as_plugin] and "probe_plugin" in line
                                         for line in lines)) or
               (present and not any(line.split()[:1] == [present] for line in lines)))
        warned = done.naming(str(cache))
        kind = "traceback" if "Traceback" in done.text else "silent" if lie or not warned else "held"
        report(f"plugin index cache {what}: clbench list", kind, done.seconds, warned or "no line names the cache")
        if what == "claims naive":
            bad = suite(w / "cache_naive.yaml", "x", "  - {name: naive, args: {optimizer: sgdd}}\n", scenario_args="{}")
            refusal("plugin index cache claims naive: a naive suite with optimizer sgdd", clbench(
                ["--suite", str(bad), "--out", str(w / "cache_out")], env=env), "unknown optimizer 'sgdd'")


def probe_refusals(w: Path) -> None:
    """Mistakes refused before any run, timed with a plugin package installed."""
    site, _ = plugin_site(w / "site_refusal")
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "CLBENCH_CACHE": str(w / "cache_refusal")}
    out = ["--out", str(w / "refused_out"), "--quiet"]

    def suite_file(name: str, strategies: str, scenarios: str = "[split_digits]") -> list[str]:
        path = w / f"refuse_{name}.yaml"
        path.write_text(f"suite: x\nscenarios: {scenarios}\nstrategies:\n{strategies}")
        return ["--suite", str(path), *out]

    quick = ["--suite", "quick", *out]
    data = w / "nodata"
    cases = {
        "optimizer: sgdd": (suite_file("sgdd", "  - {name: replay, args: {optimizer: sgdd}}\n"), {}, "sgdd"),
        "unknown strategy": (suite_file("unknown", "  - {name: naiv}\n"), {}, "naiv"),
        "unknown scenario": (suite_file("unknown_scenario", "  - naive\n", "[split_digitz]"), {}, "split_digitz"),
        "--strategy not in the suite": (["--suite", "quick", "--strategy", "naiv", *out], {}, "naiv"),
        "--out not writable": (["--suite", "quick", "--out", "/proc/probe_out", "--quiet"], {}, "/proc/probe_out"),
        "--out ''": (["--suite", "quick", "--out", ""], {}, "--out"),
        "--jobs 0": ([*quick, "--jobs", "0"], {}, "--jobs"),
        "--jobs -1": ([*quick, "--jobs", "-1"], {}, "--jobs"),
        "--threads 0": ([*quick, "--threads", "0"], {}, "--threads"),
        "--retries -1": ([*quick, "--retries", "-1"], {}, "--retries"),
        "--seeds -1": ([*quick, "--seeds", "-1"], {}, "seed"),
        "dp: epsilon no noise reaches": (suite_file("dp", "  - {name: naive, dp: {epsilon: 0.01, delta: 1e-5}}\n"),
                                         {}, "epsilon"),
        "dp: delta 1": (suite_file("dp_delta", "  - {name: naive, dp: {epsilon: 3.0, delta: 1.0}}\n"), {}, "delta"),
        "dp with a replay memory": (suite_file("dp_replay", "  - {name: replay, dp: {epsilon: 3.0}}\n"), {}, "dp"),
        "dataset missing": (["--suite", str(suite(w / "refuse_data.yaml", "x", "  - naive\n",
                                                    scenario="split_cifar100", scenario_args="{}")), *out],
                            {"CLBENCH_DATA": str(data), "HOME": str(data)}, "cifar"),
        "--device cuda without CUDA": ([*quick, "--device", "cuda"], {"CUDA_VISIBLE_DEVICES": ""}, "cuda"),
        "vit: heads not dividing the width": (
            suite_file("heads", "  - {name: naive, args: {model: vit, model_args: {num_heads: 5}}}\n"), {},
            "num_heads"),
        "vit: heads not dividing a given width": (
            suite_file("heads_width", "  - {name: naive, args: {model: vit, model_args: {embed_dim: 48, "
                                      "num_heads: 5}}}\n"), {}, "num_heads"),
        "vit: patch not dividing the image": (
            suite_file("patch", "  - {name: naive, args: {model: vit, model_args: {patch_size: 3}}}\n"), {},
            "patch_size"),
        "batch_size 10^12": (suite_file("batch", "  - {name: replay, args: {batch_size: 1000000000000}}\n"), {},
                             "batch_size"),
        "batch_size 10^12 with scenario arguments": (
            suite_file("batch_args", "  - {name: naive, args: {batch_size: 1000000000000}}\n",
                       "[{name: split_digits, args: {n_experiences: 2}}]"), {}, "batch_size"),
        "batch_size 1e12 (a float)": (suite_file("batch_float", "  - {name: naive, args: {batch_size: 1e12}}\n"),
                                      {}, "batch_size"),
        "mem_size above the stream": (suite_file("mem", "  - {name: replay, args: {mem_size: 100000}}\n"), {},
                                      "mem_size"),
    }
    if shutil.which("nvidia-smi") is not None:
        del cases["--device cuda without CUDA"]
    first = cases["dp with a replay memory"]       # the first start with the package: nothing cached
    refusal("refusal with a plugin installed, its first start (nothing cached): dp with a replay "
            "memory", clbench(first[0], env={**env, **first[1]}), first[2])
    for what, (argv, more, expect) in cases.items():
        refusal(f"refusal with a plugin installed, {what}", clbench(argv, env={**env, **more}), expect)


def probe_imagenet(w: Path) -> None:
    def scenario(root: Path) -> str:
        return f"{{root: '{root}', n_experiences: 1}}"
    strategies = "  - {name: naive, preset: cpu, args: {epochs: 1, model: mlp}}\n"
    cases = {"ImageNet flat val/ with LOC_val_solution.csv": (imagenet(w / "in_truth", True, True), None),
             "ImageNet flat val/ without a ground-truth file": (imagenet(w / "in_flat", True, False), "ground-truth"),
             "images of mixed sizes": (imagenet(w / "in_mixed", False, True, mixed=True), "image_size")}
    for what, (root, expect) in cases.items():
        path = suite(w / f"{root.name}.yaml", root.name.replace("_", "-"), strategies,
                     scenario="split_imagenet_subset", scenario_args=scenario(root))
        done = run(path, w / f"{root.name}_out")
        records = [json.loads(p.read_text()) for p in (w / f"{root.name}_out" / "runs").glob("*.json")]
        finished = [r for r in records if r["status"] == "finished"]
        if expect is None:
            ok = done.rc == 0 and finished and finished[0]["test_sizes"] == [6]
            report(f"{what}: read", "traceback" if "Traceback" in done.text else "held" if ok else "silent",
                   done.seconds, f"finished, test sizes {finished[0]['test_sizes']}" if finished else done.last())
        else:
            kind = ("traceback" if "Traceback" in done.text else "silent" if finished or expect not in done.text else
                    "late" if records else "held")
            report(f"{what}: refused naming {expect}", kind, done.seconds,
                   done.naming(expect) or done.last())


def probe_interrupt(w: Path) -> None:
    long = suite(w / "long.yaml", "probe_long", "  - {name: naive, preset: cpu, args: {epochs: 400}}\n"
                                                "  - {name: replay, preset: cpu, args: {epochs: 400, mem_size: 20}}\n")
    for i, (what, to_group) in enumerate((("Ctrl-C (SIGINT to the process group)", True),
                                          ("SIGINT to the driver alone", False))):
        out = w / f"interrupt{i}"
        command = [sys.executable, "-m", "clbench", "--suite", str(long), "--out", str(out), "--jobs", "2", "--quiet"]
        driver = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True, env={**os.environ, "CLBENCH_JOBS": "2"},
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        logs = [out / "artifacts" / run_id / "training_log.jsonl" for run_id in (RUN, OTHER)]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and driver.poll() is None and not all(
                p.exists() and p.stat().st_size for p in logs):
            time.sleep(0.5)
        workers = descendants(driver.pid)
        start = time.perf_counter()
        if driver.poll() is None:
            (os.killpg(driver.pid, signal.SIGINT) if to_group else os.kill(driver.pid, signal.SIGINT))
        try:
            _, err = driver.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            driver.kill()
            _, err = driver.communicate()
        seconds = time.perf_counter() - start
        grace = time.monotonic() + 5
        while time.monotonic() < grace and any(alive(p) for p in workers):
            time.sleep(0.2)
        left = [p for p in workers if alive(p)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        lines = [line for line in err.strip().splitlines() if line.strip()]
        kind = ("traceback" if "Traceback" in err else "silent" if left or not workers else
                "late" if seconds > 10 else "held")
        report(f"{what} during --jobs 2", kind, seconds,
               f"exit {driver.returncode}, {len(workers)} worker process(es), {len(left)} left running; "
               f"{lines[-1] if lines else '(nothing printed)'}")


PROBES = ("base", "edits", "injection", "other_suite", "changed_config", "links", "logger", "cache", "refusals",
          "imagenet", "interrupt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=PROBES, help="run only these groups (base is always run)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary folder)")
    args = parser.parse_args()
    chosen = set(args.only or PROBES)
    work = args.keep or Path(tempfile.mkdtemp(prefix="probes_records_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start; work folder {work}", flush=True)
    start = time.perf_counter()
    try:
        needs_base = chosen & {"base", "edits", "injection", "other_suite", "changed_config", "links", "logger"}
        base = probe_base(work) if needs_base else None
        for name in PROBES[1:]:
            if name in chosen:
                function = globals()[f"probe_{name}"]
                function(work, base) if function.__code__.co_argcount == 2 else function(work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    counts = Counter(kind for _, kind in RESULTS)
    print(f"# {len(RESULTS)} probes in {time.perf_counter() - start:.0f} s: " +
          ", ".join(f"{counts[k]} {k}" for k in CLASSES))
    sys.exit(0 if counts["held"] == len(RESULTS) else 1)


if __name__ == "__main__":
    main()
