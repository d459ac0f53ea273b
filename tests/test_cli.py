"""run_bench.py end to end on a tiny suite: run, resume, leaderboard, list, and error exits."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import clbench
import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench.cli import main

ROOT = Path(__file__).parents[1]


def test_run_resume_and_rebuild_leaderboard(tiny_suite, tmp_path, capsys):
    suite = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}},
                        {"name": "replay", "preset": "cpu", "args": {"epochs": 1, "mem_size": 30}}], seeds=(0, 1))
    out = tmp_path / "out"
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    records = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert records == ["synthetic__naive__s0.json", "synthetic__naive__s1.json",
                       "synthetic__replay__s0.json", "synthetic__replay__s1.json"]
    table = pd.read_csv(out / "leaderboard.csv")
    assert set(table["strategy"]) == {"naive", "replay"} and (table["n_seeds"] == 2).all()
    assert (out / "plots" / "synthetic__accuracy.png").exists()

    stamp = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table"]) == 0   # resume: no rerun
    assert stamp == {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}

    (out / "leaderboard.csv").unlink()
    assert main(["leaderboard", "--out", str(out)]) == 0
    assert (out / "leaderboard.csv").exists()
    assert json.loads((out / "runs" / records[0]).read_text())["status"] == "finished"


def test_list_prints_registries(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for name in ("split_digits", "naive", "der_dark", "quick", "resnet32"):
        assert name in text


def test_unknown_strategy_exits_2_with_suggestion(tiny_suite, tmp_path, capsys):
    suite = tiny_suite([{"name": "replya"}])
    assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "Did you mean 'replay'" in capsys.readouterr().err


def test_unknown_override_exits_2(capsys):
    assert main(["--suite", "quick", "--strategy", "nave", "--quiet"]) == 2
    assert "has no strategy 'nave'. Did you mean 'naive'" in capsys.readouterr().err


def test_version_and_program_names():
    assert _python("-m", "clbench", "--version").stdout == f"clbench {clbench.__version__}\n"
    assert _python("-m", "clbench", "--help").stdout.startswith("usage: python -m clbench ")
    assert _python(str(ROOT / "run_bench.py"), "--help").stdout.startswith("usage: run_bench.py ")
    assert _python("-c", "import sys; from clbench.cli import main; sys.argv = ['/x/bin/clbench']; main(['--help'])"
                   ).stdout.startswith("usage: clbench ")


def test_help_and_list_import_no_plugin_module_and_no_torch():
    """The fast start: names and summaries come from the registries' index (see README, Startup)."""
    code = ("import contextlib, sys\nfrom clbench.cli import main\n"
            "with contextlib.suppress(SystemExit):\n    main({})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'avalanche', 'numpy', 'timm') or "
            "m.startswith(('clbench.strategies.', 'clbench.scenarios.', 'clbench.models.'))))")
    for argv in (["list"], ["--help"], ["run", "--help"]):
        done = _python("-c", code.format(argv))
        assert "naive" in done.stdout or "usage:" in done.stdout
        assert done.stdout.splitlines()[-1] == "[]", f"{argv} imported modules (stale index? run `make lists`)"


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT)


def test_threads_flag_sets_torch_threads_and_rejects_zero(tiny_suite, tmp_path, capsys):
    import torch
    before = torch.get_num_threads()
    suite = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}}], seeds=(0,))
    try:
        assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet", "--quiet-table",
                     "--device", "cpu", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        assert main(["--suite", str(suite), "--out", str(tmp_path / "o"), "--quiet", "--threads", "0"]) == 2
        assert "--threads must be at least 1" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


UNINSTALLED = ("import sys\n"
               "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]\n"
               "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in getattr(h, '__module__', '')]\n"
               "sys.path_importer_cache.clear()\n"
               "sys.path.insert(0, {root!r})\n"
               "from clbench.cli import main\n"
               "sys.exit(main({argv!r}))\n")


def test_an_uninstalled_checkout_says_in_one_line_to_install_it(tmp_path):
    """From a checkout that is not pip-installed (clbench importable from it, clbench.strategies and
    clbench.scenarios not mapped in), `list` listed nothing and a suite failed with "unknown scenario 'split_digits'.
    Known scenarios: ." — now both say in one line to install it."""
    for argv in (["list"], ["--suite", "quick", "--out", str(tmp_path / "out")]):
        done = subprocess.run([sys.executable, "-c", UNINSTALLED.format(root=str(ROOT), argv=argv)], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: clbench.strategies is not found: ")
        assert f"pip install -e {ROOT}" in done.stderr
    assert not (tmp_path / "out").exists()


PYTHON = sys.executable


@pytest.mark.parametrize("argv", [["list"], ["config", "naive"]])
def test_a_closed_output_pipe_ends_quietly(argv):
    proc = subprocess.Popen([PYTHON, "-m", "clbench", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()                     # `| head -0`: the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


def test_top_level_help_says_where_the_suite_flags_are(capsys):
    with pytest.raises(SystemExit):
        main(["--help"], prog="clbench")
    text = " ".join(capsys.readouterr().out.split())
    assert "`clbench --suite quick` is `clbench run --suite quick`" in text and "`clbench run --help`" in text
