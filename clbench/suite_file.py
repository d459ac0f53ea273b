"""Suite files: YAML read safely and checked into a :class:`clbench.specs.SuiteSpec`.

A suite file only overrides; every default lives in a strategy's ``Config`` dataclass (the paper's values)
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
factory's, the chosen model factory's for ``model_args``), the choices a Config field declares, names that become
file names (suite, labels: :data:`SAFE_NAME`) and what each strategy declares it needs
(:class:`clbench.protocol.StrategyBase`: the scenario kinds it serves; under ``dp``, its ``private_needs``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from clbench import recorded, typecheck
from clbench.config import checked_config, type_hints
from clbench.errors import ConfigError, check_keys, suggest
from clbench.names import MAX_NAME, check_path_name
from clbench.plugins import private_flag, record
from clbench.registry import CALLBACKS, SCENARIOS, STRATEGIES, PluginError, load_plugin, only_shipped
from clbench.specs import ScenarioEntry, StrategyEntry, SuiteSpec, check_seeds
from clbench.typecheck import brief

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
        raise ConfigError(f"unknown suite {brief(suite)}.{suggest(suite, shipped)} Shipped suites: "
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
            raise ConfigError(f"{where}[{i}]: each entry needs at least a 'name' (got {brief(item)}).")
        if not isinstance(item["name"], str) or len(item["name"]) > MAX_NAME:
            raise ConfigError(f"{where}[{i}].name: expected a registered name (a string of at most {MAX_NAME} "
                              f"characters), got {brief(item['name'])}.")
        check_keys(f"{where}[{i}]", item, keys)
        if not isinstance(item.get("args", {}), dict):
            raise ConfigError(f"{where}[{i}].args: expected a mapping, got {brief(item['args'])}.")
        out.append(item)
    return out


@dataclass(frozen=True)
class Signature:
    """The keyword parameters a scenario factory or a callback takes: their names, whether it takes ``**kwargs``,
    the annotations, declarations and defaults the values are checked against. :meth:`of` reads them from the
    factory (after importing its module), :meth:`recorded` from the registries' index (:mod:`clbench.recorded`:
    before any import); the one :meth:`check` runs on both, so the refusals read the same."""

    names: tuple[str, ...]
    var_keyword: bool
    hints: dict
    declared: dict
    defaults: dict
    complete: bool = True        # False: only the values of ``hints`` are known (the others checked after imports)

    @classmethod
    def of(cls, factory: Any) -> Signature:
        params = inspect.signature(factory).parameters
        return cls(tuple(params), any(p.kind is p.VAR_KEYWORD for p in params.values()), type_hints(factory),
                   typecheck.parameter_declarations(factory),
                   {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty})

    @classmethod
    def recorded(cls, kind: str, name: str) -> Signature | None:
        found = record(kind, name)
        if found is None or "signature" not in found:
            return None
        hints, declared, defaults = recorded.declared_parameters(found["signature"], only_shipped())
        return cls(tuple(p["name"] for p in found["signature"]["params"]), found["signature"]["var_keyword"], hints,
                   declared, defaults, complete=False)

    def check(self, args: dict, where_keys: str, prefix: str, skip: tuple[str, ...] = ()) -> dict:
        """``args`` checked: unknown keys (:class:`ConfigError` naming ``where_keys``; ``skip`` are not arguments
        here), then types, ranges and choices (:class:`~clbench.typecheck.TypeMismatch` naming ``prefix + key``);
        a recorded signature checks only the values whose annotation it records and returns those."""
        if not self.var_keyword:
            check_keys(where_keys, args, [n for n in self.names if n not in skip])
        known = args if self.complete else {k: v for k, v in args.items() if k in self.hints}
        return typecheck.check_values(known, self.hints, prefix, self.declared)

    def check_used(self, where: str, args: dict) -> None:
        """Refuse an argument given while the argument it is used only with (its declared
        :class:`~clbench.typecheck.UsedOnlyWith`) has another value (given, else the default): it would change
        nothing but the run's identity (dp's ``gamma`` with ``clipping: flat``)."""
        for name, need in ((n, d.only_with) for n, d in self.declared.items()
                           if d.only_with is not None and n in args):
            if not self.complete and need.other not in self.hints:
                continue
            other = args.get(need.other, self.defaults.get(need.other))
            if not need.test(other):
                raise ConfigError(f"{where}.args.{name} is used only with {need.other}: {need.wanted} (this entry's "
                                  f"{need.other} is {brief(other)}), so it would change nothing; remove it or set "
                                  f"{need.other}.")


def _checked_scenario_args(where: str, name: str, args: dict) -> dict:
    """``args`` checked against the scenario factory's keyword parameters, their annotations and declared ranges
    and choices (:func:`clbench.typecheck.parameter_declarations`), then against the data by the factory's optional
    ``check_args(**args)`` (a ``ValueError`` there, e.g. more experiences than classes, is a :class:`ConfigError`):
    what the scenario would refuse when built is refused at load."""
    factory = SCENARIOS.get(name)
    checked = _scenario_args(where, Signature.of(factory), args)
    check = getattr(factory, "check_args", None)
    if check is not None:
        try:
            check(**checked)
        except ValueError as exc:
            raise ConfigError(f"{where}: args: {exc}") from None
    return checked


def _scenario_args(where: str, signature: Signature, args: dict) -> dict:
    try:
        return signature.check(args, f"{where}: args", "args.", skip=("seed",))
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_callbacks(where: str, raw: Any) -> tuple[dict, ...]:
    """Validate a list of callback entries (``{name, args}``; a bare name is ``{name}``) against :data:`CALLBACKS`
    and each factory's keyword arguments."""
    out = []
    for i, item in enumerate(_entry_list(where, raw, CALLBACK_KEYS, allow_empty=True)):
        try:
            factory = CALLBACKS.get(item["name"])
        except KeyError as exc:
            raise ConfigError(f"{where}[{i}]: {exc}") from None
        args = _callback_args(where, i, item, Signature.of(factory))
        out.append({"name": item["name"], "args": dict(args)})
    return tuple(out)


