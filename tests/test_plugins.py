"""Plugins: modules outside clbench (``--plugins`` files and modules, a suite's ``plugins:``, ``$CLBENCH_PLUGINS``)
register strategies like shipped ones, are checked by the same contract, join the code fingerprint and reach worker
processes; a module that fails is skipped whole (or, when named explicitly, refused) with its cause first, never
reported as an unknown name. The installed-package route (entry points) is tested in tests/test_example_plugin.py."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import plugins, registry
from clbench.cli import main
from clbench.plugins import ENV, UNAVAILABLE, PluginError, import_plugin, load_plugin, scan
from clbench.registry import MODELS, STRATEGIES, UnavailableError
from tests._plugin_dist import STRATEGY_MODULE, installed_package

ROOT = Path(__file__).parents[1]

MISSING_DEPENDENCY = '''
from clbench.registry import MODELS, STRATEGIES
from tests._fakes import IncreasingLogits


@MODELS.register("test_half_model")
def half_model():
    """Registered before the failing import."""


@STRATEGIES.register("test_half_strategy")
class Half(IncreasingLogits):
    """Registered before the failing import."""


import opacus_is_not_installed_here  # noqa: E402,F401
'''

STRATEGY = '''
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from clbench.cl.data import experience_tensors
from clbench.protocol import ParamCount, StrategyBase
from clbench.registry import STRATEGIES
from clbench.training import FitSettings, fit


@dataclass
class Config:
    epochs: int = 1
    lr: float = 0.01


@STRATEGIES.register("{name}")
class Linear(StrategyBase):
    """A linear classifier trained by clbench.training.fit (a plugin strategy)."""

    Config = Config
    PRESETS = {{"cpu": {{}}}}

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), info.n_classes))

    def train(self, experience):
        x, y = experience_tensors(experience)
        fit(self.net, self.net, self.net.parameters(), x, y, F.cross_entropy,
            FitSettings(self.config.epochs, 16, self.config.lr), seed=0, callbacks=self.callbacks)

    @torch.no_grad()
    def predict(self, x, task_labels):
        return self.net(x)

    def {count}(self):
        return ParamCount.of(self.net)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Write a module into a folder on sys.path; whatever the test loads is forgotten afterwards."""
    monkeypatch.setenv(ENV, "")      # restored (unset) afterwards: a plugin loaded here must not reach later tests
    monkeypatch.setattr(plugins, "_loaded_specs", {})
    before = set(sys.modules)

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        return name

    yield write
    for r in registry.REGISTRIES:
        for name in [n for n, origin in r.origins.items() if origin.startswith("test_plugin")]:
            del r._entries[name], r.origins[name]
    for name in set(sys.modules) - before:
        if name.startswith("test_plugin"):
            del sys.modules[name]
    for table in (UNAVAILABLE, plugins.FAILED_NAMES):
        for name in [m for m in table if m.startswith("test_plugin")]:
            del table[name]


def _suite(tmp_path, strategy: str, **extra) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"suite": "plugged", "seeds": [0], **extra,
                                    "scenarios": [{"name": "synthetic", "args": {"train_per_class": 10,
                                                                                 "test_per_class": 5}}],
                                    "strategies": [{"name": strategy, "preset": "cpu"}]}))
    return path


def test_module_with_a_missing_dependency_is_skipped_whole_and_listed(plugin, capsys):
    name = plugin("test_plugin_missing", MISSING_DEPENDENCY)
    assert import_plugin(name) is False
    assert "test_half_strategy" not in STRATEGIES and "test_half_model" not in MODELS     # nothing half-loaded
    assert UNAVAILABLE[name] == "ModuleNotFoundError: No module named 'opacus_is_not_installed_here'"
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert f"{name}" in listed and "UNAVAILABLE: ModuleNotFoundError: No module named 'opacus_is_not_in" in listed
    assert "naive" in listed and "split_digits" in listed                                  # the rest still there
    with pytest.raises(UnavailableError) as info:                                          # the cause, first
        STRATEGIES.get("test_half_strategy")
    assert str(info.value).startswith("ModuleNotFoundError: No module named 'opacus_is_not_installed_here' (strategy "
                                      f"'test_half_strategy' is registered by plugin module {name}")
    assert main(["config", "replay", "--preset", "cpu"]) == 0                             # other commands work


