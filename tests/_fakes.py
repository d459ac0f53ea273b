"""Strategies with known outputs, registered for the tests (accuracy matrices can be computed by hand), and a
stand-in ``ray`` module (Ray itself is an optional extra, not installed in CI)."""

from __future__ import annotations

import pickle
import types
from dataclasses import dataclass

import torch

from clbench.protocol import ParamCount, StrategyBase
from clbench.registry import STRATEGIES


@dataclass
class FakeConfig:
    interrupt_at_seed: int = -1
    extra: float = 1.5


@STRATEGIES.register("test_increasing_logits")
class IncreasingLogits(StrategyBase):
    """Scores class c with c: the runner's masking decides every prediction (the largest allowed class)."""

    Config = FakeConfig
    PRESETS = {"cpu": {}}

    def __init__(self, info, device, config):
        super().__init__(info, device, config)
        self.steps = 0
        self.weight = torch.nn.Parameter(torch.zeros(3))

    def train(self, experience):
        if torch.initial_seed() == self.config.interrupt_at_seed:
            raise KeyboardInterrupt
        self.steps += 1
        self.weight = torch.nn.Parameter(torch.zeros(3 + self.steps))   # grows by one parameter per step

    def predict(self, x, task_labels):
        return torch.arange(self.info.n_classes, dtype=torch.float32).expand(len(x), -1)

    def num_parameters(self):
        return ParamCount(total=self.weight.numel(), trainable=self.weight.numel())

    def extra_metrics(self):
        return {"answer": self.config.extra}


class _Ref:
    def __init__(self, value):
        self.value = value


def fake_ray(calls: dict) -> types.ModuleType:
    """A ``ray`` module that runs each task synchronously when submitted, with arguments and result pickled as
    Ray's object store would. ``calls`` records ``init`` kwargs, ``resources`` of the last ``ray.remote``, the
    ``tasks`` run (function names, nested ones included) and every ``wait``'s ``num_returns``."""
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: bool(calls.get("init"))
    ray.init = lambda **kw: calls.update(init=kw)
    calls.update(tasks=[], waits=[])

    def remote(**resources):
        calls["resources"] = resources

        def submit(fn, *args):
            calls["tasks"].append(fn.__name__)
            return _Ref(pickle.loads(pickle.dumps(fn(*pickle.loads(pickle.dumps(args))))))

        return lambda fn: types.SimpleNamespace(remote=lambda *args: submit(fn, *args))

    def wait(refs, num_returns):
        calls["waits"].append(num_returns)
        return refs[:num_returns], refs[num_returns:]

    ray.remote = remote
    ray.wait = wait
    ray.get = lambda refs: [r.value for r in refs] if isinstance(refs, list) else refs.value
    return ray
