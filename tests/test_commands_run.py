"""``clbench run`` / ``clbench --suite`` (:mod:`clbench.commands.run`): what a suite would fail on is refused in one
line before its first run; a suite ends cleanly on interruption, a full disk or a closed pipe."""
from __future__ import annotations

import errno
import sys
from pathlib import Path

import torch
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import executors
from clbench.cli import main
from tests._cli import one_error_line, run_suite


# -------------------------------------------------------------------------------------- output folder and flags
def test_unusable_output_folder_device_and_executor_stop_before_the_first_run(tiny_suite, tmp_path, capsys,
                                                                             monkeypatch):
    calls = []
    monkeypatch.setattr(executors, "run", lambda spec, out: calls.append(spec))
    suite = tiny_suite([{"name": "test_increasing_logits"}])
    (tmp_path / "a_file").write_text("")
    cases = [(["--out", str(tmp_path / "a_file")], "output folder"),
             (["--out", str(tmp_path / "a_file" / "below")], "output folder"),
             (["--shard-workers", "0"], "--shard-workers"),
             (["--device", "tpu"], "--device")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda"))
    monkeypatch.setitem(sys.modules, "ray", None)                     # Ray not installed
    cases.append((["--executor", "ray"], "pip install"))
    for flags, message in cases:
        capsys.readouterr()
        argv = ["--suite", str(suite), "--quiet", "--quiet-table"]
        argv += flags if "--out" in flags else ["--out", str(tmp_path / "out"), *flags]
        assert main(argv) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (flags, err)
    assert calls == []


def test_an_empty_out_is_refused(tiny_suite, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_suite(tiny_suite([{"name": "test_increasing_logits"}]), "") == 2
    one_error_line(capsys, "--out ''")
    assert not (tmp_path / "results").exists()


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


def test_a_truncated_checkpoint_is_one_line_naming_the_file_before_the_first_run(tiny_suite, tmp_path, capsys):
    import torch

    from clbench.models.checkpoint import save_weights

    checkpoint = save_weights(torch.nn.Linear(8, 4), tmp_path / "w0.safetensors")
    checkpoint.write_bytes(checkpoint.read_bytes()[:40])
    suite = tiny_suite([{"name": "naive", "preset": "cpu", "args": {"init": str(checkpoint)}}])
    assert run_suite(suite, tmp_path / "out") == 2
    one_error_line(capsys, f"checkpoint file {checkpoint} cannot be read", "cut short")
    assert not list((tmp_path / "out").rglob("*.json"))


DIGITS = {"suite": "s", "seeds": [0], "scenarios": [{"name": "split_digits"}],
          "strategies": [{"name": "naive", "preset": "cpu"}]}


# ------------------------------------------------------------------------------------------------ disk full
def _disk_full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_missing_checkpoint_is_refused_before_the_first_run(tmp_path, capsys):
    """An ``init`` file that does not exist (after ``{scenario}`` is replaced) is one error line naming the file
    and how to create it, exit code 2, and no run starts (each run would have failed on it)."""
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({**DIGITS, "strategies": [{"name": "naive", "preset": "cpu", "args": {
        "init": str(tmp_path / "none_{scenario}.pt")}}]}))
    assert run_suite(suite, tmp_path / "out") == 2
    one_error_line(capsys, str(tmp_path / "none_split_digits.pt"), "naive (init) on split_digits", "pretrain")
    assert not list((tmp_path / "out").glob("runs/*.json"))


def test_a_full_disk_while_plotting_is_one_line_and_keeps_the_records(tiny_suite, tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", _disk_full)
    assert run_suite(tiny_suite([{"name": "test_increasing_logits"}]), tmp_path / "out") == 2
    one_error_line(capsys, "plots", "No space left on device")
    assert len(list((tmp_path / "out/runs").glob("*.json"))) == 1
    assert not [p for p in (tmp_path / "out").rglob("*.tmp")]


def test_seeds_given_on_the_command_line_are_checked_too(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump(DIGITS))
    assert run_suite(suite, tmp_path / "out", "--seeds", "3", "3") == 2
    one_error_line(capsys, "seed 3 appears twice")
    assert run_suite(suite, tmp_path / "out", "--seeds", str(2**32)) == 2
    one_error_line(capsys, "2**32")


def test_a_suite_refused_before_its_first_run_leaves_no_output_folder(tmp_path, capsys):
    """A checkpoint that does not exist is refused after the output folder was checked: nothing is created."""
    out = tmp_path / "deep" / "out"
    assert main(["--suite", "quick", "--strategy", "taft", "--init", str(tmp_path / "nope.pt"), "--out", str(out),
                 "--quiet"]) == 2
    assert "checkpoint file(s) not found" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_output_folder_is_still_refused_before_the_first_run(tmp_path, capsys):
    """Nothing is created, yet ``--out`` under a file (not a folder) is refused by the probe of the nearest folder."""
    (tmp_path / "file").write_text("")
    assert main(["--suite", "quick", "--strategy", "naive", "--out", str(tmp_path / "file" / "out"), "--quiet"]) == 2
    assert "cannot be written to" in capsys.readouterr().err
