"""One hook interface for every training loop: a callback attached from a suite file sees the same hook sequence in
an Avalanche template (naive), DyTox's template and the fit loop (taft, whose members rebuild their callbacks), also
in spawned processes; a non-finite loss fails every loop with the same error.

CallbackList dispatch, unit by unit: every hook reaches every callback in attachment order with its arguments,
the loss guard raises before any callback sees a non-finite loss, the Avalanche bridge maps the template's events to
the hooks, hook_trace writes what it promises, and the runner fires the evaluation and run-end hooks with the
scores of each step (:class:`~clbench.callbacks.Evaluation`) and the record's metrics."""

import dataclasses
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from clbench.augment import CropFlip
from clbench.callbacks import (
    CALLBACKS,
    Callback,
    CallbackContext,
    CallbackList,
    CallbackPlugin,
    CallbackSpec,
    Evaluation,
    HookTrace,
    bridge,
    planned_loader,
)
from clbench.errors import NonFiniteLossError
from clbench.executors import LocalExecutor
from clbench.metrics import ACCURACY, MetricSpec
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


HOOKS = ("on_experience_start", "on_experience_end", "on_batch_start", "after_forward", "after_backward",
         "after_step", "on_epoch_end", "on_evaluation", "close", "on_run_end")


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


# ----------------------------------------------------------------------------------------- minibatch plans
class Rows(torch.utils.data.Dataset):
    """Sample ``i`` is the integer ``i`` (the default collation turns a batch into its index tensor); optionally
    Avalanche's task labels (``targets_task_labels.uniques``) and a ``collate_fn``."""

    def __init__(self, n: int, tasks: set | None = None, collate=None) -> None:
        self.n = n
        if tasks is not None:
            self.targets_task_labels = SimpleNamespace(uniques=tasks)
        if collate is not None:
            self.collate_fn = collate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Planner(Callback):
    """Records what ``batch_sampler`` is asked; offers no plan (``epochs`` None) or a plan whose k-th call yields
    the k-th epoch of ``epochs`` (lists of indices), recording the generator it is given."""

    def __init__(self, epochs: list | None = None) -> None:
        self.epochs, self.asked, self.generators = epochs, [], []

    def batch_sampler(self, n, batch_size, epochs):
        self.asked.append((n, batch_size, epochs))
        if self.epochs is None:
            return None
        remaining = iter(self.epochs)

        def plan(generator):
            self.generators.append(generator)
            return (torch.tensor(batch) for batch in next(remaining))
        return plan


class Poisson(Planner):
    """A second planning callback (its class name appears in the refusal)."""


class Template:
    """What the plugin and :func:`planned_loader` read of an Avalanche template."""

    def __init__(self, dataset, loader=None, mb_size: int = 4, epochs: int = 3) -> None:
        self.adapted_dataset, self.train_mb_size, self.train_epochs = dataset, mb_size, epochs
        self.dataloader = torch.utils.data.DataLoader(dataset) if loader is None else loader


class TaskBalancedDataLoader:
    """Stands for Avalanche's loader of that name (planned_loader recognises it by name): what naive's template
    builds for one experience."""


class Looping(torch.utils.data.DataLoader):
    """A loader that is not a plain DataLoader (e.g. replay's, interleaving a memory)."""


EPOCHS = [[[0, 1], [2, 3, 4]], [[5], [6, 7]]]


def _list(*callbacks: Callback) -> CallbackList:
    built = CallbackList()
    built.callbacks.extend(callbacks)
    return built


# ----------------------------------------------------------------------------------- evaluation and run end
R = [[0.9, 0.0, 0.0],
     [0.6, 0.8, 0.0],
     [0.3, 0.7, 1.0]]


SIZES = [10, 30, 20]


class Watcher(Callback):
    """Logs the run-level hooks and what they carry."""

    def __init__(self, log: list) -> None:
        self.log = log

    def on_experience_end(self, experience):
        self.log.append(("on_experience_end", experience))

    def on_evaluation(self, evaluation):
        self.log.append(("on_evaluation", evaluation))

    def close(self):
        self.log.append(("close",))

    def on_run_end(self, metrics):
        self.log.append(("on_run_end", metrics))


