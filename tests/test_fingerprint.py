"""The code fingerprint's per-file cache (clbench/fingerprint.py): a file is parsed once across processes while it
is unchanged, and again after any write to it."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import fingerprint
from clbench.registry import SCENARIOS
from tests._cli import run_suite


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh process's cache (nothing loaded yet) in a temporary cache folder; counts the files parsed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parsed = []
    original = fingerprint.analysed
    monkeypatch.setattr(fingerprint, "analysed", lambda source: parsed.append(source) or original(source))
    monkeypatch.setattr(fingerprint, "_CACHE", fingerprint.FileCache())
    return parsed


def _new_process(monkeypatch):
    monkeypatch.setattr(fingerprint, "_CACHE", fingerprint.FileCache())


def test_an_unchanged_file_is_not_parsed_again_in_a_later_process(tmp_path, cache, monkeypatch):
    module = tmp_path / "mod.py"
    module.write_text('"""doc"""\nimport os\nfrom . import sibling\nX = 1\n')
    digest = fingerprint.code_digest(module)
    assert fingerprint._imports("pkg.mod", module, lambda m: True)[0] == "os"
    fingerprint._CACHE.save()
    assert fingerprint.cache_path().is_file() and len(cache) == 1
    _new_process(monkeypatch)
    assert fingerprint.code_digest(module) == digest and len(cache) == 1        # read from the cache file


def test_a_write_of_the_same_size_is_seen(tmp_path, cache, monkeypatch):
    """``X = 1`` -> ``X = 2``: same size, and the modification time set back to the old one: the status-change time
    still differs, so the file is parsed again and its digest changes."""
    module = tmp_path / "mod.py"
    module.write_text("X = 1\n")
    before = os.stat(module)
    digest = fingerprint.code_digest(module)
    fingerprint._CACHE.save()
    _new_process(monkeypatch)
    module.write_text("X = 2\n")
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert fingerprint.code_digest(module) != digest and len(cache) == 2


def test_docstrings_do_not_count_and_a_broken_cache_is_ignored(tmp_path, cache, monkeypatch):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text('"""one"""\ndef f():\n    """x"""\n    return 1\n')
    second.write_text('"""two"""\ndef f():\n    return 1\n')
    assert fingerprint.code_digest(first) == fingerprint.code_digest(second)
    fingerprint.cache_path().parent.mkdir(parents=True)
    fingerprint.cache_path().write_text("{not json")
    _new_process(monkeypatch)
    assert fingerprint.code_digest(first) == fingerprint.code_digest(second) and len(cache) == 4


def test_fingerprint_follows_code_not_comments(tmp_path, monkeypatch):
    """A change to a function body changes the fingerprint of a module and of everything importing it; a change to
    a comment or a docstring does not. The closure follows imports inside clbench and leaves out the CLI."""
    from clbench import fingerprint

    module = tmp_path / "fp_probe.py"
    source = '"""Doc."""\nfrom clbench import metrics\n\n\ndef predict(x):\n    """Doc."""\n    return x + 1\n'
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    files = fingerprint.module_files(["fp_probe"])
    assert "clbench.metrics" in files and "fp_probe" in files and "clbench.cli" not in files
    before = fingerprint.fingerprint_of(["fp_probe"])
    module.write_text(source.replace('"""Doc."""', '"""Other words."""') + "# a comment\n")
    assert fingerprint.fingerprint_of(["fp_probe"]) == before
    module.write_text(source.replace("x + 1", "x + 2"))
    assert fingerprint.fingerprint_of(["fp_probe"]) != before

    core = fingerprint.module_files([SCENARIOS.get("synthetic").__module__, *fingerprint.CORE])
    assert {"clbench.runner", "clbench.metrics", "clbench.scenarios.synthetic"} <= set(core)
    assert not {"clbench.cli", "clbench.leaderboard", "clbench.report"} & set(core)


ROOT = Path(__file__).resolve().parents[1]


PYTHON = sys.executable


PLUGIN = '''from helper_x37e import EXTRA
from clbench.registry import STRATEGIES
from tests._fakes import IncreasingLogits


@STRATEGIES.register("helped_x37")
class Helped(IncreasingLogits):
    """Scores as its parent; imports a helper module from its folder."""
'''


def test_the_code_fingerprint_covers_a_plugin_s_helper_module_outside_site_packages(tmp_path, monkeypatch):
    (tmp_path / "helper_x37.py").write_text("import json\nimport yaml\n\ndef scale():\n    return 2\n")
    (tmp_path / "plugin_x37.py").write_text("from helper_x37 import scale\n\nFACTOR = scale()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = fingerprint.module_files(["plugin_x37"])
    assert found["helper_x37"] == tmp_path / "helper_x37.py"
    assert "yaml" not in found and "json" not in found      # installed packages and the standard library do not
    before = fingerprint.fingerprint_of(["plugin_x37"])
    (tmp_path / "helper_x37.py").write_text("import json\nimport yaml\n\ndef scale():\n    return 3\n")
    assert fingerprint.fingerprint_of(["plugin_x37"]) != before      # resume reruns the plugin's runs


def test_resume_reruns_a_plugin_s_run_once_its_helper_module_changed(tiny_suite, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_PLUGINS", "")                # load_plugin adds to it: restored after the test
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "helper_x37e.py").write_text("EXTRA = 2.0\n")
    plugin = tmp_path / "plugin_x37e.py"
    plugin.write_text(PLUGIN)
    suite, out = tiny_suite([{"name": "helped_x37"}]), tmp_path / "out"
    assert run_suite(suite, out, "--plugins", str(plugin)) == 0
    (tmp_path / "helper_x37e.py").write_text("EXTRA = 3.0\n")
    monkeypatch.setattr(fingerprint, "_computed", functools.cache(fingerprint._computed.__wrapped__))  # a new process
    capsys.readouterr()
    assert run_suite(suite, out, "--plugins", str(plugin)) == 0
    assert "running 1: 1 made by other code" in capsys.readouterr().err


def test_code_from_two_source_trees_is_refused_in_one_line(tmp_path):
    """An editable install of this tree, run from a second checkout: clbench from the checkout, clbench.strategies
    and clbench.scenarios (mapped by the installation) from this tree."""
    editable = any(p.name.startswith("__editable__") and "clbench" in p.name
                   for p in Path(next(p for p in sys.path if p.endswith("site-packages"))).iterdir())
    if not editable:
        pytest.skip("needs clbench installed in editable mode")
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "clbench", checkout / "clbench", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([PYTHON, "-m", "clbench", "--suite", "quick", "--out", str(tmp_path / "out")],
                            cwd=checkout, capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"clbench from {checkout}" in lines[0] and f"clbench.strategies from {ROOT}" in lines[0]
    assert not (tmp_path / "out").exists()
