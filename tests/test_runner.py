"""Runner and executor behaviour: determinism, failures, interruption and resume.

Contract violations that only show when a strategy runs are named as such by the runner: a subclass that skips
``super().__init__`` and a ``train`` that steps an optimizer without firing the batch hooks (its own loop: no NaN
guard, no private step, no training log). A strategy that learns without an optimizer is not one."""

import json
import math
from dataclasses import dataclass

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F

import tests._fakes  # noqa: F401
from clbench import api, config
from clbench.cl.data import experience_tensors
from clbench.executors import LocalExecutor, is_done
from clbench.models.checkpoint import save_weights
from clbench.protocol import ParamCount, StrategyBase
from clbench.registry import STRATEGIES
from clbench.runner import record_path
from clbench.suite_file import parse_suite
from tests._cli import run_suite
from tests._contract import Good as _Good

SCENARIO = {"name": "synthetic", "args": {"train_per_class": 15, "test_per_class": 10}}


def _suite(strategies, seeds=(0,)):
    return parse_suite({"suite": "t", "seeds": list(seeds), "scenarios": [SCENARIO], "strategies": strategies})


def test_same_seed_gives_identical_accuracy_matrix(tmp_path):
    suite = _suite([{"name": "naive", "preset": "cpu", "args": {"epochs": 1}}])
    a = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path / "a")[0]
    b = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path / "b")[0]
    assert a.status == b.status == "finished"
    assert a.accuracy_matrix == b.accuracy_matrix


def test_nan_loss_marks_the_run_failed_and_the_suite_continues(tmp_path):
    suite = _suite([{"name": "naive", "preset": "cpu", "label": "diverges",
                     "args": {"epochs": 1, "optimizer": "sgd", "lr": 1e30, "momentum": 0.0}},
                    {"name": "test_increasing_logits"}])
    records = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert [r.status for r in records] == ["failed", "finished"]
    assert "non-finite" in records[0].reason
    saved = json.loads(record_path(tmp_path, records[0].run_id).read_text())
    assert saved["status"] == "failed" and "lower the learning rate" in saved["reason"].lower()


def test_interrupted_suite_keeps_finished_runs_and_resumes(tmp_path):
    interrupted = _suite([{"name": "test_increasing_logits", "args": {"interrupt_at_seed": 1}}], seeds=(0, 1))
    with pytest.raises(KeyboardInterrupt):
        LocalExecutor().run_all(interrupted.run_specs("cpu"), tmp_path)
    first = record_path(tmp_path, "synthetic__test_increasing_logits__s0")
    assert first.exists() and not record_path(tmp_path, "synthetic__test_increasing_logits__s1").exists()

    # the same command again (here without the interruption, i.e. another config) resumes where it stopped
    resumed = _suite([{"name": "test_increasing_logits", "args": {"interrupt_at_seed": 1}}], seeds=(0,))
    assert is_done(resumed.run_specs("cpu")[0], tmp_path)
    assert LocalExecutor().run_all(resumed.run_specs("cpu"), tmp_path) == []


def test_changed_configuration_or_failed_run_is_run_again(tmp_path):
    suite = _suite([{"name": "test_increasing_logits"}])
    (spec,) = suite.run_specs("cpu")
    LocalExecutor().run_all([spec], tmp_path)
    assert is_done(spec, tmp_path)
    changed = _suite([{"name": "test_increasing_logits", "args": {"extra": 2.0}}]).run_specs("cpu")[0]
    assert changed.run_id == spec.run_id and not is_done(changed, tmp_path)
    path = record_path(tmp_path, spec.run_id)
    data = json.loads(path.read_text())
    data["status"] = "failed"
    path.write_text(json.dumps(data))
    assert not is_done(spec, tmp_path)
    assert len(LocalExecutor().run_all([spec], tmp_path)) == 1


DIGITS = {"suite": "s", "seeds": [0], "scenarios": [{"name": "split_digits"}],
          "strategies": [{"name": "naive", "preset": "cpu"}]}


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


SCENARIO_ARGS = {"train_per_class": 6, "test_per_class": 3}


@dataclass
class Config:
    lr: float = 0.1


class Linear(StrategyBase):
    Config = Config
    PRESETS = {"cpu": {}}

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), info.n_classes))

    def train(self, experience):
        x, y = experience_tensors(experience)
        optimizer = torch.optim.SGD(self.net.parameters(), lr=self.config.lr)
        for _ in range(3):                                   # its own loop, no callbacks
            optimizer.zero_grad()
            F.cross_entropy(self.net(x), y).backward()
            optimizer.step()

    @torch.no_grad()
    def predict(self, x, task_labels):
        return self.net(x)

    def num_parameters(self):
        return ParamCount.of(self.net)


class NoSuper(Linear):
    def __init__(self, info, device, config):                # forgets super().__init__
        self.config = config
        self.net = nn.Linear(math.prod(info.input_shape), info.n_classes)


class Means(Linear):
    """Class means, no optimizer: nothing to fire hooks for."""

    def train(self, experience):
        x, y = experience_tensors(experience)
        with torch.no_grad():
            for c in y.unique():
                self.net[1].weight[c] = x[y == c].flatten(1).mean(0)


@pytest.fixture
def violators():
    """The three strategies of the contract-violation tests, registered for one test."""
    names = {"test_own_loop": Linear, "test_no_super": NoSuper, "test_means": Means}
    for name, cls in names.items():
        STRATEGIES.register(name)(cls)
    yield
    for name in names:
        del STRATEGIES._entries[name], STRATEGIES.origins[name]


def _run(name):
    return api.run("synthetic", name, preset="cpu", device="cpu", scenario_args=SCENARIO_ARGS)


def test_a_loop_that_bypasses_the_callbacks_is_a_contract_violation(violators):
    record = _run("test_own_loop")
    assert record.status == "failed"
    assert record.reason == ("StrategyContractError: Linear.train() took 3 optimizer step(s) on experience 0 without "
                             "firing the batch hooks: train through clbench.training.fit(..., "
                             "callbacks=self.callbacks) or clbench.callbacks.bridge(template, self.callbacks) (see "
                             "clbench.protocol.StrategyBase).")


def test_a_skipped_super_init_is_named(violators):
    record = _run("test_no_super")
    assert record.status == "failed"
    assert record.reason.startswith("StrategyContractError: NoSuper.__init__ did not call super().__init__(info, "
                                    "device, config), which sets self.")


def test_learning_without_an_optimizer_needs_no_hooks(violators):
    assert _run("test_means").status == "finished"


SYNTHETIC = {"n_classes": 4, "n_experiences": 2, "train_per_class": 10, "test_per_class": 5}




def test_wrong_return_type_fails_the_run_naming_the_strategy(tmp_path, registered):
    from clbench.runner import execute
    from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry

    class IntCount(_Good):
        def num_parameters(self):
            return 5

    registered(STRATEGIES, "test_int_count", IntCount)
    record = execute(RunSpec("t", ScenarioEntry("synthetic", SYNTHETIC), StrategyEntry("test_int_count"), 0, "cpu"))
    assert record.status == "failed"
    assert record.reason == ("StrategyContractError: IntCount.num_parameters() returned int, expected ParamCount "
                             "(see clbench.protocol.StrategyBase).")
