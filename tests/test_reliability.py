"""Issue #26's probes, one test each: settings silently replaced, records counted twice, state and checkpoints taken
from the wrong place, workers that outlive their driver, failures that were not one clear line (a full disk,
binary or exploding suite files) and errors that came only after work had started (scenario arguments against the
data, seeds, dp with a memory or without opacus). Each failed on the code before the fix (the commit that added this
file); the PETL-module probes are in tests/test_petl.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

import tests._fakes  # noqa: F401 - registers test_increasing_logits
from clbench import api, config, executors
from clbench import records as record_files
from clbench.cli import main
from clbench.errors import ConfigError
from clbench.models.checkpoint import save_weights
from clbench.suite_file import load_suite, parse_suite
from tests._cli import one_error_line, run_suite

ROOT = Path(__file__).resolve().parents[1]
DIGITS = {"suite": "s", "seeds": [0], "scenarios": [{"name": "split_digits"}],
          "strategies": [{"name": "naive", "preset": "cpu"}]}




# ---------------------------------------------------------------------------------------------- counted twice
def test_a_copied_record_counts_once_whatever_its_file_name_and_is_reported_by_path(tiny_suite, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_suite(tiny_suite([{"name": "test_increasing_logits", "args": {"extra": 2.0}}], seeds=(0, 1)), out) == 0
    runs = out / "runs"
    original = runs / "synthetic__test_increasing_logits__s0.json"
    shutil.copy(original, runs / "synthetic__test_increasing_logits__s0 (copy).json")
    shutil.copy(original, runs / "synthetic__test_increasing_logits__s5.json")          # holds seed 0
    capsys.readouterr()
    assert main(["leaderboard", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "s0 (copy).json" in err and "__s5.json" in err and str(original) in err
    table = pd.read_csv(out / "leaderboard.csv")
    assert list(table["n_seeds"]) == [2]
    records, problems = record_files.load_dir(out)
    assert sorted(r["seed"] for r in records) == [0, 1] and len(problems) == 2


# ------------------------------------------------------------------------------------------------ saved state
@pytest.fixture(scope="module")
def copied_results(tmp_path_factory):
    """A taft_shards run in ``original``, its results folder copied to ``archive``, then the original run made
    again with other settings (its state replaced)."""
    root = tmp_path_factory.mktemp("copied")
    vit = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}

    def suite(n_shards):
        path = root / f"s{n_shards}.yaml"
        path.write_text(yaml.safe_dump({
            "suite": "s", "scenarios": [{"name": "synthetic", "args": {"train_per_class": 10, "test_per_class": 5}}],
            "strategies": [{"name": "taft_shards", "preset": "cpu",
                            "args": {"n_shards": n_shards, "epochs": 1, "model_args": vit}}]}))
        return path

    assert run_suite(suite(3), root / "original") == 0
    shutil.copytree(root / "original", root / "archive")
    assert run_suite(suite(2), root / "original") == 0
    return root


def test_records_store_paths_relative_to_their_results_folder(copied_results):
    record = json.loads((copied_results / "archive/runs/synthetic__taft_shards__s0.json").read_text())
    assert record["state_dir"] == "state/synthetic__taft_shards__s0"
    assert str(copied_results) not in json.dumps(record)


def test_forget_on_a_copied_results_folder_uses_the_copy_s_own_state(copied_results, capsys):
    archive = copied_results / "archive/runs/synthetic__taft_shards__s0.json"
    (copied_results / "ids.txt").write_text("4")
    capsys.readouterr()
    assert main(["forget", "--run", str(archive), "--ids", str(copied_results / "ids.txt"), "--mode", "retrain"]) == 0
    row = json.loads((copied_results / "archive/removals/synthetic__taft_shards__s0__retrain__ids.json").read_text())
    assert row["shards_left"] == 3 * 3                            # the archive's 3 shards per experience, not 2
    assert not (copied_results / "original/removals").exists()


def test_forget_refuses_a_record_whose_state_belongs_to_another_run(copied_results, capsys):
    """A record written before paths were relative names the original folder's state, which another run replaced."""
    archive = copied_results / "archive/runs/synthetic__taft_shards__s0.json"
    old_style = copied_results / "old/runs/synthetic__taft_shards__s0.json"
    old_style.parent.mkdir(parents=True)
    record = json.loads(archive.read_text())
    record["state_dir"] = str(copied_results / "original/state/synthetic__taft_shards__s0")
    old_style.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["forget", "--run", str(old_style), "--touch", "1"]) == 2
    one_error_line(capsys, "written by another run", "--force")
    assert not (copied_results / "old/removals").exists()


