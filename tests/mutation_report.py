"""`make mutation`: mutation testing of the core that decides numbers and settings, one mutmut run per group.

Usage: ``python tests/mutation_report.py [GROUP ...] [--survivors] [--collect] [--resume] [--help]``. The groups and
their tests are ``[tool.clbench.mutation]`` in pyproject.toml (``mutate``: files; ``tests``: pytest arguments: the
fast tests that matter for those files; ``data``, optional: committed files those tests read, such as reference
records); the other mutmut settings come from ``[tool.mutmut]``. Each group runs in a
fresh copy of the committed tree (``git archive HEAD``: the scores name a commit; commit first) under
``build/mutation/<group>/`` (mutmut keeps stale unmutated modules in its ``mutants/`` copy, and a fresh copy keeps one
group's run from reading another's), niced, one mutant at a time (``--max-children 1``).

Printed per group and in ``build/mutation/report.md``: mutants, killed (a test failed or a mutant timed out),
survived, no test reaches it (counts as not killed), and the score ``killed / mutants``; with ``--survivors`` the
diff of every surviving mutant (``mutmut show``), else their names. ``--collect`` runs nothing: it reports what
the groups' mutmut runs under ``build/mutation/`` have recorded so far (mutants not yet run count as "other").
``--resume`` goes on with a group's stopped run (mutmut keeps each mutant's result in its copy and runs only those
without one) when the group's mutated files, ``tests/`` and pyproject.toml are the same at HEAD as at the commit its
copy was made from (the score still names that commit, and it holds for HEAD); otherwise the group starts afresh,
saying why. A long group can so be measured over several sittings; its minutes column sums them.
The property tests run with ``CLBENCH_HYPOTHESIS_EXAMPLES=25`` examples per test here (60 in ``make test``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutation"
COPIED = ("clbench", "strategies", "scenarios", "tests", "README.md", "docs", "run_bench.py")
MAPPED = ("strategies", "scenarios")
"""Folders the installation maps below ``clbench`` (``clbench.strategies``...): moved there in a group's copy, so
that its code is one source tree (an editable install would import them from the checkout, which
:func:`clbench.fingerprint.check_one_tree` refuses)."""
KILLED = {1: "killed", 3: "killed", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}
STATUS = {0: "survived", 5: "no tests", 33: "no tests", None: "not checked"}


def _toml(value) -> str:
    """A TOML value for strings, booleans, numbers and lists of them (JSON spells them the same way)."""
    return json.dumps(value)


def prepare(group: str, spec: dict, base: dict, pytest_ini: dict) -> Path:
    """A fresh copy of the committed tree for ``group`` with a pyproject.toml that mutates only its files with its
    tests."""
    work = WORK / group
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    data = spec.get("data", [])
    archive = subprocess.run(["git", "archive", "HEAD", *COPIED, *data], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    for folder in MAPPED:
        (work / folder).rename(work / "clbench" / folder)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    (work / "COMMIT").write_text(commit)
    mutmut = {**base, "only_mutate": spec["mutate"], "pytest_add_cli_args_test_selection": spec["tests"],
              "also_copy": [*base.get("also_copy", []), *data]}
    lines = ["[tool.pytest.ini_options]", *(f"{k} = {_toml(v)}" for k, v in pytest_ini.items()), "",
             "[tool.mutmut]", *(f"{k} = {_toml(v)}" for k, v in mutmut.items())]
    (work / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return work


def resumable(group: str, spec: dict) -> tuple[Path | None, str]:
    """``(the group's copy, '')`` when its run can go on at HEAD: the copy exists and its mutated files, ``tests/``
    and pyproject.toml are unchanged since the commit it was made from; else ``(None, why not)``."""
    work = WORK / group
    if not (work / "COMMIT").exists() or not (work / "mutants").is_dir():
        return None, f"no earlier run of {group} under {work}"
    commit = (work / "COMMIT").read_text().strip()
    changed = subprocess.run(["git", "diff", "--name-only", commit, "HEAD", "--", *spec["mutate"], "tests",
                              "pyproject.toml"], cwd=ROOT, capture_output=True, text=True)
    if changed.returncode != 0:
        return None, f"its commit {commit} is not in this checkout"
    if changed.stdout.strip():
        return None, f"changed since {commit}: {', '.join(changed.stdout.split()[:5])}"
    return work, ""


def statuses(work: Path, files: list[str]) -> dict[str, str]:
    """``{mutant name: status}`` from mutmut's ``mutants/<file>.meta`` of each mutated file."""
    out = {}
    for file in files:
        meta = work / "mutants" / f"{file}.meta"
        if not meta.exists():
            raise SystemExit(f"{meta} is missing: mutmut did not finish in {work} (see its output above).")
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = KILLED.get(code) or STATUS.get(code, f"suspicious (exit {code})")
    return out


def minutes_spent(work: Path, sitting: float | None) -> float:
    """Minutes of mutmut over every sitting of the group's run in ``work`` (``SECONDS`` there holds the sum; a fresh
    copy starts at 0), ``sitting`` seconds added first (``None``: nothing run now, ``--collect``); NaN when no
    sitting was timed."""
    path = work / "SECONDS"
    total = float(path.read_text()) if path.exists() else None
    if sitting is not None:
        total = (total or 0.0) + sitting
        path.write_text(f"{total:.1f}")
    return float("nan") if total is None else total / 60


def summary_row(group: str, found: dict[str, str], minutes: float) -> tuple[str, float]:
    counts = Counter("killed" if s in ("killed", "timeout") else s for s in found.values())
    total = len(found)
    score = 100.0 * counts["killed"] / total if total else float("nan")
    other = total - counts["killed"] - counts["survived"] - counts["no tests"]
    return (f"| {group} | {total} | {counts['killed']} | {counts['survived']} | {counts['no tests']} | {other} | "
            f"{score:.1f}% | {minutes:.1f} |", score)


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    show, collect, resume = "--survivors" in argv, "--collect" in argv, "--resume" in argv
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    groups: dict[str, dict] = config["tool"]["clbench"]["mutation"]
    chosen = [a for a in argv if not a.startswith("--")] or list(groups)
    unknown = [g for g in chosen if g not in groups]
    if unknown:
        print(f"unknown group(s) {unknown}; groups: {', '.join(groups)}", file=sys.stderr)
        return 2
    mutmut = Path(sys.executable).parent / "mutmut"
    env = {**os.environ, "CLBENCH_JOBS": "1", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "CLBENCH_HYPOTHESIS_EXAMPLES": "25"}
    for group in chosen:
        spec, work, start = groups[group], WORK / group, time.perf_counter()
        if not collect:
            kept, why = resumable(group, spec) if resume else (None, "")
            if resume and kept is None:
                print(f"{group}: starting afresh ({why})", flush=True)
            work = kept or prepare(group, spec, config["tool"]["mutmut"], config["tool"]["pytest"]["ini_options"])
            print(f"== {group}: {', '.join(spec['mutate'])} ({work}{', resumed' if kept else ''})", flush=True)
            # the mutants' own cache folder: a mutant of clbench/fingerprint.py writes its cache wherever it says
            done = subprocess.run(["nice", "-n", "10", str(mutmut), "run", "--max-children", "1"], cwd=work,
                                  env={**env, "XDG_CACHE_HOME": str(work / ".cache")}, stdout=subprocess.DEVNULL)
            if done.returncode != 0:
                print(f"mutmut failed in {work} (exit {done.returncode}); run it there to see why: "
                      f"cd {work} && {mutmut} run --max-children 1", file=sys.stderr)
                return 1
        commit = (work / "COMMIT").read_text() if (work / "COMMIT").exists() else "?"
        found = statuses(work, spec["mutate"])
        row, _ = summary_row(group, found, minutes_spent(work, None if collect else time.perf_counter() - start))
        print(row, flush=True)
        names = sorted(n for n, s in found.items() if s not in ("killed", "timeout"))
        lines = [f"## {group}: {len(names)} not killed", ""]
        for name in names:
            if show:
                diff = subprocess.run([str(mutmut), "show", name], cwd=work, env=env, capture_output=True,
                                      text=True).stdout
                lines += [f"### {name} ({found[name]})", "```diff", diff.strip(), "```"]
            else:
                lines.append(f"- {name} ({found[name]})")
        timeouts = sorted(n for n, s in found.items() if s == "timeout")
        lines += ["", f"Timed out (counted killed; check they loop rather than run slow): {len(timeouts)}"
                      + (f": {', '.join(timeouts)}" if timeouts else "")]
        (work / "result.json").write_text(json.dumps({"group": group, "commit": commit, "row": row,
                                                      "survivors": lines}))
    results = [json.loads(p.read_text()) for g in groups if (p := WORK / g / "result.json").exists()]
    commits = ", ".join(f"{r.get('group', '?')} at {r.get('commit', '?')}" for r in results)
    text = "\n".join(["# Mutation testing", "", f"Tested commits: {commits}.", "",
                      "| group | mutants | killed | survived | no test reaches it | other | score | minutes |",
                      "|---|---|---|---|---|---|---|---|", *(r["row"] for r in results), "",
                      *(line for r in results for line in [*r["survivors"], ""])])
    (WORK / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