def _callback_args(where: str, i: int, item: dict, signature: Signature) -> dict:
    """The args of ``where[i]``, a callback entry, checked against its factory's ``signature``."""
    try:
        args = signature.check(item.get("args", {}), f"{where}[{i}].args (callback {brief(item['name'])})",
                               f"[{i}].args.")
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}{exc}") from None
    signature.check_used(f"{where}[{i}]", args)
    return args


def _parse_dp(where: str, raw: Any) -> tuple[dict, ...]:
    """A strategy entry's ``dp: {epsilon, delta, clip, ...}`` as the ``dp`` callback entry (part of the run's
    identity; checked by :func:`_check_dp`; :func:`parse_suite` has checked that it is a mapping)."""
    return parse_callbacks(f"{where}.dp", [{"name": "dp", "args": raw}])


def _check_one_dp(where: str, count: int) -> None:
    """At most one ``dp`` callback an entry (its ``dp:`` key and its ``callbacks:`` list together)."""
    if count > 1:
        raise ConfigError(f"{where}: private training is given twice (dp: and a dp callback); keep one.")


def _check_dp(where: str, strategy: str, callbacks: tuple[dict, ...], config: Any = None) -> None:
    """The ``dp`` callback of an entry (from its ``dp:`` key or its ``callbacks:`` list; :func:`_check_budgets` has
    refused two): a strategy that may train privately, a budget that can be used
    (:class:`clbench.privacy.config.DPConfig`), opacus installed (its accountant computes the noise) and the entry's
    resolved ``config`` meeting the strategy's declared ``private_needs``
    (:meth:`clbench.protocol.StrategyBase.check_private`: no rehearsal memory, by default)."""
    entries = [c for c in callbacks if c["name"] == "dp"]
    if not entries:
        return
    from clbench.privacy.accountant import PrivacyBudgetError
    from clbench.privacy.step import PrivateTraining, check_private_strategy

    try:
        check_private_strategy(strategy)
        PrivateTraining(**entries[0]["args"])            # builds the DPConfig, which checks the budget
    except PrivacyBudgetError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not _installed("opacus"):
        raise ConfigError(f"{where}: dp needs opacus (its accountant calibrates the noise), which is not installed: "
                          f"pip install 'clbench[dp]', or remove the dp entry.")
    try:
        STRATEGIES.get(strategy).check_private(config)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_model_args(where: str, config: Any, scenarios: list[ScenarioEntry]) -> None:
    """The resolved ``model_args`` of an entry whose Config names its model, with the model factory's defaults
    filled in, against the divisibility rules the factory declares (its ``divides``) and each scenario's input
    shape (the factory's ``input_shape(**args)``, where it declares one): what the model would refuse when each run
    builds it (ViT heads that do not divide the width, patches that do not tile the image) is refused at load. With
    ``model: auto`` the model is the scenario's, known when the scenario is built."""
    from clbench.registry import MODELS

    model, model_args = getattr(config, "model", "auto"), getattr(config, "model_args", None)
    if model == "auto" or not isinstance(model_args, dict) or model not in MODELS:
        return
    factory = MODELS.get(model)
    defaults = {p.name: p.default for p in inspect.signature(factory).parameters.values()
                if p.default is not inspect.Parameter.empty}
    shapes = [(s, getattr(SCENARIOS.get(s.name), "input_shape", lambda **_: None)(**s.args)) for s in scenarios]
    _check_model_shape(where, getattr(factory, "divides", ()), {**defaults, **model_args}, shapes)


