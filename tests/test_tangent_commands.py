"""`run_bench.py pretrain` and `run_bench.py forget` end to end on the synthetic scenario; pretraining on the one
loop (callbacks and the non-finite loss guard reach it)."""

import ast
import json
from pathlib import Path

import pytest
import torch

import clbench.tangent
from clbench import tasks
from clbench.callbacks import CallbackSpec
from clbench.cli import main
from clbench.errors import NonFiniteLossError
from clbench.models.checkpoint import read_state_dict
from clbench.pretraining import Pretraining, pretrain

TINY_VIT = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}


def test_pretrain_writes_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "vit.safetensors"
    assert main(["pretrain", "--scenario", "synthetic", "--experiences", "0", "1", "--model-args",
                 json.dumps(TINY_VIT), "--epochs", "1", "--out", str(out)]) == 0
    state = read_state_dict(out)
    assert state["blocks.0.attn.qkv.weight"].shape == (48, 16)


def test_pretrain_command_attaches_callbacks(tmp_path):
    """--callbacks reach the pretraining loop: hook_trace writes one batch-hook group per optimizer step (2 epochs of
    one step: the 16 samples of experience 0 in one batch of 16)."""
    out = tmp_path / "vit.pt"
    assert main(["pretrain", "--scenario", "synthetic", "--scenario-args", json.dumps({"train_per_class": 8}),
                 "--experiences", "0", "--model-args", json.dumps(TINY_VIT), "--epochs", "2", "--batch-size", "16",
                 "--callbacks", json.dumps([{"name": "hook_trace"}]), "--out", str(out)]) == 0
    trace = (tmp_path / "vit.pt.artifacts" / "hooks.jsonl").read_text().splitlines()
    hooks = [json.loads(line)["hook"] for line in trace]
    assert hooks == ["on_batch_start", "after_forward", "after_backward", "after_step"] * 2


def test_pretraining_is_guarded_against_a_non_finite_loss(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", lambda logits, y: logits.sum() * float("nan"))
    setup = Pretraining("synthetic", (0,), {"train_per_class": 4}, TINY_VIT, epochs=1, batch_size=8)
    with pytest.raises(NonFiniteLossError):
        pretrain(setup, report=lambda line: None)


def test_pretraining_reports_the_source_accuracy_per_epoch():
    setup = Pretraining("synthetic", (0, 1), {"train_per_class": 4}, TINY_VIT, epochs=2, batch_size=8)
    lines = []
    model, accuracies = pretrain(setup, [CallbackSpec("hook_trace")], report=lines.append)
    assert len(accuracies) == len(lines) == 2 and all(0.0 <= a <= 1.0 for a in accuracies)
    assert lines[1].startswith("epoch 2/2: source test accuracy") and model.training


def test_the_tangent_package_imports_nothing_from_the_command_line():
    """Method libraries register commands from their own module (clbench/commands/), never import clbench.cli."""
    for path in Path(clbench.tangent.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "clbench.cli" or n.startswith("clbench.cli.") for n in names), path.name


def test_forget_command_records_subtraction_and_retraining(tiny_suite, tmp_path, monkeypatch):
    pools = []       # --shard-workers reaches the task pool of both commands (kept in-process: no spawn here)
    monkeypatch.setattr(tasks, "make_pool", lambda kind, workers: pools.append((kind, workers)) or
                        tasks.SequentialPool())
    suite = tiny_suite([{"name": "taft_shards", "preset": "cpu",
                         "args": {"n_shards": 3, "epochs": 1, "model_args": TINY_VIT}}])
    out = tmp_path / "out"
    assert main(["--suite", str(suite), "--out", str(out), "--quiet", "--quiet-table", "--shard-workers", "2"]) == 0
    run = out / "runs" / "synthetic__taft_shards__s0.json"
    assert json.loads(run.read_text())["state_dir"]
    assert main(["forget", "--run", str(run), "--touch", "1", "--per-shard", "2",
                 "--mode", "subtract", "retrain", "--shard-workers", "3"]) == 0
    assert pools == [("process", 2), ("process", 3)]
    removals = {p.name: json.loads(p.read_text()) for p in (out / "removals").glob("*.json")}
    subtract = removals["synthetic__taft_shards__s0__subtract__touch1.json"]
    retrain = removals["synthetic__taft_shards__s0__retrain__touch1.json"]
    for row in (subtract, retrain):
        assert len(row["ids"]) == 2 and row["hash_before"] != row["hash_after"]
        assert 0.0 <= row["accuracy_after"] <= 100.0
    # the two ids come from one shard; subtraction drops that whole shard, retraining only the ids
    assert len(subtract["shards_touched"]) == len(retrain["shards_touched"]) >= 1
    assert subtract["samples_dropped"] > retrain["samples_dropped"] == 2
    assert "touch1" in (out / "removals.md").read_text()