def test_every_hook_reaches_every_callback_in_attachment_order_with_its_arguments(recorders):
    callbacks, log, context, specs = recorders
    assert log == [("a", "setup", context), ("b", "setup", context)] and callbacks.context is context
    assert callbacks.specs() == tuple(specs)
    log.clear()
    x, y, loss, model, opt = torch.zeros(2, 3), torch.tensor([0, 1]), torch.tensor(0.5), torch.nn.Linear(1, 1), object()
    evaluation, metrics = object(), {"last_acc": 1.0}
    callbacks.on_experience_start(3)
    callbacks.on_batch_start(x, y)
    callbacks.after_forward(loss)
    callbacks.after_backward(model)
    callbacks.after_step(opt)
    callbacks.on_epoch_end(0)
    callbacks.on_experience_end(3)
    callbacks.on_evaluation(evaluation)
    callbacks.close()
    callbacks.on_run_end(metrics)
    expected = [(3,), (x, y), (loss,), (model,), (opt,), (0,), (3,), (evaluation,), (), (metrics,)]
    hooks = ["on_experience_start", "on_batch_start", "after_forward", "after_backward", "after_step",
             "on_epoch_end", "on_experience_end", "on_evaluation", "close", "on_run_end"]
    assert [(tag, hook) for tag, hook, _ in log] == [(t, h) for h in hooks for t in "ab"]
    for (_, _, args), want in zip(log, [a for a in expected for _ in "ab"]):
        assert len(args) == len(want) and all(a is w or a == w == 0 for a, w in zip(args, want))
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


def test_find_returns_the_first_callback_of_a_type_or_none(recorders):
    """A strategy asks its list for the callback it talks to (the dp callback); first match in attachment order."""
    callbacks, _, _, _ = recorders
    first = callbacks.callbacks[0]
    assert callbacks.find(Recorder) is first
    assert callbacks.find(HookTrace) is None
    assert CallbackList().find(Callback) is None


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


