"""The code fingerprint's per-file cache (clbench/fingerprint.py): a file is parsed once across processes while it
is unchanged, and again after any write to it; the modules a run depends on, found by reading import statements,
and the hash over their code; which files count as installed code, the source trees of the shipped packages and the
refusal of two, and the modules a plugin package's fingerprint follows.

The tests of imports build a small fake ``clbench`` package in a temporary folder (``_PACKAGE_DIR`` pointed at
it), so that every kind of import (absolute, ``from package import module``, relative at one and two levels, from a
package's ``__init__``, of a name that is not a module) has one known answer, computed by hand below."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import fingerprint
from clbench.errors import ConfigError
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


def test_the_cache_file_keeps_only_files_that_still_exist_unchanged(tmp_path, cache, monkeypatch):
    """Saved after a later process parsed ``c``: ``a`` (rewritten since) and ``b`` (deleted) are dropped, ``c`` and
    the new ``a`` are kept under their current keys; a process that parsed nothing writes nothing."""
    a, b, c = (tmp_path / f"{name}.py" for name in "abc")
    for path in (a, b, c):
        path.write_text(f"NAME = {path.stem!r}\n")
    fingerprint.code_digest(a), fingerprint.code_digest(b)
    fingerprint._CACHE.save()
    assert set(json.loads(fingerprint.cache_path().read_text())) == {fingerprint.file_key(a), fingerprint.file_key(b)}
    _new_process(monkeypatch)
    a.write_text("NAME = 'a, longer'\n")
    b.unlink()
    fingerprint.code_digest(a), fingerprint.code_digest(c)
    fingerprint._CACHE.save()
    assert set(json.loads(fingerprint.cache_path().read_text())) == {fingerprint.file_key(a), fingerprint.file_key(c)}
    _new_process(monkeypatch)
    fingerprint.code_digest(c)                                   # read from the cache: nothing parsed
    fingerprint.cache_path().unlink()
    fingerprint._CACHE.save()
    assert not fingerprint.cache_path().exists() and len(cache) == 4          # a, b, the new a, c


def test_the_cache_file_is_per_python_and_cache_version_under_the_user_cache_folder(tmp_path, monkeypatch):
    name = f"fingerprints-{sys.implementation.cache_tag}-v{fingerprint.CACHE_VERSION}.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fingerprint.cache_path() == tmp_path / "xdg" / "clbench-code" / name
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fingerprint.cache_path() == tmp_path / "home" / ".cache" / "clbench-code" / name


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


# -------------------------------------------------------------------------------------------------- fingerprint
FAKE = {
    "__init__.py": '"""The fake package."""\n',
    "a.py": "import os\nimport clbench.c\nfrom clbench import b\nfrom clbench import CONSTANT\n",
    "b.py": "from . import d\nfrom .sub import e\n",
    "c.py": "X = 1\n",
    "d.py": "def f(x):\n    return x + 1\n",
    "cli.py": "import clbench.c\n",
    "uses_cli.py": "import clbench.cli\nimport clbench.d\n",
    "sub/__init__.py": "from . import e\nfrom .. import c\n",
    "sub/e.py": "from . import f\nfrom ..d import f as g\nfrom .. import d\n",
    "sub/f.py": "import json\n",
}


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    """A fake ``clbench`` package under ``tmp_path`` that the fingerprint reads instead of the real one (``cli`` is
    in EXCLUDED, as in the real package)."""
    root = tmp_path / "clbench"
    for name, source in FAKE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    monkeypatch.setattr(fingerprint, "_PACKAGE_DIR", root)
    return root


def test_source_file_maps_package_modules_to_their_file_or_package_init(fake):
    """``clbench`` is the package's ``__init__``, ``clbench.x.y`` is ``x/y.py`` or ``x/y/__init__.py``, a name
    with no file is None (a wrong split of the dotted name, or a lookup outside the package, is caught)."""
    assert fingerprint._source_file("clbench") == fake / "__init__.py"
    assert fingerprint._source_file("clbench.a") == fake / "a.py"
    assert fingerprint._source_file("clbench.sub") == fake / "sub" / "__init__.py"
    assert fingerprint._source_file("clbench.sub.e") == fake / "sub" / "e.py"
    assert fingerprint._source_file("clbench.nope") is None
    assert fingerprint._source_file("clbench.sub.nope") is None


def test_source_file_follows_the_package_dir_mapping():
    """``clbench.strategies`` and ``clbench.scenarios`` live in the repository's top-level folders (setup.py maps
    them): the fingerprint reads their modules there."""
    repo = Path(fingerprint.__file__).parents[1]
    assert fingerprint._source_file("clbench.strategies.baselines") == repo / "strategies" / "baselines.py"
    assert fingerprint._source_file("clbench.scenarios") == repo / "scenarios" / "__init__.py"
    assert "clbench.strategies.baselines" in fingerprint.module_files(["clbench.strategies.baselines"])


def test_source_file_of_modules_outside_the_package(fake, tmp_path, monkeypatch):
    """Outside the package: an imported module by its ``__file__`` (even one no finder knows), a module not yet
    imported by its spec's origin, and None for a missing module, a built-in one and a compiled extension."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "fp_not_imported.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(outside))
    assert fingerprint._source_file("fp_not_imported") == outside / "fp_not_imported.py"
    virtual = types.ModuleType("fp_virtual")              # in sys.modules only: find_spec cannot find it
    virtual.__file__ = str(outside / "virtual.py")
    monkeypatch.setitem(sys.modules, "fp_virtual", virtual)
    assert fingerprint._source_file("fp_virtual") == outside / "virtual.py"
    compiled = types.ModuleType("fp_compiled")
    compiled.__file__ = str(outside / "compiled.so")
    monkeypatch.setitem(sys.modules, "fp_compiled", compiled)
    assert fingerprint._source_file("fp_compiled") is None
    assert fingerprint._source_file("fp_no_such_module_anywhere") is None
    assert fingerprint._source_file("sys") is None                   # built in: no __file__


