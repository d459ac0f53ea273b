"""CallbackList dispatch, unit by unit: every hook reaches every callback in attachment order with its arguments,
the loss guard raises before any callback sees a non-finite loss, the Avalanche bridge maps the template's events to
the hooks, and hook_trace writes what it promises."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from clbench.callbacks import CALLBACKS, Callback, CallbackContext, CallbackList, CallbackPlugin, CallbackSpec, bridge
from clbench.errors import NonFiniteLossError

HOOKS = ("on_experience_start", "on_experience_end", "on_batch_start", "after_forward", "after_backward",
         "after_step", "close")


class Recorder(Callback):
    """Appends ``(tag, hook, args)`` to a shared log for every hook."""

    def __init__(self, tag: str = "", log: list | None = None, extra: dict | None = None) -> None:
        self.tag, self.log, self.extra = tag, log if log is not None else [], extra or {}

    def setup(self, context):
        super().setup(context)
        self.log.append((self.tag, "setup", context))

    def extra_metrics(self):
        return self.extra

    def __getattribute__(self, name):
        if name in HOOKS:
            return lambda *args: self.log.append((self.tag, name, args))
        return super().__getattribute__(name)


@pytest.fixture
def recorders(monkeypatch):
    """A CallbackList of recorders ``a`` then ``b`` (registered under test names) sharing one log."""
    log: list = []
    monkeypatch.setitem(CALLBACKS._entries, "test_rec_a", lambda **kw: Recorder("a", log, **kw))
    monkeypatch.setitem(CALLBACKS._entries, "test_rec_b", lambda **kw: Recorder("b", log, **kw))
    context = CallbackContext(run_id="r", member="m", n_train=7)
    specs = [CallbackSpec("test_rec_a", {"extra": {"eps": 1.5}}), CallbackSpec("test_rec_b")]
    return CallbackList.build(specs, context), log, context, specs


def test_every_hook_reaches_every_callback_in_attachment_order_with_its_arguments(recorders):
    callbacks, log, context, specs = recorders
    assert log == [("a", "setup", context), ("b", "setup", context)] and callbacks.context is context
    assert callbacks.specs() == tuple(specs)
    log.clear()
    x, y, loss, model, opt = torch.zeros(2, 3), torch.tensor([0, 1]), torch.tensor(0.5), torch.nn.Linear(1, 1), object()
    callbacks.on_experience_start(3)
    callbacks.on_batch_start(x, y)
    callbacks.after_forward(loss)
    callbacks.after_backward(model)
    callbacks.after_step(opt)
    callbacks.on_experience_end(3)
    callbacks.close()
    expected = [(3,), (x, y), (loss,), (model,), (opt,), (3,), ()]
    hooks = ["on_experience_start", "on_batch_start", "after_forward", "after_backward", "after_step",
             "on_experience_end", "close"]
    assert [(tag, hook) for tag, hook, _ in log] == [(t, h) for h in hooks for t in "ab"]
    for (_, _, args), want in zip(log, [a for a in expected for _ in "ab"]):
        assert len(args) == len(want) and all(a is w for a, w in zip(args, want))
    assert callbacks.extra_metrics() == {"eps": 1.5}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_the_loss_guard_raises_before_any_callback_sees_a_non_finite_loss(recorders, value):
    callbacks, log, _, _ = recorders
    log.clear()
    with pytest.raises(NonFiniteLossError) as info:
        callbacks.after_forward(torch.tensor([1.0, value]))
    assert str(info.value).startswith(f"non-finite value ({value + 1.0}) in the training loss. Lower the learning "
                                      f"rate, enable gradient clipping, or check the inputs")
    assert log == []
    callbacks.after_forward(torch.tensor([6e4, 6e4], dtype=torch.float16))   # summed in float32: no overflow
    assert [hook for _, hook, _ in log] == ["after_forward", "after_forward"]


def test_an_empty_list_only_guards():
    callbacks = CallbackList()
    assert callbacks.specs() == () and callbacks.extra_metrics() == {} and callbacks.context == CallbackContext()
    callbacks.after_forward(torch.tensor(1.0))
    with pytest.raises(NonFiniteLossError):
        callbacks.after_forward(torch.tensor(math.nan))


def test_the_avalanche_bridge_maps_template_events_to_hooks_and_is_appended_last(recorders):
    callbacks, log, _, _ = recorders
    template = SimpleNamespace(plugins=["own"], mb_x=torch.ones(1), mb_y=torch.zeros(1), loss=torch.tensor(2.0),
                               model=torch.nn.Linear(1, 1), optimizer=object())
    bridge(template, callbacks)
    assert template.plugins[0] == "own" and isinstance(template.plugins[-1], CallbackPlugin)
    plugin = template.plugins[-1]
    assert plugin.callbacks is callbacks
    log.clear()
    plugin.before_training_iteration(template)
    plugin.before_backward(template)
    plugin.after_backward(template)
    plugin.after_update(template)
    got = [(hook, args) for tag, hook, args in log if tag == "a"]
    assert [h for h, _ in got] == ["on_batch_start", "after_forward", "after_backward", "after_step"]
    assert got[0][1][0] is template.mb_x and got[0][1][1] is template.mb_y and got[1][1][0] is template.loss
    assert got[2][1][0] is template.model and got[3][1][0] is template.optimizer


def test_hook_trace_writes_the_first_batches_and_counts_the_rest(tmp_path):
    trace = CALLBACKS.get("hook_trace")(batches=2)
    trace.setup(CallbackContext(run_id="r", artifacts=tmp_path / "art", member="m0"))
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    trace.on_experience_start(0)
    for _ in range(3):
        trace.on_batch_start(torch.zeros(4, 2), torch.zeros(4))
        trace.after_forward(torch.tensor(0.25))
        trace.after_backward(model)
        trace.after_step(None)
    trace.on_experience_end(0)
    lines = [json.loads(line) for line in (tmp_path / "art" / "hooks.jsonl").read_text().splitlines()]
    assert lines[0] == {"hook": "on_experience_start", "member": "m0", "experience": 0}
    assert lines[1:5] == [{"hook": "on_batch_start", "member": "m0", "batch": 4},
                          {"hook": "after_forward", "member": "m0", "loss": 0.25},
                          {"hook": "after_backward", "member": "m0", "params_with_grad": 2},
                          {"hook": "after_step", "member": "m0"}]
    assert len(lines) == 1 + 2 * 4 + 1
    assert lines[-1] == {"hook": "on_experience_end", "member": "m0", "experience": 0, "batches": 3}


def test_hook_trace_without_an_artifacts_folder_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = CALLBACKS.get("hook_trace")()
    trace.setup(CallbackContext())
    trace.on_experience_start(0)
    trace.on_experience_end(0)
    assert trace.batches == 1000 and list(tmp_path.iterdir()) == []
