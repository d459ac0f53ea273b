"""Tangent Transformers for continual learning and unlearning (Liu & Soatto, ICLR 2024) and their comparisons.

Every strategy here starts from one ViT ``w0`` (a local checkpoint, ``init``) whose blocks before the last ``k`` stay
frozen; their output tokens are cached per experience, so training runs the last ``k`` blocks only.

- ``taft``: one tangent model ``Δ_t`` per experience, trained from ``w0`` on that experience alone; the deployed
  model is ``compose(Δ_1..Δ_t)`` (Tangent Model Composition), one model's inference cost. No replay.
- ``taft_shards``: each experience split into ``n_shards`` disjoint seeded shards, one tangent model per shard, all
  composed; samples are removed by subtracting their shards (:meth:`forget`).
  Members train independently on the run's task pool (:mod:`clbench.tasks`; ``--shard-workers``), same result.
- ``nlft``: ordinary non-linear fine-tuning of the same last ``k`` blocks + head, sequentially over experiences.
- ``model_soup``: a non-linear copy per experience/shard from ``w0``, deployed as the average of their weights.
- ``sisa``: a non-linear copy per shard, deployed as the average of their outputs (O(N) inference).

Samples are identified by global ids: ``offset_t + i`` for sample ``i`` of training experience ``t`` in stream
order. Inputs are used without random augmentation (the cached prefix is a function of the stored sample).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from clbench import tasks
from clbench.cl import experience_tensors
from clbench.protocol import ParamCount, ScenarioInfo, StrategyBase
from clbench.registry import MODELS, STRATEGIES
from clbench.tangent import ShardComposition, cache_prefix, delta_hash, linearize, reset_blocks, split_shards
from clbench.tangent.losses import LOSSES, tangent_objective
from clbench.tangent.members import MemberJob, train_delta, train_tail
from clbench.tangent.tail import TailModel
from clbench.training import OPTIMIZERS, FitSettings, Schedule, fit
from clbench.typecheck import NON_NEGATIVE, POSITIVE, RangeChecked, only_with, setting

WEIGHTINGS = ("uniform", "samples")
SQUARE_LOSS = only_with("loss", "mse")
"""The rescaled square loss's own settings (α, κ) act only with ``loss: mse``."""


@dataclass
class FineTuneConfig(RangeChecked):
    """Shared by all strategies of this module. Defaults: the TAFT recipe (last attention block linearized,
    rescaled square loss α=1, κ=15, batch 32, Adam 1e-3, no augmentation). The ``full`` preset adds the rest of the
    authors' released ViT composition setting (``tangent-model-composition``: ``scripts/compose_vit.sh``,
    ``conf/main.yaml``, read for reference only): 30 epochs, lr ×0.1 after epoch 25, regularizer weight 1e-5 — there
    on ‖Δ‖, here on ‖Δ‖² (the issue's ridge). The paper's ViT-L/16 ImageNet backbone is replaced by a local
    checkpoint (``init``)."""

    model_args: dict = field(default_factory=lambda: {"embed_dim": 128, "depth": 4, "num_heads": 4,
                                                      "patch_size": 4})
    init: str | None = None            # local checkpoint of the linearization point (run_bench.py pretrain)
    last_blocks: int = setting(1, within=NON_NEGATIVE)   # k: blocks fine-tuned (TAFT-1 / NLFT-1; 0: head only)
    reset: bool = False                # re-initialize the last k blocks before fine-tuning
    loss: str = setting("mse", choices=LOSSES.names)   # mse (rescaled square loss) | ce
    alpha: float = setting(1.0, within=NON_NEGATIVE, only_with=SQUARE_LOSS)   # the rescaled square loss's α, κ
    kappa: float = setting(15.0, within=POSITIVE, only_with=SQUARE_LOSS)
    ridge: float = setting(0.0, within=NON_NEGATIVE)   # λ of the ridge penalty λ‖Δ‖² (tangent models only)
    optimizer: str = setting("adam", choices=OPTIMIZERS.names)
    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 5
    lr_milestones: tuple[int, ...] = ()  # lr ×lr_decay from each milestone epoch on (0-based; training.step_decay)
    lr_decay: float = setting(0.1, within=POSITIVE)
    batch_size: int = 32
    eval_batch_size: int = 512
    n_shards: int = 1                  # disjoint shards per experience, one member each
    weighting: str = setting("uniform", choices=WEIGHTINGS)   # composition weights of the members
    linearize_cls: bool = False        # tangent CLS token (taft only; disables the prefix cache)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.lr_milestones = tuple(int(m) for m in self.lr_milestones)

    @property
    def fit_settings(self) -> FitSettings:
        return FitSettings(self.epochs, self.batch_size,
                           Schedule(self.lr, milestones=self.lr_milestones, gamma=self.lr_decay), self.optimizer,
                           self.weight_decay)