def test_hook_trace_writes_1000_batch_groups_by_default_and_counts_the_rest(tmp_path):
    """The default ``batches`` (1000, evaluated when ``HookTrace`` is defined): a trace built without arguments writes
    the 1000th batch and not the 1001st, into an artifacts folder it creates with its parents; catches a changed
    default or a folder not created."""
    trace = HookTrace()
    trace.setup(CallbackContext(artifacts=tmp_path / "artifacts" / "run"))
    trace.on_experience_start(0)
    x, y = torch.zeros(1, 1), torch.zeros(1)
    for _ in range(1001):
        trace.on_batch_start(x, y)
    trace.on_experience_end(0)
    lines = (tmp_path / "artifacts" / "run" / "hooks.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 1000 + 1 and json.loads(lines[-1])["batches"] == 1001


def test_a_member_trace_counts_batches_from_zero_without_an_experience_start(tmp_path):
    """A shard member's callbacks are rebuilt in the member job and see only fit's batch hooks (no
    ``on_experience_start``: clbench.tangent.members): with ``batches=2`` its trace writes exactly the first 2 of 3
    batch groups; catches a count that does not start at 0 at construction (1 would write only one group)."""
    trace = HookTrace(batches=2)
    trace.setup(CallbackContext(artifacts=tmp_path, member="shard0"))
    for _ in range(3):
        trace.on_batch_start(torch.zeros(2, 1), torch.zeros(2))
        trace.after_forward(torch.tensor(0.5))
        trace.after_step(None)
    lines = [json.loads(line) for line in (tmp_path / "hooks.jsonl").read_text().splitlines()]
    assert [line["hook"] for line in lines] == ["on_batch_start", "after_forward", "after_step"] * 2
    assert trace.seen == 3


def test_batch_sampler_asks_every_callback_and_returns_the_one_plan_offered():
    """The loop's (n, batch_size, epochs) reach every callback; the single plan is returned unchanged (None when no
    callback offers one); catches a dropped or reordered argument and a plan lost or invented."""
    quiet, planner, plain = Planner(), Planner(EPOCHS), Callback()
    plan = _list(quiet, planner, plain).batch_sampler(10, 4, 3)
    assert quiet.asked == planner.asked == [(10, 4, 3)]
    assert [b.tolist() for b in plan("g")] == EPOCHS[0] and planner.generators == ["g"]
    assert _list(Planner(), plain).batch_sampler(10, 4, 3) is None and CallbackList().batch_sampler(1, 1, 1) is None


def test_two_callbacks_offering_plans_are_refused_with_their_names():
    """Two plans would silently drop one (dp's Poisson batches); the exact message names both classes in order."""
    with pytest.raises(ValueError, match=re.escape(
            "callbacks ['Planner', 'Poisson'] each want to choose the minibatches; attach at most one of them.")):
        _list(Planner(EPOCHS), Planner(), Poisson(EPOCHS)).batch_sampler(10, 4, 3)


def test_the_plugin_swaps_in_a_loader_that_follows_the_plan_epoch_by_epoch():
    """Bridged template: the plugin asks with (len(adapted_dataset), train_mb_size, train_epochs) and the new loader
    yields exactly the plan's batches, one plan call per epoch, all from one generator seeded from the global RNG
    (``randint(2**31 - 1)``: the batches of a seeded run stay reproducible); catches a wrong size or schedule, a
    loader over other data, a lost or re-created generator and a changed seed derivation."""
    dataset = Rows(10)
    template, planner = Template(dataset), Planner(EPOCHS)
    torch.manual_seed(3)
    seed = int(torch.randint(2**31 - 1, ()))
    torch.manual_seed(3)
    CallbackPlugin(_list(Callback(), planner)).before_training_exp(template)
    assert planner.asked == [(10, 4, 3)]
    loader = template.dataloader
    assert type(loader) is torch.utils.data.DataLoader and loader.dataset is dataset
    assert [b.tolist() for b in loader] == EPOCHS[0] and [b.tolist() for b in loader] == EPOCHS[1]
    first, second = planner.generators
    assert first is second and first.initial_seed() == seed


def test_the_plugin_keeps_the_template_loader_when_no_callback_plans():
    """No plan: the template's own loader stays (catches a loader replaced by a plan of None)."""
    template, planner = Template(Rows(10), mb_size=5, epochs=2), Planner()
    own = template.dataloader
    CallbackPlugin(_list(planner)).before_training_exp(template)
    assert template.dataloader is own and planner.asked == [(10, 5, 2)]


def test_planned_loader_collates_with_the_dataset_collate_fn():
    """A dataset's own ``collate_fn`` (Avalanche datasets have one) collates the planned batches; catches it
    dropped."""
    loader = planned_loader(Template(Rows(8, collate=lambda items: ("collated", items))), Planner(EPOCHS)
                            .batch_sampler(8, 4, 1))
    assert list(loader) == [("collated", [0, 1]), ("collated", [2, 3, 4])]


@pytest.mark.parametrize("loader, tasks", [
    (None, {0, 1}),                              # a plain DataLoader batches one dataset whatever its labels
    (TaskBalancedDataLoader(), None),            # Avalanche's loader for a dataset without task labels
    (TaskBalancedDataLoader(), {0}),             # ... or with one task
], ids=["plain", "task_balanced_unlabelled", "task_balanced_one_task"])
def test_planned_loader_accepts_loaders_that_batch_one_dataset(loader, tasks):
    """Accepted loaders: catches a refusal of the loaders naive's template builds."""
    dataset = Rows(8, tasks=tasks)
    planned = planned_loader(Template(dataset, loader), Planner(EPOCHS).batch_sampler(8, 4, 1))
    assert planned.dataset is dataset and [b.tolist() for b in planned] == EPOCHS[0]


@pytest.mark.parametrize("loader, tasks, name", [
    (Looping(Rows(8)), None, "Looping"),
    (TaskBalancedDataLoader(), {0, 1}, "TaskBalancedDataLoader"),    # balances two task groups
], ids=["other_loader", "two_tasks"])
def test_planned_loader_refuses_loaders_that_do_more_than_batch_one_dataset(loader, tasks, name):
    """A plan would silently drop what such a loader adds (replay's memory, task balancing): refused with the exact
    message naming the template and the loader."""
    with pytest.raises(ValueError, match=re.escape(
            f"Template trains through a {name}; a callback that chooses the minibatches (e.g. dp) supports plain "
            f"single-dataset loaders only.")):
        planned_loader(Template(Rows(8, tasks=tasks), loader), Planner(EPOCHS).batch_sampler(8, 4, 1))


def test_mer_fires_forward_backward_and_step_hooks_at_every_inner_step(recorders, monkeypatch):
    """Avalanche's MER takes one optimizer step per sample inside its own loop; :class:`HookedMER` fires
    ``after_forward`` (with that sample's loss), ``after_backward`` and ``after_step`` at each of them, in that
    order, and ``on_batch_start`` once per mini-batch. Catches MER training with the NaN guard, the training log
    and every other callback blind again (it fired only the batch start)."""
    from clbench import api

    callbacks, log, _, _ = recorders
    scenario = api.scenario("synthetic", n_classes=4, n_experiences=2, train_per_class=6, test_per_class=2)
    strategy = api.strategy("mer", scenario.info, preset="cpu", epochs=1, batch_size=4, mem_size=4,
                            batch_size_mem=2, n_inner_steps=2)
    bridge(strategy.template, callbacks)
    steps = []
    handle = strategy.template.optimizer.register_step_post_hook(lambda *a: steps.append(1))
    for experience in scenario.train_stream:
        strategy.train(experience)
    handle.remove()
    hooks = [hook for tag, hook, _ in log if tag == "a" and hook != "setup"]
    assert hooks.count("on_batch_start") == 2 * 12 // 4
    assert hooks.count("after_forward") == hooks.count("after_backward") == hooks.count("after_step") == len(steps)
    assert len(steps) > 2 * 12 * 2                   # per sample, memory samples in the second experience too
    inner = [h for h in hooks if h != "on_batch_start" and h != "on_epoch_end"]
    assert inner == ["after_forward", "after_backward", "after_step"] * len(steps)
    losses = [args[0] for tag, hook, args in log if tag == "a" and hook == "after_forward"]
    assert all(loss.shape == () and loss.requires_grad for loss in losses)


def test_an_evaluation_holds_the_row_and_the_summaries_of_the_matrix_seen_so_far():
    """After step i: row i as stored, and the summaries of the leading block R[:i+1, :i+1] in percent, by hand:
    A_0 = 90, A_1 = (0.6*10 + 0.8*30) / 40 = 75, A_2 = (3 + 21 + 20) / 60 = 73.33; forgetting at step 1 = 90 - 60,
    at step 2 = mean(90 - 30, 80 - 70) = 35; bwt at step 1 = 60 - 90, at step 2 = mean(30 - 90, 70 - 80) = -35.
    Catches summaries over the whole (future) matrix, unweighted means, a fraction where a percentage is due, and
    scalars of experiences not seen yet."""
    seen = {"accuracy": []}
    got = []
    for i, row in enumerate(R):
        seen["accuracy"].append(row)
        got.append(Evaluation.after(i, seen, SIZES, (ACCURACY,), offline=False))
    assert [e.rows for e in got] == [{"accuracy": row} for row in R] and got[2].sizes == SIZES
    assert got[0].summaries == {"avg_inc_acc": pytest.approx(90), "last_acc": pytest.approx(90),
                                "forgetting": None, "bwt": None}
    assert got[1].summaries == pytest.approx({"avg_inc_acc": 82.5, "last_acc": 75, "forgetting": 30, "bwt": -30})
    assert got[2].summaries == pytest.approx({"avg_inc_acc": (90 + 75 + 44 / 0.6) / 3, "last_acc": 44 / 0.6,
                                              "forgetting": 35, "bwt": -35})
    assert got[0].scalars() == pytest.approx({"accuracy/exp0": 90, "avg_inc_acc": 90, "last_acc": 90})
    assert got[1].scalars() == pytest.approx({"accuracy/exp0": 60, "accuracy/exp1": 80, "avg_inc_acc": 82.5,
                                              "last_acc": 75, "forgetting": 30, "bwt": -30})


def test_an_offline_evaluation_covers_every_experience_and_a_unitless_metric_keeps_its_values():
    """An offline (joint) run's single row: every experience's score and only ``last`` (weighted over all); a
    metric without unit (NDCG) is logged as stored, under its own column names; lower-is-better forgetting signs."""
    ndcg = MetricSpec("ndcg@10", primary=True)
    offline = Evaluation.after(0, {"ndcg@10": [[0.2, 0.4, 0.1]]}, SIZES, (ndcg,), offline=True)
    assert offline.scalars() == pytest.approx({"ndcg@10/exp0": 0.2, "ndcg@10/exp1": 0.4, "ndcg@10/exp2": 0.1,
                                               "ndcg@10_last": (2 + 12 + 2) / 60})
    loss = MetricSpec("loss", higher_is_better=False)
    two = Evaluation.after(1, {"loss": [[1.0, 5.0], [3.0, 2.0]]}, [1, 1], (loss,), offline=False)
    assert two.summaries["loss_forgetting"] == pytest.approx(2.0) and two.summaries["loss_bwt"] == pytest.approx(2.0)


@pytest.mark.parametrize("strategy", ["naive", "joint"])
def test_the_runner_fires_an_evaluation_after_each_step_and_the_run_end_with_the_records_metrics(
        monkeypatch, strategy):
    """Each step: on_experience_end(i), then on_evaluation with row i of the record's matrix; close once; then
    on_run_end with the record's metrics (the same dict). An offline run (joint) is evaluated once, at step 0, on
    every experience. Catches a hook not fired, fired before the scores exist, or fed other numbers."""
    from clbench import api

    log: list = []
    monkeypatch.setitem(CALLBACKS._entries, "test_watch", lambda: Watcher(log))
    record = api.run("synthetic", strategy, preset="cpu", args={"epochs": 1}, device="cpu", callbacks=["test_watch"],
                     scenario_args={"train_per_class": 4, "test_per_class": 2, "n_experiences": 3})
    assert record.status == "finished", record.reason
    steps = 1 if strategy == "joint" else 3
    assert [entry[0] for entry in log] == ["on_experience_end", "on_evaluation"] * steps + ["close", "on_run_end"]
    evaluations = [entry[1] for entry in log if entry[0] == "on_evaluation"]
    assert [e.step for e in evaluations] == list(range(steps))
    assert [e.rows["accuracy"] for e in evaluations] == record.accuracy_matrix
    assert all(e.offline == (strategy == "joint") and e.sizes == record.test_sizes for e in evaluations)
    assert log[-1][1] is record.metrics
    last = {k: v for k, v in evaluations[-1].summaries.items()}
    assert last == pytest.approx({k: record.metrics[k] for k in last})


# ------------------------------------------------------------------------------- bookkeeping of the dispatch
def test_the_batch_counter_counts_each_batch_start_once(recorders):
    """:data:`~clbench.callbacks.BATCH_HOOKS_FIRED` (which :func:`clbench.protocol.hooks_checked` compares with the
    optimizer steps) grows by exactly 1 per ``on_batch_start`` of any list, empty or not; catches a count that
    drops, doubles or runs backwards."""
    from clbench.callbacks import BATCH_HOOKS_FIRED

    callbacks, _, _, _ = recorders
    before = BATCH_HOOKS_FIRED["on_batch_start"]
    x, y = torch.zeros(1, 1), torch.zeros(1)
    callbacks.on_batch_start(x, y)
    CallbackList().on_batch_start(x, y)
    callbacks.on_batch_start(x, y)
    assert BATCH_HOOKS_FIRED["on_batch_start"] - before == 3


def test_the_augmentation_counter_counts_each_batch_offered_once():
    """``BATCH_HOOKS_FIRED["augment_batch"]`` grows by exactly 1 per ``augment_batch`` call, whether the list has a
    batch augmentation or not, and leaves the batch-start count alone; catches a count that drops, doubles, runs
    backwards or is reset."""
    from clbench.callbacks import BATCH_HOOKS_FIRED

    before, started = BATCH_HOOKS_FIRED["augment_batch"], BATCH_HOOKS_FIRED["on_batch_start"]
    x = torch.zeros(2, 1, 4, 4)
    CallbackList().augment_batch(x)
    CallbackList(batch_augment=CropFlip(4, padding=1)).augment_batch(x)
    CallbackList().augment_batch(x)
    assert BATCH_HOOKS_FIRED["augment_batch"] - before == 3
    assert BATCH_HOOKS_FIRED["on_batch_start"] == started


def test_the_bridge_numbers_each_experiences_epochs_from_0(recorders):
    """The template's ``after_training_epoch`` becomes ``on_epoch_end(epoch)`` with the epoch counted from 0 within
    each experience (``before_training_exp`` restarts it); catches an epoch not passed, counted from 1, by 2,
    backwards, or not counted."""
    callbacks, log, _, _ = recorders
    template = Template(Rows(4))
    plugin = CallbackPlugin(callbacks)
    log.clear()
    for _ in range(2):
        plugin.before_training_exp(template)
        for _ in range(3):
            plugin.after_training_epoch(template)
    assert [args for tag, hook, args in log if tag == "a"] == [(0,), (1,), (2,)] * 2
    assert {hook for _, hook, _ in log} == {"on_epoch_end"}


def test_callback_plugin_is_made_on_first_use_and_other_names_are_refused():
    """``clbench.callbacks.CallbackPlugin`` (read when asked, through the module's ``__getattr__``) is the one class
    that :func:`bridge` instantiates; any other missing name raises Python's usual AttributeError. Catches the
    name misspelt, the test inverted and the message lost."""
    import clbench.callbacks as module

    plugin = module.__getattr__("CallbackPlugin")
    assert plugin is module.CallbackPlugin and plugin.__name__ == "CallbackPlugin"
    assert issubclass(plugin, module.CallbackBridge) and plugin.__module__ == "clbench.callbacks"
    with pytest.raises(AttributeError) as info:
        module.__getattr__("CallbackPlugins")
    assert str(info.value) == "module 'clbench.callbacks' has no attribute 'CallbackPlugins'"


def test_an_evaluation_reads_only_the_rows_up_to_its_step():
    """Given more rows than ``step + 1`` (a whole matrix), the summaries are still those of the leading block
    ``R[:step+1, :step+1]``: at step 1 of R, A_0 = 90, A_1 = 75, forgetting 30, bwt -30 (as in the test above);
    catches a block that takes a row of the future."""
    early = Evaluation.after(1, {"accuracy": R}, SIZES, (ACCURACY,), offline=False)
    assert early.summaries == pytest.approx({"avg_inc_acc": 82.5, "last_acc": 75, "forgetting": 30, "bwt": -30})
    assert early.rows == {"accuracy": R[1]}


@pytest.mark.parametrize("member, kept", [("", False), ("shard0", True)])
def test_hook_trace_removes_an_earlier_attempts_file_only_in_the_runs_own_process(tmp_path, member, kept):
    """A rerun's trace must not hold the failed attempt's hooks: the run's own process removes ``hooks.jsonl``
    when set up; a member job (which appends to the same file) keeps it; other files stay. Catches the wrong file
    removed."""
    (tmp_path / "hooks.jsonl").write_text('{"hook": "stale"}\n')
    (tmp_path / "other.jsonl").write_text("x\n")
    HookTrace().setup(CallbackContext(artifacts=tmp_path, member=member))
    assert (tmp_path / "hooks.jsonl").exists() is kept and (tmp_path / "other.jsonl").read_text() == "x\n"


# ------------------------------------------------------------------------------------------- batch augmentation
@dataclasses.dataclass(frozen=True)
class CountingCropFlip(CropFlip):
    """A :class:`~clbench.augment.CropFlip` that records the size of each batch it augments and its output."""

    calls: list = dataclasses.field(default_factory=list, compare=False)

    def batch(self, x):
        out = super().batch(x)
        self.calls.append(out)
        return out


def _tiny_images(augment: CropFlip) -> object:
    """Two experiences of two classes each, 6 random 3x8x8 images per class, ``augment`` as batch augmentation."""
    from clbench.protocol import ClassificationInfo
    from clbench.streams import class_incremental

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 3, 8, 8, generator=g), torch.arange(4).repeat_interleave(6)
    info = ClassificationInfo(name="tiny_images", n_classes=4, classes_per_experience=(2, 2), input_shape=(3, 8, 8),
                              default_model="mlp", batch_augment=augment)
    return class_incremental(info, x, y, x[::3], y[::3], class_order=[0, 1, 2, 3])