def test_imports_resolve_absolute_relative_and_package_imports(fake):
    """Every import statement of a file, as module names: ``import x`` as written; ``from clbench import b`` as
    ``clbench.b`` when b is a module, else ``clbench``; ``from clbench.d import f`` as ``clbench.d``; relative
    imports against the file's package (its own name for an ``__init__``), one and two levels up; imports from
    outside the package (``from os import path``) are left out."""
    def imports(name):
        return fingerprint._imports(name, fingerprint._source_file(name))

    assert imports("clbench.a") == ["os", "clbench.c", "clbench.b", "clbench"]
    assert imports("clbench.b") == ["clbench.d", "clbench.sub.e"]
    assert imports("clbench.sub") == ["clbench.sub.e", "clbench.c"]
    assert imports("clbench.sub.e") == ["clbench.sub.f", "clbench.d", "clbench.d"]
    assert imports("clbench.d") == []


def test_imports_of_a_module_outside_the_package_keep_only_what_it_imports(tmp_path, fake):
    """A module outside ``clbench`` (a plugin strategy) yields its ``import`` names and its ``from clbench...``
    modules, not its ``from os import path``."""
    probe = tmp_path / "probe.py"
    probe.write_text("from os import path\nimport numpy\nfrom clbench.sub import e\nfrom clbench.d import f\n")
    assert fingerprint._imports("probe", probe) == ["numpy", "clbench.sub.e", "clbench.d"]