@dataclass
class ShardedTangentConfig(FineTuneConfig):
    n_shards: int = 10


@dataclass
class NonlinearConfig(FineTuneConfig):
    """Non-linear members are fine-tuned with cross-entropy by default (ordinary fine-tuning), always on cached
    prefix tokens (a non-linear tail has no tangent CLS token)."""

    loss: str = setting("ce", choices=LOSSES.names)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.linearize_cls:
            raise ValueError("linearize_cls applies to tangent models only (taft, taft_shards).")
        if self.ridge:
            raise ValueError("ridge (λ‖Δ‖² on a tangent model's Δ) applies to tangent models only (taft, "
                             "taft_shards); a non-linear member is regularized by weight_decay.")


@dataclass
class NlftConfig(NonlinearConfig):
    """NLFT trains one tail sequentially on every experience: no shards."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_shards != 1:
            raise ValueError(f"n_shards {self.n_shards}: nlft fine-tunes one model on every experience, without "
                             f"shards; use sisa (non-linear members per shard) or model_soup.")


@dataclass
class SisaConfig(NonlinearConfig):
    n_shards: int = 10


CPU = {"model_args": {"embed_dim": 64, "depth": 3, "num_heads": 4, "patch_size": 4}, "epochs": 5, "batch_size": 32,
       "lr": 1e-3}
# the released TAFT setting; its lr drops after epoch 25 (0-based `x < epoch`): milestone 26 of training.step_decay
FULL = {"model_args": {"embed_dim": 384, "depth": 6, "num_heads": 12, "patch_size": 4}, "epochs": 30,
        "lr_milestones": (26,), "batch_size": 32, "lr": 1e-3, "ridge": 1e-5}
NONLINEAR_FULL = {k: v for k, v in FULL.items() if k != "ridge"}     # the ridge acts on tangent Δ only


@dataclass(frozen=True)
class RemovalRecord:
    """What :meth:`ShardedFineTuning.forget` did: shards touched, ids asked and samples actually dropped (their
    number and ``removed_ids``, the global ids of exactly those samples), hashes of the deployed weights before and
    after, and its wall time."""

    mode: str
    ids: list[int]
    shards_touched: list[int]
    samples_dropped: int
    shards_left: int
    hash_before: str
    hash_after: str
    seconds: float
    removed_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class PrefixFineTuning(StrategyBase):
    """A ViT ``w0`` whose blocks before the last ``k`` are frozen and cached: the shared part of every strategy here
    (model construction, cached inputs, prediction, parameter counts). Subclasses train and deploy."""

    Config: ClassVar[type] = FineTuneConfig
    PRESETS: ClassVar[dict[str, dict]] = {"cpu": CPU, "full": FULL}

    def __init__(self, info: ScenarioInfo, device: torch.device, config: FineTuneConfig) -> None:
        super().__init__(info, device, config)
        vit = MODELS.get("vit")(info, **{**config.model_args, "fused_attn": False, "init": config.init})
        if config.reset:
            reset_blocks(vit, config.last_blocks)
        self.tangent = linearize(vit, config.last_blocks, linearize_cls=config.linearize_cls).to(self.device)
        self.tail0 = TailModel(vit, config.last_blocks).to(self.device)
        self.cached = self.tangent.prefix_cacheable
        self.objective = tangent_objective(config.loss, config.alpha, config.kappa, 0.0)
        self.seed = int(torch.randint(2**31 - 1, ()))      # drawn from the run's seeded global RNG

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        return self._predict_tokens(self._inputs(x.to(self.device)))

    def num_parameters(self) -> ParamCount:
        """Parameters a deployed model holds: the frozen ViT ``w0`` plus its trained part (SISA: one per shard)."""
        frozen = sum(b.numel() for b in self.tangent.linearization_point().values())
        trainable = sum(p.numel() for p in self.tail0.parameters())
        return ParamCount(total=frozen + trainable * (self._deployed_copies() - 1), trainable=trainable)

    @torch.no_grad()
    def _inputs(self, x: Tensor) -> Tensor:
        """Cached prefix tokens ``(M, N, D)`` when the prefix carries no tangent, else the images."""
        x = x.to(self.device, self.tangent.head.weight0.dtype)
        return cache_prefix(self.tangent, x, self.config.eval_batch_size) if self.cached else x

    def _deployed_copies(self) -> int:
        return 1

    def _predict_tokens(self, inputs: Tensor) -> Tensor:
        raise NotImplementedError


class ShardedFineTuning(PrefixFineTuning):
    """Members trained independently on disjoint shards of each experience from the same ``w0``, then combined.

    Subclasses define a member (``train_member``: a :mod:`clbench.tangent.members` trainer, :meth:`_member_w0`: the
    model it starts from) and how members are combined for prediction (:meth:`_refresh`, :meth:`_predict_tokens`).
    Shard bookkeeping, state saving and forgetting are shared. Members are trained on the run's task pool
    (:func:`clbench.tasks.current`), each from its own job, and added in shard-key order, so the composition is the
    same whatever the pool.
    """

    train_member: ClassVar[Callable[[MemberJob], dict[str, Tensor]]]

    def __init__(self, info: ScenarioInfo, device: torch.device, config: FineTuneConfig) -> None:
        super().__init__(info, device, config)
        self.composition = ShardComposition()
        self.shards: dict[int, tuple[int, Tensor]] = {}     # shard key -> (experience, local sample indices)
        self.offsets: list[int] = []                        # global id of each experience's first sample
        self.n_samples = 0                                  # training samples seen so far
        self.next_key = 0

    def train(self, experience: Any) -> None:
        t = len(self.offsets)
        x, y = experience_tensors(experience)
        self.offsets.append(self.n_samples)
        self.n_samples += len(y)
        inputs, y = self._inputs(x), y.to(self.device)
        data = {}
        for local in split_shards(len(y), self.config.n_shards, seed=self.seed + 1_000_003 * (t + 1)):
            key, self.next_key = self.next_key, self.next_key + 1
            self.shards[key] = (t, local)
            data[key] = (inputs, y)
        for key, state in self._train_members(data).items():
            self._add(key, state)
        self._refresh()

    def extra_metrics(self) -> dict[str, float]:
        return {"members": float(len(self.composition.shards))}

    # ---------------------------------------------------------------------------------------------- unlearning
    def forget(self, ids: list[int], mode: str = "subtract", experiences: list | None = None) -> RemovalRecord:
        """Remove the training samples with global ``ids``.

        ``subtract``: drop every shard holding one of them from the composition (``S ← S − w_j Δ_j``) — no
        training, the shard's other samples go too. ``retrain``: retrain those shards from ``w0`` on their remaining
        samples (needs the training ``experiences``, in stream order) — SISA's exact unlearning.

        Every id must be held by a shard still in the composition (a training sample not removed before), and there
        must be at least one: otherwise ``ValueError`` and nothing changes.
        """
        if mode not in ("subtract", "retrain"):
            raise ValueError(f"mode must be 'subtract' or 'retrain', got {mode!r}")
        if mode == "retrain" and experiences is None:
            raise ValueError("forget(mode='retrain') needs the training experiences.")
        ids_t = torch.as_tensor(sorted({int(i) for i in ids}), dtype=torch.long)
        held = torch.cat([local + self.offsets[t] for t, local in self.shards.values()] or [ids_t[:0]])
        unknown = ids_t[~torch.isin(ids_t, held)].tolist()
        if not len(ids_t) or unknown:
            raise ValueError(f"{len(unknown)} id(s) are not training samples held by this composition: "
                             f"{unknown[:10]}" if unknown else "no sample ids to remove")
        before = delta_hash(self._deployed_state())
        start = time.perf_counter()
        touched, removed = [], []
        experience_data: dict[int, tuple[Tensor, Tensor]] = {}
        retrain: dict[int, tuple[Tensor, Tensor]] = {}
        for key, (t, local) in sorted(self.shards.items()):
            hit = torch.isin(local + self.offsets[t], ids_t)
            if not hit.any():
                continue
            touched.append(key)
            keep = local[~hit] if mode == "retrain" else local[:0]
            removed += (local[hit] if mode == "retrain" else local).add(self.offsets[t]).tolist()
            if len(keep):
                if t not in experience_data:
                    x, y = experience_tensors(experiences[t])
                    experience_data[t] = (self._inputs(x), y.to(self.device))
                self.shards[key] = (t, keep)
                retrain[key] = experience_data[t]
            else:
                del self.shards[key]
        retrained = self._train_members(retrain)
        for key in touched:                          # S ← S − w_j Δ_j (+ w_j' Δ_j' when retrained), in key order
            self.composition.subtract([key])
            if key in retrained:
                self._add(key, retrained[key])
        self._refresh()
        return RemovalRecord(mode, ids_t.tolist(), touched, len(removed), len(self.composition.shards), before,
                             delta_hash(self._deployed_state()), time.perf_counter() - start, sorted(removed))

    def shard_ids(self) -> dict[int, list[int]]:
        """Global sample ids held by each shard still in the composition."""
        return {k: (local + self.offsets[t]).tolist() for k, (t, local) in self.shards.items()}

    # ----------------------------------------------------------------------------------------------- state I/O
    def save_state(self, directory: str | Path) -> Path:
        """Everything :meth:`forget` needs: ``w0`` buffers, the members' states and weights, the shard index."""
        path = Path(directory) / "strategy.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"tangent": self.tangent.state_dict(), "tail0": self.tail0.state_dict(),
                    "members": self.composition.deltas, "weights": self.composition.weights,
                    "shards": self.shards, "offsets": self.offsets, "n_samples": self.n_samples,
                    "next_key": self.next_key, "seed": self.seed}, path)
        return path

    def load_state(self, directory: str | Path) -> None:
        blob = torch.load(Path(directory) / "strategy.pt", map_location=self.device, weights_only=True)
        self.tangent.load_state_dict(blob["tangent"])
        self.tail0.load_state_dict(blob["tail0"])
        self.composition = ShardComposition()
        for key, state in blob["members"].items():
            self.composition.add(key, state, blob["weights"][key])
        self.shards = {k: (t, local.cpu()) for k, (t, local) in blob["shards"].items()}
        self.offsets, self.n_samples = blob["offsets"], blob["n_samples"]
        self.next_key, self.seed = blob["next_key"], blob["seed"]
        self._refresh()

    # ---------------------------------------------------------------------------------------------- internals
    def _train_members(self, data: dict[int, tuple[Tensor, Tensor]]) -> dict[int, dict[str, Tensor]]:
        """``{key: member state}`` in key order: one member per shard ``key`` of ``data`` (``data[key]``: its
        experience's ``(inputs, targets)``, of which the shard holds rows ``self.shards[key][1]``), trained with
        seed ``self.seed + key`` on the task pool."""
        keys = sorted(data)
        jobs = []
        for key in keys:
            (inputs, targets), index = data[key], self.shards[key][1].to(self.device)
            context = replace(self.callbacks.context, modules=dict, member=f"shard{key}")
            jobs.append(MemberJob(self._member_w0(), inputs[index], targets[index], self.objective,
                                  self.config.fit_settings, self.seed + key, self.callbacks.specs(), context))
        return dict(zip(keys, tasks.current().map(self.train_member, jobs)))

    def _add(self, key: int, state: dict[str, Tensor]) -> None:
        """``S ← S + w Δ`` for shard ``key`` (``w`` = 1, or its sample count with ``weighting: samples``)."""
        weight = float(len(self.shards[key][1])) if self.config.weighting == "samples" else 1.0
        self.composition.add(key, state, weight)

    def _member_w0(self) -> nn.Module:
        raise NotImplementedError

    def _refresh(self) -> None:
        raise NotImplementedError

    def _deployed_state(self) -> dict[str, Tensor]:
        raise NotImplementedError