def _check_model_shape(where: str, rules: Any, model_args: dict,
                       shapes: list[tuple[ScenarioEntry, tuple[int, ...] | None]]) -> None:
    """``model_args`` (defaults filled in) against a model factory's declared :class:`~clbench.typecheck.Divides`
    ``rules``, with the input shape of each scenario ``(entry, shape or None when unknown)`` of the suite."""
    for j, (scenario, shape) in enumerate(shapes):
        try:
            typecheck.check_divides(rules, model_args, shape, f"scenarios[{j}] ({scenario.key})")
        except ValueError as exc:
            raise ConfigError(f"{where}: model_args: {exc}") from None


def _check_recorded_model(where: str, item: dict, found: dict,
                          shapes: list[tuple[ScenarioEntry, tuple[int, ...] | None]]) -> None:
    """A strategy entry's model and ``model_args`` (its args over its preset over its Config's defaults, as the
    strategy's index ``found`` records them) against the divisibility rules the index records of the model factory
    and the input shapes it records of the scenarios (:func:`_check_model_shape`); values of another type are left
    to the full check."""
    values = {f["name"]: f["default"] for f in found["fields"]}
    values.update(found["presets"].get(item.get("preset"), {}) if isinstance(item.get("preset"), str) else {})
    values.update(item.get("args", {}))
    model, model_args = values.get("model"), values.get("model_args")
    model_record = record("model", model) if isinstance(model, str) and isinstance(model_args, dict) else None
    if model_record is None:
        return
    defaults = {p["name"]: p["default"] for p in model_record["signature"]["params"] if "default" in p}
    rules = [typecheck.Divides(**rule) for rule in model_record["divides"]]
    _check_model_shape(where, rules, {**defaults, **model_args}, shapes)


