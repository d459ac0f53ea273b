"""Typed configuration: strategy hyperparameters, suite YAML files and the run specifications they expand to.

A suite file (YAML) only overrides; every default lives in a strategy's ``Config`` dataclass (the paper's values)
or one of its named ``PRESETS`` (``cpu`` for 2-core machines, ``full`` for the paper's GPU setting)::

    suite: quick                       # name; results go to results/<suite>/ by default
    description: ...
    seeds: [0, 1, 2]
    scenarios:
      - name: split_digits             # a SCENARIOS name
        args: {n_experiences: 5}       # keyword arguments of the scenario factory
    strategies:
      - name: replay                   # a STRATEGIES name
        preset: cpu                    # optional: one of the strategy's PRESETS
        args: {mem_size: 200}          # optional: fields of the strategy's Config dataclass
        label: replay_200              # optional: row name in the leaderboard (default: name)

Unknown keys anywhere are errors that name the file and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import inspect
import json
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from clbench.registry import SCENARIOS, STRATEGIES


class ConfigError(ValueError):
    """A suite file or hyperparameter set that cannot be used as written; the message says what to change."""


def _suggest(key: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=2, cutoff=0.5)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _check_keys(where: str, given: dict, known: typing.Iterable[str]) -> None:
    known = list(known)
    for key in given:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}.{_suggest(key, known)} Allowed keys: {', '.join(known)}.")


# ---------------------------------------------------------------------------------------------------------- hparams
def build_config(strategy_name: str, preset: str | None = None, overrides: dict | None = None,
                 where: str = "") -> Any:
    """Instantiate ``STRATEGIES.get(strategy_name).Config`` from its defaults, then ``PRESETS[preset]``, then
    ``overrides``. Unknown fields and presets raise :class:`ConfigError`."""
    cls = STRATEGIES.get(strategy_name)
    config_cls = cls.Config
    presets: dict[str, dict] = getattr(cls, "PRESETS", {})
    where = where or f"strategy {strategy_name!r}"
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in presets:
            raise ConfigError(f"{where}: strategy {strategy_name!r} has no preset {preset!r}."
                              f"{_suggest(preset, presets)} Presets: {', '.join(presets) or 'none'}.")
        values.update(presets[preset])
    values.update(overrides or {})
    names = [f.name for f in dataclasses.fields(config_cls)]
    _check_keys(f"{where} args", values, names)
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: invalid hyperparameters: {exc}") from exc


def config_dict(config: Any) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def config_hash(payload: dict) -> str:
    """A stable short hash of a JSON-serializable mapping (run identity for resume)."""
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


# ------------------------------------------------------------------------------------------------------------ specs
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
    """A suite's strategy: a STRATEGIES name, Config overrides (``args``), a label and a preset."""

    preset: str | None = None


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

    def identity(self) -> dict:
        """What makes two runs the same run (device and amp excluded: they do not change the experiment)."""
        resolved = config_dict(build_config(self.strategy.name, self.strategy.preset, self.strategy.args))
        return {"suite": self.suite, "scenario": dataclasses.asdict(self.scenario),
                "strategy": {**dataclasses.asdict(self.strategy), "resolved": resolved}, "seed": self.seed}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        return cls(suite=d["suite"], scenario=ScenarioEntry(**d["scenario"]),
                   strategy=StrategyEntry(**d["strategy"]), seed=d["seed"], device=d.get("device", "auto"),
                   amp=d.get("amp", False))


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    scenarios: tuple[ScenarioEntry, ...]
    strategies: tuple[StrategyEntry, ...]
    seeds: tuple[int, ...] = (0,)
    description: str = ""
    source: str = ""

    def run_specs(self, device: str = "auto", amp: bool = False) -> list[RunSpec]:
        """The cross product scenario x strategy x seed, in that nesting order."""
        return [RunSpec(self.name, sc, st, seed, device, amp)
                for sc in self.scenarios for st in self.strategies for seed in self.seeds]

    def select(self, scenarios: list[str] | None = None, strategies: list[str] | None = None,
               seeds: list[int] | None = None) -> SuiteSpec:
        """Restrict to the given scenario/strategy keys (labels or names) and/or replace the seeds."""
        def pick(entries, wanted, kind):
            if not wanted:
                return entries
            keys = {e.key for e in entries} | {e.name for e in entries}
            for w in wanted:
                if w not in keys:
                    raise ConfigError(f"suite {self.name!r} has no {kind} {w!r}.{_suggest(w, keys)} "
                                      f"It has: {', '.join(sorted(keys))}.")
            return tuple(e for e in entries if e.key in wanted or e.name in wanted)

        return dataclasses.replace(self, scenarios=pick(self.scenarios, scenarios, "scenario"),
                                   strategies=pick(self.strategies, strategies, "strategy"),
                                   seeds=tuple(seeds) if seeds else self.seeds)


