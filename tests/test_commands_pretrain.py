"""``clbench pretrain`` (:mod:`clbench.commands.pretrain`) end to end on the synthetic scenario: a loadable
checkpoint, the run's callbacks attached."""

import json

from clbench.cli import main
from clbench.models.checkpoint import read_state_dict

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