class _TangentMembers(ShardedFineTuning):
    """Members are tangent models ``Δ_i`` (fresh zeros each, trained with loss + λ‖Δ‖²); deployed: one tangent
    model with ``Δ = Σ w_i Δ_i / Σ w_i``."""

    train_member = staticmethod(train_delta)

    def __init__(self, info: ScenarioInfo, device: torch.device, config: FineTuneConfig) -> None:
        super().__init__(info, device, config)
        self.objective = tangent_objective(config.loss, config.alpha, config.kappa, config.ridge)

    def _forward(self, model: nn.Module):
        return model.from_prefix if self.cached else model

    def _member_w0(self) -> nn.Module:
        return self.tangent

    def _refresh(self) -> None:
        self.deployed = copy.deepcopy(self.tangent)
        self.deployed.load_delta(self.composition.delta())

    def _deployed_state(self) -> dict[str, Tensor]:
        return self.deployed.delta_state()

    def _predict_tokens(self, inputs: Tensor) -> Tensor:
        return self._forward(self.deployed)(inputs)


class _TailMembers(ShardedFineTuning):
    """Members are non-linear tails (last ``k`` blocks + norm + head) fine-tuned from ``w0``."""

    Config: ClassVar[type] = NonlinearConfig
    PRESETS: ClassVar[dict[str, dict]] = {"cpu": CPU, "full": NONLINEAR_FULL}
    train_member = staticmethod(train_tail)

    def _member_w0(self) -> nn.Module:
        return self.tail0


