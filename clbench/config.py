"""Typed configuration: strategy hyperparameters, suite YAML files and the run specifications they expand to.

A suite file (YAML) only overrides; every default lives in a strategy's ``Config`` dataclass (the paper's values)
or one of its named ``PRESETS`` (``cpu`` for 2-core machines, ``full`` for the paper's GPU setting)::

    suite: quick                       # name; results go to results/<suite>/ by default
    description: ...
    seeds: [0, 1, 2]
    plugins: [my_methods.py]           # optional: modules or .py files (relative to this file) imported first
    scenarios:
      - name: split_digits             # a SCENARIOS name
        args: {n_experiences: 5}       # keyword arguments of the scenario factory
    strategies:
      - name: replay                   # a STRATEGIES name
        preset: cpu                    # optional: one of the strategy's PRESETS
        args: {mem_size: 200}          # optional: fields of the strategy's Config dataclass
        label: replay_200              # optional: row name in the leaderboard (default: name)
        dp: {epsilon: 3.0, clip: 1.0}  # optional: private training (clbench.privacy; becomes the "dp" callback)

Everything is checked when the suite loads, before any run starts, and every mistake is a :class:`ConfigError`
naming the file, the entry and the key: unknown keys (with a suggestion), values of the wrong type or out of range
for every field, nested ones included (:mod:`clbench.typecheck`: a strategy ``Config``'s annotations, a scenario
factory's, the chosen model factory's for ``model_args``), ``model``/``head`` names, and names that become file
names (suite, labels: :data:`SAFE_NAME`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import inspect
import json
import re
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from clbench import typecheck
from clbench.registry import CALLBACKS, MODELS, SCENARIOS, STRATEGIES, PluginError, load_plugin


class ConfigError(ValueError):
    """A suite file, hyperparameter set or command-line choice that cannot be used as written; the message says
    what to change. The command line prints it as one line and exits with code 2."""


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
    ``overrides``, each value checked against the field's annotation and range (see :func:`checked_overrides`).
    Unknown fields and presets, wrong types and values raise :class:`ConfigError`."""
    config_cls, values, _ = _resolve(strategy_name, preset, overrides or {}, where or f"strategy {strategy_name!r}")
    return _instantiate(config_cls, values, where or f"strategy {strategy_name!r}")


def checked_overrides(strategy_name: str, preset: str | None, overrides: dict, where: str) -> dict:
    """``overrides`` coerced to the types of the strategy's ``Config`` fields (``lr: "1e-3"`` -> ``0.001``),
    after checking that the whole configuration builds; raises :class:`ConfigError` naming ``where`` and the key."""
    config_cls, values, checked = _resolve(strategy_name, preset, overrides, where)
    _instantiate(config_cls, values, where)
    return checked


def _resolve(strategy_name: str, preset: str | None, overrides: dict, where: str) -> tuple[type, dict, dict]:
    """``(Config class, preset + overrides, overrides)``, every value type- and range-checked."""
    cls = STRATEGIES.get(strategy_name)
    config_cls = cls.Config
    presets: dict[str, dict] = getattr(cls, "PRESETS", {})
    values: dict[str, Any] = {}
    if preset is not None:
        if not isinstance(preset, str) or preset not in presets:
            raise ConfigError(f"{where}: strategy {strategy_name!r} has no preset {preset!r}."
                              f"{_suggest(str(preset), presets)} Presets: {', '.join(presets) or 'none'}.")
        values.update(_checked_fields(f"{where}: preset {preset!r}", config_cls, presets[preset], {}))
    checked = _checked_fields(f"{where}: args", config_cls, overrides, values)
    values.update(checked)
    return config_cls, values, checked


def _instantiate(config_cls: type, values: dict, where: str) -> Any:
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as exc:   # the Config's own __post_init__ checks
        raise ConfigError(f"{where}: invalid hyperparameters: {exc}") from exc


