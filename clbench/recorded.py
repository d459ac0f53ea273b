"""What the registries' index (:func:`clbench.plugins.build_index`) records of a shipped strategy's ``Config`` and a
shipped scenario's declared sizes, and what the torch-free phase of suite loading
(:func:`clbench.suite_file.parse_suite`) rebuilds from it, so that a wrong value is refused without importing the
strategy's module (nor torch, Avalanche).

A strategy's record (:func:`strategy_record`): its Config's fields in order, each with its annotation as text
(:func:`annotation_text`), its default and what it declares beside it (:class:`clbench.typecheck.Declared`: the range,
the choices — evaluated when the index is built, marked ``computed`` where a function gives them, such as a
registry's names —, ``at_most``, and ``only_with`` where it is an equality, :func:`clbench.typecheck.only_with`), and
the strategy's presets with their values, and whether it may train with ``dp`` and what its Config must then satisfy
(:func:`private_record`, checked by :func:`failed_private_need`). :func:`stand_in` rebuilds from it an object with
that ``Config`` (a dataclass with the same fields, annotations, defaults and declarations) and those ``PRESETS``, which
:func:`clbench.config.checked_config` checks with the code of the full check: the refusals read the same. A record is
kept only when the stand-in rebuilt from it describes the class exactly (:func:`_signature`); otherwise the strategy is
left to the full check.

Left to the full check, which still runs after: an ``only_with`` whose test is a function of its own (DyTox's
``warmup_lr`` and ``crop_padding``), computed choices while a module outside clbench has registered something (its
names are not recorded: :func:`clbench.registry.only_shipped`), ``model_args`` (checked against the model factory's
signature), the Config's own ``__post_init__``.

A scenario's record (:func:`scenario_record`): the sizes its ``sizes(**args)`` returns
(:data:`clbench.typecheck.SCENARIO_SIZES`) for its default arguments and for the arguments each shipped suite gives
it, keyed by the arguments that function names (defaults filled in; those it takes as ``**_`` do not count). Other
arguments are left to the full check, which calls the function (split digits' needs scikit-learn: seconds to import).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import json
import math
import types
import typing
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from clbench import typecheck
from clbench.typecheck import Equals, Range, TypeMismatch, UsedOnlyWith, type_hints

_TYPES: dict[str, Any] = {**{t.__name__: t for t in (int, float, str, bool, dict, list, tuple)}, "Any": Any}
_GENERICS = (tuple, list, dict)


class Unrecordable(ValueError):
    """A declaration that cannot be written as data."""


# ----------------------------------------------------------------------------------------------------- annotations
def annotation_text(tp: Any) -> str:
    """``tp`` as text that :func:`parse_annotation` reads back: ``int float str bool dict list tuple``, ``Any``,
    ``None``, ``Literal[...]`` of constants, unions (``|``) and ``tuple``/``list``/``dict`` of these. Anything else
    raises :class:`Unrecordable`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(annotation_text(a) for a in args)
    if origin is Literal and all(type(a) in (str, int, float, bool, type(None)) for a in args):
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin in _GENERICS and args:
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else annotation_text(a) for a in args)}]"
    if any(tp is t for t in _TYPES.values()):
        return "Any" if tp is Any else tp.__name__
    raise Unrecordable(f"annotation {tp!r}")


def parse_annotation(text: str) -> Any:
    """The annotation :func:`annotation_text` wrote as ``text``."""
    return _annotation(ast.parse(text, mode="eval").body)


