"""The contracts between the runner, scenarios and strategies.

The runner never reaches inside a strategy: it only calls :class:`StrategyBase`'s methods, and it only reads a
scenario through :class:`Scenario` (two streams of experiences, a :class:`ScenarioInfo` and the scenario's
evaluator, which scores a strategy after each training step).

Classification label convention (enforced by every classification scenario): class labels are renumbered by their
position in the class order, so experience ``t`` holds the contiguous label range ``info.class_range(t)`` and after
experience ``t`` the seen classes are ``0 .. info.n_seen(t) - 1``. A strategy's ``predict`` returns logits whose
column ``c`` is class ``c``.

The strategy contract (:class:`StrategyBase`), checked when a strategy registers (:func:`check_strategy`)::

    @STRATEGIES.register("my_method")
    class MyMethod(StrategyBase):
        Config = MyConfig                          # a dataclass; defaults = the paper's values
        PRESETS = {"cpu": {...}, "full": {}}       # named overrides of Config fields
        offline = False                            # True: one train() call with the list of all experiences
        private = False                            # True: may train with dp (each call its own data, batch-mean loss)
        scenario_kinds = (CLASSIFICATION,)         # the kinds of scenario it serves (NEXT_ITEM: item sequences)
        private_needs = (NO_REHEARSAL_MEMORY,)     # what its Config must satisfy to train with dp

        def __init__(self, info, device, config):  # call super().__init__(info, device, config) first
        def train(self, experience) -> None        # one experience (Avalanche experience for classification)
        def predict(self, x, task_labels) -> Tensor          # (B, C) scores; column c = class (or item) c
        def num_parameters(self) -> ParamCount
        # optional, with defaults:
        def modules(self) -> dict[str, nn.Module]  # what callbacks may hook (default: nn.Module attributes)
        def extra_metrics(self) -> dict[str, float]   # extra leaderboard columns (default: none)
        def save_state(self, directory) -> Path | None  # called after the last step (default: saves nothing)

Training loops fire ``self.callbacks`` (:class:`~clbench.callbacks.CallbackList`, set up by the runner): a template
strategy passes it to :func:`clbench.callbacks.bridge`, a non-template one to :func:`clbench.training.fit`. The runner
checks it (:func:`hooks_checked`): a ``train`` call that steps an optimizer while no batch hook fires is a contract
violation, and so is a subclass that skips ``super().__init__`` (named as such when ``self.callbacks`` is missing).

What a strategy needs is declared on its class and checked when a suite loads (:mod:`clbench.suite_file`), before
any run: ``scenario_kinds`` against each scenario's kind (:func:`scenario_kind`: a factory's ``kind`` attribute,
:data:`CLASSIFICATION` when it declares none; a :data:`NEXT_ITEM` scenario's info has ``extra["n_items"]``), and,
for an entry trained with ``dp``, ``private_needs`` (each a :class:`PrivateNeed`) against its Config.

Scenario factories (:func:`check_scenario`) take a keyword ``seed``; callbacks (:func:`check_callback`) are
:class:`~clbench.callbacks.Callback` subclasses or factories returning one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from clbench.augment import CropFlip
from clbench.typecheck import Empty, declarations

if TYPE_CHECKING:
    from clbench.metrics import MetricSpec


class StrategyContractError(TypeError):
    """A strategy class or one of its return values does not follow :class:`StrategyBase`; names the strategy."""


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of a strategy after a training step (numbers of scalars, not millions)."""

    total: int
    trainable: int

    @classmethod
    def of(cls, *modules: torch.nn.Module) -> ParamCount:
        params = {id(p): p for m in modules for p in m.parameters()}.values()
        return cls(total=sum(p.numel() for p in params),
                   trainable=sum(p.numel() for p in params if p.requires_grad))


