"""A strategy's hyperparameters: its ``Config`` dataclass built from the defaults (the paper's values), then one of
its named ``PRESETS`` (``cpu`` for 2-core machines, ``full`` for the paper's GPU setting), then a suite entry's
``args`` — every value checked against the field's annotation and what the field declares beside it (range,
choices, the setting it is used only with: :func:`clbench.typecheck.setting`; generic names by
:data:`clbench.typecheck.RANGES`), ``model_args`` against the named model factory — and what the run identity takes
from it (:func:`config_hash`, :func:`checkpoint_hashes`).

Suite files are parsed by :mod:`clbench.suite_file` into the specs of :mod:`clbench.specs`."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

from clbench import typecheck
from clbench.errors import ConfigError, check_keys, suggest
from clbench.registry import MODELS, STRATEGIES
from clbench.typecheck import brief, type_hints


def build_config(strategy_name: str, preset: str | None = None, overrides: dict | None = None,
                 where: str = "") -> Any:
    """Instantiate ``STRATEGIES.get(strategy_name).Config`` from its defaults, then ``PRESETS[preset]``, then
    ``overrides``, each value checked against the field's annotation and range (see :func:`checked_config`).
    Unknown fields and presets, wrong types and values raise :class:`ConfigError`."""
    where = where or f"strategy {strategy_name!r}"
    config_cls, values, checked = _resolve(strategy_name, preset, overrides or {}, where)
    config = _instantiate(config_cls, values, where)
    _check_used(where, config, checked)
    return config


def checked_config(strategy_name: str, preset: str | None, overrides: dict, where: str,
                   strategy: Any = None) -> tuple[dict, Any]:
    """``(checked overrides, the Config they build)``: ``overrides`` coerced to the types of the strategy's
    ``Config`` fields (``lr: "1e-3"`` -> ``0.001``) once the whole configuration builds; raises
    :class:`ConfigError` naming ``where`` and the key. ``strategy``: the class with the ``Config`` and ``PRESETS``
    (default ``STRATEGIES.get(strategy_name)``), or the stand-in the torch-free phase of suite loading rebuilds from
    the registries' index (:func:`clbench.recorded.stand_in`)."""
    config_cls, values, checked = _resolve(strategy_name, preset, overrides, where, strategy)
    config = _instantiate(config_cls, values, where)
    _check_used(where, config, checked)
    return checked, config


def _resolve(strategy_name: str, preset: str | None, overrides: dict, where: str, strategy: Any = None
             ) -> tuple[type, dict, dict]:
    """``(Config class, preset + overrides, overrides)``, every value type- and range-checked."""
    cls = strategy or STRATEGIES.get(strategy_name)
    config_cls = cls.Config
    presets: dict[str, dict] = getattr(cls, "PRESETS", {})
    values: dict[str, Any] = {}
    if preset is not None:
        if not isinstance(preset, str) or preset not in presets:
            raise ConfigError(f"{where}: strategy {brief(strategy_name)} has no preset {brief(preset)}."
                              f"{suggest(str(preset), presets)} Presets: {', '.join(presets) or 'none'}.")
        values.update(_checked_fields(f"{where}: preset {brief(preset)}", config_cls, presets[preset], {}))
    checked = _checked_fields(f"{where}: args", config_cls, overrides, values)
    values.update(checked)
    return config_cls, values, checked


def _check_used(where: str, config: Any, overrides: dict) -> None:
    """Refuse a field set in ``overrides`` that is used only with another field's value (its declared
    :class:`~clbench.typecheck.UsedOnlyWith`) while that field has another: it would change nothing."""
    for name, declared in typecheck.declarations(type(config)).items():
        need = declared.only_with
        if need is not None and name in overrides and not need.test(getattr(config, need.other)):
            raise ConfigError(f"{where}: args.{name} is used only with {need.other}: {need.wanted} (this entry's "
                              f"{need.other} is {brief(getattr(config, need.other))}), so it would change nothing; "
                              f"remove it or set {need.other}.")


def _instantiate(config_cls: type, values: dict, where: str) -> Any:
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as exc:   # the Config's own __post_init__ checks
        raise ConfigError(f"{where}: invalid hyperparameters: {exc}") from exc


