"""`run_bench.py pretrain` and `run_bench.py forget` end to end on the synthetic scenario."""

import json

from clbench import tasks
from clbench.cli import main
from clbench.models.checkpoint import read_state_dict

TINY_VIT = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 4}


def test_pretrain_writes_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "vit.safetensors"
    assert main(["pretrain", "--scenario", "synthetic", "--experiences", "0", "1", "--model-args",
                 json.dumps(TINY_VIT), "--epochs", "1", "--out", str(out)]) == 0
    state = read_state_dict(out)
    assert state["blocks.0.attn.qkv.weight"].shape == (48, 16)


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