def _replay_run(augment: CropFlip) -> list:
    """A replay run (memory 4, batch 4) over :func:`_tiny_images`, evaluated after each step; returns what
    ``on_batch_start`` saw: ``(x, y)`` per training minibatch."""
    from clbench.config import build_config
    from clbench.protocol import hooks_checked
    from clbench.registry import STRATEGIES
    from clbench.runner import seed_everything

    seed_everything(0)
    scenario = _tiny_images(augment)
    strategy = STRATEGIES.get("replay")(scenario.info, "cpu", build_config(
        "replay", "cpu", {"epochs": 1, "batch_size": 4, "mem_size": 4, "model_args": {"hidden": [8]}}))
    seen: list = []
    strategy.callbacks.callbacks.append(type("Seen", (Callback,), {"on_batch_start": lambda s, x, y: seen.append(
        (x, y))})())
    for step, experience in enumerate(scenario.train_stream):
        with hooks_checked(strategy, step):
            strategy.train(experience)
        calls = len(augment.calls)
        scenario.evaluator(strategy, scenario, step, torch.device("cpu"))
        assert len(augment.calls) == calls, "the evaluation augmented its inputs"
    return seen


def test_the_batch_augmentation_runs_once_per_training_minibatch_buffer_included_and_never_at_evaluation():
    """A scenario's ``batch_augment`` goes through the strategy's callbacks into the template: each training
    minibatch is augmented exactly once (``on_batch_start`` sees that output), replayed buffer samples in it
    (the second experience's minibatches hold 4 new + up to 4 buffer samples), and the evaluator's forwards are
    not. Catches the hook removed, applied twice, applied before the replay loader joined the buffer, or at
    evaluation."""
    augment = CountingCropFlip(8, padding=1)
    seen = _replay_run(augment)
    assert len(augment.calls) == len(seen) == 3 + 3                      # 12 samples / batch 4, per experience
    assert all(x is out for (x, _), out in zip(seen, augment.calls))    # the batch the forward gets
    assert [len(y) for _, y in seen] == [4, 4, 4, 8, 8, 8]             # buffer samples are in the augmented batch
    assert set(seen[-1][1].tolist()) & {0, 1}                           # ... and they are old classes