def _checked_fields(where: str, config_cls: type, values: dict, below: dict) -> dict:
    """``values`` (Config field -> value) checked: known fields, annotations and ranges, ``model``/``head`` names
    (:data:`NAMED_CHOICES`) and ``model_args`` against the signature of the model named in ``values``, else in
    ``below`` (the preset's values), else by the Config (a field default or a class attribute ``model``)."""
    _check_keys(where, values, [f.name for f in dataclasses.fields(config_cls)])
    try:
        checked = typecheck.check_values(values, _type_hints(config_cls))
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}.{exc}") from None
    for name, choices in NAMED_CHOICES.items():
        value = checked.get(name)
        if value is not None and value not in choices():
            raise ConfigError(f"{where}.{name}: unknown {name} {value!r}.{_suggest(str(value), choices())} "
                              f"Choose one of: {', '.join(choices())}.")
    if "model_args" in checked:
        model = checked.get("model", below.get("model", getattr(config_cls, "model", "auto")))
        checked["model_args"] = _checked_model_args(f"{where}.model_args", model, checked["model_args"])
    return checked


def _head_names() -> list[str]:
    from clbench.models.classifier import HEADS

    return ["auto", *HEADS]


def _optimizer_names() -> list[str]:
    from clbench.training import OPTIMIZERS

    return OPTIMIZERS.names()


# Config fields whose value must be a name from a registry or a fixed set, by field name (every strategy)
NAMED_CHOICES: dict[str, typing.Callable[[], list[str]]] = {
    "model": lambda: ["auto", *MODELS.names()],
    "head": _head_names,
    "optimizer": _optimizer_names,
}


def _checked_model_args(where: str, model: str, args: Any) -> dict:
    """``model_args`` checked against ``MODELS.get(model)``'s keyword parameters and their annotations. With
    ``model: auto`` the backbone is the scenario's default, known only when the scenario is built: keys must then
    be a parameter of some registered model (a misspelling is still caught); name the model for a full check."""
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: expected a mapping, got {args!r}.")
    factories = [MODELS.get(model)] if model != "auto" else [MODELS.get(m) for m in MODELS.names()]
    params = [p for f in factories for p in list(inspect.signature(f).parameters.values())[1:]]
    if model == "auto" or not any(p.kind is p.VAR_KEYWORD for p in params):
        _check_keys(where, args, dict.fromkeys(p.name for p in params if p.kind in (p.KEYWORD_ONLY,
                                                                                    p.POSITIONAL_OR_KEYWORD)))
    try:
        return typecheck.check_values(args, _type_hints(factories[0]) if len(factories) == 1 else {}, ".")
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}{exc}") from None


def _type_hints(obj: Any) -> dict[str, Any]:
    """The annotations of a function's parameters, a dataclass's fields or a class's ``__init__`` parameters; an
    annotation that cannot be resolved is left unchecked."""
    target = obj.__init__ if isinstance(obj, type) and not dataclasses.is_dataclass(obj) else obj
    try:
        return typing.get_type_hints(target)
    except (NameError, TypeError):
        return {}


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
    """A suite's strategy: a STRATEGIES name, Config overrides (``args``), a label, a preset and the callbacks
    attached to its training loops (``{"name": CALLBACKS name, "args": {...}}`` each; part of the run's identity)."""

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

    def identity(self) -> dict:
        """What makes two runs the same run (device and amp excluded: they do not change the experiment)."""
        resolved = config_dict(build_config(self.strategy.name, self.strategy.preset, self.strategy.args))
        return {"suite": self.suite, "scenario": dataclasses.asdict(self.scenario),
                "strategy": {**dataclasses.asdict(self.strategy), "resolved": resolved}, "seed": self.seed}

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

        if seeds:
            _check_seeds("--seeds", list(seeds))

        return dataclasses.replace(self, scenarios=pick(self.scenarios, scenarios, "scenario"),
                                   strategies=pick(self.strategies, strategies, "strategy"),
                                   seeds=tuple(seeds) if seeds else self.seeds)