def test_forget_refuses_a_state_whose_strategy_file_was_swapped_for_another_run_s(copied_results, capsys):
    """The archive's own state folder (owner file intact), its strategy.pt replaced by the rerun's (2 shards, not 3):
    forget would serve the other run's weights under this record's name (issue #37)."""
    swapped = copied_results / "swapped"
    shutil.copytree(copied_results / "archive", swapped)
    shutil.rmtree(swapped / "removals", ignore_errors=True)          # the archive's own, made by an earlier test
    state = "state/synthetic__taft_shards__s0/strategy.pt"
    shutil.copy(copied_results / "original" / state, swapped / state)
    capsys.readouterr()
    assert main(["forget", "--run", str(swapped / "runs/synthetic__taft_shards__s0.json"), "--touch", "1"]) == 2
    one_error_line(capsys, "strategy.pt differ from what the run saved", "--force")
    assert not (swapped / "removals").exists()


def test_a_record_with_an_absolute_state_dir_still_reads(copied_results):
    """Records written before this change (absolute state_dir) load: leaderboards and resume read them."""
    record = json.loads((copied_results / "archive/runs/synthetic__taft_shards__s0.json").read_text())
    record["state_dir"] = "/tmp/quickref/state/x"
    path = copied_results / "abs/runs/synthetic__taft_shards__s0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    assert record_files.read(path)["state_dir"] == "/tmp/quickref/state/x"
    with pytest.raises(record_files.ForeignState, match="is missing"):
        record_files.state_dir(path, record)


# ------------------------------------------------------------------------------------------------ checkpoints
def test_overwriting_an_init_checkpoint_makes_resume_run_again(tmp_path, capsys):
    scenario = api.scenario("split_digits")
    strategy = api.strategy("naive", scenario.info, preset="cpu")
    checkpoint = tmp_path / "w0.pt"
    save_weights(strategy.model.feature_extractor, checkpoint)
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({**DIGITS, "strategies": [{"name": "naive", "preset": "cpu",
                                                              "args": {"init": str(checkpoint), "epochs": 1}}]}))
    out = tmp_path / "out"
    assert run_suite(suite, out) == 0
    first = json.loads((out / "runs/split_digits__naive__s0.json").read_text())
    assert first["checkpoints"] == {"init": first["checkpoints"]["init"]} and len(first["checkpoints"]["init"]) == 16
    with torch.no_grad():
        for p in strategy.model.feature_extractor.parameters():
            p.add_(0.5)
    save_weights(strategy.model.feature_extractor, checkpoint)           # another pretraining, same path
    capsys.readouterr()
    assert run_suite(suite, out) == 0
    assert "1 made with another configuration" in capsys.readouterr().err
    second = json.loads((out / "runs/split_digits__naive__s0.json").read_text())
    assert second["checkpoints"] != first["checkpoints"]
    assert second["identity_hash"] != first["identity_hash"]


def test_scenario_in_init_names_the_scenario_file_for_every_strategy(tmp_path):
    """``{scenario}`` in ``init`` is replaced by the scenario's name for any strategy (here naive; it was done by the
    PETL strategies alone, so every other one failed at run time on the literal path): the run finishes and its
    record hashes the file of that scenario, while the identity keeps the written path. Catches a substitution
    that is lost, or done in the identity but not in what the strategy reads."""
    scenario = api.scenario("split_digits")
    strategy = api.strategy("naive", scenario.info, preset="cpu")
    save_weights(strategy.model.feature_extractor, tmp_path / "w_split_digits.pt")
    suite = tmp_path / "s.yaml"
    written = str(tmp_path / "w_{scenario}.pt")
    suite.write_text(yaml.safe_dump({**DIGITS, "strategies": [{"name": "naive", "preset": "cpu",
                                                              "args": {"init": written, "epochs": 1}}]}))
    assert run_suite(suite, tmp_path / "out") == 0
    record = json.loads((tmp_path / "out/runs/split_digits__naive__s0.json").read_text())
    assert record["status"] == "finished"
    assert record["checkpoints"] == {"init": config.file_hash(tmp_path / "w_split_digits.pt")}
    assert record["strategy_config"]["init"] == written


def test_build_strategy_replaces_scenario_in_init_as_the_run_does(tmp_path):
    """``forget`` rebuilds a run's strategy with ``build_strategy(spec, info, device)`` (no config): the path it reads
    has ``{scenario}`` replaced as in the run, so the backbone holds the scenario's checkpoint."""
    from clbench.runner import build_scenario, build_strategy

    scenario = api.scenario("split_digits")
    saved = api.strategy("naive", scenario.info, preset="cpu")
    save_weights(saved.model.feature_extractor, tmp_path / "w_split_digits.pt")
    spec = parse_suite({**DIGITS, "strategies": [{"name": "naive", "preset": "cpu", "args": {
        "init": str(tmp_path / "w_{scenario}.pt")}}]}, source="test").run_specs("cpu")[0]
    built = build_strategy(spec, build_scenario(spec).info, torch.device("cpu"))
    for a, b in zip(built.model.feature_extractor.parameters(), saved.model.feature_extractor.parameters()):
        assert torch.equal(a, b)


