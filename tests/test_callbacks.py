"""One hook interface for every training loop: a callback attached from a suite file sees the same hook sequence in
an Avalanche template (naive), DyTox's template and the fit loop (taft, whose members rebuild their callbacks), also
in spawned processes; a non-finite loss fails every loop with the same error."""

import json
import re
from pathlib import Path

import pytest
import torch

from clbench.callbacks import CALLBACKS, Callback, CallbackContext, CallbackList, CallbackSpec
from clbench.errors import NonFiniteLossError
from clbench.executors import LocalExecutor
from clbench.suite_file import parse_suite
from clbench.training import FitSettings, Schedule, fit, fit_dataset

SYNTHETIC = {"n_classes": 4, "n_experiences": 2, "train_per_class": 12, "test_per_class": 4}
LOOPS = {   # one strategy per loop kind, tiny
    "naive": {"preset": "cpu", "args": {"epochs": 1, "model_args": {"hidden": [8]}}},
    "dytox": {"preset": "micro", "args": {"epochs": 1, "finetune_epochs": 1, "mem_size": 8,
                                          "arch_overrides": {"embed_dim": 8, "depth": 1, "num_heads": 2,
                                                             "patch_size": 4}}},
    "taft": {"preset": "cpu", "args": {"epochs": 1, "model_args": {"embed_dim": 8, "depth": 1, "num_heads": 2,
                                                                   "patch_size": 4}}},
}
BATCH = ["on_batch_start", "after_forward", "after_backward", "after_step"]


def _suite(strategies: dict, callbacks: list) -> object:
    return parse_suite({"suite": "hooks", "scenarios": [{"name": "synthetic", "args": SYNTHETIC}],
                        "strategies": [{"name": n, **e, "callbacks": callbacks} for n, e in strategies.items()]})


def _trace(out: Path, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (out / "artifacts" / run_id / "hooks.jsonl").read_text().splitlines()]


def _shape(trace: list[dict]) -> list[str]:
    """The hook names with each run of batch groups collapsed to one 'batches' token (after checking the groups are
    whole and in order)."""
    names = [t["hook"] for t in trace]
    shape, i = [], 0
    while i < len(names):
        if names[i] == BATCH[0]:
            while names[i: i + 4] == BATCH:
                i += 4
            shape.append("batches")
        else:
            shape.append(names[i])
            i += 1
    return shape


def test_yaml_callback_sees_the_same_hook_sequence_in_all_three_loop_kinds(tmp_path):
    suite = _suite(LOOPS, [{"name": "hook_trace"}])
    records = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert [r.status for r in records] == ["finished"] * 3, [r.reason for r in records]
    expected = ["on_experience_start", "batches", "on_experience_end"] * 2
    for record in records:
        trace = _trace(tmp_path, record.run_id)
        assert _shape(trace) == expected, record.run_id
        steps = [t for t in trace if t["hook"] == "after_backward"]
        assert steps and all(t["params_with_grad"] > 0 for t in steps), record.run_id
        assert list(record.spec["strategy"]["callbacks"]) == [{"name": "hook_trace", "args": {}}]
    members = {t["member"] for t in _trace(tmp_path, "synthetic__taft__s0")}
    assert members == {"", "shard0", "shard1"}          # the fit loop runs in the shard members' jobs


def test_member_callbacks_are_rebuilt_in_spawned_processes(tmp_path):
    suite = _suite({"taft_shards": {"preset": "cpu", "args": {**LOOPS["taft"]["args"], "n_shards": 2}}},
                   [{"name": "hook_trace", "args": {"batches": 1}}])
    (record,) = LocalExecutor(shard_workers=2).run_all(suite.run_specs("cpu"), tmp_path)
    assert record.status == "finished", record.reason
    trace = _trace(tmp_path, record.run_id)
    by_member = {m: [t["hook"] for t in trace if t["member"] == m] for m in {t["member"] for t in trace}}
    assert set(by_member) == {"", "shard0", "shard1", "shard2", "shard3"}       # 2 shards x 2 experiences
    for member in ("shard0", "shard1", "shard2", "shard3"):
        assert by_member[member] == BATCH                  # batches=1: the first batch group, written in the worker
    assert by_member[""] == ["on_experience_start", "on_experience_end"] * 2