# ------------------------------------------------------------------------------------------------------ suite files
SUITE_KEYS = ("suite", "description", "seeds", "plugins", "scenarios", "strategies")
SCENARIO_KEYS = ("name", "args", "label")
STRATEGY_KEYS = ("name", "preset", "args", "label", "callbacks", "dp")
CALLBACK_KEYS = ("name", "args")


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


def _entry_list(where: str, raw: Any, keys: tuple[str, ...], allow_empty: bool = False) -> list[dict]:
    """``raw`` as a list of mappings with a 'name' (a bare string is ``{name: string}``), only ``keys`` and a mapping
    as ``args``."""
    if not isinstance(raw, list) or not (raw or allow_empty):
        raise ConfigError(f"{where}: expected a {'' if allow_empty else 'non-empty '}list of entries, each a mapping "
                          f"with keys {keys}.")
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


def _checked_scenario_args(where: str, name: str, args: dict) -> dict:
    """``args`` checked against the scenario factory's keyword parameters, their annotations and ranges."""
    factory = SCENARIOS.get(name)
    params = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        _check_keys(f"{where}: args", args, [p for p in params if p != "seed"])
    try:
        return typecheck.check_values(args, _type_hints(factory), "args.")
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}: {exc}") from None


# Names that become parts of file names (suite -> results/<suite>/, labels -> runs/<scenario>__<strategy>__s0.json)
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def check_path_name(where: str, key: str, value: Any) -> str:
    """``value`` if it is a :data:`SAFE_NAME` without ``..`` (leaves its folder) or ``__`` (separates the parts of
    a run id); else :class:`ConfigError` naming ``where`` and ``key``."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value or "__" in value:
        raise ConfigError(f"{where}: {key!r} {value!r} may contain only letters, digits, '_', '.', '+' and '-', "
                          f"start with a letter or digit and contain neither '..' nor '__': it becomes part of file "
                          f"names (results/<suite>/runs/<scenario>__<strategy>__s<seed>.json).")
    return value


def _check_seeds(where: str, seeds: Any) -> None:
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and s >= 0 for s in seeds):
        raise ConfigError(f"{where}: 'seeds' must be a non-empty list of integers >= 0 (not booleans), "
                          f"got {seeds!r}.")


def parse_callbacks(where: str, raw: Any) -> tuple[dict, ...]:
    """Validate a list of callback entries (``{name, args}``; a bare name is ``{name}``) against :data:`CALLBACKS`
    and each factory's keyword arguments."""
    out = []
    for i, item in enumerate(_entry_list(where, raw, CALLBACK_KEYS, allow_empty=True)):
        try:
            factory = CALLBACKS.get(item["name"])
        except KeyError as exc:
            raise ConfigError(f"{where}[{i}]: {exc}") from None
        args = item.get("args", {})
        params = inspect.signature(factory).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            _check_keys(f"{where}[{i}].args (callback {item['name']!r})", args, list(params))
        try:
            args = typecheck.check_values(args, _type_hints(factory), f"[{i}].args.")
        except typecheck.TypeMismatch as exc:
            raise ConfigError(f"{where}{exc}") from None
        out.append({"name": item["name"], "args": dict(args)})
    return tuple(out)