def test_with_scenario_paths_replaces_init_at_any_depth_and_nothing_else():
    """Top-level ``init`` and ``model_args.init`` are replaced, other strings holding ``{scenario}`` and the input
    config are not; a config without the placeholder comes back as the same object."""
    base = config.build_config("naive", "cpu", {"init": "c/{scenario}.pt"})
    out = config.with_scenario_paths(base, "split_mnist")
    assert out.init == "c/split_mnist.pt" and base.init == "c/{scenario}.pt"
    assert {k: v for k, v in vars(out).items() if k != "init"} == {k: v for k, v in vars(base).items() if k != "init"}
    nested = {"init": None, "model_args": {"init": "{scenario}/b.pt", "name": "{scenario}"}}
    assert config.with_scenario_paths(nested, "x") == {"init": None, "model_args": {"init": "x/b.pt",
                                                                                    "name": "{scenario}"}}
    plain = config.build_config("naive", "cpu", {})
    assert config.with_scenario_paths(plain, "x") is plain


def test_a_missing_checkpoint_is_refused_before_the_first_run(tmp_path, capsys):
    """An ``init`` file that does not exist (after ``{scenario}`` is replaced) is one error line naming the file
    and how to create it, exit code 2, and no run starts (each run would have failed on it)."""
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({**DIGITS, "strategies": [{"name": "naive", "preset": "cpu", "args": {
        "init": str(tmp_path / "none_{scenario}.pt")}}]}))
    assert run_suite(suite, tmp_path / "out") == 2
    one_error_line(capsys, str(tmp_path / "none_split_digits.pt"), "naive (init) on split_digits", "pretrain")
    assert not list((tmp_path / "out").glob("runs/*.json"))


# ------------------------------------------------------------------------------------------- driver killed
def _driver(tmp_path, markers, seeds=(0, 1, 2, 3)):
    """A suite of held runs started with --jobs 2 in a separate driver process."""
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({
        "suite": "s", "seeds": list(seeds),
        "scenarios": [{"name": "synthetic", "args": {"train_per_class": 5, "test_per_class": 5}}],
        "strategies": [{"name": "test_hold_or_crash",
                        "args": {"marker_dir": str(markers), "hold_seeds": [1, 2, 3]}}]}))
    code = ("import sys, tests._scale_fakes; from clbench.cli import main; "
            f"sys.exit(main(['--suite', {str(suite)!r}, '--out', {str(tmp_path / 'out')!r}, '--quiet', "
            "'--quiet-table', '--device', 'cpu', '--jobs', '2']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_driver_leaves_no_worker_behind(tmp_path, how):
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "hold").write_text("")
    driver = _driver(tmp_path, markers)
    try:
        deadline, workers = time.monotonic() + 240, set()
        while len(workers) < 2 and time.monotonic() < deadline:          # both workers in a run
            time.sleep(0.1)
            workers = {int(text) for p in markers.glob("[0-9]*.*") if (text := p.read_text())}
        assert len(workers) == 2 and driver.pid not in workers
        time.sleep(0.5)
        driver.send_signal(how)
        _, err = driver.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers), "a worker outlived its driver"
    finally:
        (markers / "hold").unlink(missing_ok=True)
        driver.kill()
    if how == signal.SIGTERM:
        lines = [line for line in err.strip().splitlines() if "suite s:" not in line]
        assert driver.returncode == 143, err
        assert len(lines) == 1 and "interrupted (SIGTERM)" in lines[0] and "rerun the same command" in lines[0], err
        assert [p.name for p in (tmp_path / "out/runs").glob("*.json")] == ["synthetic__test_hold_or_crash__s0.json"]


def test_sigterm_in_process_keeps_finished_records_and_says_how_to_resume(tiny_suite, tmp_path, capsys,
                                                                           monkeypatch):
    real_run, started = executors.run, []

    def terminated_at_the_second_run(spec, out):
        started.append(spec)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGTERM)       # the first run is recorded
        return real_run(spec, out)

    monkeypatch.setattr(executors, "run", terminated_at_the_second_run)
    suite = tiny_suite([{"name": "test_increasing_logits"}], seeds=(0, 1))
    before = signal.getsignal(signal.SIGTERM)       # SIG_DFL, or e.g. Ray's when a Ray test ran in this process
    assert run_suite(suite, tmp_path / "out") == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("interrupted (SIGTERM): 1 finished records are kept") and len(err) == 2, err
    assert len(list((tmp_path / "out/runs").glob("*.json"))) == 1
    assert signal.getsignal(signal.SIGTERM) is before      # the suite's handler is taken back


