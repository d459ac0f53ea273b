"""Values read from YAML checked against type annotations and value ranges, so that a suite fails when it loads.

:func:`check_values` takes ``{key: value}`` and the annotations of the function or dataclass the values are for
(``typing.get_type_hints``) and returns the values coerced where the meaning is unambiguous:

- an ``int`` (not a ``bool``) for a ``float`` field becomes that float (``lr: 1`` is ``1.0``, one identity);
- a string that spells a number for a numeric field becomes that number: YAML 1.1 (PyYAML) reads ``1e-3`` as the
  string ``"1e-3"`` because it has no dot;
- an integral float for an ``int`` field becomes that int (``epochs: 2.0``); ``1.5`` is refused;
- a list for a ``tuple[...]`` field becomes a tuple; containers are checked element by element.

Everything else must already have the annotated type: a ``bool`` is never a number (``seed: true``), a number is
never a string, ``None`` only where the annotation allows it. In a union, a member the value already has wins over
one it would be coerced to (``int | str`` keeps ``"1"`` a string). ``Literal`` values must be one of the listed ones.

What a value may be, beyond its type, is declared beside the field it is for. A strategy's ``Config`` field
says it with :func:`setting` (dataclass field metadata, a :class:`Declared`): its range (``within``), its choices
(``choices``: a fixed set or a registry's names, checked element by element for a list) and another field of the same
Config it is used only with (``only_with``). Only generic names keep a central rule, so that every strategy, model
and scenario gets them without code of its own: :data:`RANGES` by exact name (``epochs >= 1``, ``mem_size >= 0``,
``lr > 0``, ``momentum`` in ``[0, 1]``...), then :data:`RANGE_SUFFIXES` and :data:`RANGE_PREFIXES` (``*_size >= 1``,
``n_* >= 1``). A Config number with neither a declaration nor a generic rule gets :data:`UNDECLARED` (``>= 0``: a
plugin's ``train_experiences: -1`` is refused, and the message says how to declare another range). The suite loader
checks all of it on the values read (:func:`check_values` with the Config's :func:`declarations`; a scenario
factory's or callback's keyword parameter declares the same with ``Annotated[T, Range(...)]`` or
``Annotated[T, Declared(...)]``, read by :func:`parameter_declarations`); a Config derives
from :class:`RangeChecked`, so one built in Python gets the same checks. A ``Config.__post_init__`` checks only what
no declaration can say: settings that exclude each other.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxlong, _BRIEF.maxother = 3, 80, 40, 80
_BRIEF.maxtuple = _BRIEF.maxlist = _BRIEF.maxdict = _BRIEF.maxset = _BRIEF.maxfrozenset = _BRIEF.maxdeque = 6
BRIEF_LENGTH = 160


def brief(value: Any) -> str:
    """``repr(value)`` cut to a sensible length (at most :data:`BRIEF_LENGTH` characters, nested containers and long
    strings elided with ``...``) for error messages: the repr of a value read from a YAML file can be gigabytes
    (nested anchors), and it is built lazily here, never in full."""
    text = _BRIEF.repr(value)
    return text if len(text) <= BRIEF_LENGTH else text[:BRIEF_LENGTH - 3] + "..."


def suggest(key: str, known: Iterable[str]) -> str:
    """The hint ``" Did you mean 'x'?"`` for the names of ``known`` close to ``key`` (empty when none is)."""
    close = difflib.get_close_matches(key, list(known), n=2, cutoff=0.5)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class TypeMismatch(ValueError):
    """A value that does not fit its annotation or range; ``key`` is its dotted path (``model_args.hidden[1]``)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True)