@pytest.mark.parametrize("name", list(LOOPS))
def test_non_finite_loss_fails_every_loop_with_the_same_error(name, tmp_path):
    """lr = 1e30: the first steps blow the weights up, a later batch's loss overflows (batch 8: 3 batches a step)."""
    entry = {**LOOPS[name], "args": {**LOOPS[name]["args"], "lr": 1e30, "batch_size": 8}}
    suite = _suite({name: entry}, [])
    (record,) = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert record.status == "failed"
    assert re.match(r"NonFiniteLossError: non-finite value \((nan|inf|-inf)\) in the training loss\. Lower the "
                    r"learning rate", record.reason), record.reason


def test_fit_fires_hooks_in_order_and_the_guard_stops_a_nan_loss(registered):
    calls = []

    class Record(Callback):
        def on_batch_start(self, x, y):
            calls.append(("batch", len(y)))

        def after_forward(self, loss):
            calls.append(("forward", round(float(loss), 6)))

        def after_backward(self, model):
            calls.append(("backward", round(float(model.weight.grad.sum()), 6)))

        def after_step(self, optimizer):
            calls.append(("step", optimizer.param_groups[0]["lr"]))

    registered(CALLBACKS, "test_record", Record)
    callbacks = CallbackList.build([CallbackSpec("test_record")], CallbackContext())
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    steps = fit(model, model, model.parameters(), torch.ones(4, 1), torch.zeros(4, 1),
                lambda out, y: (out - y).pow(2).mean(), FitSettings(1, 2, 0.1, optimizer="sgd", momentum=0.0), 0,
                callbacks)
    # w = 1: loss 1, grad 2 -> w = 0.8: loss 0.64, grad 1.6
    assert steps == 2
    assert calls == [("batch", 2), ("forward", 1.0), ("backward", 2.0), ("step", 0.1),
                     ("batch", 2), ("forward", 0.64), ("backward", 1.6), ("step", 0.1)]
    with pytest.raises(NonFiniteLossError, match="non-finite value"):
        fit(model, model, model.parameters(), torch.ones(2, 1), torch.zeros(2, 1),
            lambda out, y: out.sum() * float("inf"), FitSettings(1, 2, 0.1), 0, CallbackList())


def test_unknown_callback_or_argument_is_a_load_time_error():
    from clbench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"callbacks\[0\]: unknown callback 'hook_trac'. Did you mean 'hook_trace'"):
        _suite({"naive": LOOPS["naive"]}, [{"name": "hook_trac"}])
    with pytest.raises(ConfigError, match=r"callbacks\[0\].args \(callback 'hook_trace'\): unknown key 'batch'"):
        _suite({"naive": LOOPS["naive"]}, [{"name": "hook_trace", "args": {"batch": 3}}])


def test_fit_dataset_takes_a_callbacks_batch_plan_and_refuses_more_steps_than_a_per_step_schedule_planned():
    """fit_dataset (pretraining's loop) draws the minibatches a callback plans; a per-step schedule, planned for
    ⌈n/batch_size⌉ minibatches per epoch, refuses a step past them with one line."""
    seen = []

    class Plan(Callback):
        def batch_sampler(self, n, batch_size, epochs):
            return lambda generator: [torch.tensor([0, 1]), torch.tensor([2])]

        def on_batch_start(self, x, y):
            seen.append(y.tolist())

    callbacks = CallbackList()
    callbacks.callbacks.append(Plan())
    data = torch.utils.data.TensorDataset(torch.arange(3.0)[:, None], torch.tensor([5, 6, 7]), torch.zeros(3))
    model = torch.nn.Linear(1, 1)
    steps = fit_dataset(model, model, model.parameters(), data, lambda out, y: out.sum(), FitSettings(2, 8, 0.1), 0,
                        callbacks)
    assert steps == 4 and seen == [[5, 6], [7], [5, 6], [7]]
    per_step = Schedule(0.1, per="step", decay="linear")
    with pytest.raises(ValueError, match="step 1 of a pass planned for 1 steps"):
        fit_dataset(model, model, model.parameters(), data, lambda out, y: out.sum(), FitSettings(1, 8, per_step), 0,
                    callbacks)