@STRATEGIES.register("taft_shards")
class TaftShards(_TangentMembers):
    """Tangent models on ``n_shards`` disjoint shards of every experience, composed; forgets by subtraction."""

    Config: ClassVar[type] = ShardedTangentConfig
    private = True                         # each training call uses its own data, the loss is a batch mean (dp)


@STRATEGIES.register("taft")
class Taft(_TangentMembers):
    """Tangent Model Composition for continual learning: one ``Δ_t`` per experience, deployed ``compose(Δ_1..Δ_t)``."""

    private = True                         # each training call uses its own data, the loss is a batch mean (dp)


@STRATEGIES.register("model_soup")
class ModelSoup(_TailMembers):
    """Weight averaging of non-linear members trained from the same ``w0`` (Wortsman et al., 2022)."""

    private = True                         # each training call uses its own data, the loss is a batch mean (dp)

    def _refresh(self) -> None:
        self.deployed = copy.deepcopy(self.tail0).eval()
        self.deployed.load_state_dict(self.composition.delta())

    def _deployed_state(self) -> dict[str, Tensor]:
        return self.deployed.state_dict()

    def _predict_tokens(self, inputs: Tensor) -> Tensor:
        return self.deployed(inputs)


@STRATEGIES.register("sisa")
class Sisa(_TailMembers):
    """SISA (Bourtoule et al., 2021): one non-linear model per shard, outputs averaged with the member weights."""

    Config: ClassVar[type] = SisaConfig
    private = True                         # each training call uses its own data, the loss is a batch mean (dp)

    def __init__(self, info: ScenarioInfo, device: torch.device, config: FineTuneConfig) -> None:
        super().__init__(info, device, config)
        self.members: dict[int, TailModel] = {}

    def _refresh(self) -> None:
        self.members = {}
        for key, state in self.composition.deltas.items():
            member = copy.deepcopy(self.tail0).eval()
            member.load_state_dict(state)
            self.members[key] = member

    def _deployed_state(self) -> dict[str, Tensor]:
        return {f"{key}.{name}": v for key, m in self.members.items() for name, v in m.state_dict().items()}

    def _deployed_copies(self) -> int:
        return max(1, len(self.members))

    def _predict_tokens(self, inputs: Tensor) -> Tensor:
        weights = self.composition.weights
        total = sum(weights[k] for k in self.members)
        return sum(weights[k] / total * m(inputs) for k, m in self.members.items())