class Range:
    """``low <= x <= high`` (``<`` where ``open_low``/``open_high``); ``None`` is unbounded."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, x: float) -> bool:
        return ((self.low is None or (x > self.low if self.open_low else x >= self.low))
                and (self.high is None or (x < self.high if self.open_high else x <= self.high)))

    def __str__(self) -> str:
        if self.low is None and self.high is None:
            return "any finite number"
        if self.low is None:
            return f"{'<' if self.open_high else '<='} {self.high:g}"
        if self.high is None:
            return f"{'>' if self.open_low else '>='} {self.low:g}"
        return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"


AT_LEAST_1, NON_NEGATIVE, POSITIVE = Range(1), Range(0), Range(0, open_low=True)
FRACTION, HALF_OPEN_FRACTION = Range(0, 1), Range(0, 1, open_high=True)
UNDECLARED = NON_NEGATIVE
"""The range of a Config number that declares none and has no generic rule (see the module docstring)."""

# Generic names only (what any strategy, model or scenario may call a field): field name -> range; names not listed
# use the first matching suffix of RANGE_SUFFIXES, then prefix of RANGE_PREFIXES. A strategy's own fields declare
# their range beside them (:func:`setting`).
RANGES: dict[str, Range] = {
    "epochs": AT_LEAST_1, "mem_size": NON_NEGATIVE, "lr": POSITIVE, "momentum": FRACTION,
    "weight_decay": NON_NEGATIVE, "dropout": HALF_OPEN_FRACTION, "seed": NON_NEGATIVE, "depth": AT_LEAST_1,
    "num_heads": AT_LEAST_1, "embed_dim": AT_LEAST_1, "width": AT_LEAST_1, "hidden": AT_LEAST_1,
}
RANGE_SUFFIXES: tuple[tuple[str, Range], ...] = (
    ("_epochs", NON_NEGATIVE), ("_size", AT_LEAST_1), ("_lr", NON_NEGATIVE), ("_lambda", NON_NEGATIVE),
    ("_alpha", NON_NEGATIVE), ("_milestones", NON_NEGATIVE), ("_per_class", AT_LEAST_1), ("_padding", NON_NEGATIVE),
    ("_temperature", POSITIVE),
)
RANGE_PREFIXES: tuple[tuple[str, Range], ...] = (("n_", AT_LEAST_1),)


def range_of(name: str) -> Range | None:
    """The generic range of a field called ``name`` (exact name in :data:`RANGES`, then suffix, then prefix)."""
    if name in RANGES:
        return RANGES[name]
    return next((r for suffix, r in RANGE_SUFFIXES if name.endswith(suffix)), None) or \
        next((r for prefix, r in RANGE_PREFIXES if name.startswith(prefix)), None)


@dataclass(frozen=True)
class UsedOnlyWith:
    """A field used only when field ``other`` of the same Config passes ``test``: set in a suite while ``other``
    fails it, it would change nothing, so it is refused at load. ``wanted`` says in words what ``test`` asks for;
    ``example`` is a value of ``other`` that passes (tests set it to see the field act)."""

    other: str
    test: Callable[[Any], bool]
    wanted: str
    example: Any


@dataclass(frozen=True)
class Equals:
    """The test of :func:`only_with`: ``v == value``. A value, not a function, so that the registries' index can
    record it (:mod:`clbench.recorded`) and the torch-free phase of suite loading can check it."""

    value: Any

    def __call__(self, v: Any) -> bool:
        return v == self.value


@dataclass(frozen=True)
class Empty:
    """The test ``not v`` (0, None, an empty collection): a value, not a function, so that the registries' index can
    record a strategy's :class:`~clbench.protocol.PrivateNeed` that uses it (:mod:`clbench.recorded`)."""

    def __call__(self, v: Any) -> bool:
        return not v


def only_with(other: str, value: Any) -> UsedOnlyWith:
    """Used only when field ``other`` equals ``value`` (``only_with("optimizer", "sgd")``)."""
    wanted = str(value).lower() if isinstance(value, bool) else str(value)
    return UsedOnlyWith(other, Equals(value), wanted, value)


