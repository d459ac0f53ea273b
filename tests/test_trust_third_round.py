"""Issue #37's probes outside suite loading, one test each: two suites into one output folder, logs of a run redone,
plugins shadowing shipped names, a plugin's helper module outside the code fingerprint, code from two source trees,
tracebacks instead of one line (deep nesting, over-long labels, a closed pipe, a missing or broken wandb/tensorboard),
a swapped saved state, an empty ``--out`` and what every run would fail on (opacus, a read-only ``artifacts/``, W&B
online without a login). Each failed on the code before the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import names, preflight
from clbench.errors import ConfigError
from clbench.plugins import PluginError, load_plugin

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def _python(code: str, cwd: Path = ROOT, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLBENCH_JOBS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, **kwargs)


# ------------------------------------------------------------------------------------------------------- names
def test_a_plugin_cannot_shadow_a_shipped_name_even_before_the_shipped_module_is_imported(tmp_path):
    for kind, registry, name, base in (("strategy", "STRATEGIES", "naive", "StrategyBase"),
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


def test_two_plugins_registering_one_name_are_refused_naming_both(tmp_path):
    for stem in ("first_plugin_x37", "second_plugin_x37"):
        (tmp_path / f"{stem}.py").write_text(
            "from clbench.registry import MODELS\n\n@MODELS.register('model_x37')\ndef make(info):\n    '''m'''\n")
    load_plugin(str(tmp_path / "first_plugin_x37.py"))
    with pytest.raises(PluginError, match="model 'model_x37' of second_plugin_x37 is already registered by "
                                          "first_plugin_x37"):
        load_plugin(str(tmp_path / "second_plugin_x37.py"))


def test_run_ids_too_long_for_the_output_folder_s_file_system_are_refused_before_the_first_run(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setattr(names, "name_limit", lambda folder: 40)
    spec = SimpleNamespace(run_id="a" * 30, strategy=SimpleNamespace(callbacks=()))
    with pytest.raises(ConfigError, match="accepts at most 40 bytes"):
        preflight.preflight([spec], tmp_path)
    preflight.preflight([SimpleNamespace(run_id="a" * 10, strategy=spec.strategy)], tmp_path)


def _private(run_id="r"):
    return SimpleNamespace(run_id=run_id, strategy=SimpleNamespace(callbacks=({"name": "dp", "args": {}},)))


def test_an_installed_opacus_that_fails_at_import_is_one_line_before_the_first_run(tmp_path, monkeypatch):
    for module in [m for m in sys.modules if m.startswith("opacus")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "opacus", None)        # `import opacus` raises ImportError
    with pytest.raises(ConfigError, match="callback dp needs opacus .* cannot be imported"):
        preflight.preflight([_private()], tmp_path)


def test_wandb_online_without_a_login_is_one_line_before_the_first_run(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login u password p\n")
    monkeypatch.setenv("NETRC", str(netrc))
    online = SimpleNamespace(run_id="r", strategy=SimpleNamespace(callbacks=({"name": "wandb",
                                                                              "args": {"mode": "online"}},)))
    with pytest.raises(ConfigError, match="needs a W&B login"):
        preflight.preflight([online], tmp_path)
    offline = SimpleNamespace(run_id="r", strategy=SimpleNamespace(callbacks=({"name": "wandb", "args": {}},)))
    preflight.preflight([offline], tmp_path)
    netrc.write_text("machine api.wandb.ai login user password 0123456789\n")
    preflight.preflight([online], tmp_path)


def test_a_file_size_limit_too_small_for_the_plots_is_one_line_before_the_first_run(tiny_suite, tmp_path):
    """``ulimit -f 100``: every run trained, then the plots could not be written (OSError 27) after the work."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    suite, out = tiny_suite([{"name": "test_increasing_logits"}]), tmp_path / "out"
    result = subprocess.run([PYTHON, "-c", "import sys, tests._fakes; from clbench.cli import main; "
                             "sys.exit(main(sys.argv[1:]))", "--suite", str(suite), "--out", str(out), "--quiet",
                             "--device", "cpu"], cwd=ROOT, preexec_fn=limit, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "CLBENCH_JOBS": "1", "PYTHONPATH": str(ROOT)})
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("suite ")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "file size limit of this shell is 102,400 bytes (ulimit -f)" in lines[0]
    assert not (out / "runs").exists() or not list((out / "runs").iterdir())