# ------------------------------------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class ScenarioInfo:
    """What a strategy may know about any scenario before training: its name, the number of experiences, the
    shape of one input (``(C, H, W)`` for images, ``(D,)`` for vectors, ``(L,)`` for item sequences) and
    scenario-specific facts in ``extra``."""

    name: str
    n_experiences: int
    input_shape: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ClassificationInfo(ScenarioInfo):
    """A classification scenario: ``classes_per_experience[t]`` is the number of classes experience ``t``
    introduces (``n_experiences`` is derived from it). In task-incremental scenarios (``task_aware``) the task label
    of each sample is given at train and test time and predictions are made among that task's classes only.
    ``domain_incremental`` scenarios reuse the same labels in every experience (``classes_per_experience[t]`` then
    counts the labels of that experience, all of them shared).

    ``batch_augment``: the scenario's train augmentation, declared here instead of as a per-sample dataset
    transform (the image scenarios: :class:`~clbench.augment.CropFlip`). Every training loop applies
    ``batch_augment.batch`` to each training minibatch once, on the batch's device, before the batch hooks and the
    forward (:meth:`clbench.callbacks.CallbackList.augment_batch`); evaluation never does. None: no augmentation."""

    n_experiences: int = 0
    n_classes: int
    classes_per_experience: tuple[int, ...]
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    task_aware: bool = False
    domain_incremental: bool = False
    default_model: str = "mlp"                  # backbone used when a strategy's config says model="auto"
    class_order: tuple[int, ...] = ()           # original label of renumbered class c (for reports)
    batch_augment: CropFlip | None = None       # train augmentation of every training minibatch (docstring)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_experiences", len(self.classes_per_experience))

    def class_range(self, t: int) -> range:
        """Renumbered labels introduced by experience ``t``."""
        if self.domain_incremental:
            return range(self.classes_per_experience[t])
        start = sum(self.classes_per_experience[:t])
        return range(start, start + self.classes_per_experience[t])

    def n_seen(self, t: int) -> int:
        """Number of classes seen after training experiences ``0..t``."""
        if self.domain_incremental:
            return max(self.classes_per_experience[: t + 1])
        return sum(self.classes_per_experience[: t + 1])


@dataclass
class Scores:
    """What an evaluator returns after step ``step``: row ``step`` of every matrix (``rows[metric][j]`` for test
    experience ``j``) and the test sizes ``n_j``."""

    rows: dict[str, list[float]]
    sizes: list[int]


class Evaluator(Protocol):
    """Scores a strategy on every test experience after a training step; owned by the scenario.

    ``specs`` names the metrics it fills (one score matrix each, one of them primary); a call returns row
    ``step`` of every matrix and the test size of each experience (the weights of the seen-data averages)."""

    specs: tuple[MetricSpec, ...]

    def __call__(self, strategy: StrategyBase, scenario: Scenario, step: int, device: torch.device) -> Scores: ...


@dataclass
class Scenario:
    """A built scenario: training and test streams of experiences (each has ``.dataset``, whose items are
    ``(x, y, task_label)``, and ``.current_experience``), its description and its evaluator. Classification
    scenarios also keep the Avalanche ``benchmark`` their streams come from (Avalanche strategies read it); the
    runner uses only the streams and the evaluator."""

    info: ScenarioInfo
    train_stream: Sequence[Any]
    test_stream: Sequence[Any]
    evaluator: Evaluator
    benchmark: Any = None


# ----------------------------------------------------------------------------------------------- scenario kinds
CLASSIFICATION = "classification"
"""A scenario of labelled samples (:class:`ClassificationInfo`), scored by accuracy."""
NEXT_ITEM = "next_item"
"""A scenario of item sequences whose info has ``extra["n_items"]`` (predictions score every item), ranked."""


def scenario_kind(factory: Any) -> str:
    """The kind of scenario a registered factory builds: its ``kind`` attribute, :data:`CLASSIFICATION` if none."""
    return getattr(factory, "kind", CLASSIFICATION)


@dataclass(frozen=True)
class PrivateNeed:
    """What a strategy's Config must satisfy to train with ``dp``: ``allows(value of field)``, else ``refusal``
    (formatted with ``value``) says why and what to set. A Config without ``field`` satisfies it. An ``allows`` that
    is a value (:class:`~clbench.typecheck.Equals`, :class:`~clbench.typecheck.Empty`) is recorded in the registries'
    index and checked before the imports; a function is checked after them."""

    field: str
    allows: Callable[[Any], bool]
    refusal: str

    def check(self, config: Any) -> None:
        """Raise ``ValueError`` with the refusal when ``config`` does not satisfy this need."""
        if hasattr(config, self.field) and not self.allows(getattr(config, self.field)):
            raise ValueError(self.refusal.format(value=getattr(config, self.field)))


NO_REHEARSAL_MEMORY = PrivateNeed(
    "mem_size", Empty(),
    "dp with a rehearsal memory (mem_size {value}) is refused: replayed samples are trained on in several "
    "experiences, so the per-experience epsilon would understate theirs; set mem_size: 0.")