@dataclass(frozen=True)
class Declared:
    """What a Config field declares beside it (:func:`setting`): ``within`` its range (None: the generic rule of its
    name, else :data:`UNDECLARED`), ``choices`` its allowed values (a collection, or a function returning one: a
    registry's ``names``; for a list or tuple value, each element), ``only_with`` the setting it needs to act,
    ``at_most`` the scenario size it may not exceed (a key of :data:`SCENARIO_SIZES`; None: the generic rule of its
    name in :data:`SIZE_BOUNDS`)."""

    within: Range | None = None
    choices: Collection | Callable[[], Collection] | None = None
    only_with: UsedOnlyWith | None = None
    at_most: str | None = None

    def allowed(self) -> list | None:
        """The choices as a list (a registry's names read now), or None."""
        if self.choices is None:
            return None
        return list(self.choices() if callable(self.choices) else self.choices)

    def range_for(self, name: str) -> tuple[Range, bool]:
        """``(range, declared)`` of a field called ``name``: its own, else the generic rule, else
        :data:`UNDECLARED` (``declared`` False only then)."""
        if self.within is not None:
            return self.within, True
        generic = range_of(name)
        return (generic, True) if generic is not None else (UNDECLARED, False)

    def bound_for(self, name: str) -> str | None:
        """The scenario size (a key of :data:`SCENARIO_SIZES`) that a field called ``name`` may not exceed: its
        own, else the generic rule of :data:`SIZE_BOUNDS`, else None."""
        return self.at_most or SIZE_BOUNDS.get(name)


SCENARIO_SIZES: dict[str, str] = {
    "train_samples": "training samples in the whole stream",
    "experience_samples": "training samples in its smallest experience",
}
"""The sizes a scenario factory may declare without loading its data (its ``sizes(**args)`` attribute returns
``{size: count}``), in words for the refusal."""

SIZE_BOUNDS: dict[str, str] = {"mem_size": "train_samples", "n_shards": "experience_samples",
                               "batch_size": "train_samples"}
"""Generic names bounded by a scenario size: a rehearsal memory larger than the stream keeps every sample (the same
run as a memory of the stream's size, under another number), ``n_shards`` disjoint non-empty shards of each
experience need that many samples in each, and a batch larger than the stream is the whole stream (``batch_size:
10**12`` ran as one batch a step under its own identity)."""


INPUT_AXES: dict[str, int] = {"channels": 0, "height": 1, "width": 2}
"""The axes of a scenario's image input shape ``(C, H, W)`` that a :class:`Divides` rule may name."""


@dataclass(frozen=True)
class Divides:
    """A model factory's rule, declared beside it (its ``divides`` attribute, recorded in the registries' index):
    its keyword parameter ``divisor`` divides ``dividend``, another of its parameters or an axis of the scenario's
    input shape (a key of :data:`INPUT_AXES`); ``why`` says what needs it (ViT: heads divide the width, patches
    tile the image)."""

    divisor: str
    dividend: str
    why: str


def check_divides(rules: Iterable[Divides], args: Mapping[str, Any], input_shape: tuple[int, ...] | None = None,
                  scenario: str = "the scenario") -> None:
    """Raise ``ValueError`` naming the first of ``rules`` that the model arguments ``args`` (defaults filled in)
    break, with ``input_shape`` the shape of ``scenario``'s inputs (None: unknown, those rules are left)."""
    for rule in rules:
        divisor = args.get(rule.divisor)
        if rule.dividend in INPUT_AXES:
            axis = INPUT_AXES[rule.dividend]
            total = input_shape[axis] if input_shape is not None and len(input_shape) == len(INPUT_AXES) else None
            named = f"the image {rule.dividend} {total} of {scenario}"
        else:
            total = args.get(rule.dividend)
            named = f"{rule.dividend} {total}"
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (divisor, total)) and total % divisor:
            raise ValueError(f"{rule.divisor} {divisor} does not divide {named} ({rule.why}); set {rule.divisor} to "
                             f"a divisor of {total}.")