def _check_kinds(source: str, scenarios: list[ScenarioEntry], strategies: list[StrategyEntry]) -> None:
    """Every strategy serves the kind of every scenario it is crossed with (its declared ``scenario_kinds``,
    :func:`clbench.protocol.scenario_kind`): a next-item model on images would fail only when its run starts."""
    from clbench.protocol import scenario_kind  # imports torch: not for `clbench list` (shipped_suites)

    for i, strategy in enumerate(strategies):
        kinds = STRATEGIES.get(strategy.name).scenario_kinds
        for j, scenario in enumerate(scenarios):
            kind = scenario_kind(SCENARIOS.get(scenario.name))
            if kind not in kinds:
                raise ConfigError(f"{source}: strategies[{i}] ({strategy.name}): it serves {' or '.join(kinds)} "
                                  f"scenarios, and scenarios[{j}] ({scenario.name}) is a {kind} scenario; every "
                                  f"strategy of a suite runs on every scenario, so put them in separate suites.")


def _check_sizes(source: str, scenarios: list[tuple[ScenarioEntry, dict[str, int] | None]],
                 strategies: list[tuple[int, StrategyEntry, type]], limits: list[dict[str, int]] | None = None
                 ) -> None:
    """Every value an entry ``(i, strategies[i], its Config)`` sets for a field bounded by a scenario size (its
    declared ``at_most``, else the generic rule of :data:`clbench.typecheck.SIZE_BOUNDS`: ``mem_size``,
    ``n_shards``) is at most that size of every scenario whose sizes are known (``(scenarios[j], sizes or None)``:
    the factory's ``sizes(**args)``, computed without loading the data, or recorded in the registries' index): a
    memory larger than the stream would be the same run as one of the stream's size under another number, and more
    shards than samples fail in the run. A scenario whose sizes are not known yet is checked against its
    ``limits`` (``{size: count}`` no arguments of it exceed, from the index; the exact sizes after the imports)."""
    known = [(j, s, size) for j, (s, size) in enumerate(scenarios) if size is not None]
    bounded = [(j, s, limit) for j, ((s, size), limit) in enumerate(zip(scenarios, limits or [{}] * len(scenarios)))
               if size is None and limit]
    for i, strategy, config in strategies:
        declared = typecheck.declarations(config)
        for name, value in strategy.args.items():
            bound = declared[name].bound_for(name) if name in declared else None
            if bound is None or not isinstance(value, int):
                continue
            where = f"{source}: strategies[{i}] ({strategy.key}): args.{name} {value:,} is more than the"
            for j, scenario, size in known:
                if bound in size and value > size[bound]:
                    raise ConfigError(
                        f"{where} {size[bound]:,} {typecheck.SCENARIO_SIZES[bound]} of scenarios[{j}] "
                        f"({scenario.key}); set {name} to at most {size[bound]:,} (every strategy of a suite runs on "
                        f"every scenario: put the entries in separate suites to use other values).")
            for j, scenario, limit in bounded:
                if bound in limit and value > limit[bound]:
                    raise ConfigError(
                        f"{where} {limit[bound]:,} {typecheck.SCENARIO_SIZES[bound]} that scenarios[{j}] "
                        f"({scenario.key}) can have with any arguments; set {name} to at most its stream's size.")


