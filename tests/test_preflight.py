"""The refusals that the command line alone decides (:func:`clbench.commands.run._check_before_imports` and
:mod:`clbench.preflight`): each one line and exit code 2, before the suite's modules, torch or Avalanche are imported
(they came after 9-13 s of imports; benchmarks/refusal_time.py times each kind), nor numpy (the failure path
imported it through clbench.records)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import names, preflight
from clbench.errors import ConfigError
from clbench.files import locked_folder
from clbench.preflight import GPU_DEVICE_FILES, check_gpu_present

ROOT = Path(__file__).parents[1]
NO_GPU = not any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES)

CHILD = """import contextlib, io, json, os, resource, sys
from clbench.cli import main
out = []
for argv, env, fsize in json.loads(sys.argv[1]):
    os.environ.update(env)
    if fsize:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    for key in env:
        del os.environ[key]
    out.append([code, err.getvalue()])
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'avalanche', 'continuum', 'numpy') or
               m.startswith(('clbench.strategies.', 'clbench.scenarios.', 'clbench.models.')))
print(json.dumps([out, heavy]))
"""


def _init_suite(tmp_path: Path) -> Path:
    """A suite whose strategy entry names a checkpoint per scenario (``{scenario}``) that does not exist."""
    path = tmp_path / "init_suite.yaml"
    path.write_text(f"suite: init_suite\nscenarios: [split_digits]\nstrategies:\n"
                    f"  - {{name: taft, args: {{init: '{tmp_path}/c_{{scenario}}.pt'}}}}\n")
    return path


def _linked_out(tmp_path: Path) -> Path:
    """An output folder whose ``artifacts/`` is a symbolic link to a folder outside it."""
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    (tmp_path / "linked").mkdir(exist_ok=True)
    if not (tmp_path / "linked" / "artifacts").is_symlink():
        (tmp_path / "linked" / "artifacts").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    return tmp_path / "linked"


def command_line_cases(tmp_path: Path) -> dict[str, tuple[list, dict, int, str]]:
    """name -> (argv, environment, file size limit or 0, the start of the refusal after 'error: '); the folder
    ``tmp_path / "locked"`` is to be held locked by the caller (benchmarks/refusal_time.py times these too)."""
    out = ["--suite", "quick", "--out", str(tmp_path / "out"), "--quiet"]
    cases = {
        "--jobs 0": ([*out, "--jobs", "0"], {}, 0, "--jobs must be at least 1, got 0."),
        "$CLBENCH_JOBS 0": (out, {"CLBENCH_JOBS": "0"}, 0, "$CLBENCH_JOBS must be at least 1, got 0"),
        "--out ''": (["--suite", "quick", "--out", ""], {}, 0, "--out '' names no folder"),
        "--out not writable": (["--suite", "quick", "--out", "/proc/clbench_out"], {}, 0,
                               "output folder /proc/clbench_out cannot be written to"),
        "output folder in use": (["--suite", "quick", "--out", str(tmp_path / "locked")], {}, 0,
                                 f"output folder {tmp_path / 'locked'} is in use by the test (pid "),
        "--strategy not in the suite": ([*out, "--strategy", "naiv"], {}, 0,
                                        "suite 'quick' has no strategy 'naiv'. Did you mean 'naive'?"),
        "--scenario not in the suite": ([*out, "--scenario", "split_digitz"], {}, 0,
                                        "suite 'quick' has no scenario 'split_digitz'. Did you mean 'split_digits'?"),
        "--seeds -1": ([*out, "--seeds", "-1"], {}, 0, "--seeds: 'seeds' must be a non-empty list of integers"),
        "--init missing": ([*out, "--init", str(tmp_path / "no.pt")], {}, 0,
                           f"checkpoint file(s) not found: {tmp_path / 'no.pt'}, given by --init."),
        "ulimit -f": (out, {}, 4096, "the file size limit of this shell is 4,096 bytes (ulimit -f)"),
        "<out>/artifacts a link": (["--suite", "quick", "--out", str(_linked_out(tmp_path)), "--quiet", "--force"],
                                   {}, 0, f"{tmp_path / 'linked' / 'artifacts'} is a symbolic link (to "
                                          f"{tmp_path / 'elsewhere'}): a run writes only inside its results folder"),
        "suite init missing": (["--suite", str(_init_suite(tmp_path)), "--out", str(tmp_path / "out"), "--quiet"],
                               {}, 0, f"checkpoint file(s) not found: {tmp_path / 'c_split_digits.pt'}, read by "
                                      f"taft (init) on split_digits."),
    }
    if NO_GPU:
        cases["--device cuda"] = ([*out, "--device", "cuda"], {}, 0, "--device cuda was asked for but this machine "
                                                                     "has no GPU")
    return dict(sorted(cases.items(), key=lambda item: item[1][2]))     # the file size limit last: it stays


def test_the_command_line_refusals_come_before_the_imports(tmp_path):
    cases = command_line_cases(tmp_path)
    with locked_folder(tmp_path / "locked", "the test"):
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([c[:3] for c in cases.values()])],
                              capture_output=True, text=True, cwd=tmp_path)
    results, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (code, err), (*_, start) in zip(cases, results, cases.values()):
        assert code == 2 and err.startswith(f"error: {start}") and err.count("\n") == 1, (name, err)
    assert heavy == [], heavy
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "elsewhere").iterdir())     # nothing written through the link, not even a probe


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU device file")
def test_cuda_on_a_machine_without_a_gpu_is_refused_without_torch():
    with pytest.raises(ConfigError, match="no GPU"):
        check_gpu_present("cuda:1")
    check_gpu_present("cpu")
    check_gpu_present("auto")


def dataset_case(tmp_path: Path) -> tuple[list, dict, str]:
    """``(argv, environment, the start of the refusal after 'error: ')`` of a suite whose scenario reads CIFAR-100
    from data roots that do not hold it (benchmarks/refusal_time.py times it too)."""
    path = tmp_path / "data_suite.yaml"
    path.write_text(f"suite: data_suite\nscenarios: [{{name: split_cifar100, args: {{data_root: '{tmp_path}/a'}}}}]\n"
                    f"strategies: [naive]\n")
    env = {"CLBENCH_DATA": str(tmp_path / "b"), "HOME": str(tmp_path / "home")}
    roots = f"{tmp_path}/a, {tmp_path}/b, {tmp_path}/home/.cache/clbench, /usr/share/datasets"
    return (["--suite", str(path), "--out", str(tmp_path / "out"), "--quiet"], env,
            f"dataset 'cifar100' of scenario split_cifar100 not found under the data roots {roots} (expected "
            f"cifar-100-python/{{train, test}} or cifar100/{{cifar100.npz}}); set CLBENCH_DATA=<a root holding "
            f"it> or pass --data-root <root>, or rerun with --download (fetches it into {tmp_path}/a).")


def test_a_missing_dataset_is_refused_before_the_imports(tmp_path):
    """The run command looks for the datasets the selected scenarios read (recorded in the registries' index) under
    the data roots before the suite's imports: one line naming the dataset, the roots and the fix (was the loader's
    DatasetNotFound in every run, after the imports); not even numpy (clbench.data imports its catalog on first
    use)."""
    argv, env, start = dataset_case(tmp_path)
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([[argv, env, 0]])], capture_output=True,
                          text=True, cwd=ROOT)
    [[code, err]], heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert (code, err) == (2, f"error: {start}\n")
    assert heavy == [], heavy


def test_an_image_folder_scenarios_data_are_checked_before_the_imports(tmp_path):
    """split_imagenet_subset over a flat val/ without LOC_val_solution.csv, or over images of mixed sizes without
    image_size, failed each run after the imports: its recorded data check refuses either in one line before them
    (torch not imported), naming the scenario and the fix; with the ground-truth file and image_size it passes."""
    from tests.test_data import _imagenet_tree

    _imagenet_tree(tmp_path / "in", {"ILSVRC2012_val_00000001": 8, "ILSVRC2012_val_00000002": 12})
    for name, extra in (("sized", ", image_size: 8"), ("mixed", "")):
        (tmp_path / f"{name}.yaml").write_text(
            f"suite: {name}\nscenarios: [{{name: split_imagenet_subset, args: {{root: '{tmp_path}/in', "
            f"n_experiences: 1{extra}}}}}]\nstrategies: [naive]\n")
    check = ("import sys\nfrom clbench.errors import ConfigError\nfrom clbench.preflight import check_suite_datasets\n"
             "try:\n    check_suite_datasets(sys.argv[1], None)\n    print('passed')\nexcept ConfigError as exc:\n"
             "    print(exc)\nprint('torch' in sys.modules)\n")

    def refusal(name: str) -> str:
        done = subprocess.run([PYTHON, "-c", check, str(tmp_path / f"{name}.yaml")], capture_output=True, text=True,
                              cwd=ROOT)
        line, torch_imported = done.stdout.strip().splitlines()
        assert torch_imported == "False", done
        return line

    assert refusal("sized") == "passed"
    assert refusal("mixed").startswith("scenario split_imagenet_subset: ") and \
        "images of different sizes (8x8, 12x12); set the scenario's image_size" in refusal("mixed")
    (tmp_path / "in" / "LOC_val_solution.csv").unlink()
    assert refusal("sized").startswith(f"scenario split_imagenet_subset: {tmp_path}/in/val holds its images "
                                       "directly, without class folders, and no ground-truth file")


PYTHON = sys.executable


def _private(run_id="r"):
    return SimpleNamespace(run_id=run_id, strategy=SimpleNamespace(callbacks=({"name": "dp", "args": {}},)))


def test_run_ids_too_long_for_the_output_folder_s_file_system_are_refused_before_the_first_run(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setattr(names, "name_limit", lambda folder: 40)
    spec = SimpleNamespace(run_id="a" * 30, strategy=SimpleNamespace(callbacks=()))
    with pytest.raises(ConfigError, match="accepts at most 40 bytes"):
        preflight.preflight([spec], tmp_path)
    preflight.preflight([SimpleNamespace(run_id="a" * 10, strategy=spec.strategy)], tmp_path)


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
