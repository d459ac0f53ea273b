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
import importlib.util
import inspect
import json
import os
import re
import sys
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from clbench import typecheck
from clbench.registry import CALLBACKS, MODELS, SCENARIOS, STRATEGIES, PluginError, load_plugin
from clbench.typecheck import brief


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
            raise ConfigError(f"{where}: unknown key {brief(key)}.{_suggest(str(key), known)} "
                              f"Allowed keys: {', '.join(known)}.")


# ---------------------------------------------------------------------------------------------------------- hparams
def build_config(strategy_name: str, preset: str | None = None, overrides: dict | None = None,
                 where: str = "") -> Any:
    """Instantiate ``STRATEGIES.get(strategy_name).Config`` from its defaults, then ``PRESETS[preset]``, then
    ``overrides``, each value checked against the field's annotation and range (see :func:`checked_overrides`).
    Unknown fields and presets, wrong types and values raise :class:`ConfigError`."""
    where = where or f"strategy {strategy_name!r}"
    config_cls, values, checked = _resolve(strategy_name, preset, overrides or {}, where)
    config = _instantiate(config_cls, values, where)
    _check_used(where, config, checked)
    return config


def checked_overrides(strategy_name: str, preset: str | None, overrides: dict, where: str) -> dict:
    """``overrides`` coerced to the types of the strategy's ``Config`` fields (``lr: "1e-3"`` -> ``0.001``),
    after checking that the whole configuration builds; raises :class:`ConfigError` naming ``where`` and the key."""
    return checked_config(strategy_name, preset, overrides, where)[0]


def checked_config(strategy_name: str, preset: str | None, overrides: dict, where: str) -> tuple[dict, Any]:
    """``(checked overrides, the Config they build)``: :func:`checked_overrides` and the configuration itself."""
    config_cls, values, checked = _resolve(strategy_name, preset, overrides, where)
    config = _instantiate(config_cls, values, where)
    _check_used(where, config, checked)
    return checked, config


def _resolve(strategy_name: str, preset: str | None, overrides: dict, where: str) -> tuple[type, dict, dict]:
    """``(Config class, preset + overrides, overrides)``, every value type- and range-checked."""
    cls = STRATEGIES.get(strategy_name)
    config_cls = cls.Config
    presets: dict[str, dict] = getattr(cls, "PRESETS", {})
    values: dict[str, Any] = {}
    if preset is not None:
        if not isinstance(preset, str) or preset not in presets:
            raise ConfigError(f"{where}: strategy {brief(strategy_name)} has no preset {brief(preset)}."
                              f"{_suggest(str(preset), presets)} Presets: {', '.join(presets) or 'none'}.")
        values.update(_checked_fields(f"{where}: preset {brief(preset)}", config_cls, presets[preset], {}))
    checked = _checked_fields(f"{where}: args", config_cls, overrides, values)
    values.update(checked)
    return config_cls, values, checked


USED_ONLY_WITH: dict[str, tuple[str, typing.Callable[[Any], bool], str]] = {
    "momentum": ("optimizer", lambda v: v == "sgd", "sgd"),        # Adam and AdamW keep torch's beta1
    "decay_factor": ("mode", lambda v: v == "online", "online"),  # EWC's separate mode keeps every matrix as it is
    "alpha": ("loss", lambda v: v == "mse", "mse"),                # the rescaled square loss's α and κ (tangent)
    "kappa": ("loss", lambda v: v == "mse", "mse"),
    "sigma_dp": ("attention", lambda v: v == "reattention", "reattention"),      # Re-Attention's error model
    "error_scale": ("attention", lambda v: v == "reattention", "reattention"),
    "prior_noise": ("attention", lambda v: v == "reattention", "reattention"),
    "prune_lambda": ("prune", lambda v: v is True, "true"),        # DER's channel-mask pruning
    "prune_s_max": ("prune", lambda v: v is True, "true"),
    "prune_init": ("prune", lambda v: v is True, "true"),
    "crop_padding": ("augment", lambda v: "crop" in v, "a list with crop"),     # DyTox's random crop
    "warmup_lr": ("warmup_epochs", lambda v: v > 0, "at least 1"),               # DyTox's warm-up start
}
"""Config fields used only when another field of the same Config has some value: ``{field: (other field, test of
its value, what the test asks for)}``. Setting such a field in a suite's ``args`` while the other field fails the
test would change nothing, so it is refused at load (a Config without the other field imposes nothing)."""