def _check_recorded_values(source: str, raw_scenarios: list[dict], raw_strategies: list[dict]) -> None:
    """The values checked from the registries' index, before any strategy or scenario module is imported: each
    scenario entry's args and each callback entry's (``dp:`` included) against the factory's recorded keyword
    parameters (:meth:`Signature.recorded`: unknown keys, types, ranges, choices, ``only_with``), each
    strategy entry's preset and args against the stand-in of its ``Config`` the index records (unknown fields,
    types, ranges, choices, preset names, ``only_with`` equalities: :func:`clbench.config.checked_config`, the
    code and messages of the full check), then the fields bounded by a scenario size against the sizes the index
    records for each scenario's arguments (:func:`_check_sizes`). What the index does not record
    (:mod:`clbench.recorded`) is left to the full check, which runs after, and so is ``model_args`` (checked against
    the model factory's signature, which needs the model's module): an entry that sets it is not checked here, a
    preset's is left out."""
    for j, item in enumerate(raw_scenarios):
        signature = Signature.recorded("scenario", item["name"])
        if signature is not None:
            _scenario_args(f"{source}: scenarios[{j}] ({item['name']})", signature, item.get("args", {}))
    scenarios = [ScenarioEntry(name=s["name"], args=s.get("args", {}), label=s.get("label", "")) for s in raw_scenarios]
    sizes = [recorded.recorded_sizes(record("scenario", s.name), s.args) for s in scenarios]
    for i, item in enumerate(raw_strategies):
        where = f"{source}: strategies[{i}] ({item['name']})"
        entries = _callback_entries(where, item)
        _check_budgets(where, entries, Signature.recorded("callback", "dp"), list(zip(scenarios, sizes)))
        for place, k, callback in entries:
            signature = Signature.recorded("callback", callback["name"])
            if signature is not None:
                _callback_args(place, k, callback, signature)
    computed_choices = only_shipped()
    checked = []
    shapes = [(s, recorded.recorded_shape(record("scenario", s.name), s.args)) for s in scenarios]
    for i, item in enumerate(raw_strategies):
        found = record("strategy", item["name"])
        private = "dp" in item or any(c["name"] == "dp" for c in _entry_list("", item.get("callbacks", []),
                                                                             CALLBACK_KEYS, allow_empty=True))
        if found is not None:
            _check_recorded_model(f"{source}: strategies[{i}] ({item['name']})", item, found, shapes)
        elif private:
            _check_cached_private(f"{source}: strategies[{i}] ({item['name']})", item["name"])
        strategy = recorded.stand_in(found, computed_choices) if found is not None else None
        args = item.get("args", {})
        if strategy is None or "model_args" in args:
            continue
        strategy.PRESETS = {name: {k: v for k, v in values.items() if k != "model_args"}
                            for name, values in strategy.PRESETS.items()}
        values, config = checked_config(item["name"], item.get("preset"), args,
                                        f"{source}: strategies[{i}] ({item['name']})", strategy)
        if private:
            _check_recorded_private(f"{source}: strategies[{i}] ({item['name']})", item["name"], found, config)
        checked.append((i, StrategyEntry(name=item["name"], args=values, label=item.get("label", "")), type(config)))
    _check_sizes(source, list(zip(scenarios, sizes)), checked,
                 [recorded.recorded_limits(record("scenario", s.name)) for s in scenarios])


def _check_recorded_private(where: str, strategy: str, found: dict, config: Any) -> None:
    """A ``dp`` entry's strategy against what the index records of its class (:func:`clbench.recorded.private_record`),
    refused in the full check's words (:func:`_check_dp`): a strategy that does not declare ``private = True``
    (listing those that do, when every strategy's flag is known without importing: :func:`_private_names`), and,
    with opacus installed (the full check refuses its absence first), a Config failing one of the recorded
    ``private_needs``."""
    from clbench.privacy.config import not_private

    if "private" not in found:
        return
    if not found["private"]:
        names = _private_names()
        if names is not None:
            raise ConfigError(f"{where}: {not_private(strategy, names)}")
        return
    refusal = recorded.failed_private_need(found, config) if _installed("opacus") else None
    if refusal is not None:
        raise ConfigError(f"{where}: {refusal}")


def _check_cached_private(where: str, strategy: str) -> None:
    """A ``dp`` entry's strategy of an installed plugin package not imported yet, refused in the full check's words
    when its ``private`` flag, read from the package's plugin index cache or from its code
    (:func:`clbench.plugins.private_flag`), is False and every strategy's flag is known without importing; the
    refusal names the file it was read from."""
    from clbench.privacy.config import not_private

    flag = private_flag(strategy)
    names = _private_names() if flag is not None and not flag[0] else None
    if names is not None:
        raise ConfigError(f"{where}: {not_private(strategy, names)} (`private` read from {flag[1]})")