"""No rehearsal memory under ``dp``: the memory's samples come back in later experiences, each accounted alone."""


# ----------------------------------------------------------------------------------------------------- strategies
class StrategyBase:
    """The strategy contract (see the module docstring). Subclasses set ``Config`` and ``PRESETS`` and implement
    ``train``, ``predict`` and ``num_parameters``; the rest has defaults."""

    Config: ClassVar[type]
    PRESETS: ClassVar[dict[str, dict]] = {}
    offline: ClassVar[bool] = False
    private: ClassVar[bool] = False      # True: each training call uses its own data and a batch-mean loss (dp allowed)
    scenario_kinds: ClassVar[tuple[str, ...]] = (CLASSIFICATION,)   # the scenario kinds it serves
    private_needs: ClassVar[tuple[PrivateNeed, ...]] = (NO_REHEARSAL_MEMORY,)   # its Config under dp

    @classmethod
    def check_private(cls, config: Any) -> None:
        """Raise ``ValueError`` (one line) when ``config`` fails one of :attr:`private_needs` (a ``dp`` entry)."""
        for need in cls.private_needs:
            need.check(config)

    def __init__(self, info: ScenarioInfo, device: torch.device | str, config: Any) -> None:
        from clbench.callbacks import CallbackList  # imported here: registering a callback checks it with this module

        self.info, self.device, self.config = info, torch.device(device), config
        self.callbacks = CallbackList(batch_augment=getattr(info, "batch_augment", None))

    def __getattr__(self, name: str) -> Any:
        """Only reached for a missing attribute: the ones ``StrategyBase.__init__`` sets name the contract."""
        if name in ("info", "device", "config", "callbacks"):
            raise StrategyContractError(f"{type(self).__name__}.__init__ did not call super().__init__(info, device, "
                                        f"config), which sets self.{name} (see clbench.protocol.StrategyBase).")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def check_entry(cls, config: Any, args: dict, private: bool) -> None:
        """Refuse, when the suite loads, a setting this strategy would ignore in this entry: ``config`` is the
        entry's Config, ``args`` the fields the entry sets, ``private`` whether it trains under ``dp``. Raise
        ``ValueError`` saying what to change (a :class:`~clbench.errors.ConfigError` naming the entry). Default:
        nothing to refuse beyond the Config's own checks."""

    def train(self, experience: Any) -> None:
        """Train on one experience (offline strategies: on the list of all of them, in one call)."""
        raise NotImplementedError

    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        """Scores ``(B, C)`` whose column ``c`` scores class (or item) ``c``; ``C`` >= classes seen so far."""
        raise NotImplementedError

    def num_parameters(self) -> ParamCount:
        """Parameters of the deployed model after the last ``train`` call."""
        raise NotImplementedError

    def modules(self) -> dict[str, nn.Module]:
        """The ``nn.Module`` s a callback may hook, by name. Default: every ``nn.Module`` attribute."""
        return {name: value for name, value in vars(self).items() if isinstance(value, nn.Module)}

    def extra_metrics(self) -> dict[str, float]:
        """Strategy-specific numbers recorded under ``metrics.extra`` (leaderboard columns). Default: none."""
        return {}

    def save_state(self, directory: Path) -> Path | None:
        """Save what later commands need (e.g. ``forget``) under ``directory`` after the last step; return the
        path written, or None (the default: nothing saved)."""
        return None


REQUIRED = ("train", "predict", "num_parameters")