def _check_used(where: str, config: Any, overrides: dict) -> None:
    for name, (other, used, wanted) in USED_ONLY_WITH.items():
        if name in overrides and hasattr(config, other) and not used(getattr(config, other)):
            raise ConfigError(f"{where}: args.{name} is used only with {other}: {wanted} (this entry's {other} is "
                              f"{brief(getattr(config, other))}), so it would change nothing; remove it or set "
                              f"{other}.")


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
            raise ConfigError(f"{where}.{name}: unknown {name} {brief(value)}.{_suggest(str(value), choices())} "
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
        raise ConfigError(f"{where}: expected a mapping, got {brief(args)}.")
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


NOT_TRAINING: dict[str, str] = {
    "eval_batch_size": "the batch size of evaluation: the same predictions, computed in other chunks",
}
"""Config fields (by name, or ``strategy.field`` for one strategy) that are part of the run identity but do not
change what is trained, with the reason. Every other field changes the trained result; tests/test_fields.py
changes each field of every shipped strategy and checks one or the other."""


def config_dict(config: Any) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def config_hash(payload: dict) -> str:
    """A stable short hash of a JSON-serializable mapping (run identity for resume)."""
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


CHECKPOINT_FIELDS = ("init",)
"""Hyperparameters (at any depth: ``init``, ``model_args.init``) that name a local checkpoint file read by the run;
``{scenario}`` in the path is the scenario's name (one checkpoint per source dataset)."""


def checkpoint_hashes(resolved: dict, scenario: str) -> dict[str, str]:
    """``{dotted field: sha256 of the file (16 digits), or "missing"}`` for every :data:`CHECKPOINT_FIELDS` value
    of a resolved configuration."""
    found: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                name = f"{prefix}{key}"
                if key in CHECKPOINT_FIELDS and isinstance(item, str) and item:
                    found[name] = file_hash(item.replace("{scenario}", scenario))
                else:
                    walk(f"{name}.", item)

    walk("", resolved)
    return found


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def file_hash(path: str | Path) -> str:
    """16 hex digits of the sha256 of a file's bytes (``"missing"`` if there is none), cached by path, size and
    modification time."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError:
        return "missing"
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_HASHES:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _FILE_HASHES[key] = digest.hexdigest()[:16]
    return _FILE_HASHES[key]


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

    def config(self) -> Any:
        """The strategy's Config for this run (defaults, preset, args)."""
        return build_config(self.strategy.name, self.strategy.preset, self.strategy.args)

    def identity(self, config: Any = None) -> dict:
        """What makes two runs the same run (device and amp excluded: they do not change the experiment): the suite,
        the scenario entry, the strategy entry with its resolved hyperparameters, the seed, and the content hash of
        every checkpoint the hyperparameters name (``checkpoints``, only when there is one): overwriting a
        checkpoint changes the identity, so resume runs again what read the old one. ``config``: this run's
        :meth:`config`, when the caller has built it already."""
        resolved = config_dict(self.config() if config is None else config)
        identity = {"suite": self.suite, "scenario": dataclasses.asdict(self.scenario),
                    "strategy": {**dataclasses.asdict(self.strategy), "resolved": resolved}, "seed": self.seed}
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
                    raise ConfigError(f"suite {brief(self.name)} has no {kind} {brief(w)}.{_suggest(w, keys)} "
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
        raise ConfigError(f"unknown suite {brief(suite)}.{_suggest(suite, shipped)} Shipped suites: "
                          f"{', '.join(sorted(shipped))}; or pass the path of a .yaml file.")
    return shipped[suite]


MAX_NAME = 100      # a registry name, label or suite name: longer is not a name (and is cut in messages)


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
            raise ConfigError(f"{where}[{i}]: each entry needs at least a 'name' (got {brief(item)}).")
        if not isinstance(item["name"], str) or len(item["name"]) > MAX_NAME:
            raise ConfigError(f"{where}[{i}].name: expected a registered name (a string of at most {MAX_NAME} "
                              f"characters), got {brief(item['name'])}.")
        _check_keys(f"{where}[{i}]", item, keys)
        if not isinstance(item.get("args", {}), dict):
            raise ConfigError(f"{where}[{i}].args: expected a mapping, got {brief(item['args'])}.")
        out.append(item)
    return out


def _checked_scenario_args(where: str, name: str, args: dict) -> dict:
    """``args`` checked against the scenario factory's keyword parameters, their annotations and ranges, then
    against the data by the factory's optional ``check_args(**args)`` (a ``ValueError`` there, e.g. more experiences
    than classes, is a :class:`ConfigError`): what the scenario would refuse when built is refused at load."""
    factory = SCENARIOS.get(name)
    params = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        _check_keys(f"{where}: args", args, [p for p in params if p != "seed"])
    try:
        checked = typecheck.check_values(args, _type_hints(factory), "args.")
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}: {exc}") from None
    check = getattr(factory, "check_args", None)
    if check is not None:
        try:
            check(**checked)
        except ValueError as exc:
            raise ConfigError(f"{where}: args: {exc}") from None
    return checked


# Names that become parts of file names (suite -> results/<suite>/, labels -> runs/<scenario>__<strategy>__s0.json)
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def check_path_name(where: str, key: str, value: Any) -> str:
    """``value`` if it is a :data:`SAFE_NAME` without ``..`` (leaves its folder) or ``__`` (separates the parts of
    a run id); else :class:`ConfigError` naming ``where`` and ``key``."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value or "__" in value:
        raise ConfigError(f"{where}: {key!r} {brief(value)} may contain only letters, digits, '_', '.', '+' and '-', "
                          f"start with a letter or digit and contain neither '..' nor '__': it becomes part of file "
                          f"names (results/<suite>/runs/<scenario>__<strategy>__s<seed>.json).")
    return value


MAX_SEED = 2**32 - 1      # numpy's seed range (seed_everything seeds random, numpy and torch with it)


def _check_seeds(where: str, seeds: Any) -> None:
    """A non-empty list of distinct integers in ``[0, 2**32 - 1]``: a repeated seed would run twice into one
    record, and numpy cannot take a larger one (the run would fail after the suite loaded)."""
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and 0 <= s <= MAX_SEED for s in seeds):
        raise ConfigError(f"{where}: 'seeds' must be a non-empty list of integers from 0 to 2**32 - 1 (not "
                          f"booleans), got {brief(seeds)}.")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"{where}: seed {repeated[0]} appears twice in 'seeds'; each seed is one run, list it once.")


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
            _check_keys(f"{where}[{i}].args (callback {brief(item['name'])})", args, list(params))
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
        raise ConfigError(f"{where}.dp: expected a mapping like {{epsilon: 3.0, clip: 1.0}}, got {brief(raw)}.")
    return parse_callbacks(f"{where}.dp", [{"name": "dp", "args": raw}])


def _check_dp(where: str, strategy: str, callbacks: tuple[dict, ...], config: Any = None) -> None:
    """Every ``dp`` callback of an entry (from its ``dp:`` key or its ``callbacks:`` list): a strategy that may train
    privately, a budget that can be used (:class:`clbench.privacy.step.DPConfig`), opacus installed (its
    accountant computes the noise) and no rehearsal memory in the entry's resolved ``config`` (``mem_size`` > 0: the
    memory's samples come back in later experiences, so each experience's epsilon would understate theirs)."""
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
    if not _installed("opacus"):
        raise ConfigError(f"{where}: dp needs opacus (its accountant calibrates the noise), which is not installed: "
                          f"pip install 'clbench[dp]', or remove the dp entry.")
    if getattr(config, "mem_size", 0):
        raise ConfigError(f"{where}: dp with a rehearsal memory (mem_size {config.mem_size}): the memory's samples are "
                          f"trained on again in later experiences, so the per-experience epsilon would understate "
                          f"theirs; set mem_size: 0 or remove the dp entry.")


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it; ``sys.modules[module] = None`` blocks it)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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
            raise ConfigError(f"{source}: missing required key {brief(required)}.")
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
        args, config = checked_config(item["name"], item.get("preset"), item.get("args", {}), where)
        callbacks = parse_callbacks(f"{where}.callbacks", item.get("callbacks", []))
        if "dp" in item:
            callbacks += _parse_dp(where, item["dp"])
        _check_dp(where, item["name"], callbacks, config)
        strategies.append(StrategyEntry(name=item["name"], preset=item.get("preset"),
                                        args=args, label=item.get("label", ""), callbacks=callbacks))

    for kind, entries in (("scenario", scenarios), ("strategy", strategies)):
        keys = [e.key for e in entries]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError(f"{source}: {kind} {brief(dupes[0])} appears twice; give the entries distinct 'label's.")

    return SuiteSpec(name=name, scenarios=tuple(scenarios), strategies=tuple(strategies),
                     seeds=tuple(seeds), description=str(data.get("description", "")), source=source)


def _check_entry_names(where: str, item: dict) -> None:
    """The entry's row key (its label, else its name) is used in file names."""
    if item.get("label"):
        check_path_name(where, "label", item["label"])
    else:
        check_path_name(where, "name", item["name"])