def _private_names() -> list[str] | None:
    """The strategies that declare ``private = True``, as :func:`clbench.privacy.step.check_private_strategy` lists
    them after importing every plugin module: read from the classes already imported and from the index's records
    of the others; None when one is not known so (a plugin module not imported yet, a strategy the index does not
    record, an installed plugin's strategy that neither its cache nor its code settles:
    :func:`clbench.plugins.private_flag`), the full check then lists them."""
    from clbench.plugins import sources

    private = {name for name, cls in STRATEGIES._entries.items() if getattr(cls, "private", False)}
    for source in sources():
        if source.imported:
            continue
        if "strategy" in source.dynamic:
            return None
        for name in source.declared.get("strategy", {}):
            if source.origin == "shipped":
                found = record("strategy", name)
                flag = None if found is None else found.get("private")
            else:
                flag = (private_flag(name) or (None,))[0]
            if flag is None:
                return None
            if flag:
                private.add(name)
    return sorted(private)


def _callback_entries(where: str, item: dict) -> list[tuple[str, int, dict]]:
    """``(place, index, entry)`` of every callback entry of the strategy entry ``item``: its ``callbacks:`` list,
    then its ``dp:`` key as the ``dp`` callback (``place`` is what a refusal names: ``<where>.callbacks`` or
    ``<where>.dp``)."""
    entries = [(f"{where}.callbacks", k, c) for k, c in enumerate(_entry_list(
        f"{where}.callbacks", item.get("callbacks", []), CALLBACK_KEYS, allow_empty=True))]
    return [*entries, *([(f"{where}.dp", 0, {"name": "dp", "args": item["dp"]})] if "dp" in item else [])]


def _check_budgets(where: str, entries: list[tuple[str, int, dict]], signature: Signature | None,
                   scenarios: list[tuple[ScenarioEntry, dict[str, int] | None]]) -> None:
    """The ``dp`` entries among a strategy entry's callback ``entries`` (:func:`_callback_entries`): at most one
    (:func:`_check_one_dp`), and its budget (:func:`_check_budget`: the budget's own words) before its arguments'
    declared ranges and choices are checked. Both phases of suite loading call it, the torch-free one with the dp
    callback's recorded ``signature`` (None: not recorded, left to the full check) and the full one with its
    factory's, so that a value is refused in the same words by both."""
    _check_one_dp(where, sum(callback["name"] == "dp" for _, _, callback in entries))
    for place, k, callback in entries:
        if signature is not None and callback["name"] == "dp":
            _check_budget(where, _callback_args(place, k, callback, dataclasses.replace(signature, declared={})),
                          scenarios)


def _check_budget(where: str, args: dict, scenarios: list[tuple[ScenarioEntry, dict[str, int] | None]]) -> None:
    """A ``dp`` entry's budget from its ``args`` (their keys and types checked: :class:`clbench.privacy.config.DPConfig`
    refuses the values in its own words, without torch: exactly one of epsilon and noise_multiplier, finite values
    in their declared ranges, a known clipping mode) and a target ε that
    some noise reaches at the δ of every scenario whose training-sample count the index records (δ = 1/n when not
    given; :func:`clbench.privacy.config.check_reachable`). A scenario without recorded sizes is checked when its
    run calibrates the noise (its n is known only once its data are split)."""
    from clbench.privacy.config import DPConfig, PrivacyBudgetError, check_reachable

    try:
        config = DPConfig(**args)
        for j, (scenario, size) in enumerate(scenarios):
            check_reachable(config, (size or {}).get("train_samples"), f"scenarios[{j}] ({scenario.key})")
    except PrivacyBudgetError as exc:
        raise ConfigError(f"{where}: {exc}") from None


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