def test_a_contract_violation_is_reported_with_its_cause_not_as_an_unknown_name(plugin):
    """The issue's case: a class without num_parameters used to surface as "unknown strategy ... Did you mean"."""
    name = plugin("test_plugin_contract", STRATEGY.format(name="ncm_naive", count="count_parameters"))
    assert import_plugin(name) is False
    assert "ncm_naive" not in STRATEGIES
    with pytest.raises(UnavailableError) as info:
        STRATEGIES.get("ncm_naive")
    message = str(info.value)
    assert message.startswith("StrategyContractError: strategy 'ncm_naive' (test_plugin_contract.Linear) does not "
                              "implement num_parameters")
    assert "Did you mean" not in message and "\n" not in message


def test_a_computed_name_that_fails_its_check_is_still_named(plugin):
    source = STRATEGY.format(name="{0}", count="count_parameters").replace('@STRATEGIES.register("{0}")\n', "") + \
        '\nSTRATEGIES.register("test_" + "computed")(Linear)\n'
    name = plugin("test_plugin_computed", source.replace("{0}", "x"))
    assert import_plugin(name) is False
    with pytest.raises(UnavailableError, match=r"^StrategyContractError: strategy 'test_computed'"):
        STRATEGIES.get("test_computed")


def test_private_must_be_a_bool(plugin):
    source = STRATEGY.format(name="test_private", count="num_parameters").replace(
        'PRESETS = {"cpu": {}}', 'PRESETS = {"cpu": {}}\n    private = "yes"')
    assert import_plugin(plugin("test_plugin_private", source)) is False
    assert UNAVAILABLE["test_plugin_private"].startswith("StrategyContractError: strategy 'test_private' ("
                                                         "test_plugin_private.Linear): private must be True or False")


def test_plugin_file_runs_through_the_cli_and_its_code_joins_the_fingerprint(plugin, tmp_path, capsys):
    path = tmp_path / "test_plugin_file.py"
    path.write_text(STRATEGY.format(name="test_file_linear", count="num_parameters"))
    out = tmp_path / "out"
    args = ["--plugins", str(path), "--suite", str(_suite(tmp_path, "test_file_linear")), "--out", str(out),
            "--quiet", "--quiet-table", "--device", "cpu"]
    assert main(args) == 0
    table = pd.read_csv(out / "leaderboard.csv")
    assert list(table["strategy"]) == ["test_file_linear"]
    record = json.loads((out / "runs" / "synthetic__test_file_linear__s0.json").read_text())
    assert record["status"] == "finished"
    assert os.environ[ENV] == str(path)                       # worker processes load it too

    from clbench.fingerprint import fingerprint_of, module_files
    assert module_files(["test_plugin_file"])["test_plugin_file"] == path
    before = fingerprint_of(["test_plugin_file"])
    path.write_text(path.read_text() + "\n# a comment\n")
    assert fingerprint_of(["test_plugin_file"]) == before
    path.write_text(path.read_text().replace("lr: float = 0.01", "lr: float = 0.02"))
    assert fingerprint_of(["test_plugin_file"]) != before     # editing the plugin's code reruns its runs

    assert main(["list", "--plugins", str(path)]) == 0
    assert "test_file_linear" in capsys.readouterr().out