def _checked_fields(where: str, config_cls: type, values: dict, below: dict) -> dict:
    """``values`` (Config field -> value) checked: known fields, annotations, and each field's declared range and
    choices (:func:`clbench.typecheck.declarations`), ``model_args`` against the signature of the model named in
    ``values``, else in ``below`` (the preset's values), else by the Config (a field default or a class attribute
    ``model``)."""
    check_keys(where, values, [f.name for f in dataclasses.fields(config_cls)])
    try:
        checked = typecheck.check_values(values, type_hints(config_cls), declared=typecheck.declarations(config_cls))
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}.{exc}") from None
    if "model_args" in checked:
        model = checked.get("model", below.get("model", getattr(config_cls, "model", "auto")))
        checked["model_args"] = _checked_model_args(f"{where}.model_args", model, checked["model_args"])
    return checked


def _checked_model_args(where: str, model: str, args: Any) -> dict:
    """``model_args`` checked against ``MODELS.get(model)``'s keyword parameters and their annotations. With
    ``model: auto`` the backbone is the scenario's default, known only when the scenario is built: keys must then
    be a parameter of some registered model (a misspelling is still caught); name the model for a full check."""
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: expected a mapping, got {brief(args)}.")
    factories = [MODELS.get(model)] if model != "auto" else [MODELS.get(m) for m in MODELS.names()]
    params = [p for f in factories for p in list(inspect.signature(f).parameters.values())[1:]]
    if model == "auto" or not any(p.kind is p.VAR_KEYWORD for p in params):
        check_keys(where, args, dict.fromkeys(p.name for p in params if p.kind in (p.KEYWORD_ONLY,
                                                                                    p.POSITIONAL_OR_KEYWORD)))
    try:
        return typecheck.check_values(args, type_hints(factories[0]) if len(factories) == 1 else {}, ".")
    except typecheck.TypeMismatch as exc:
        raise ConfigError(f"{where}{exc}") from None


NOT_TRAINING: dict[str, str] = {
    "eval_batch_size": "the batch size of evaluation: the same predictions, computed in other chunks",
}
"""Config fields (by name, or ``strategy.field`` for one strategy) that are part of the run identity but do not
change what is trained, with the reason. Every other field changes the trained result; tests/test_conformance.py
changes each field of every shipped strategy and checks one or the other."""


def config_dict(config: Any) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def config_hash(payload: dict) -> str:
    """A stable short hash of a JSON-serializable mapping (run identity for resume)."""
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


CHECKPOINT_FIELDS = ("init",)
"""Hyperparameters (at any depth: ``init``, ``model_args.init``) that name a local checkpoint file read by the run;
``{scenario}`` in the path is the scenario's name (one checkpoint per source dataset), replaced for every strategy by
:func:`with_scenario_paths` before the strategy is built."""


def _scenario_path(value: Any, scenario: str) -> Any:
    """A dict with ``{scenario}`` replaced in every :data:`CHECKPOINT_FIELDS` string at any depth; other values as
    they are."""
    if not isinstance(value, dict):
        return value
    return {key: item.replace("{scenario}", scenario) if key in CHECKPOINT_FIELDS and isinstance(item, str)
            else _scenario_path(item, scenario) for key, item in value.items()}


def checkpoint_paths(resolved: dict, scenario: str) -> dict[str, str]:
    """``{dotted field: file path}`` for every non-empty :data:`CHECKPOINT_FIELDS` value of a resolved configuration
    (``{scenario}`` replaced by ``scenario``)."""
    found: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        for key, item in value.items():
            if key in CHECKPOINT_FIELDS and isinstance(item, str) and item:
                found[f"{prefix}{key}"] = item
            elif isinstance(item, dict):
                walk(f"{prefix}{key}.", item)

    walk("", _scenario_path(resolved, scenario))
    return found


def checkpoint_hashes(resolved: dict, scenario: str) -> dict[str, str]:
    """``{dotted field: sha256 of the file (16 digits), or "missing"}`` for every :func:`checkpoint_paths` entry."""
    return {name: file_hash(path) for name, path in checkpoint_paths(resolved, scenario).items()}


def with_scenario_paths(config: Any, scenario: str) -> Any:
    """``config`` (a Config dataclass or a dict) with ``{scenario}`` replaced by ``scenario`` in every
    :data:`CHECKPOINT_FIELDS` value, at any depth (``init``, ``model_args.init``): what the strategy is built with,
    so that every strategy reads the file the run identity hashed. The run identity keeps the written form."""
    if not dataclasses.is_dataclass(config):
        return _scenario_path(config, scenario)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    changed = {name: new for name, new in _scenario_path(fields, scenario).items() if new != fields[name]}
    return dataclasses.replace(config, **changed) if changed else config


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