@STRATEGIES.register("nlft")
class Nlft(PrefixFineTuning):
    """Non-linear fine-tuning (the paper's NLFT): one tail trained sequentially on every experience; no
    composition and no shard structure (exact removal would mean retraining from scratch)."""

    Config: ClassVar[type] = NlftConfig
    private = True                         # each training call uses its own data, the loss is a batch mean (dp)
    # cpu_sgd: the authors' NLFT optimizer (SGD lr 1e-2, weight decay 1e-4; momentum 0.9, this code's SGD default)
    PRESETS: ClassVar[dict[str, dict]] = {"cpu": CPU, "full": NONLINEAR_FULL,
                                          "cpu_sgd": {**CPU, "optimizer": "sgd", "lr": 1e-2, "weight_decay": 1e-4}}

    def __init__(self, info: ScenarioInfo, device: torch.device, config: FineTuneConfig) -> None:
        super().__init__(info, device, config)
        self.model = copy.deepcopy(self.tail0).eval()
        self.steps = 0

    def train(self, experience: Any) -> None:
        x, y = experience_tensors(experience)
        self.model.train()
        fit(self.model, self.model, self.model.parameters(), self._inputs(x), y.to(self.device), self.objective,
            self.config.fit_settings, self.seed + self.steps, self.callbacks)
        self.model.eval()
        self.steps += 1

    def _predict_tokens(self, inputs: Tensor) -> Tensor:
        return self.model(inputs)