def test_a_failing_plugin_file_is_one_line_with_its_name_and_cause(plugin, tmp_path, capsys):
    path = tmp_path / "test_plugin_bad.py"
    path.write_text(STRATEGY.format(name="test_bad_linear", count="count_parameters"))
    assert main(["list", "--plugins", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: plugin '{path}' failed to load: StrategyContractError: strategy 'test_bad_linear' "
                   "(test_plugin_bad.Linear) does not implement num_parameters (see StrategyBase).")
    assert main(["list", "--plugins", str(tmp_path / "nowhere.py")]) == 2
    assert "failed to load: no such file" in capsys.readouterr().err
    with pytest.raises(PluginError, match="plugin 'test_plugin_no_such_module' failed to load: ModuleNotFoundError"):
        load_plugin("test_plugin_no_such_module")


def test_suite_plugins_are_loaded_relative_to_the_suite_before_its_names_are_checked(plugin, tmp_path):
    (tmp_path / "test_plugin_suite.py").write_text(STRATEGY.format(name="test_suite_linear", count="num_parameters"))
    suite = _suite(tmp_path, "test_suite_linear", plugins=["test_plugin_suite.py"])
    out = tmp_path / "out"
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table", "--device", "cpu"]) == 0
    assert list(pd.read_csv(out / "leaderboard.csv")["strategy"]) == ["test_suite_linear"]


def test_a_suite_plugin_that_fails_stops_the_suite_before_any_run(plugin, tmp_path, capsys):
    (tmp_path / "test_plugin_suite_bad.py").write_text("raise RuntimeError('boom')\n")
    suite = _suite(tmp_path, "naive", plugins=["test_plugin_suite_bad.py"])
    assert main(["--suite", str(suite), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "plugin 'test_plugin_suite_bad.py' failed to load: RuntimeError: boom" in err
    assert not (tmp_path / "out" / "runs").exists() or not list((tmp_path / "out" / "runs").glob("*.json"))


def test_plugins_reach_a_fresh_process_through_the_environment(tmp_path):
    """What a spawned --jobs worker does: $CLBENCH_PLUGINS names the file, the registry imports it on first use,
    under the same module name, so the plugin's part of the worker's code fingerprint is the driver's. (Only the
    plugin's part is compared: the whole run's fingerprint also hashes clbench's own files, which other work in a
    shared checkout may change between the two processes; that made this test fail in long runs.)"""
    path = tmp_path / "test_plugin_env.py"
    path.write_text(STRATEGY.format(name="test_env_linear", count="num_parameters"))
    code = ("from clbench.fingerprint import code_fingerprint, fingerprint_of, module_files; "
            "from clbench.registry import STRATEGIES; module = STRATEGIES.get('test_env_linear').__module__; "
            "code_fingerprint('test_env_linear', 'synthetic'); "
            "print(module, module_files([module])[module], fingerprint_of([module]))")
    env = {**os.environ, ENV: str(path), "PYTHONPATH": str(ROOT)}
    printed = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                              cwd=tmp_path).stdout.split() for _ in range(2)]
    assert printed[0][:2] == ["test_plugin_env", str(path)] and printed[0] == printed[1]


def test_scan_finds_literal_names_aliases_and_computed_ones():
    declared, dynamic = scan(b'from clbench.registry import STRATEGIES as S, MODELS\n'
                             b'@S.register("a")\nclass A: ...\n'
                             b'MODELS.register("m")(f)\n'
                             b'from clbench import registry\nregistry.SCENARIOS.register(name)(g)\n'
                             b'OTHER.register("not_a_plugin")(h)\n')
    assert declared == {"strategy": {"a": ""}, "model": {"m": ""}} and dynamic == {"scenario"}


def test_a_plugin_packages_own_modules_join_the_fingerprint(tmp_path, monkeypatch):
    """Editing a helper module of a plugin package reruns the runs of its strategy (not only the strategy's file)."""
    from clbench.fingerprint import fingerprint_of, module_files

    package = tmp_path / "test_plugin_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text("WIDTH = 8\n")
    (package / "methods.py").write_text("from test_plugin_pkg.nets import WIDTH\nfrom . import nets\nimport json\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(module_files(["test_plugin_pkg.methods"])) == {"test_plugin_pkg.methods", "test_plugin_pkg.nets"}
    before = fingerprint_of(["test_plugin_pkg.methods"])
    (package / "nets.py").write_text("WIDTH = 16\n")
    assert fingerprint_of(["test_plugin_pkg.methods"]) != before


def test_list_reads_the_index_and_list_check_imports_to_find_failures(plugin, monkeypatch, capsys):
    """A module known from the index is listed from it without importing; --check imports it and shows its cause."""
    name = plugin("test_plugin_indexed", MISSING_DEPENDENCY)
    indexed = plugins.Source(name, None, "shipped", {"strategy": {"test_half_strategy": "From the index."}})
    monkeypatch.setattr(plugins, "_sources", [*plugins.sources(), indexed])
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "test_half_strategy" in listed and "From the index." in listed and name not in sys.modules
    assert main(["list", "--check"]) == 0
    listed = capsys.readouterr().out
    assert f"{name}" in listed and "UNAVAILABLE: ModuleNotFoundError: No module named 'opacus_is_not_installed_here'" \
        in listed and "From the index." not in listed


CACHED_MODULE = '''
from clbench.registry import STRATEGIES


@STRATEGIES.register("test_cached_nm")
class Cached:
    """A strategy of an installed package (never imported here)."""
'''


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An installed distribution ``test-cached-pkg 0.1`` whose entry point names ``test_cached_methods`` (a
    dist-info folder on sys.path, as pip writes it), and a writer of its plugin index cache; the discovery is redone
    in this test and put back after it."""
    import hashlib

    site = installed_package(tmp_path / "site", "test-cached-pkg", "test_cached_methods", CACHED_MODULE)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(plugins, "_sources", None)
    cache = plugins.cache_file("test-cached-pkg", "0.1")

    def write(entries: dict) -> Path:
        cache.parent.mkdir(parents=True, exist_ok=True)
        sha = hashlib.sha256(CACHED_MODULE.encode()).hexdigest()
        cache.write_text(json.dumps({"modules": {"test_cached_methods": {"sha256": sha, "entries": entries}}}))
        monkeypatch.setattr(plugins, "_sources", None)
        return cache

    write.module = site / "test_cached_methods.py"
    return write


def _installed_source() -> plugins.Source:
    (source,) = [s for s in plugins.sources() if s.module == "test_cached_methods"]
    return source


def test_an_honest_plugin_index_cache_is_read(installed):
    installed({"strategy": {"test_cached_nm": "From the cache."}})
    source = _installed_source()
    assert source.cached and source.declared == {"strategy": {"test_cached_nm": "From the cache."}}
    assert STRATEGIES.describe("test_cached_nm") == "From the cache."
    from clbench.commands.lists import list_lines

    listed = {line.split()[0]: line for line in list_lines() if line.startswith("  ")}
    assert listed["test_cached_nm"].endswith("From the cache. [plugin: test_cached_methods]")
    assert "[plugin" not in listed["naive"]
    assert not any("test_cached_nm" in line for line in list_lines(shipped=True))


@pytest.mark.parametrize("entries, wrong", [
    ({"strategy": {"test_cached_nm": "", "naive": ""}}, "it claims strategy 'naive', which clbench ships"),
    ({"strategy": {}}, "it hides strategy 'test_cached_nm', which the module's code registers"),
    ({"strategy": {"test_cached_nm": "", "test_invented": ""}},
     "it claims strategy 'test_invented', which the module's code does not register"),
    ({"strategy": ["test_cached_nm"]}, "its entries are not {kind: {name: summary}}"),
], ids=["claims a shipped name", "hides an installed strategy", "invents a name", "malformed"])
def test_a_plugin_index_cache_that_lies_is_not_used_and_the_warning_names_its_file(installed, caplog, entries,
                                                                                    wrong):
    """An edited cache entry (the module's sha256 kept) can neither take a shipped name (every suite using naive
    failed with a self-contradictory line), hide a strategy the module registers (a valid suite refused as unknown)
    nor invent one (shown by `list`): the names are read from the module's code, and the warning names the file."""
    cache = installed(entries)
    source = _installed_source()
    assert not source.cached and source.declared == {"strategy": {"test_cached_nm": ""}}
    assert "test_cached_nm" in STRATEGIES.names() and "test_invented" not in STRATEGIES.names()
    assert plugins.holder("strategy", "naive", "clbench.strategies.baselines") is None
    assert STRATEGIES.module_of("naive") == "clbench.strategies.baselines"
    (warning,) = [r.getMessage() for r in caplog.records if "plugin index cache" in r.getMessage()]
    assert str(cache) in warning and wrong in warning and "test_cached_methods" in warning


@pytest.mark.parametrize("code, shipped_choices", [
    (CACHED_MODULE, True),
    (CACHED_MODULE + "\nfrom clbench.training import OPTIMIZERS\nOPTIMIZERS.register('sgdd')(object)\n", False),
    (CACHED_MODULE + "\nfrom clbench.registry import MODELS\nMODELS.register('test_net')(object)\n", False),
], ids=["strategies only", "an optimizer", "a model"])
def test_an_installed_plugin_that_registers_only_strategies_leaves_the_choices_checked_from_the_index(
        installed, monkeypatch, code, shipped_choices):
    """With any plugin package installed, `optimizer: sgdd` went to the full check (13-16 s of imports instead of
    0.26 s): the Configs' computed choices (optimizers, models...) were not trusted. They are, unless the package's
    code may register into those registries."""
    from clbench import suite_file
    from clbench.errors import ConfigError

    monkeypatch.setattr(registry, "OUTSIDE", set())            # other tests' plugin files, imported in this process
    monkeypatch.setattr(plugins, "_loaded_specs", {})
    installed.module.write_text(code)
    plugins._sources = None
    assert plugins.only_shipped() is shipped_choices
    sgdd = [{"name": "naive", "args": {"optimizer": "sgdd"}}]
    if shipped_choices:
        with pytest.raises(ConfigError, match="optimizer"):
            suite_file._check_recorded_values("s.yaml", [{"name": "split_digits"}], sgdd)


def test_dp_on_an_installed_plugins_strategy_that_is_not_private_is_refused_without_importing_it(tmp_path):
    """`dp:` on a plugin package's strategy that cannot train privately took the full import (~12-20 s) to refuse,
    on the package's first load and, for a module failing the strategy contract, on every load. The flag is read
    from the module's code (the registered class and its bases, StrategyBase's default in clbench.protocol) before
    any cache exists, and from the plugin index cache that the first import writes (with the modules it comes from
    and their sha256) after; each refusal names the file it read, the module unimported. A private strategy of the
    package passes, and a cache whose dependency changed since is not read: the code is."""
    site = installed_package(tmp_path / "site", "test-private-pkg", "test_private_methods", STRATEGY_MODULE)
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "CLBENCH_CACHE": str(tmp_path / "cache")}
    check = """
        import sys
        from clbench import suite_file
        from clbench.errors import ConfigError
        try:
            suite_file._check_recorded_values("s.yaml", [{"name": "split_digits"}],
                                              [{"name": %r, "dp": {"epsilon": 3.0}}])
            print("passed")
        except ConfigError as exc:
            print(exc)
        print("test_private_methods" in sys.modules)
    """
    code = f"(`private` read from the code of {site / 'test_private_methods.py'})"
    for _ in range(2):                     # no cache is written without the import: the second start reads code too
        line, imported = _python(check % "test_cached_plain", env=env).stdout.strip().splitlines()
        assert line.startswith("s.yaml: strategies[0] (test_cached_plain): dp: strategy 'test_cached_plain' is not "
                               "known to use each sample in one training call only") and imported == "False"
        assert "test_cached_private" in line.split("private strategies: ")[1] and "naive" in line
        assert line.endswith(code) and not (tmp_path / "cache").exists()
    assert _python(check % "test_cached_private", env=env).stdout.split() == ["passed", "False"]
    first = _python("""
        from clbench import plugins
        plugins.load_declaring("strategy", "test_cached_plain")
        print(plugins.cache_file("test-private-pkg", "0.1"))
    """, env=env)
    cache = Path(first.stdout.strip())
    flags = json.loads(cache.read_text())["modules"]["test_private_methods"]["private"]
    assert {name: flag["private"] for name, flag in flags.items()} == {"test_cached_plain": False,
                                                                      "test_cached_private": True}
    assert list(flags["test_cached_plain"]["depends"]) == ["clbench.protocol"]     # StrategyBase sets it
    assert list(flags["test_cached_private"]["depends"]) == ["test_private_methods"]
    line, imported = _python(check % "test_cached_plain", env=env).stdout.strip().splitlines()
    assert line.endswith(f"(`private` read from the plugin index cache {cache}; delete that file if it is out of "
                         "date)") and imported == "False"
    assert _python(check % "test_cached_private", env=env).stdout.split() == ["passed", "False"]
    data = json.loads(cache.read_text())
    data["modules"]["test_private_methods"]["private"]["test_cached_plain"]["depends"]["clbench.protocol"] = "0" * 64
    cache.write_text(json.dumps(data))
    line, imported = _python(check % "test_cached_plain", env=env).stdout.strip().splitlines()
    assert line.endswith(code) and imported == "False"


def test_a_flag_the_code_does_not_settle_is_left_to_the_full_check(tmp_path):
    """A strategy whose ``private`` only its import can tell (set by a decorator here) is not refused from the
    code: the full check imports the module and decides; the code's answer is never a guess."""
    decorated = STRATEGY_MODULE.replace('@STRATEGIES.register("test_cached_plain")',
                                        'def mark(cls):\n    cls.private = True\n    return cls\n\n\n'
                                        '@STRATEGIES.register("test_cached_plain")\n@mark')
    site = installed_package(tmp_path / "site", "test-private-pkg", "test_private_methods", decorated)
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "CLBENCH_CACHE": str(tmp_path / "cache")}
    found = _python("""
        from clbench import plugins
        print(plugins.private_flag("test_cached_plain"), plugins.private_flag("test_cached_private"))
    """, env=env)
    assert found.stdout.split() == ["None", "None"], found.stderr      # the module sets `private` outside a body


