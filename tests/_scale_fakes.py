"""A test strategy for the executors: it can hold a run until a file disappears, or kill its own process, so that the
tests can interrupt a suite mid-way and lose worker processes on purpose; and a scenario whose dataset is missing.
Executors import this module in their worker processes and Ray tasks (it registered the names a spec uses)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from clbench.data import DatasetNotFound
from clbench.registry import SCENARIOS, STRATEGIES
from tests._fakes import FakeConfig, IncreasingLogits


@dataclass
class ScaleConfig(FakeConfig):
    marker_dir: str = ""                                      # one file "<seed>.<attempt>" per attempt: the pid
    crash_seeds: list[int] = field(default_factory=list)      # these seeds SIGKILL their own process ...
    crash_times: int = 0                                      # ... on their first this many attempts
    hold_seeds: list[int] = field(default_factory=list)       # these seeds wait while <marker_dir>/hold exists


@STRATEGIES.register("test_hold_or_crash")
class HoldOrCrash(IncreasingLogits):
    """:class:`~tests._fakes.IncreasingLogits` that, in its first ``train``, writes its process id to
    ``<marker_dir>/<seed>.<attempt>``, then kills its own process (``crash_seeds``, first ``crash_times``
    attempts) or waits while ``<marker_dir>/hold`` exists (``hold_seeds``, at most 120 s)."""

    Config = ScaleConfig
    PRESETS = {"cpu": {}}

    def train(self, experience):
        if self.steps == 0 and self.config.marker_dir:
            seed, folder = torch.initial_seed(), Path(self.config.marker_dir)
            attempt = len(list(folder.glob(f"{seed}.*")))
            (folder / f"{seed}.{attempt}").write_text(str(os.getpid()))
            if seed in self.config.crash_seeds and attempt < self.config.crash_times:
                os.kill(os.getpid(), signal.SIGKILL)
            deadline = time.monotonic() + 120
            while seed in self.config.hold_seeds and (folder / "hold").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        super().train(experience)


@SCENARIOS.register("test_missing_dataset")
def missing_dataset(*, seed: int = 0) -> None:
    """A scenario whose dataset is never there: a set-up error that stops a suite."""
    raise DatasetNotFound("test_missing_dataset: no such data (searched nowhere); this stops the suite")


def attempts(marker_dir: Path, seed: int) -> int:
    """How many times seed ``seed`` started training."""
    return len(list(Path(marker_dir).glob(f"{seed}.*")))
