"""Issue #37's probes outside suite loading, one test each: two suites into one output folder, logs of a run redone,
plugins shadowing shipped names, a plugin's helper module outside the code fingerprint, code from two source trees,
tracebacks instead of one line (deep nesting, over-long labels, a closed pipe, a missing or broken wandb/tensorboard),
a swapped saved state, an empty ``--out`` and what every run would fail on (opacus, a read-only ``artifacts/``, W&B
online without a login). Each failed on the code before the fix."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import files, fingerprint, names, preflight
from clbench import records as record_files
from clbench.errors import ConfigError
from clbench.plugins import PluginError, load_plugin
from clbench.suite_file import load_suite
from tests._cli import one_error_line, run_suite

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable




def _python(code: str, cwd: Path = ROOT, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLBENCH_JOBS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, **kwargs)


# ------------------------------------------------------------------------------------------- one folder, one suite
HOLD = """
import sys, time
from clbench.files import locked_folder
with locked_folder(sys.argv[1], "the suite other (run)"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_suite_into_a_held_folder_is_refused_naming_the_holder_and_a_dead_holder_s_lock_is_taken_over(
        tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    holder = subprocess.Popen([PYTHON, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_suite(suite, out) == 2
        one_error_line(capsys, str(out), f"in use by the suite other (run) (pid {holder.pid})", "--out")
        assert not (out / "runs" / "synthetic__test_increasing_logits__s0.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / files.LOCK_FILE).read_text().strip() == f"{holder.pid} the suite other (run)"   # stays, stale
    assert run_suite(suite, out) == 0                                                # and is taken over
    assert (out / "runs" / "synthetic__test_increasing_logits__s0.json").exists()


def test_the_lock_is_released_when_the_suite_ends(tiny_suite, tmp_path):
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    assert run_suite(suite, out) == 0
    with files.locked_folder(out, "test"):  # would raise FolderInUse if the finished suite still held it
        pass


# --------------------------------------------------------------------------------------------- logs of a run redone
def _logs(artifacts: Path) -> dict[str, str]:
    return {name: (artifacts / name).read_text() for name in
            ("training_log.jsonl", "training_log.csv", "evaluation_log.jsonl", "hooks.jsonl")}


def test_a_run_redone_rewrites_its_training_evaluation_and_hook_logs(tiny_suite, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "out"
    suite = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 2},
                         "callbacks": [{"name": "hook_trace", "args": {"batches": 1}}, {"name": "tensorboard"},
                                       {"name": "wandb"}]}],
                       scenario_args={"train_per_class": 8, "test_per_class": 4, "n_experiences": 2})
    assert run_suite(suite, out) == 0
    artifacts = out / "artifacts" / "synthetic__naive__s0"
    first = _logs(artifacts)
    assert len(first["training_log.jsonl"].splitlines()) == 4              # 2 experiences x 2 epochs
    assert len(first["evaluation_log.jsonl"].splitlines()) == 2
    for name in first:                      # an interrupted earlier attempt left rows behind
        with open(artifacts / name, "a") as f:
            f.write(first[name].splitlines()[-1] + "\n")
    assert run_suite(suite, out, "--force") == 0
    assert _logs(artifacts) == first        # exactly the rerun's own rows (the runs are deterministic)
    assert len(list((artifacts / "tensorboard").glob("events.*"))) == 1       # the rerun's writer only
    assert len(list((artifacts / "wandb" / "wandb").glob("offline-run-*"))) == 1


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


PLUGIN = '''from helper_x37e import EXTRA
from clbench.registry import STRATEGIES
from tests._fakes import IncreasingLogits


@STRATEGIES.register("helped_x37")
class Helped(IncreasingLogits):
    """Scores as its parent; imports a helper module from its folder."""
'''


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


# ------------------------------------------------------------------------------------------ one line, no traceback
def test_a_deeply_nested_suite_file_is_one_line_naming_the_limit(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("suite: deep\nscenarios: " + "[" * 3000 + "]" * 3000 + "\n")
    assert run_suite(path, tmp_path / "out") == 2
    one_error_line(capsys, str(path), "more than 50 levels")


def test_a_label_longer_than_a_file_name_may_be_is_refused_at_load_naming_the_limit(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"suite": "s", "scenarios": [{"name": "synthetic", "label": "x" * 300}],
                                    "strategies": [{"name": "naive"}]}))
    with pytest.raises(ConfigError, match=f"300 characters long; at most {names.MAX_NAME}"):
        load_suite(path)


def test_run_ids_too_long_for_the_output_folder_s_file_system_are_refused_before_the_first_run(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setattr(names, "name_limit", lambda folder: 40)
    spec = SimpleNamespace(run_id="a" * 30, strategy=SimpleNamespace(callbacks=()))
    with pytest.raises(ConfigError, match="accepts at most 40 bytes"):
        preflight.preflight([spec], tmp_path)
    preflight.preflight([SimpleNamespace(run_id="a" * 10, strategy=spec.strategy)], tmp_path)


@pytest.mark.parametrize("argv", [["list"], ["config", "naive"]])
def test_a_closed_output_pipe_ends_quietly(argv):
    proc = subprocess.Popen([PYTHON, "-m", "clbench", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()                     # `| head -0`: the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


BLOCK = """
import importlib.abc, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ("wandb", "tensorboard"):
            raise ImportError(f"{name} is broken here")
sys.meta_path.insert(0, Broken())
from clbench.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_broken_wandb_and_tensorboard_break_only_their_callbacks(tiny_suite, tmp_path):
    plain = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}}], name="plain",
                       scenario_args={"train_per_class": 4, "test_per_class": 2, "n_experiences": 2})
    logged = tiny_suite([{"name": "naive", "preset": "cpu", "callbacks": [{"name": "tensorboard"}]}], name="logged")
    env = {**os.environ, "CLBENCH_JOBS": "1", "PYTHONPATH": str(ROOT)}
    for suite, code in ((plain, 0), (logged, 2)):
        result = subprocess.run([PYTHON, "-c", BLOCK, "--suite", str(suite), "--out", str(tmp_path / suite.stem),
                                 "--quiet", "--quiet-table", "--device", "cpu"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("suite ")]
    assert lines == ["error: callback tensorboard needs torch.utils.tensorboard, which cannot be imported "
                     "(ImportError: tensorboard is broken here); pip install 'clbench[tensorboard]' or remove the "
                     "tensorboard entries."]
    assert not (tmp_path / "logged" / "runs" / "synthetic__naive__s0.json").exists()


# ------------------------------------------------------------------------------------- state, --out, pre-flight
def test_a_state_file_swapped_for_another_run_s_is_refused(tmp_path):
    record = SimpleNamespace(run_id="r", identity_hash="h", code_fingerprint="c", started="t")
    state = tmp_path / "out" / "state" / "r"
    state.mkdir(parents=True)
    (state / "strategy.pt").write_bytes(b"mine")
    record_files.write_owner(state, record)
    path = tmp_path / "out" / "runs" / "r.json"
    as_read = {**vars(record), "state_dir": "state/r", "status": "finished"}
    assert record_files.state_dir(path, as_read) == state.resolve()
    (state / "strategy.pt").write_bytes(b"another run's")
    with pytest.raises(record_files.ForeignState, match="files strategy.pt differ from what the run saved"):
        record_files.state_dir(path, as_read)


def test_an_empty_out_is_refused(tiny_suite, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_suite(tiny_suite([{"name": "test_increasing_logits"}]), "") == 2
    one_error_line(capsys, "--out ''")
    assert not (tmp_path / "results").exists()


def test_the_missing_opacus_hint_names_an_extra_that_exists():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("opacus") for d in extras["dp"])
    for module in ("clbench/suite_file.py", "clbench/privacy/accountant.py"):
        hinted = {part.split("]")[0] for part in (ROOT / module).read_text().split("clbench[")[1:]}
        assert hinted <= set(extras), (module, hinted)


def _private(run_id="r"):
    return SimpleNamespace(run_id=run_id, strategy=SimpleNamespace(callbacks=({"name": "dp", "args": {}},)))


def test_an_installed_opacus_that_fails_at_import_is_one_line_before_the_first_run(tmp_path, monkeypatch):
    for module in [m for m in sys.modules if m.startswith("opacus")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "opacus", None)        # `import opacus` raises ImportError
    with pytest.raises(ConfigError, match="callback dp needs opacus .* cannot be imported"):
        preflight.preflight([_private()], tmp_path)


def test_a_read_only_artifacts_folder_is_one_line_before_the_first_run(tiny_suite, tmp_path, capsys, monkeypatch):
    real = Path.write_text

    def read_only(self, *args, **kwargs):
        if self.parent.name == "artifacts":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *args, **kwargs)

    (tmp_path / "out" / "artifacts").mkdir(parents=True)        # read-only: it exists (a fresh one is made writable)
    monkeypatch.setattr(Path, "write_text", read_only)
    assert run_suite(tiny_suite([{"name": "test_increasing_logits"}]), tmp_path / "out") == 2
    one_error_line(capsys, "cannot be written to", "Read-only file system", "artifacts")
    assert not list((tmp_path / "out").rglob("*.json"))


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


def test_a_lock_file_of_an_older_clbench_holding_only_a_pid_is_refused_naming_that_pid(tmp_path):
    """Lock files written before they named their holder hold ``<pid>`` alone: still refused, as another process."""
    import fcntl

    path = tmp_path / files.LOCK_FILE
    path.write_text("4242\n")
    with open(path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(files.FolderInUse) as info:
            with files.locked_folder(tmp_path, "report", "wait"):
                pass
    assert str(info.value) == f"output folder {tmp_path} is in use by another clbench process (pid 4242); wait."


def test_the_lock_file_holds_the_holder_s_pid_and_name_while_held(tmp_path):
    with files.locked_folder(tmp_path, "leaderboard"):
        assert (tmp_path / files.LOCK_FILE).read_text().strip() == f"{os.getpid()} leaderboard"
        started = time.monotonic()
        result = _python("""
            import sys
            from clbench.files import FolderInUse, locked_folder
            try:
                with locked_folder(sys.argv[1], "report"):
                    print("taken")
            except FolderInUse as exc:
                print(exc)
        """.replace("sys.argv[1]", repr(str(tmp_path))))
        assert f"in use by leaderboard (pid {os.getpid()})" in result.stdout, result
        assert time.monotonic() - started < 60            # refused at once, not waited for


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


def test_a_truncated_checkpoint_is_one_line_naming_the_file_before_the_first_run(tiny_suite, tmp_path, capsys):
    import torch

    from clbench.models.checkpoint import save_weights

    checkpoint = save_weights(torch.nn.Linear(8, 4), tmp_path / "w0.safetensors")
    checkpoint.write_bytes(checkpoint.read_bytes()[:40])
    suite = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"init": str(checkpoint)}}])
    assert run_suite(suite, tmp_path / "out") == 2
    one_error_line(capsys, f"checkpoint file {checkpoint} cannot be read", "cut short")
    assert not list((tmp_path / "out").rglob("*.json"))