def test_module_files_is_the_import_closure_inside_the_package_minus_excluded(fake):
    """The closure of ``clbench.a`` follows absolute, relative and ``__init__`` imports, keeps the package's
    ``__init__`` (``from clbench import CONSTANT``) and no module outside the package (``os``, ``json``)."""
    expected = {"clbench.a": "a.py", "clbench.b": "b.py", "clbench.c": "c.py", "clbench.d": "d.py",
                "clbench": "__init__.py", "clbench.sub.e": "sub/e.py", "clbench.sub.f": "sub/f.py"}
    assert fingerprint.module_files(["clbench.a"]) == {k: fake / v for k, v in expected.items()}
    assert fingerprint.module_files(["clbench.sub"]) == {
        "clbench.sub": fake / "sub" / "__init__.py", "clbench.c": fake / "c.py", "clbench.d": fake / "d.py",
        "clbench.sub.e": fake / "sub" / "e.py", "clbench.sub.f": fake / "sub" / "f.py"}


def test_module_files_skips_excluded_missing_and_repeated_roots_and_goes_on(fake):
    """An excluded module (cli), a name without a file and a module seen before are skipped, and the roots after
    them are still followed (a skip that stopped the walk would drop them)."""
    assert fingerprint.module_files(["clbench.uses_cli"]) == {"clbench.uses_cli": fake / "uses_cli.py",
                                                              "clbench.d": fake / "d.py"}
    assert fingerprint.module_files(["clbench.c", "clbench.cli"]) == {"clbench.c": fake / "c.py"}
    assert fingerprint.module_files(["clbench.c", "clbench.nope"]) == {"clbench.c": fake / "c.py"}
    assert fingerprint.module_files(["clbench.c", "clbench.d", "clbench.d"]) == {"clbench.c": fake / "c.py",
                                                                                "clbench.d": fake / "d.py"}
    assert fingerprint.module_files([]) == {}


def test_fingerprint_of_is_sixteen_hex_digits_over_sorted_name_and_code_digest_lines(fake):
    """The fingerprint is sha256 over ``name:sha256(ast without docstrings)`` lines joined by a newline, sorted by
    module name, cut to 16 hex digits; computed here by hand for two modules."""
    def digest(source: str) -> str:
        import ast

        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module) and node.body and isinstance(node.body[0], ast.Expr):
                node.body = node.body[1:] or [ast.Pass()]
        return hashlib.sha256(ast.dump(tree).encode()).hexdigest()

    blob = "\n".join([f"clbench.c:{digest(FAKE['c.py'])}", f"clbench.d:{digest(FAKE['d.py'])}",
                      f"clbench.uses_cli:{digest(FAKE['uses_cli.py'])}"])           # sorted by module name
    expected = hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert fingerprint.fingerprint_of(["clbench.uses_cli", "clbench.c"]) == expected
    assert re.fullmatch(r"[0-9a-f]{16}", expected)
    assert fingerprint.code_digest(fake / "__init__.py") == digest(FAKE["__init__.py"])


def test_fingerprint_of_changes_with_code_and_not_with_a_docstring(fake):
    """Editing a module's expression changes the fingerprint of a module importing it; editing its docstring
    does not."""
    before = fingerprint.fingerprint_of(["clbench.b"])
    (fake / "d.py").write_text('"""Now with a docstring."""\n' + FAKE["d.py"])
    assert fingerprint.fingerprint_of(["clbench.b"]) == before
    (fake / "d.py").write_text(FAKE["d.py"].replace("x + 1", "x + 2"))
    assert fingerprint.fingerprint_of(["clbench.b"]) != before


# ------------------------------------------------------------------------------------------------ code fingerprint
def test_installed_code_is_the_standard_library_and_any_site_or_dist_packages_folder(tmp_path):
    """The standard library (under an installed root, its path without "site-packages") and any file below a
    folder named site-packages or dist-packages count as installed; a project file does not."""
    assert fingerprint.installed(Path(json.__file__))
    assert fingerprint.installed(tmp_path / "env" / "site-packages" / "m.py")
    assert fingerprint.installed(tmp_path / "usr" / "dist-packages" / "m.py")
    assert not fingerprint.installed(tmp_path / "project" / "site" / "m.py")