def check_strategy(name: str, cls: Any) -> None:
    """Raise :class:`StrategyContractError` unless ``cls`` follows :class:`StrategyBase` (called on registration)."""
    where = f"strategy {name!r} ({getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)!s})"
    if not (isinstance(cls, type) and issubclass(cls, StrategyBase)):
        raise StrategyContractError(f"{where} must be a class deriving from clbench.protocol.StrategyBase.")
    missing = [m for m in REQUIRED if getattr(cls, m) is getattr(StrategyBase, m)]
    if missing:
        raise StrategyContractError(f"{where} does not implement {', '.join(missing)} (see StrategyBase).")
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise StrategyContractError(f"{where}: Config must be a dataclass of hyperparameters, got {config!r}.")
    fields = {f.name for f in dataclasses.fields(config)}
    if not isinstance(cls.PRESETS, dict):
        raise StrategyContractError(f"{where}: PRESETS must be a dict of name -> Config overrides.")
    for preset, values in cls.PRESETS.items():
        unknown = sorted(set(values) - fields) if isinstance(values, dict) else ["<not a dict>"]
        if unknown:
            raise StrategyContractError(f"{where}: preset {preset!r} sets unknown Config fields {unknown}.")
    for flag in ("offline", "private"):
        if not isinstance(getattr(cls, flag, False), bool):
            raise StrategyContractError(f"{where}: {flag} must be True or False, got {getattr(cls, flag)!r}.")
    kinds = cls.scenario_kinds
    if not (isinstance(kinds, tuple) and kinds and all(isinstance(k, str) for k in kinds)):
        raise StrategyContractError(f"{where}: scenario_kinds must be a non-empty tuple of scenario kinds "
                                    f"(CLASSIFICATION, NEXT_ITEM, ...), got {kinds!r}.")
    if not (isinstance(cls.private_needs, tuple) and all(isinstance(n, PrivateNeed) for n in cls.private_needs)):
        raise StrategyContractError(f"{where}: private_needs must be a tuple of clbench.protocol.PrivateNeed, got "
                                    f"{cls.private_needs!r}.")
    for name, declared in declarations(config).items():
        if declared.only_with is not None and declared.only_with.other not in fields:
            raise StrategyContractError(f"{where}: Config field {name!r} is declared used only with "
                                        f"{declared.only_with.other!r}, which is not a field of {config.__name__}.")


def check_scenario(name: str, factory: Any) -> None:
    """Raise :class:`TypeError` unless ``factory`` is callable with a keyword ``seed`` (called on registration)."""
    where = f"scenario {name!r} ({getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', factory)!s})"
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        raise TypeError(f"{where} must be a function f(*, seed, ...) -> Scenario.") from None
    if "seed" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise TypeError(f"{where} must take the keyword argument seed: f(*, seed, ...) -> Scenario.")


def check_callback(name: str, factory: Any) -> None:
    """Raise :class:`TypeError` unless ``factory`` is a :class:`~clbench.callbacks.Callback` subclass or another
    callable (a factory returning one; checked when it is built)."""
    from clbench.callbacks import Callback

    if not callable(factory) or isinstance(factory, type) and not issubclass(factory, Callback):
        raise TypeError(f"callback {name!r} ({factory!r}) must be a subclass of clbench.callbacks.Callback or a "
                        f"function returning one.")


@contextlib.contextmanager
def hooks_checked(strategy: StrategyBase, step: int):
    """Around ``strategy.train(step)``: raise :class:`StrategyContractError` if an optimizer of this process took a
    step while no ``on_batch_start`` fired (a loop of its own that bypasses the callbacks: no NaN guard, no private
    step, no training log); inside, :func:`clbench.training.fit` called without ``callbacks=`` fires the
    strategy's. Training in other processes (shard members) is checked there. (Only the batch start is checked: a
    loop that fires it but not ``after_forward`` / ``after_backward`` / ``after_step`` around its steps, as
    Avalanche's MER template did before :class:`~clbench.strategies.avalanche_plugins.HookedMER`, passes.)"""
    from clbench.callbacks import BATCH_HOOKS_FIRED
    from clbench.training import strategy_training

    steps = [0]
    handle = register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: steps.__setitem__(0, steps[0] + 1))
    before = BATCH_HOOKS_FIRED["on_batch_start"]
    try:
        with strategy_training(strategy.callbacks):     # fit(...) without callbacks= fires the strategy's
            yield
    finally:
        handle.remove()
    if steps[0] and BATCH_HOOKS_FIRED["on_batch_start"] == before:
        raise StrategyContractError(
            f"{type(strategy).__name__}.train() took {steps[0]} optimizer step(s) on experience {step} without firing "
            f"the batch hooks: train through clbench.training.fit(..., callbacks=self.callbacks) or "
            f"clbench.callbacks.bridge(template, self.callbacks) (see clbench.protocol.StrategyBase).")


def checked(value: Any, expected: type, strategy: StrategyBase, method: str) -> Any:
    """``value`` if it is an ``expected``, else a :class:`StrategyContractError` naming the strategy and method."""
    if not isinstance(value, expected):
        raise StrategyContractError(f"{type(strategy).__name__}.{method}() returned {type(value).__name__}, "
                                    f"expected {expected.__name__} (see clbench.protocol.StrategyBase).")
    return value