MAX_SUITE_BYTES = 1_000_000     # a suite file is a few KB; a larger one is not a suite
MAX_SUITE_NODES = 100_000       # YAML nodes after expanding aliases (nested anchors can expand to billions)


def load_suite(suite: str | Path) -> SuiteSpec:
    """Load a shipped suite by name (``quick``) or a suite file by path, and validate it."""
    path = resolve_suite_path(str(suite))
    return parse_suite(read_yaml(path), source=str(path))


def read_yaml(path: Path) -> Any:
    """The YAML document at ``path`` (safe loader), refused with one :class:`ConfigError` line when it is larger
    than :data:`MAX_SUITE_BYTES`, not UTF-8 text, not YAML, or expands (through aliases) to more than
    :data:`MAX_SUITE_NODES` nodes or into itself."""
    try:
        size = os.path.getsize(path)
        if size > MAX_SUITE_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes; a suite file is at most {MAX_SUITE_BYTES:,} bytes (is it a "
                              f"suite .yaml?).")
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); pass a suite .yaml file."
                          ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc}).") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_expansion(path, node)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None


def _check_expansion(path: Path, root: yaml.Node | None) -> None:
    """Refuse a document whose aliases expand it past :data:`MAX_SUITE_NODES` nodes, or into itself."""
    sizes: dict[int, int] = {}
    expanding = object()

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is expanding:
            raise ConfigError(f"{path}: an anchor contains an alias to itself; a suite is a finite tree.")
        if known is not None:
            return known
        sizes[id(node)] = expanding
        children = (node.value if isinstance(node, yaml.SequenceNode) else
                    [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_SUITE_NODES:
                raise ConfigError(f"{path}: expands to more than {MAX_SUITE_NODES:,} values through its anchors and "
                                  f"aliases; a suite file is a few entries (write them out, or use fewer aliases).")
        sizes[id(node)] = total
        return total

    if root is not None:
        size(root)
