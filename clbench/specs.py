"""What a suite expands to: its entries (:class:`ScenarioEntry`, :class:`StrategyEntry`), the suite
(:class:`SuiteSpec`) and one (scenario, strategy, seed) run (:class:`RunSpec`) with its identity. Suite files are
parsed into these by :mod:`clbench.suite_file`; a strategy's hyperparameters are built by :mod:`clbench.config`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clbench.config import build_config, checkpoint_hashes, config_dict
from clbench.errors import ConfigError, suggest
from clbench.registry import CALLBACKS, UnknownNameError
from clbench.typecheck import brief

MAX_SEED = 2**32 - 1      # numpy's seed range (seed_everything seeds random, numpy and torch with it)


def check_seeds(where: str, seeds: Any) -> None:
    """A non-empty list of distinct integers in ``[0, 2**32 - 1]``: a repeated seed would run twice into one
    record, and numpy cannot take a larger one (the run would fail after the suite loaded)."""
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and 0 <= s <= MAX_SEED for s in seeds):
        raise ConfigError(f"{where}: 'seeds' must be a non-empty list of integers from 0 to 2**32 - 1 (not "
                          f"booleans), got {brief(seeds)}.")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"{where}: seed {repeated[0]} appears twice in 'seeds'; each seed is one run, list it once.")



def identity_callbacks(callbacks: Iterable[dict]) -> tuple[dict, ...]:
    """The callback entries (``{"name", "args"}``) that are part of a run's identity: all but those whose
    :data:`~clbench.registry.CALLBACKS` factory declares ``observer = True`` (loggers, traces: they change neither
    the training nor the record, so adding or removing one resumes a finished run). A name no registry knows (a
    record's plugin callback that is not loaded) stays."""
    def observer(name: str) -> bool:
        try:
            return getattr(CALLBACKS.get(name), "observer", False) is True
        except UnknownNameError:
            return False

    return tuple(c for c in callbacks if not observer(c["name"]))


@dataclass(frozen=True)
class ScenarioEntry:
    """A suite's scenario: a SCENARIOS name, its keyword arguments, and an optional row label."""

    name: str
    args: dict = field(default_factory=dict)
    label: str = ""

    @property
    def key(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class StrategyEntry(ScenarioEntry):
    """A suite's strategy: a STRATEGIES name, Config overrides (``args``), a label, a preset and the callbacks
    attached to its training loops (``{"name": CALLBACKS name, "args": {...}}`` each; part of the run's identity,
    observers excepted: :func:`identity_callbacks`)."""

    preset: str | None = None
    callbacks: tuple[dict, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """One (scenario, strategy, seed) run: everything the runner needs, nothing it has to look up elsewhere."""

    suite: str
    scenario: ScenarioEntry
    strategy: StrategyEntry
    seed: int
    device: str = "auto"
    amp: bool = False

    @property
    def run_id(self) -> str:
        return f"{self.scenario.key}__{self.strategy.key}__s{self.seed}"

    def code_fingerprint(self) -> str:
        """A hash of the code this run depends on (:func:`clbench.fingerprint.code_fingerprint`): resume reruns a
        finished run whose record holds another one."""
        from clbench.fingerprint import code_fingerprint

        return code_fingerprint(self.strategy.name, self.scenario.name)

    def config(self) -> Any:
        """The strategy's Config for this run (defaults, preset, args)."""
        return build_config(self.strategy.name, self.strategy.preset, self.strategy.args)

    def identity(self, config: Any = None) -> dict:
        """What makes two runs the same run: the suite, the scenario entry, the strategy entry (its callbacks
        without the observers: :func:`identity_callbacks`) with its resolved hyperparameters, the seed, ``amp: True``
        for a bf16 autocast run (only then: a float32 run's identity is the one it had before amp entered it; a bf16
        run is another experiment, so resume does not mix the two), and the content hash of every checkpoint the
        hyperparameters name (``checkpoints``, only when there is one): overwriting a checkpoint changes the
        identity, so resume runs again what read the old one. The device is left out. ``config``: this run's
        :meth:`config`, when the caller has built it already."""
        resolved = config_dict(self.config() if config is None else config)
        strategy = {**dataclasses.asdict(self.strategy), "resolved": resolved}
        strategy["callbacks"] = identity_callbacks(strategy["callbacks"])
        identity = {"suite": self.suite, "scenario": dataclasses.asdict(self.scenario), "strategy": strategy,
                    "seed": self.seed}
        if self.amp:
            identity["amp"] = True
        checkpoints = checkpoint_hashes(resolved, self.scenario.name)
        if checkpoints:
            identity["checkpoints"] = checkpoints
        return identity

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        """The inverse of :meth:`to_dict`, also after a JSON round trip (a record's ``spec``): JSON turns the
        callbacks tuple into a list, which is turned back (so that the entry compares equal to the one written)."""
        strategy = {**d["strategy"], "callbacks": tuple(d["strategy"].get("callbacks", ()))}
        return cls(suite=d["suite"], scenario=ScenarioEntry(**d["scenario"]), strategy=StrategyEntry(**strategy),
                   seed=d["seed"], device=d.get("device", "auto"), amp=d.get("amp", False))


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    scenarios: tuple[ScenarioEntry, ...]
    strategies: tuple[StrategyEntry, ...]
    seeds: tuple[int, ...] = (0,)
    description: str = ""
    source: str = ""

    def run_specs(self, device: str = "auto", amp: bool = False) -> list[RunSpec]:
        """The cross product scenario x strategy x seed, in that nesting order. ``amp`` is checked here, where the
        command line, :func:`clbench.api.run` and any other caller make their runs: :meth:`check_amp`."""
        if amp:
            self.check_amp(device)
        return [RunSpec(self.name, sc, st, seed, device, amp)
                for sc in self.scenarios for st in self.strategies for seed in self.seeds]

    def check_amp(self, device: str) -> None:
        """bf16 autocast (:func:`clbench.precision.autocast`) on ``device`` for every run: refused on anything but
        cpu and cuda (``auto`` is one of them), and for strategies trained privately, whose per-sample norms must
        explain autograd's gradient to float32 precision (the dp callback's first-step invariant), which bf16
        products do not meet. One :class:`ConfigError` line each, before any run starts."""
        kind = device.partition(":")[0]
        if kind not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"--amp (amp=True) is bf16 autocast on cpu and cuda, not on {kind}; run without it.")
        private = [e.key for e in self.strategies if any(c["name"] == "dp" for c in e.callbacks)]
        if private:
            raise ConfigError(f"--amp (amp=True) with private training (dp) is refused: its per-sample norms are "
                              f"checked against autograd's gradients to float32 precision, which bf16 products do "
                              f"not meet; leave out {', '.join(private)} (--strategy) or run without amp.")

    def select(self, scenarios: list[str] | None = None, strategies: list[str] | None = None,
               seeds: list[int] | None = None) -> SuiteSpec:
        """Restrict to the given scenarios/strategies and/or replace the seeds. A wanted word picks, exactly, the
        entry whose key (its label, else its name) it is; a name that is no entry's key picks every entry of that
        name (``naive`` picks the row ``naive``, not ``naive_dp_eps8``, an entry of strategy naive too)."""
        def pick(entries, wanted, kind):
            if not wanted:
                return entries
            keys = {e.key for e in entries}
            names = {e.name for e in entries} - keys
            for w in wanted:
                if w not in keys | names:
                    raise ConfigError(f"suite {brief(self.name)} has no {kind} {brief(w)}.{suggest(w, keys | names)} "
                                      f"It has: {', '.join(sorted(keys | names))}.")
            return tuple(e for e in entries if e.key in wanted or e.name in wanted and e.name in names)

        if seeds:
            check_seeds("--seeds", list(seeds))

        return dataclasses.replace(self, scenarios=pick(self.scenarios, scenarios, "scenario"),
                                   strategies=pick(self.strategies, strategies, "strategy"),
                                   seeds=tuple(seeds) if seeds else self.seeds)
