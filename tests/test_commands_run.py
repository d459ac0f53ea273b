"""``clbench run`` / ``clbench --suite`` (:mod:`clbench.commands.run`): what a suite would fail on is refused in one
line before its first run; a suite ends cleanly on interruption, a full disk or a closed pipe."""

import sys

import torch

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import executors
from clbench.cli import main


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