def _parse_dp(where: str, raw: Any) -> tuple[dict, ...]:
    """A strategy entry's ``dp: {epsilon, delta, clip, ...}`` as the ``dp`` callback entry (part of the run's
    identity; checked by :func:`_check_dp`)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}.dp: expected a mapping like {{epsilon: 3.0, clip: 1.0}}, got {raw!r}.")
    return parse_callbacks(f"{where}.dp", [{"name": "dp", "args": raw}])


def _check_dp(where: str, strategy: str, callbacks: tuple[dict, ...]) -> None:
    """Every ``dp`` callback of an entry (from its ``dp:`` key or its ``callbacks:`` list): a strategy that may train
    privately, and a budget that can be used (:class:`clbench.privacy.step.DPConfig`)."""
    entries = [c for c in callbacks if c["name"] == "dp"]
    if not entries:
        return
    from clbench.privacy.accountant import PrivacyBudgetError
    from clbench.privacy.step import PrivateTraining, check_private_strategy

    if len(entries) > 1:
        raise ConfigError(f"{where}: private training is given twice (dp: and a dp callback); keep one.")
    try:
        check_private_strategy(strategy)
        PrivateTraining(**entries[0]["args"])            # builds the DPConfig, which checks the budget
    except PrivacyBudgetError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _load_plugins(source: str, plugins: Any) -> None:
    """A suite's ``plugins:`` (modules, or .py files relative to the suite file), imported before its names are
    checked (:func:`clbench.registry.load_plugin`)."""
    if not isinstance(plugins, list) or not all(isinstance(p, str) and p for p in plugins):
        raise ConfigError(f"{source}: 'plugins' must be a list of module names or .py files, got {plugins!r}.")
    base = Path(source).parent if Path(source).is_file() else None
    for plugin in plugins:
        try:
            load_plugin(plugin, base)
        except PluginError as exc:
            raise ConfigError(f"{source}: {exc}") from None


def parse_suite(data: Any, source: str = "<suite>") -> SuiteSpec:
    """Validate a suite mapping (already parsed from YAML) into a :class:`SuiteSpec`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a suite file must be a mapping with keys {', '.join(SUITE_KEYS)}.")
    _check_keys(source, data, SUITE_KEYS)
    _load_plugins(source, data.get("plugins", []))
    for required in ("suite", "scenarios", "strategies"):
        if required not in data:
            raise ConfigError(f"{source}: missing required key {required!r}.")
    name = check_path_name(source, "suite", data["suite"])
    seeds = data.get("seeds", [0])
    _check_seeds(source, seeds)

    scenarios = []
    for i, item in enumerate(_entry_list(f"{source}: scenarios", data["scenarios"], SCENARIO_KEYS)):
        try:
            SCENARIOS.get(item["name"])
        except KeyError as exc:
            raise ConfigError(f"{source}: scenarios[{i}]: {exc}") from None
        where = f"{source}: scenarios[{i}] ({item['name']})"
        _check_entry_names(where, item)
        scenarios.append(ScenarioEntry(name=item["name"], label=item.get("label", ""),
                                       args=_checked_scenario_args(where, item["name"], item.get("args", {}))))

    strategies = []
    for i, item in enumerate(_entry_list(f"{source}: strategies", data["strategies"], STRATEGY_KEYS)):
        where = f"{source}: strategies[{i}] ({item['name']})"
        try:
            STRATEGIES.get(item["name"])
        except KeyError as exc:
            raise ConfigError(f"{source}: strategies[{i}]: {exc}") from None
        _check_entry_names(where, item)
        args = checked_overrides(item["name"], item.get("preset"), item.get("args", {}), where)
        callbacks = parse_callbacks(f"{where}.callbacks", item.get("callbacks", []))
        if "dp" in item:
            callbacks += _parse_dp(where, item["dp"])
        _check_dp(where, item["name"], callbacks)
        strategies.append(StrategyEntry(name=item["name"], preset=item.get("preset"),
                                        args=args, label=item.get("label", ""), callbacks=callbacks))

    for kind, entries in (("scenario", scenarios), ("strategy", strategies)):
        keys = [e.key for e in entries]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError(f"{source}: {kind} {dupes[0]!r} appears twice; give the entries distinct 'label's.")

    return SuiteSpec(name=name, scenarios=tuple(scenarios), strategies=tuple(strategies),
                     seeds=tuple(seeds), description=str(data.get("description", "")), source=source)


def _check_entry_names(where: str, item: dict) -> None:
    """The entry's row key (its label, else its name) is used in file names."""
    if item.get("label"):
        check_path_name(where, "label", item["label"])
    else:
        check_path_name(where, "name", item["name"])


def load_suite(suite: str | Path) -> SuiteSpec:
    """Load a shipped suite by name (``quick``) or a suite file by path, and validate it."""
    path = resolve_suite_path(str(suite))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_suite(data, source=str(path))