def test_source_trees_follow_each_packages_imported_folder(tmp_path, monkeypatch):
    """Each shipped package's tree is the folder above where it is imported from (the checkout's root for
    ``clbench`` and a package mapped below it or beside it); a package imported from another folder names that
    tree, one without a ``__path__`` and one not imported fall back to the package's own folders, and two trees
    are refused in one line naming each package's."""
    root = Path(fingerprint.__file__).resolve().parents[1]
    assert fingerprint.source_trees() == dict.fromkeys(fingerprint.SHIPPED, root)
    fingerprint.check_one_tree()
    (tmp_path / "other" / "strategies").mkdir(parents=True)
    elsewhere = types.ModuleType("clbench.strategies")
    elsewhere.__path__ = [str(tmp_path / "other" / "strategies")]
    monkeypatch.setitem(sys.modules, "clbench.strategies", elsewhere)
    monkeypatch.delitem(sys.modules, "clbench.scenarios", raising=False)
    trees = fingerprint.source_trees()
    assert trees == {"clbench": root, "clbench.strategies": (tmp_path / "other").resolve(), "clbench.scenarios": root}
    with pytest.raises(ConfigError) as info:
        fingerprint.check_one_tree()
    assert str(info.value) == (
        f"clbench's code comes from more than one source tree (clbench from {root}; clbench.strategies from "
        f"{(tmp_path / 'other').resolve()}; clbench.scenarios from {root}): run from the tree that is installed, or "
        f"install this one (pip install -e .).")
    monkeypatch.setitem(sys.modules, "clbench.strategies", types.ModuleType("clbench.strategies"))   # no __path__
    assert fingerprint.source_trees()["clbench.strategies"] == root


def test_an_installed_plugin_package_is_followed_and_other_installed_code_is_not(tmp_path, monkeypatch):
    """A plugin package installed in site-packages (``fpplug``): its modules imported from one another are
    followed (``from fpplug.sub import b``, ``import fpplug.sub.c``), so are local helpers beside the project
    (``fphelper``), not another installed package (``fpother``) nor the standard library."""
    site = tmp_path / "site-packages"
    (site / "fpplug" / "sub").mkdir(parents=True)
    (site / "fpother").mkdir()
    (tmp_path / "local").mkdir()
    for path, text in ((site / "fpplug" / "__init__.py", ""), (site / "fpplug" / "sub" / "__init__.py", ""),
                       (site / "fpplug" / "sub" / "a.py", "import json\nimport fpother\nimport fphelper\n"
                                                          "import fpplug.sub.c\nfrom fpplug.sub import b\n"),
                       (site / "fpplug" / "sub" / "b.py", "B = 1\n"), (site / "fpplug" / "sub" / "c.py", "C = 1\n"),
                       (site / "fpother" / "__init__.py", ""), (tmp_path / "local" / "fphelper.py", "H = 1\n")):
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "local"))
    monkeypatch.syspath_prepend(str(site))
    found = fingerprint.module_files(["fpplug.sub.a"])
    assert set(found) == {"fpplug.sub.a", "fpplug.sub.b", "fpplug.sub.c", "fphelper"}
    assert found["fphelper"] == tmp_path / "local" / "fphelper.py"


def test_a_pinned_fingerprint_is_answered_as_pinned(monkeypatch):
    """A worker process answers the fingerprints its driver took (``pin``) instead of computing them again, for
    exactly the (strategy, scenario) pinned."""
    monkeypatch.setattr(fingerprint, "_PINNED", {})
    fingerprint.pin([("fp_strategy", "fp_scenario", "f" * 16), ("fp_other", "fp_scenario", "e" * 16)])
    assert fingerprint.code_fingerprint("fp_strategy", "fp_scenario") == "f" * 16
    assert fingerprint.code_fingerprint("fp_other", "fp_scenario") == "e" * 16


def test_plugin_discovery_is_not_code_a_run_depends_on():
    """Which module registers a name is found by clbench.plugins, and that module counts by itself: editing the
    discovery (its cache format, its checks) leaves every record's fingerprint as it was; the registry counts."""
    files = fingerprint.module_files(["clbench.runner"])
    assert "clbench.registry" in files and "clbench.plugins" not in files