@pytest.mark.parametrize("flags", [
    None, ["test_cached_nm"], {"test_cached_nm": {"private": "no", "depends": {}}},
    {"test_invented": {"private": False, "depends": {}}}, {"test_cached_nm": {"private": False}},
], ids=["absent", "a list", "not a bool", "an undeclared name", "no depends"])
def test_private_flags_that_are_not_well_formed_are_not_read(installed, flags):
    installed({"strategy": {"test_cached_nm": ""}})
    entry = json.loads(plugins.cache_file("test-cached-pkg", "0.1").read_text())
    entry["modules"]["test_cached_methods"]["private"] = flags
    plugins.cache_file("test-cached-pkg", "0.1").write_text(json.dumps(entry))
    plugins._sources = None
    assert _installed_source().cached and _installed_source().private is None
    assert plugins.private_flag("test_cached_nm") is None


PYTHON = sys.executable


def _python(code: str, cwd: Path = ROOT, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter, with ``env`` added to this process's environment."""
    env = {**os.environ, "CLBENCH_JOBS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, **kwargs)


# ------------------------------------------------------------------------------------------------------- names
def test_a_plugin_cannot_shadow_a_shipped_name_even_before_the_shipped_module_is_imported(tmp_path):
    for kind, registry, name, base in (("strategy", "STRATEGIES", "naive", "StrategyBase"),  # noqa: F402
                                       ("scenario", "SCENARIOS", "split_digits", None)):
        plugin = tmp_path / f"shadow_{kind}.py"
        body = f"class Mine({base}):\n    pass\n" if base else "def Mine(seed, **kw):\n    pass\n"
        plugin.write_text(f"from clbench.protocol import StrategyBase\nfrom clbench.registry import {registry}\n\n"
                          f"@{registry}.register({name!r})\n{body}")
        result = _python(f"""
            import sys
            from clbench.plugins import PluginError, load_plugin
            try:
                load_plugin({str(plugin)!r})
            except PluginError as exc:
                print(exc)
            print(sorted(m for m in sys.modules if m.startswith("clbench.s")))
        """)
        line, imported = result.stdout.strip().splitlines()
        shipped = "clbench.strategies.baselines" if kind == "strategy" else "clbench.scenarios.digits"
        assert line.startswith(f"plugin {str(plugin)!r} failed to load: ValueError: {kind} {name!r} of shadow_{kind} "
                               f"is already registered by shipped module {shipped}"), result
        assert shipped not in imported         # refused from the index, without importing the shipped module


def test_two_plugins_registering_one_name_are_refused_naming_both(tmp_path, plugin):
    """(The ``plugin`` fixture forgets both afterwards: load_plugin adds the first to $CLBENCH_PLUGINS, which every
    later fresh process of the test run would otherwise load.)"""
    for stem in ("test_plugin_first_x37", "test_plugin_second_x37"):
        plugin(stem, "from clbench.registry import MODELS\n\n@MODELS.register('model_x37')\ndef make(info):\n"
                     "    '''m'''\n")
    load_plugin(str(tmp_path / "test_plugin_first_x37.py"))
    with pytest.raises(PluginError, match="model 'model_x37' of test_plugin_second_x37 is already registered by "
                                          "test_plugin_first_x37"):
        load_plugin(str(tmp_path / "test_plugin_second_x37.py"))