def _checked_without_imports(data: Any, source: str) -> tuple[str, list, list[dict], list[dict]]:
    """The first phase of :func:`parse_suite`, which imports no strategy or scenario module: ``(name, seeds,
    scenario entries, strategy entries)``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a suite file must be a mapping with keys {', '.join(SUITE_KEYS)}.")
    check_keys(source, data, SUITE_KEYS)
    _load_plugins(source, data.get("plugins", []))
    for required in ("suite", "scenarios", "strategies"):
        if required not in data:
            raise ConfigError(f"{source}: missing required key {brief(required)}.")
    name = check_path_name(source, "suite", data["suite"])
    seeds = data.get("seeds", [0])
    check_seeds(source, seeds)
    raw_scenarios = _named_entries(f"{source}: scenarios", data["scenarios"], SCENARIO_KEYS, SCENARIOS)
    raw_strategies = _named_entries(f"{source}: strategies", data["strategies"], STRATEGY_KEYS, STRATEGIES)
    for i, item in enumerate(raw_strategies):
        where = f"{source}: strategies[{i}] ({item['name']})"
        _named_entries(f"{where}.callbacks", item.get("callbacks", []), CALLBACK_KEYS, CALLBACKS, allow_empty=True)
        if "dp" in item and not isinstance(item["dp"], dict):
            raise ConfigError(f"{where}.dp: expected a mapping like {{epsilon: 3.0, clip: 1.0}}, got "
                              f"{brief(item['dp'])}.")
    for kind, items in (("scenario", raw_scenarios), ("strategy", raw_strategies)):
        keys = [item.get("label") or item["name"] for item in items]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError(f"{source}: {kind} {brief(dupes[0])} appears twice; give the entries distinct 'label's.")
    _check_recorded_values(source, raw_scenarios, raw_strategies)
    return name, seeds, raw_scenarios, raw_strategies


def check_without_imports(suite: str | Path) -> None:
    """What :func:`load_suite` refuses before importing a strategy or scenario module (the file's shape and the
    values the registries' index records), refused the same way: ``clbench run`` checks it before what needs the
    file to be right (the datasets its scenarios read)."""
    path = resolve_suite_path(str(suite))
    _checked_without_imports(read_yaml(path), str(path))


def parse_suite(data: Any, source: str = "<suite>") -> SuiteSpec:
    """Validate a suite mapping (already parsed from YAML) into a :class:`SuiteSpec`. The shape of the file (keys,
    names, labels, seeds, entries given twice) is checked first, from the registries' index, then the strategies'
    values and the memory and shard sizes against what the index records of the shipped Configs and scenario sizes
    (:func:`_check_recorded_values`): such a file is refused without importing a strategy or scenario module (nor
    torch). Every value is checked after, against the modules that use them."""
    name, seeds, raw_scenarios, raw_strategies = _checked_without_imports(data, source)
    scenarios = []
    for i, item in enumerate(raw_scenarios):
        where = f"{source}: scenarios[{i}] ({item['name']})"
        scenarios.append(ScenarioEntry(name=item["name"], label=item.get("label", ""),
                                       args=_checked_scenario_args(where, item["name"], item.get("args", {}))))

    sizes = [getattr(SCENARIOS.get(s.name), "sizes", None) for s in scenarios]
    sized = [(s, found and found(**s.args)) for s, found in zip(scenarios, sizes)]
    strategies = []
    for i, item in enumerate(raw_strategies):
        where = f"{source}: strategies[{i}] ({item['name']})"
        args, config = checked_config(item["name"], item.get("preset"), item.get("args", {}), where)
        _check_model_args(where, config, scenarios)
        _check_budgets(where, _callback_entries(where, item), Signature.of(CALLBACKS.get("dp")), sized)
        callbacks = parse_callbacks(f"{where}.callbacks", item.get("callbacks", []))
        if "dp" in item:
            callbacks += _parse_dp(where, item["dp"])
        _check_dp(where, item["name"], callbacks, config)
        try:
            STRATEGIES.get(item["name"]).check_entry(config, args, any(c["name"] == "dp" for c in callbacks))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        strategies.append(StrategyEntry(name=item["name"], preset=item.get("preset"),
                                        args=args, label=item.get("label", ""), callbacks=callbacks))

    _check_kinds(source, scenarios, strategies)
    _check_sizes(source, sized, [(i, s, STRATEGIES.get(s.name).Config) for i, s in enumerate(strategies)])
    return SuiteSpec(name=name, scenarios=tuple(scenarios), strategies=tuple(strategies),
                     seeds=tuple(seeds), description=str(data.get("description", "")), source=source)


def _named_entries(where: str, raw: Any, keys: tuple[str, ...], registry: Any, allow_empty: bool = False
                   ) -> list[dict]:
    """``raw`` as entries (:func:`_entry_list`) whose names ``registry`` holds (known from its index: no module is
    imported for a known name) and, for scenarios and strategies, whose row keys (label, else name) can be file
    names."""
    items = _entry_list(where, raw, keys, allow_empty)
    for i, item in enumerate(items):
        if item["name"] not in registry:
            try:
                registry.get(item["name"])          # the message: close names, plugin modules that failed
            except KeyError as exc:
                raise ConfigError(f"{where}[{i}]: {exc}") from None
        if registry is not CALLBACKS:
            _check_entry_names(f"{where}[{i}] ({item['name']})", item)
    return items


def _check_entry_names(where: str, item: dict) -> None:
    """The entry's row key (its label, else its name) is used in file names."""
    if item.get("label"):
        check_path_name(where, "label", item["label"])
    else:
        check_path_name(where, "name", item["name"])


MAX_SUITE_BYTES = 1_000_000     # a suite file is a few KB; a larger one is not a suite
MAX_SUITE_NODES = 100_000       # YAML nodes after expanding aliases (nested anchors can expand to billions)


def suite_name(suite: str | Path) -> str | None:
    """The ``suite:`` name of a shipped suite or suite file, read without checking the rest (``clbench run`` checks
    its output folder before the imports of :func:`load_suite`); None when the file or the name is not right, which
    :func:`load_suite` then refuses."""
    try:
        data = read_yaml(resolve_suite_path(str(suite)))
        return check_path_name(str(suite), "suite", data["suite"])
    except (ConfigError, TypeError, KeyError):
        return None


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
        _check_depth(path, text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_expansion(path, node)
        _check_duplicate_keys(path, node)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None


MAX_SUITE_DEPTH = 50            # nested lists/mappings; a suite nests 5 or 6 (PyYAML's composer recurses per level)


def _check_depth(path: Path, text: str) -> None:
    """Refuse a document nested deeper than :data:`MAX_SUITE_DEPTH`, read from PyYAML's event stream (which does not
    recurse), before composing it would exhaust Python's recursion limit."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_SUITE_DEPTH:
                raise ConfigError(f"{path}: nested more than {MAX_SUITE_DEPTH} levels deep (line "
                                  f"{event.start_mark.line + 1}); a suite nests a few levels.")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


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


def _check_duplicate_keys(path: Path, root: yaml.Node | None) -> None:
    """Refuse a mapping that gives one key twice (``epochs: 1, epochs: 3``; YAML loaders silently keep the last),
    naming the entry and the key. Each node is walked once, in document order (an alias is the node its anchor
    names, checked where the anchor stands), so the walk is bounded by the document's own nodes even on an alias to
    itself (:func:`_check_expansion` refuses that first)."""
    stack: list[tuple[str, yaml.Node]] = [("", root)] if root is not None else []
    walked: set[int] = set()
    while stack:
        where, node = stack.pop()
        if id(node) in walked:
            continue
        walked.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(reversed([(f"{where}[{i}]", child) for i, child in enumerate(node.value)]))
        elif isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, Any], int] = {}
            children = []
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is not None and (key.tag, name) in seen:
                    raise ConfigError(f"{path}: {where + '.' if where else ''}{brief(name)[1:-1]} is given twice "
                                      f"(lines {seen[key.tag, name]} and {key.start_mark.line + 1}); a YAML loader "
                                      f"would silently keep the last: keep one.")
                if name is not None:
                    seen[key.tag, name] = key.start_mark.line + 1
                children.append((f"{where}.{name}" if where else str(name), value))
            stack.extend(reversed(children))