def _annotation(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _TYPES:
        return _TYPES[node.id]
    if isinstance(node, ast.Constant) and node.value in (None, Ellipsis):
        return type(None) if node.value is None else Ellipsis
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation(node.left) | _annotation(node.right)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if node.value.id == "Literal":
            return Literal[tuple(ast.literal_eval(item) for item in items)]
        if node.value.id in ("tuple", "list", "dict"):
            return _TYPES[node.value.id][tuple(_annotation(item) for item in items)]
    raise ValueError(f"not an annotation the index writes: {ast.unparse(node)}")


# ---------------------------------------------------------------------------------------------------------- values
def _data(value: Any) -> Any:
    """``value`` as JSON data (a tuple as a list); anything else (a non-finite float included) raises
    :class:`Unrecordable`."""
    if value is None or isinstance(value, (bool, int, str)) or isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, (list, tuple)):
        return [_data(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _data(v) for k, v in value.items()}
    raise Unrecordable(f"value {typecheck.brief(value)}")


def _restored(value: Any, tp: Any) -> Any:
    """A value read from the record as the annotation ``tp`` holds it without coercion (a list as a tuple)."""
    try:
        return typecheck.coerce(value, tp, "", strict=True)
    except TypeMismatch:
        return value


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise Unrecordable(f"field {f.name} without a default")


# ------------------------------------------------------------------------------------------------------ strategies
def strategy_record(cls: Any) -> dict | None:
    """What the index records of a strategy class (see the module docstring); None when its declarations cannot all
    be written as data."""
    config = cls.Config
    hints = type_hints(config)
    try:
        fields = [_field_record(f, hints, typecheck.declarations(config)[f.name]) for f in dataclasses.fields(config)]
        presets = {name: _data(values) for name, values in getattr(cls, "PRESETS", {}).items()}
    except Unrecordable:
        return None
    record = {"fields": fields, "presets": presets, "depends": _strategy_modules(cls), **private_record(cls)}
    return record if _signature(stand_in(record, computed_choices=True)) == _signature(cls) else None


def private_record(cls: Any) -> dict:
    """Whether a strategy class may train with ``dp`` (its ``private``) and what its Config must then satisfy (its
    ``private_needs``: each need's field and refusal, with its test where the test is a value,
    :class:`~clbench.typecheck.Equals` or :class:`~clbench.typecheck.Empty`; a need whose test is a function has
    none and is left, with the needs after it, to the full check)."""
    needs = []
    for need in getattr(cls, "private_needs", ()):
        test = need.allows
        entry = {"field": need.field, "refusal": need.refusal}
        try:
            if isinstance(test, typecheck.Equals):
                entry["test"] = {"equals": _data(test.value)}
            elif isinstance(test, typecheck.Empty):
                entry["test"] = {"empty": True}
        except Unrecordable:
            pass
        needs.append(entry)
    return {"private": bool(getattr(cls, "private", False)), "private_needs": needs}


def failed_private_need(record: dict, config: Any) -> str | None:
    """The refusal of the first of a strategy ``record``'s ``private_needs`` that ``config`` fails (as
    :meth:`clbench.protocol.StrategyBase.check_private` words it); None when it fails none of those recorded up to
    the first without a test (that one and the rest are the full check's)."""
    for need in record.get("private_needs", ()):
        if "test" not in need:
            return None
        if not hasattr(config, need["field"]):
            continue
        value = getattr(config, need["field"])
        if not (not value if "empty" in need["test"] else value == need["test"]["equals"]):
            return need["refusal"].format(value=value)
    return None


def _field_record(f: dataclasses.Field, hints: dict, declared: typecheck.Declared) -> dict:
    if not f.init:
        raise Unrecordable(f"field {f.name} is not an __init__ argument")
    need = declared.only_with
    if need is not None and isinstance(need.test, Equals):
        need = {"other": need.other, "equals": _data(need.test.value), "wanted": need.wanted,
                "example": _data(need.example)}
    else:
        need = None
    record = {"name": f.name, "type": annotation_text(hints.get(f.name, Any)), "default": _data(_default(f)),
              "within": dataclasses.asdict(declared.within) if declared.within is not None else None,
              "choices": _data(declared.allowed()) if declared.choices is not None else None,
              "computed": callable(declared.choices) or None, "only_with": need, "at_most": declared.at_most}
    return {key: value for key, value in record.items() if value is not None or key == "default"}


def _strategy_modules(cls: Any) -> list[str]:
    """The modules whose code the record comes from: those that define the Config's fields, the presets, ``private``
    and ``private_needs``."""
    names = {f.name for f in dataclasses.fields(cls.Config)}
    found = {k.__module__ for k in cls.Config.__mro__ if names & set(vars(k).get("__annotations__", {}))}
    found |= {next(k.__module__ for k in cls.__mro__ if "PRESETS" in vars(k))} if hasattr(cls, "PRESETS") else set()
    found |= {next(k.__module__ for k in cls.__mro__ if attribute in vars(k)) for attribute in ("private",
                                                                                                 "private_needs")
              if hasattr(cls, attribute)}
    return sorted(found)


def stand_in(record: dict, computed_choices: bool) -> Any:
    """An object with the ``Config`` dataclass and the ``PRESETS`` that a strategy's ``record`` describes, for
    :func:`clbench.config.checked_config`. Computed choices are declared only with ``computed_choices`` (while no
    module outside clbench has registered names they may hold)."""
    hints = {f["name"]: parse_annotation(f["type"]) for f in record["fields"]}
    specs = []
    for f in record["fields"]:
        need = f.get("only_with")
        declared = {
            "within": Range(**f["within"]) if "within" in f else None,
            "choices": f.get("choices") if computed_choices or not f.get("computed") else None,
            "only_with": None if need is None else UsedOnlyWith(
                need["other"], Equals(_restored(need["equals"], hints.get(need["other"], Any))), need["wanted"],
                _restored(need["example"], hints.get(need["other"], Any))),
            "at_most": f.get("at_most"),
        }
        default = _restored(f["default"], hints[f["name"]])
        specs.append((f["name"], hints[f["name"]],
                      typecheck.setting(default_factory=functools.partial(copy.deepcopy, default), **declared)))
    presets = {name: {key: _restored(value, hints.get(key, Any)) for key, value in values.items()}
               for name, values in record["presets"].items()}
    return types.SimpleNamespace(Config=dataclasses.make_dataclass("Config", specs), PRESETS=presets)


def _signature(cls: Any) -> str:
    """Everything of a strategy class that the loader's checks read (the Config's fields with their annotations,
    defaults and declarations, the presets), as text: equal for a class and a faithful stand-in."""
    config, hints = cls.Config, type_hints(cls.Config)
    declared = typecheck.declarations(config)

    def need(u: UsedOnlyWith | None) -> Any:
        return (u.other, u.test.value, u.wanted, u.example) if u is not None and isinstance(u.test, Equals) else None

    return repr([[(f.name, typecheck.type_name(hints.get(f.name, Any)), _default(f), declared[f.name].within,
                   declared[f.name].allowed(), declared[f.name].at_most, need(declared[f.name].only_with))
                  for f in dataclasses.fields(config)], getattr(cls, "PRESETS", {})])


# ------------------------------------------------------------------------------------------------------- scenarios
def scenario_record(name: str, factory: Any) -> dict | None:
    """What the index records of scenario ``name``'s factory: its keyword parameters (:func:`signature_record`), the
    datasets it reads (its ``datasets`` attribute: :class:`clbench.data.catalog.DatasetSpec` s, as
    :func:`dataset_record`), and what two functions of its arguments declared beside it return for its defaults
    and for the arguments each shipped suite gives it (checked as the loader checks them; left out without the
    function or when it reads arguments it does not name): the sizes of ``sizes(**args)`` and the input shape of
    ``input_shape(**args)`` (``(C, H, W)`` of an image; ``None`` when the data decide it); and its ``size_limits``
    (``{size: count}`` no arguments exceed: the loader checks them for arguments the sizes table does not hold); and
    its ``data_check``, ``"module:function"`` of a function that checks its data from its arguments without torch
    (:func:`clbench.preflight.check_suite_datasets` calls it before the imports)."""
    record = {"signature": signature_record(factory), "depends": [factory.__module__],
              "datasets": [dataset_record(spec) for spec in getattr(factory, "datasets", ())]}
    sizes = _declared_table(name, factory, "sizes", lambda found: {k: int(v) for k, v in found.items()})
    if sizes is not None:
        params, table = sizes
        record.update(params=params, sizes=[{"args": json.loads(key), "sizes": found} for key, found in table])
    if hasattr(factory, "data_check"):
        record["data_check"] = str(factory.data_check)
    if hasattr(factory, "size_limits"):
        record["limits"] = {size: int(count) for size, count in factory.size_limits.items()}
    shapes = _declared_table(name, factory, "input_shape", lambda found: None if found is None else list(found))
    if shapes is not None:
        params, table = shapes
        record["shapes"] = {"params": params, "rows": [{"args": json.loads(key), "shape": found}
                                                       for key, found in table]}
    record["depends"] = sorted({factory.__module__, *(getattr(factory, f).__module__ for f in ("sizes", "input_shape")
                                                      if hasattr(factory, f))})
    return record


def _declared_table(name: str, factory: Any, function: str, convert: Callable[[Any], Any]
                    ) -> tuple[dict, list[tuple[str, Any]]] | None:
    """``(params, [(arguments as text, value)])`` of scenario ``name``'s declared ``factory.<function>(**args)``
    (see :func:`scenario_record`), None without one."""
    declared = getattr(factory, function, None)
    params = _size_params(declared) if declared is not None else None
    if params is None:
        return None
    table = {}
    for args in [{}, *_suite_arguments().get(name, [])]:
        try:
            checked = typecheck.check_values(args, type_hints(factory),
                                             declared=typecheck.parameter_declarations(factory))
            table[_key(params, checked)] = convert(declared(**checked))
        except (ValueError, TypeError):       # arguments the loader refuses: left to it
            continue
    return params, sorted(table.items())


def dataset_record(spec: Any) -> dict:
    """A :class:`clbench.data.catalog.DatasetSpec` as data: its name, each layout's folder, file names and whether a
    file may be gzipped, whether it can be downloaded, and how to get it otherwise."""
    return {"name": spec.name, "download": spec.download is not None, "how_to_get": spec.how_to_get,
            "layouts": [{"folder": layout.folder, "files": list(layout.files), "gzip_ok": layout.gzip_ok}
                        for layout in spec.layouts]}


# ------------------------------------------------------------------------------------------------------ signatures
def signature_record(func: Callable) -> dict:
    """The keyword parameters of a scenario factory or a callback class (``__init__``): ``{"params": [{name, type,
    default, within, choices, computed, only_with}], "var_keyword"}``, what :func:`clbench.suite_file.Signature`
    checks arguments against. A parameter whose annotation or default cannot be written as data has neither (its
    value is then checked after the imports only); a declaration that cannot be is left out the same way."""
    hints = type_hints(func)
    declared = typecheck.parameter_declarations(func)
    params, var_keyword = [], False
    target = func.__init__ if isinstance(func, type) else func
    for i, p in enumerate(inspect.signature(target).parameters.values()):
        if p.kind is p.VAR_KEYWORD:
            var_keyword = True
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or isinstance(func, type) and i == 0:
            continue
        entry: dict[str, Any] = {"name": p.name}
        try:
            entry["type"] = annotation_text(hints[p.name]) if p.name in hints else None
            if p.default is not inspect.Parameter.empty:
                entry["default"] = _data(p.default)
            if p.name in declared:
                entry.update(_declaration_record(declared[p.name], hints))
        except Unrecordable:
            entry = {"name": p.name, "type": None}
        params.append(entry)
    return {"params": params, "var_keyword": var_keyword}


def _declaration_record(declared: typecheck.Declared, hints: dict) -> dict:
    need = declared.only_with
    if need is not None and not isinstance(need.test, Equals):
        raise Unrecordable(f"only_with {need!r}")
    return {key: value for key, value in {
        "within": dataclasses.asdict(declared.within) if declared.within is not None else None,
        "choices": _data(declared.allowed()) if declared.choices is not None else None,
        "computed": callable(declared.choices) or None,
        "only_with": None if need is None else {"other": need.other, "equals": _data(need.test.value),
                                                "wanted": need.wanted, "example": _data(need.example)},
    }.items() if value is not None}


def declared_parameters(signature: dict, computed_choices: bool) -> tuple[dict, dict, dict]:
    """``(hints, declarations, defaults)`` of the parameters a :func:`signature_record` describes with a type: those
    the torch-free check reads (computed choices only with ``computed_choices``, as :func:`stand_in`)."""
    hints, declared, defaults = {}, {}, {}
    for p in signature["params"]:
        if p.get("type") is None:
            continue
        hints[p["name"]] = parse_annotation(p["type"])
    for p in signature["params"]:
        if p["name"] not in hints:
            continue
        if "default" in p:
            defaults[p["name"]] = _restored(p["default"], hints[p["name"]])
        need = p.get("only_with")
        declared[p["name"]] = typecheck.Declared(
            within=Range(**p["within"]) if "within" in p else None,
            choices=p.get("choices") if computed_choices or not p.get("computed") else None,
            only_with=None if need is None else UsedOnlyWith(
                need["other"], Equals(_restored(need["equals"], hints.get(need["other"], Any))), need["wanted"],
                _restored(need["example"], hints.get(need["other"], Any))))
    return hints, declared, defaults


def _size_params(sizes: Callable) -> dict | None:
    """``{parameter: default}`` of a ``sizes`` function whose parameters are keywords with defaults and ``**_``."""
    params = inspect.signature(sizes).parameters.values()
    named = {p.name: p.default for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    if any(p.kind is p.VAR_KEYWORD and p.name != "_" or p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)
           for p in params) or any(d is inspect.Parameter.empty for d in named.values()):
        return None
    try:
        return _data(named)
    except Unrecordable:
        return None


def _key(params: dict, args: dict) -> str:
    """The arguments a ``sizes`` function reads (its ``params``' defaults, overridden by ``args``), as text."""
    return json.dumps(_data({**params, **{k: v for k, v in args.items() if k in params}}), sort_keys=True)


@functools.cache
def _suite_arguments() -> dict[str, list[dict]]:
    """``{scenario name: [args, ...]}`` of the scenario entries of the shipped suites (package data)."""
    found: dict[str, list[dict]] = {}
    for path in sorted(str(p) for p in (resources.files("clbench") / "suites").iterdir() if str(p).endswith(".yaml")):
        for entry in yaml.safe_load(Path(path).read_text()).get("scenarios", []):
            entry = {"name": entry} if isinstance(entry, str) else entry
            found.setdefault(entry["name"], []).append(entry.get("args", {}))
    return found


def recorded_sizes(record: dict | None, args: dict) -> dict[str, int] | None:
    """The sizes a scenario's ``record`` holds for ``args`` as a suite gives them (None: not recorded; the full check
    computes them). A value matches only as the same JSON (``5`` is not ``5.0``, nor ``"5"``), so the recorded sizes
    are those the function returns for the values the loader makes of ``args``."""
    if record is None or "sizes" not in record:
        return None
    return _recorded(record["params"], [(e["args"], e["sizes"]) for e in record["sizes"]], args)


def recorded_limits(record: dict | None) -> dict[str, int]:
    """The sizes no arguments of a scenario exceed, as its ``record`` holds them (``{}``: none declared)."""
    return {} if record is None else record.get("limits", {})


def recorded_shape(record: dict | None, args: dict) -> tuple[int, ...] | None:
    """The input shape a scenario's ``record`` holds for ``args`` (None: not recorded, or decided by the data), as
    :func:`recorded_sizes` finds sizes."""
    if record is None or "shapes" not in record:
        return None
    found = _recorded(record["shapes"]["params"], [(e["args"], e["shape"]) for e in record["shapes"]["rows"]], args)
    return None if found is None else tuple(found)


def _recorded(params: dict, rows: list[tuple[dict, Any]], args: dict) -> Any:
    try:
        key = _key(params, args)
    except Unrecordable:
        return None
    return next((found for recorded_args, found in rows if json.dumps(recorded_args, sort_keys=True) == key), None)


def model_record(name: str, factory: Any) -> dict:
    """What the index records of a model factory: its keyword parameters (:func:`signature_record`: the defaults
    that ``model_args`` override) and the divisibility rules it declares (its ``divides``: :class:`Divides` s)."""
    return {"signature": signature_record(factory), "depends": [factory.__module__],
            "divides": [dataclasses.asdict(rule) for rule in getattr(factory, "divides", ())]}


RECORDERS: dict[str, Callable[[str, Any], dict | None]] = {
    "strategy": lambda name, cls: strategy_record(cls), "scenario": scenario_record,
    "callback": lambda name, cls: {"signature": signature_record(cls), "depends": [cls.__module__]},
    "model": model_record}
"""The kinds whose entries the index records, and how (``recorder(name, entry)``; each record lists the modules it
``depends`` on)."""