# ------------------------------------------------------------------------------------------------ disk full
def _disk_full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_writing_a_record_is_one_line_and_leaves_no_temporary_file(tiny_suite, tmp_path, capsys,
                                                                                    monkeypatch):
    real_write = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if self.name.endswith(".tmp"):
            real_write(self, "")                        # the file exists, empty, when the disk fills up
            _disk_full()
        return real_write(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert run_suite(tiny_suite([{"name": "test_increasing_logits"}]), tmp_path / "out") == 2
    one_error_line(capsys, "No space left on device", "free some space")
    written = [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert not [n for n in written if n.endswith(".tmp")] and not list((tmp_path / "out/runs").iterdir()), written


def test_a_full_disk_while_plotting_is_one_line_and_keeps_the_records(tiny_suite, tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", _disk_full)
    assert run_suite(tiny_suite([{"name": "test_increasing_logits"}]), tmp_path / "out") == 2
    one_error_line(capsys, "plots", "No space left on device")
    assert len(list((tmp_path / "out/runs").glob("*.json"))) == 1
    assert not [p for p in (tmp_path / "out").rglob("*.tmp")]


# ---------------------------------------------------------------------------------------------- suite files
def test_a_binary_suite_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    assert run_suite(path, tmp_path / "out") == 2
    one_error_line(capsys, str(path), "not a text file")


def test_a_yaml_anchor_bomb_is_refused_quickly_in_one_short_line(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nsuite: s\nseeds: *a8\nscenarios: *a8\nstrategies: *a8\n")
    assert len(path.read_bytes()) < 2000
    start = time.monotonic()
    assert run_suite(path, tmp_path / "out") == 2
    assert time.monotonic() - start < 5
    one_error_line(capsys, "bomb.yaml", "anchors")


def test_a_huge_value_is_cut_in_the_error_message():
    data = yaml.safe_load(yaml.safe_dump(DIGITS))
    data["strategies"][0]["args"] = {"lr": "x" * 100_000}
    with pytest.raises(ConfigError, match=r"args\.lr: expected a float") as info:
        parse_suite(data, "s.yaml")
    assert len(str(info.value)) < 400


def test_an_oversized_suite_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("suite: s\ndescription: " + "x" * 2_000_000 + "\n")
    with pytest.raises(ConfigError, match="at most 1,000,000 bytes"):
        load_suite(path)


# ------------------------------------------------------------------------------------------- checked at load
@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["scenarios"][0].update(args={"n_experiences": 11}), "scenarios[0] (split_digits): args: 10 classes"),
    (lambda d: d.update(seeds=[2**32]), "from 0 to 2**32 - 1"),
    (lambda d: d.update(seeds=[0, 0]), "seed 0 appears twice"),
    (lambda d: d["strategies"][0].update(name="lora", args={"mem_size": 50}, dp={"epsilon": 3.0}),
     "dp with a rehearsal memory (mem_size 50)"),
    # found by tests/test_fields.py: settings another setting makes unused (Adam has no momentum, cross-entropy no
    # alpha/kappa), which used to be accepted and change nothing
    (lambda d: d["strategies"][0].update(args={"momentum": 0.5}),
     "args.momentum is used only with optimizer: sgd (this entry's optimizer is 'adam')"),
    (lambda d: d["strategies"][0].update(name="nlft", args={"kappa": 5.0}),
     "args.kappa is used only with loss: mse (this entry's loss is 'ce')"),
])
def test_what_a_run_would_refuse_is_refused_when_the_suite_loads(mutate, message):
    data = yaml.safe_load(yaml.safe_dump(DIGITS))
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_suite(data, "s.yaml")
    assert str(info.value).startswith("s.yaml: ") and message in str(info.value), str(info.value)


def test_seeds_given_on_the_command_line_are_checked_too(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump(DIGITS))
    assert run_suite(suite, tmp_path / "out", "--seeds", "3", "3") == 2
    one_error_line(capsys, "seed 3 appears twice")
    assert run_suite(suite, tmp_path / "out", "--seeds", str(2**32)) == 2
    one_error_line(capsys, "2**32")


def test_dp_without_opacus_is_refused_when_the_suite_loads(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    data = yaml.safe_load(yaml.safe_dump(DIGITS))
    data["strategies"][0]["dp"] = {"epsilon": 3.0}
    with pytest.raises(ConfigError, match=r"strategies\[0\] \(naive\): dp needs opacus .* pip install"):
        parse_suite(data, "s.yaml")