METADATA_KEY = "clbench"
NOTHING_DECLARED = Declared()


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            within: Range | None = None, choices: Collection | Callable[[], Collection] | None = None,
            only_with: UsedOnlyWith | None = None, at_most: str | None = None) -> Any:
    """A Config field with its declaration (:class:`Declared`) as dataclass metadata::

        optimizer: str = setting("sgd", choices=OPTIMIZERS.names)
        kd_tau: float = setting(1.0, within=POSITIVE)
        momentum: float = setting(0.9, only_with=only_with("optimizer", "sgd"))

    The default (or ``default_factory``) is the field's; the metadata changes neither the value nor the identity."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={METADATA_KEY: Declared(within, choices, only_with, at_most)})


def declarations(config_cls: type) -> dict[str, Declared]:
    """``{field: Declared}`` for every field of a Config dataclass (:data:`NOTHING_DECLARED` where it declares
    nothing)."""
    return {f.name: f.metadata.get(METADATA_KEY, NOTHING_DECLARED) for f in dataclasses.fields(config_cls)}


def parameter_declarations(func: Callable) -> dict[str, Declared]:
    """``{parameter: Declared}`` for the parameters of a function (a scenario factory, a callback's ``__init__``)
    annotated ``Annotated[T, Range(...)]`` or ``Annotated[T, Declared(...)]``: the declarations of a Config's
    :func:`setting`, for keyword arguments. Parameters without one are left out (they get the generic rules)."""
    target = func.__init__ if isinstance(func, type) else func
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except (NameError, TypeError):
        return {}
    out = {}
    for name, hint in hints.items():
        for meta in getattr(hint, "__metadata__", ()) if typing.get_origin(hint) is typing.Annotated else ():
            if isinstance(meta, Range):
                out[name] = Declared(within=meta)
            elif isinstance(meta, Declared):
                out[name] = meta
    return out


def type_hints(obj: Any) -> dict[str, Any]:
    """The annotations of a function's parameters, a dataclass's fields or a class's ``__init__`` parameters; an
    annotation that cannot be resolved is left unchecked."""
    target = obj.__init__ if isinstance(obj, type) and not dataclasses.is_dataclass(obj) else obj
    try:
        return typing.get_type_hints(target)
    except (NameError, TypeError):
        return {}


def type_name(tp: Any) -> str:
    """``float``, ``tuple[int, ...]``, ``int or None``: how an annotation reads in an error message."""
    if _is_union(tp):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp).replace("typing.", "")


def _article(tp: Any) -> str:
    name = type_name(tp)
    return name if _is_union(tp) or name == "None" or typing.get_origin(tp) is Literal else \
        f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def coerce(value: Any, tp: Any, key: str, strict: bool = False) -> Any:
    """``value`` as annotation ``tp`` (see the module docstring); raises :class:`TypeMismatch`. ``strict`` allows
    no coercion (the first pass over a union's members)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return value
    if _is_union(tp):
        for attempt_strict in (True, False) if not strict else (True,):
            for member in args:
                try:
                    return coerce(value, member, key, attempt_strict)
                except TypeMismatch:
                    pass
        raise TypeMismatch(key, f"expected {_article(tp)}, got {brief(value)}")
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise TypeMismatch(key, f"{brief(value)} is not one of {', '.join(repr(a) for a in args)}")
    if tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        number = _number(value, strict, allow_int_only=True)
        if number is not None:
            return number
    elif tp is float:
        number = _number(value, strict, allow_int_only=False)
        if number is not None:
            return number
    elif origin in (tuple, list) or tp in (tuple, list):
        if isinstance(value, (list, tuple)):
            is_tuple = (origin or tp) is tuple
            return (tuple if is_tuple else list)(_items(value, args if is_tuple else args * len(value), key, strict))
    elif origin is dict or tp is dict or origin is Mapping:
        if isinstance(value, dict):
            if not args:
                return dict(value)
            return {coerce(k, args[0], f"{key}[{brief(k)}]", strict): coerce(v, args[1], f"{key}.{k}", strict)
                    for k, v in value.items()}
    elif isinstance(origin or tp, type):
        if isinstance(value, origin or tp) and not (isinstance(value, bool) and tp is not bool):
            return value
    else:                       # an annotation this checker does not know (a Callable, a Protocol...): accept
        return value
    raise TypeMismatch(key, f"expected {_article(tp)}, got {brief(value)}")


def _number(value: Any, strict: bool, allow_int_only: bool) -> int | float | None:
    """``value`` as an int (``allow_int_only``) or a float, or None when it is not one (booleans never are)."""
    if isinstance(value, bool):
        return None
    if strict:
        ok = isinstance(value, int) if allow_int_only else isinstance(value, float)
        return value if ok else None
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if allow_int_only:
        return int(value) if float(value).is_integer() else None
    return float(value)


def _items(value: list | tuple, args: tuple, key: str, strict: bool) -> list:
    """The items coerced to ``args`` (a tuple's annotation: one type per item, or ``(X, ...)``)."""
    if not args:
        return list(value)
    if len(args) == 2 and args[1] is Ellipsis:
        args = (args[0],) * len(value)
    elif len(args) != len(value):
        raise TypeMismatch(key, f"expected {len(args)} items, got {len(value)}: {brief(value)}")
    return [coerce(v, a, f"{key}[{i}]", strict) for i, (v, a) in enumerate(zip(value, args))]


def _numbers(value: Any) -> list:
    """The numbers of a value (itself, or the items of a list or tuple); booleans are not numbers."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    return [x for x in items if isinstance(x, (int, float)) and not isinstance(x, bool)]


def check_range(name: str, value: Any, key: str, declared: Declared | None = None) -> None:
    """Raise :class:`TypeMismatch` when a number (or each number of a list) under ``name`` is out of its range:
    ``declared``'s (a Config field: its own, the generic rule or :data:`UNDECLARED`), else the generic rule."""
    if declared is None:
        allowed, own = range_of(name), True
    else:
        allowed, own = declared.range_for(name)
    if allowed is None:
        return
    for x in _numbers(value):
        if x not in allowed:
            hint = "" if own else (" (the rule of a Config number that declares no range; declare its own with "
                                   "clbench.typecheck.setting(default, within=Range(...)) beside the field)")
            raise TypeMismatch(key, f"{brief(x)} is out of range: {name} must be {allowed}{hint}")


def check_choice(name: str, value: Any, key: str, declared: Declared) -> None:
    """Raise :class:`TypeMismatch` when ``value`` (or an element of a list or tuple value) is not one of the declared
    choices; None is left to the annotation."""
    allowed = declared.allowed()
    if allowed is None or value is None:
        return
    for i, item in enumerate(value if isinstance(value, (list, tuple)) else (value,)):
        if item not in allowed:
            where = f"{key}[{i}]" if isinstance(value, (list, tuple)) else key
            raise TypeMismatch(where, f"unknown {name} {brief(item)}.{suggest(str(item), map(str, allowed))} "
                                      f"Choose one of: {', '.join(map(str, allowed))}.")


def check_values(values: Mapping[str, Any], hints: Mapping[str, Any], prefix: str = "",
                 declared: Mapping[str, Declared] | None = None) -> dict[str, Any]:
    """Every ``values[k]`` coerced to ``hints[k]`` (keys without a hint are returned as they are) and checked
    against its range and its choices as ``declared`` says (a Config's :func:`declarations`, a function's
    :func:`parameter_declarations`; a name it leaves out gets the generic rule of its name); errors name
    ``prefix + k``."""
    out = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        out[name] = coerce(value, hints[name], key) if name in hints else value
        field_declared = None if declared is None else declared.get(name)
        check_range(name, out[name], key, field_declared)
        if field_declared is not None:
            check_choice(name, out[name], key, field_declared)
    return out


class RangeChecked:
    """Base of the strategies' ``Config`` dataclasses: at construction every field is checked against its range and
    choices (:func:`check_range`, :func:`check_choice`: the loader's checks), so a Config built in Python gets the
    checks a suite file gets. A subclass's ``__post_init__`` calls ``super().__post_init__()``."""

    def __post_init__(self) -> None:
        for name, declared in declarations(type(self)).items():
            check_range(name, getattr(self, name), name, declared)
            check_choice(name, getattr(self, name), name, declared)