def test_the_batch_augmentation_draws_the_same_batches_from_the_same_seed():
    """Same seed, same augmented minibatches (draws from torch's global generator, seeded by the runner)."""
    first, second = _replay_run(CountingCropFlip(8, padding=1)), _replay_run(CountingCropFlip(8, padding=1))
    assert all(torch.equal(a, b) and torch.equal(u, v) for (a, u), (b, v) in zip(first, second))
    assert not all(torch.equal(a, b) for (a, _), (b, _) in zip(first, first[1:]))


def test_fit_dataset_augments_each_minibatch_once_and_fit_never():
    """:func:`~clbench.training.fit_dataset` applies the callbacks' batch augmentation to each minibatch before
    ``on_batch_start`` and the forward; :func:`~clbench.training.fit` (stored tensors) never does."""
    augment = CountingCropFlip(4, padding=1)
    seen: list = []
    callbacks = CallbackList(batch_augment=augment)
    callbacks.callbacks.append(type("Seen", (Callback,), {"on_batch_start": lambda s, x, y: seen.append(x)})())
    x, y = torch.randn(10, 1, 4, 4), torch.arange(10) % 2
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    forwarded: list = []
    model.register_forward_pre_hook(lambda m, args: forwarded.append(args[0]))
    settings = FitSettings(epochs=2, batch_size=4, schedule=0.01)
    steps = fit_dataset(model, model, model.parameters(), torch.utils.data.TensorDataset(x, y),
                        torch.nn.functional.cross_entropy, settings, seed=0, callbacks=callbacks)
    assert steps == len(augment.calls) == len(seen) == 6
    assert all(a is b is c for a, b, c in zip(augment.calls, seen, forwarded))
    fit(model, model, model.parameters(), x, y, torch.nn.functional.cross_entropy, settings, seed=0,
        callbacks=callbacks)
    assert len(augment.calls) == 6 and len(seen) == 12
    assert CallbackList().augment_batch(x) is x                          # no batch augmentation: the batch itself
