"""The outside-package route, as a user takes it: examples/clbench-example-plugin is pip-installed into a fresh
virtual environment (which sees this clbench and .venv's packages through one site line: torch is not reinstalled),
and from another folder `python -m clbench list` shows its strategy and scenario and a suite with them runs and
ranks the plugin's strategy in the leaderboard. The plugin's modules are found through its entry points only."""

import csv
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "clbench-example-plugin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with the example plugin installed (built from a copy: no build files in the repository)."""
    base = tmp_path_factory.mktemp("plugin_venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    python = base / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    reused = sysconfig.get_paths()["purelib"]          # this environment's: torch, avalanche, clbench (editable)
    Path(purelib, "reuse_test_env.pth").write_text(f"import site; site.addsitedir({reused!r})\n")
    shutil.copytree(EXAMPLE, base / "example", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", str(base / "example")], check=True, capture_output=True)
    return python, base


ENV = {"PATH": "/usr/bin:/bin", "OMP_WAIT_POLICY": "PASSIVE", "CLBENCH_JOBS": "1"}


def _clbench(venv, *args: str) -> subprocess.CompletedProcess:
    python, base = venv
    return subprocess.run([str(python), "-m", "clbench", *args], cwd=base, capture_output=True, text=True,
                          env={**ENV, "XDG_CACHE_HOME": str(base / "cache")})


LIST_IMPORTS = ("import contextlib, sys\nfrom clbench.cli import main\nwith contextlib.suppress(SystemExit):\n"
                "    main(['list'])\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
                "('torch', 'avalanche', 'numpy', 'clbench_example_plugin')))")


CACHED = ("from clbench.plugins import sources\n"
          "print(sorted(s.module for s in sources() if s.cached))")


def _python(venv, code: str) -> list[str]:
    python, base = venv
    done = subprocess.run([str(python), "-c", code], cwd=base, capture_output=True, text=True,
                          env={**ENV, "XDG_CACHE_HOME": str(base / "cache")})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_list_shows_an_installed_plugin_without_importing_it_and_caches_its_index(venv):
    """``list`` reads the plugin's names and summaries from its code (the strategy's literal PRESETS included):
    neither the plugin's modules nor torch are imported. Once a module is imported (``list --check`` here, a run
    otherwise), what it registered is cached per distribution and version and read from there; editing the installed
    module (same version) makes its entry stale."""
    python, base = venv
    index = base / "cache" / "clbench" / "plugin_index"
    shutil.rmtree(index, ignore_errors=True)
    listed = _python(venv, LIST_IMPORTS)
    assert listed[-1] == "['clbench_example_plugin']"             # the package's docstring-only __init__ (find_spec)
    (line,) = [line for line in listed if line.split()[:1] == ["nearest_mean"]]
    assert "example plugin" in line and line.endswith("(presets: cpu, full) [plugin: clbench_example_plugin.strategy]")
    assert _python(venv, CACHED)[-1] == "[]"

    assert _clbench(venv, "list", "--check").returncode == 0                 # imports every plugin module
    (cache,) = index.glob("clbench?example?plugin-0.1.0.json")         # one file per distribution and version
    modules = json.loads(cache.read_text())["modules"]
    summary = line.split(None, 1)[1].removesuffix(" [plugin: clbench_example_plugin.strategy]")
    assert modules["clbench_example_plugin.strategy"]["entries"] == {"strategy": {"nearest_mean": summary}}
    assert set(modules["clbench_example_plugin.scenario"]["entries"]["scenario"]) == {"rings"}
    both = "['clbench_example_plugin.scenario', 'clbench_example_plugin.strategy']"
    assert _python(venv, CACHED)[-1] == both and _python(venv, LIST_IMPORTS)[-1] == "['clbench_example_plugin']"
    module = Path(_python(venv, "import importlib.util as u\n"
                               "print(u.find_spec('clbench_example_plugin.strategy').origin)")[-1])
    module.write_text(module.read_text() + "\n# edited in place\n")
    assert _python(venv, CACHED)[-1] == "['clbench_example_plugin.scenario']"


def test_installed_plugin_is_listed_and_runs_in_a_suite(venv):
    python, base = venv
    listed = _clbench(venv, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert any(line.split()[:1] == ["nearest_mean"] and "example plugin" in line for line in lines)
    assert any(line.split()[:1] == ["rings"] for line in lines)

    ran = _clbench(venv, "--suite", str(base / "example" / "suite.yaml"), "--out", "results", "--quiet",
                   "--quiet-table", "--device", "cpu")
    assert ran.returncode == 0, ran.stderr
    with open(base / "results" / "leaderboard.csv") as f:
        rows = {row["strategy"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"nearest_mean", "naive"} and {r["scenario"] for r in rows.values()} == {"rings"}
    assert 0 < float(rows["nearest_mean"]["avg_inc_acc"]) <= 100
    log = base / "results" / "artifacts" / "rings__nearest_mean__s0" / "training_log.jsonl"
    assert len(log.read_text().splitlines()) == 3 * 2          # 3 experiences x 2 epochs (cpu preset)

    # the plugin is an installed package, not something this test process can see
    assert subprocess.run([sys.executable, "-c", "import clbench_example_plugin"], capture_output=True).returncode


def test_a_suite_naming_a_plugin_that_is_not_loaded_says_how_to_load_it(tmp_path, capsys):
    """The example suite without its plugin (not installed in this environment): the one error line names the plugin
    route (--plugins or installing the package) besides the close names, and no output folder is made."""
    from clbench.cli import main

    assert main(["--suite", str(EXAMPLE / "suite.yaml"), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "unknown scenario 'rings'" in err
    assert "pass --plugins MODULE_OR_FILE" in err and "install its package" in err
    assert not (tmp_path / "out").exists()