# ------------------------------------------------------------------------------------------------------ suite files
SUITE_KEYS = ("suite", "description", "seeds", "scenarios", "strategies")
SCENARIO_KEYS = ("name", "args", "label")
STRATEGY_KEYS = ("name", "preset", "args", "label")


def shipped_suites() -> dict[str, Path]:
    """Suites shipped as package data: ``{name: path}``."""
    folder = resources.files("clbench") / "suites"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".yaml")}


def resolve_suite_path(suite: str) -> Path:
    path = Path(suite)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"suite file {path} does not exist.")
        return path
    shipped = shipped_suites()
    if suite not in shipped:
        raise ConfigError(f"unknown suite {suite!r}.{_suggest(suite, shipped)} Shipped suites: "
                          f"{', '.join(sorted(shipped))}; or pass the path of a .yaml file.")
    return shipped[suite]


def _entry_list(where: str, raw: Any, keys: tuple[str, ...]) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a non-empty list of entries, each a mapping with keys {keys}.")
    out = []
    for i, item in enumerate(raw):
        item = {"name": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or "name" not in item:
            raise ConfigError(f"{where}[{i}]: each entry needs at least a 'name' (got {item!r}).")
        _check_keys(f"{where}[{i}]", item, keys)
        if not isinstance(item.get("args", {}), dict):
            raise ConfigError(f"{where}[{i}].args: expected a mapping, got {item['args']!r}.")
        out.append(item)
    return out


def _check_scenario_args(where: str, name: str, args: dict) -> None:
    factory = SCENARIOS.get(name)
    params = inspect.signature(factory).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    _check_keys(f"{where}.args (scenario {name!r})", args, [p for p in params if p != "seed"])


def parse_suite(data: Any, source: str = "<suite>") -> SuiteSpec:
    """Validate a suite mapping (already parsed from YAML) into a :class:`SuiteSpec`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a suite file must be a mapping with keys {', '.join(SUITE_KEYS)}.")
    _check_keys(source, data, SUITE_KEYS)
    for required in ("suite", "scenarios", "strategies"):
        if required not in data:
            raise ConfigError(f"{source}: missing required key {required!r}.")
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"{source}: 'seeds' must be a non-empty list of integers, got {seeds!r}.")

    scenarios = []
    for i, item in enumerate(_entry_list(f"{source}: scenarios", data["scenarios"], SCENARIO_KEYS)):
        try:
            SCENARIOS.get(item["name"])
        except KeyError as exc:
            raise ConfigError(f"{source}: scenarios[{i}]: {exc}") from None
        _check_scenario_args(f"{source}: scenarios[{i}]", item["name"], item.get("args", {}))
        scenarios.append(ScenarioEntry(name=item["name"], args=dict(item.get("args", {})),
                                       label=item.get("label", "")))

    strategies = []
    for i, item in enumerate(_entry_list(f"{source}: strategies", data["strategies"], STRATEGY_KEYS)):
        where = f"{source}: strategies[{i}] ({item['name']})"
        try:
            STRATEGIES.get(item["name"])
        except KeyError as exc:
            raise ConfigError(f"{source}: strategies[{i}]: {exc}") from None
        build_config(item["name"], item.get("preset"), item.get("args", {}), where=where)
        strategies.append(StrategyEntry(name=item["name"], preset=item.get("preset"),
                                        args=dict(item.get("args", {})), label=item.get("label", "")))

    for kind, entries in (("scenario", scenarios), ("strategy", strategies)):
        keys = [e.key for e in entries]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError(f"{source}: {kind} {dupes[0]!r} appears twice; give the entries distinct 'label's.")

    return SuiteSpec(name=str(data["suite"]), scenarios=tuple(scenarios), strategies=tuple(strategies),
                     seeds=tuple(seeds), description=str(data.get("description", "")), source=source)


def load_suite(suite: str | Path) -> SuiteSpec:
    """Load a shipped suite by name (``quick``) or a suite file by path, and validate it."""
    path = resolve_suite_path(str(suite))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_suite(data, source=str(path))
