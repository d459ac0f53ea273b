"""The dual form of linear layers trained by gradient descent (Irie, Csordás & Schmidhuber, ICML 2022).

A linear layer ``y = W x + b`` trained by SGD from ``W_0`` ends at ``W_T = W_0 + Σ_t e_t ⊗ x_t``: the sum, over every
training pattern ``t`` (one per sample, or per token of a sequence, per step), of the outer product of the value
``e_t = c_t · ∂L/∂y_t`` and the key ``x_t`` (the layer's input). So for a test query ``x``::

    W_T x = W_0 x + Σ_t e_t (x_tᵀ x)          (unnormalized dot attention; b_T = b_0 + Σ_t e_t likewise)

``∂L/∂y_t`` is the per-sample gradient of the loss actually minimized, so the 1/B of a batch-mean loss is in it.
The coefficient ``c_t`` depends on the optimizer (torch's ``SGD``, per parameter; ``η_s`` the lr used at step s)::

    plain SGD (μ = 0)     c_t = −η_t
    momentum μ            buf_s = μ buf_{s−1} + (1 − τ) g_s  (buf = g at a fresh buffer), W_s = W_{s−1} − η_s buf_s
                          c_t = −w_t Σ_{s ≥ t} η_s Π_{r=t+1..s} μ_r,   w_t = 1 at a fresh buffer else 1 − τ
    nesterov              W_s = W_{s−1} − η_s (g_s + μ buf_s):   c_t = −(η_t + w_t Σ_{s ≥ t} η_s μ_s Π_{r=t+1..s} μ_r)

(the sums run until the momentum buffer is recreated, e.g. by a reset of the optimizer state). Because
``c_t`` depends on the final step T, the recorder stores the raw ``∂L/∂y_t`` and the per-step hyperparameters and
applies the coefficients when asked (:func:`coefficients`). The identity fails — and the recorder raises, saying
why — for Adam/AdamW or any optimizer other than ``torch.optim.SGD`` (the update is not a sum of outer products of
per-sample terms), for weight decay on a recorded layer (W_T then holds ``Π(1 − η λ) W_0``, not ``W_0``), for
``maximize``, for a frozen layer, and when the gradient of a recorded layer is changed after backward (clipping,
DP noise, GEM's projection: checked at every step with a random probe, ``G v = Σ_t g_t (x_tᵀ v)``).

:class:`PatternRecorder` is a :class:`~clbench.callbacks.Callback` (``callbacks: [{name: dual_form, args: {layers:
[model.classifier], ...}}]`` in a suite attaches it to any strategy) and a context manager for plain loops
(it then hooks ``optimizer.step`` itself). Patterns go to a :class:`~clbench.analysis.store.PatternWriter` store
(memory-mapped chunks, float16/32/64, a byte budget, a seeded per-step sample fraction chosen before training).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from clbench.analysis import store as pattern_store
from clbench.analysis.store import LayerShape, PatternStore, PatternWriter, StoreBudgetError, step_dtype
from clbench.callbacks import CALLBACKS, Callback, CallbackContext


class DualFormError(RuntimeError):
    """The recorded training does not have the dual form W_T = W_0 + Σ_t e_t x_tᵀ (the message says why)."""


# ------------------------------------------------------------------------------------------------- coefficients
def coefficients(steps: np.ndarray, param: int, upto: int | None = None) -> np.ndarray:
    """``c_t`` for every step ``t < upto`` of parameter ``param`` (a column of the step table): the factor of
    step t's gradient in ``W_upto − W_0`` (see the module docstring); 0 where the parameter was not updated."""
    steps = steps[:upto]
    out = np.zeros(len(steps))
    tail = tail_nesterov = 0.0       # Σ_{s>t} η_s Π μ  and  Σ_{s>t} η_s μ_s Π μ  within the current buffer's chain
    mu_next = 0.0                    # μ of the next active step, 0 if it starts a fresh buffer (or none follows)
    for t in range(len(steps) - 1, -1, -1):
        row = steps[t]
        if not row["active"][param]:
            continue
        lr, mu = row["lr"][param], row["momentum"][param]
        s = lr + mu_next * tail
        q = lr * mu + mu_next * tail_nesterov
        w = 1.0 if row["fresh"][param] else 1.0 - row["dampening"][param]
        out[t] = -(lr + w * q) if row["nesterov"][param] else -w * s
        tail, tail_nesterov = s, q
        mu_next = 0.0 if row["fresh"][param] else mu
    return out


def _restored(chunk: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return chunk.astype(np.float64) * scale[:, None].astype(np.float64)


def values(store: PatternStore, steps_table: np.ndarray, layer: str, upto: int | None = None):
    """Yields per chunk ``(x, e_w, e_b, meta)`` in float64 for patterns of steps ``< upto``: keys ``x (n, d_in)``,
    weight values ``e_w = c^W_t ∂L/∂y_t (n, d_out)``, bias values ``e_b = c^b_t ∂L/∂y_t`` (None without bias)."""
    index = store.params.index(f"{layer}.weight")
    coef_w = coefficients(steps_table, index, upto)
    coef_b = coefficients(steps_table, index + 1, upto) if store.layers[layer]["bias"] else None
    for x, g, meta, scale in store.chunks(layer):
        keep = meta[:, 0] < len(coef_w)
        step = meta[keep, 0]
        x, g = _restored(x[keep], scale[keep, 0]), _restored(g[keep], scale[keep, 1])
        yield x, coef_w[step][:, None] * g, None if coef_b is None else coef_b[step][:, None] * g, meta[keep]


def check_exact(store: PatternStore) -> None:
    if not store.full:
        raise DualFormError(
            f"the store at {store.folder} kept a fraction {store.fraction} of the samples"
            f"{'' if store.manifest['complete'] else ' and its recording did not complete'}: W_0 + Σ e_t x_tᵀ over "
            f"the kept patterns is not the trained weight. Record with fraction=1 for an exact reconstruction; "
            f"attribution over kept patterns is still available (it sums kept patterns only).")


def reconstruct(store: PatternStore, layer: str, upto: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(W_0 + Σ_t e_t x_tᵀ, b_0 + Σ_t e_t)`` in float64 over the first ``upto`` steps (default: all): equal to
    the layer's weights after that step when the recording is full (raises :class:`DualFormError` otherwise)."""
    check_exact(store)
    w0, b0 = store.initial(layer)
    w, b = w0.astype(np.float64), None if b0 is None else b0.astype(np.float64)
    for x, e_w, e_b, _ in values(store, store.steps(), layer, upto):
        w += e_w.T @ x
        if b is not None:
            b += e_b.sum(axis=0)
    return w, b


# ------------------------------------------------------------------------------------------------------ recorder
class _Layer:
    """One hooked nn.Linear: its forward calls of the current step (input, version, output gradient)."""

    def __init__(self, name: str, module: nn.Linear, first_forward) -> None:
        self.name, self.module, self.first_forward = name, module, first_forward
        self.calls: list[dict] = []
        self.hook()

    def hook(self) -> None:
        self.handle = self.module.register_forward_hook(self._forward)

    def _forward(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        if not (torch.is_grad_enabled() and output.requires_grad):
            return                      # evaluation or a frozen pass: nothing reaches the weights
        self.first_forward()
        call = {"x": inputs[0].detach(), "version": inputs[0]._version, "g": None, "input": inputs[0]}
        self.calls.append(call)

        def keep(grad: Tensor) -> None:
            call["g"] = grad.detach() if call["g"] is None else call["g"] + grad.detach()

        output.register_hook(keep)

    def params(self) -> list[tuple[str, nn.Parameter]]:
        out = [(f"{self.name}.weight", self.module.weight)]
        return out + ([(f"{self.name}.bias", self.module.bias)] if self.module.bias is not None else [])


@CALLBACKS.register("dual_form")
class PatternRecorder(Callback):
    """Records the training patterns ``(x_t, ∂L/∂y_t)`` of chosen ``nn.Linear`` layers to an on-disk store.

    As a callback (suite YAML or :func:`clbench.api.run`): ``layers`` are names under the strategy's ``modules()``
    (``model.classifier``; the module key may be left out when there is one module) and the store goes to
    ``<artifacts>/dual_form/patterns`` (model snapshots after each experience to ``.../dual_form/models``). As a
    context manager: ``with PatternRecorder(model, optimizer, layers=["fc2"], storage_dir=d) as rec: <plain loop>``
    (layer names under ``model``; call ``rec.on_batch_start(x, y)`` to record labels, ``rec.on_experience_start(t)``
    for experiences). ``storage_dir=None`` in a plain loop uses a new temporary folder (``rec.storage_dir``).

    Storage: ``dtype`` float16 | float32 | float64, at most ``budget_bytes`` on disk. ``fraction`` of each batch's
    samples is kept (seeded by ``seed``); ``fraction="auto"`` takes the largest that fits the budget for
    ``planned_samples`` training samples (``planned_steps`` optimizer steps; default: as many as samples, the worst
    case). A plan that does not fit, or a budget below the store's minimum, is refused before training; without a
    plan the budget is a hard cap that stops the run with :class:`StoreBudgetError` (never a silent drop).

    Per pattern: step, experience, sample (running index of the sample in the training stream, −1 for forward
    calls of another batch size, e.g. a separate replay-buffer pass), label (−1 if unknown), token (position in a
    sequence; inputs ``(B, ..., d_in)`` give one pattern per token).
    """

    def __init__(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 layers: list[str] | tuple[str, ...] = (), storage_dir: str | Path | None = None,
                 dtype: str = "float32", budget_bytes: int = 2 * 10**9, fraction: float | str = 1.0,
                 planned_samples: int | None = None, planned_steps: int | None = None, chunk_rows: int = 8192,
                 seed: int = 0, snapshots: bool = True) -> None:
        if not layers:
            raise ValueError("dual_form: give the names of the nn.Linear layers to record (layers=[...]).")
        if fraction != "auto" and not 0 < float(fraction) <= 1:
            raise ValueError(f"dual_form: fraction must be in (0, 1] or 'auto', got {fraction!r}.")
        if fraction == "auto" and not planned_samples:
            raise ValueError("dual_form: fraction='auto' needs planned_samples (training samples the run will see).")
        self.model, self.optimizer, self.layer_names = model, optimizer, list(layers)
        self.storage_dir = None if storage_dir is None else Path(storage_dir)
        self.dtype, self.budget_bytes, self.fraction = dtype, int(budget_bytes), fraction
        self.planned_samples, self.planned_steps = planned_samples, planned_steps
        self.chunk_rows, self.seed, self.snapshots = chunk_rows, seed, snapshots
        self.layers: dict[str, _Layer] = {}
        self.writer: PatternWriter | None = None
        self.experience, self.step = 0, 0
        self.labels: Tensor | None = None
        self._buffers: dict[str, object] = {}
        self._probes: dict[str, Tensor] = {}
        self._started = False
        self._post_hook = None
        self.context = CallbackContext()

    # ------------------------------------------------------------------------------------------------ attaching
    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        if self.storage_dir is None:
            if context.artifacts is None:
                raise ValueError("dual_form: this run has no output folder; give storage_dir=... to the callback.")
            self.storage_dir = context.artifacts / "dual_form" / (context.member or "run")
        self._attach(context.modules())

    def __enter__(self) -> PatternRecorder:
        if self.model is None or self.optimizer is None:
            raise ValueError("dual_form: as a context manager the recorder needs model= and optimizer=.")
        if self.storage_dir is None:
            self.storage_dir = Path(tempfile.mkdtemp(prefix="dual_form_"))
        self._attach({"": self.model})
        self._post_hook = self.optimizer.register_step_post_hook(lambda opt, args, kwargs: self.after_step(opt))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._post_hook.remove()
        self.close(complete=exc_type is None)

    def _resolve(self, modules: Mapping[str, nn.Module], name: str) -> tuple[nn.Module, nn.Module]:
        """(root module, layer) for ``name``: ``<module key>.<path>`` or, with one module, ``<path>``."""
        head, _, rest = name.partition(".")
        if head in modules:
            root, path = modules[head], rest
        elif len(modules) == 1:
            root, path = next(iter(modules.values())), name
        else:
            raise ValueError(f"dual_form: layer {name!r} must start with one of the modules {sorted(modules)}.")
        try:
            layer = root.get_submodule(path) if path else root
        except AttributeError:
            raise ValueError(f"dual_form: no layer {name!r}; linear layers there: "
                             f"{', '.join(n for n, m in root.named_modules() if isinstance(m, nn.Linear))}.") from None
        if not isinstance(layer, nn.Linear):
            raise ValueError(f"dual_form: {name!r} is a {type(layer).__name__}; only nn.Linear layers have this "
                             f"dual form.")
        return root, layer

    def _attach(self, modules: Mapping[str, nn.Module]) -> None:
        resolved = {name: self._resolve(modules, name) for name in self.layer_names}
        for name, (_, layer) in resolved.items():
            if not all(p.requires_grad for p in layer.parameters()):
                raise DualFormError(f"dual_form: layer {name!r} is frozen (requires_grad=False): it never changes, "
                                    f"so it has no training patterns; record a trainable layer.")
        self.roots = {id(root): root for root, _ in resolved.values()}
        shapes = {name: LayerShape(m.in_features, m.out_features, m.bias is not None)
                  for name, (_, m) in resolved.items()}
        params = [f"{name}.{kind}" for name, (_, m) in resolved.items()
                  for kind in (("weight", "bias") if m.bias is not None else ("weight",))]
        itemsize = next(iter(resolved.values()))[1].weight.element_size()
        if self.planned_samples:
            self.fraction = pattern_store.choose_fraction(shapes, self.dtype, self.budget_bytes, self.planned_samples,
                                            self.planned_steps or self.planned_samples, itemsize, self.chunk_rows,
                                            self.fraction)
        minimum = (pattern_store.fixed_bytes(shapes, itemsize, 1) + pattern_store.pattern_bytes(shapes, self.dtype)
                   + 8 * 128 * len(shapes))
        if self.budget_bytes < minimum:
            raise StoreBudgetError(f"dual_form: budget_bytes={self.budget_bytes} is below the store's minimum "
                                   f"({minimum} bytes: W_0, one step-table chunk and one pattern per layer).")
        policy = {"fraction": float(self.fraction), "seed": self.seed, "rule": "seeded per-step sample fraction, "
                  "kept count = floor(fraction * samples seen)"}
        self.writer = PatternWriter(self.storage_dir / "patterns", shapes, params, self.dtype, self.budget_bytes,
                                    self.chunk_rows, policy)
        generator = torch.Generator().manual_seed(self.seed)
        self._probes = {name: torch.randn(s.d_in, generator=generator, dtype=torch.float64)
                        for name, s in shapes.items()}
        self.layers = {name: _Layer(name, layer, self._save_initial) for name, (_, layer) in resolved.items()}

    # ------------------------------------------------------------------------------------------------ hooks
    def on_experience_start(self, experience: int) -> None:
        self.experience = experience

    def on_experience_end(self, experience: int) -> None:
        if self.snapshots:
            folder = self.storage_dir / "models"
            folder.mkdir(parents=True, exist_ok=True)
            for layer in self.layers.values():       # hooks hold closures: a module with them does not pickle
                layer.handle.remove()
            for i, root in enumerate(self.roots.values()):
                torch.save(root, folder / f"after_exp{experience}{'' if i == 0 else f'_{i}'}.pt")
            for layer in self.layers.values():
                layer.hook()
        self.writer.flush()

    def on_batch_start(self, x: Tensor, y: Tensor) -> None:
        self.labels = y.detach().cpu()

    def _save_initial(self) -> None:
        """W_0, b_0: the weights at the first forward pass with gradients (before any recorded step)."""
        if self._started:
            return
        for name, layer in self.layers.items():
            bias = layer.module.bias
            self.writer.save_initial(name, layer.module.weight.detach().cpu().numpy().copy(),
                                     None if bias is None else bias.detach().cpu().numpy().copy())
        self._started = True

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._save_initial()            # a step without any forward of a recorded layer: W_0 is the weight now
        groups = self._groups(optimizer)
        row = np.zeros(1, step_dtype(len(self.writer.params)))[0]
        row["step"], row["experience"] = self.step, self.experience
        n_units = self._units()
        keep = self._selection(n_units)
        row["kept"] = len(keep)
        index = 0
        for name, layer in self.layers.items():
            calls = [c for c in layer.calls if c["g"] is not None]
            for c in calls:
                if c["input"]._version != c["version"]:
                    raise DualFormError(f"dual_form: the input of layer {name!r} was modified in place after its "
                                        f"forward; the recorded key x_t would be wrong.")
            self._check_gradients(name, layer, calls)
            for pname, p in layer.params():
                self._fill(row, index, pname, p, groups, optimizer)
                index += 1
            if calls and len(keep):
                self._write(name, calls, keep, n_units)
            layer.calls.clear()
        self.writer.append_step(row[None])
        self.writer.samples_seen += n_units
        self.step += 1
        self.labels = None

    # ------------------------------------------------------------------------------------------------ checks
    def _groups(self, optimizer: torch.optim.Optimizer) -> dict[int, dict]:
        if type(optimizer) is not torch.optim.SGD:
            raise DualFormError(
                f"dual_form: the optimizer is {type(optimizer).__name__}; only torch.optim.SGD (with or without "
                f"momentum) makes W_T = W_0 + Σ_t e_t x_tᵀ with per-pattern values e_t — an adaptive optimizer "
                f"(Adam, AdamW, ...) rescales each weight's update elementwise, so the update is not a sum of outer "
                f"products. Train with SGD to use the dual-form analysis.")
        return {id(p): g for g in optimizer.param_groups for p in g["params"]}

    def _fill(self, row: np.void, index: int, pname: str, p: nn.Parameter, groups: dict, optimizer) -> None:
        group = groups.get(id(p))
        if group is None:
            raise DualFormError(f"dual_form: {pname} is not in the optimizer's parameter groups; an untrained layer "
                                f"has no dual form to record.")
        if group.get("weight_decay", 0):
            raise DualFormError(
                f"dual_form: weight_decay={group['weight_decay']} on {pname}: each step then scales the weight by "
                f"(1 − ηλ), so W_T is not W_0 + Σ_t e_t x_tᵀ. Put the recorded layers in a parameter group with "
                f"weight_decay=0.")
        if group.get("maximize", False):
            raise DualFormError(f"dual_form: maximize=True on {pname} is not supported; minimize the negated loss.")
        active = p.grad is not None
        mu = float(group.get("momentum", 0.0))
        fresh = True
        if active and mu:
            buffer = optimizer.state[p].get("momentum_buffer")
            fresh = buffer is not self._buffers.get(pname)
            if fresh and not torch.equal(buffer, p.grad):
                raise DualFormError(
                    f"dual_form: the momentum buffer of {pname} existed before the recorder saw it (the recorder was "
                    f"attached after the optimizer's first step); attach it before training starts.")
            self._buffers[pname] = buffer
        row["lr"][index], row["momentum"][index] = group["lr"], mu
        row["dampening"][index], row["nesterov"][index] = group.get("dampening", 0.0), group.get("nesterov", False)
        row["active"][index], row["fresh"][index] = active, fresh

    def _check_gradients(self, name: str, layer: _Layer, calls: list[dict]) -> None:
        """The layer's gradient must be Σ_t ∂L/∂y_t x_tᵀ: compared along a random probe v (and the bias fully)."""
        weight, bias = layer.module.weight, layer.module.bias
        if weight.grad is None:
            if calls:
                raise DualFormError(f"dual_form: layer {name!r} has recorded patterns but no gradient at step "
                                    f"{self.step}.")
            return
        v = self._probes[name]
        if v.dtype != weight.grad.dtype or v.device != weight.grad.device:
            v = self._probes[name] = v.to(weight.grad)
        predicted = torch.zeros(weight.shape[0], dtype=weight.grad.dtype, device=weight.grad.device)
        bound = torch.zeros_like(predicted)
        bias_sum = torch.zeros_like(predicted)
        for c in calls:
            x = c["x"].reshape(-1, c["x"].shape[-1])
            g = c["g"].reshape(-1, c["g"].shape[-1])
            predicted += g.T @ (x @ v)
            bound += g.abs().T @ (x.abs() @ v.abs())
            bias_sum += g.sum(0)
        eps = torch.finfo(predicted.dtype).eps
        error = (weight.grad @ v - predicted).abs()
        bad = bool((error > 1e3 * eps * bound + 1e-30).any())
        if bias is not None and bias.grad is not None:
            bad |= not torch.allclose(bias.grad, bias_sum, rtol=1e3 * eps, atol=1e3 * eps * float(bias_sum.abs().max()))
        if bad:
            raise DualFormError(
                f"dual_form: at step {self.step} the gradient of layer {name!r} is not the sum of the recorded "
                f"per-sample outer products Σ_t ∂L/∂y_t x_tᵀ (max error {float(error.max()):.3g}). Something changed "
                f"it after backward (gradient clipping, DP noise, a projection such as GEM's) or the layer's weight is "
                f"used outside its forward; the dual form of the update does not hold.")

    # ------------------------------------------------------------------------------------------------ writing
    def _units(self) -> int:
        """Samples in this step: the labelled batch, else the first recorded call of the first layer."""
        if self.labels is not None:
            return len(self.labels)
        for layer in self.layers.values():
            for c in layer.calls:
                if c["g"] is not None:
                    return c["x"].shape[0]
        return 0

    def _selection(self, n_units: int) -> np.ndarray:
        """Kept sample positions of this step: ⌊f·(seen + n)⌋ − ⌊f·seen⌋ of them, drawn with a (seed, step) RNG."""
        seen, f = self.writer.samples_seen, float(self.fraction)
        k = int(np.floor(f * (seen + n_units) + 1e-9) - np.floor(f * seen + 1e-9))
        if k >= n_units:
            return np.arange(n_units)
        return np.sort(np.random.default_rng([self.seed, self.step]).permutation(n_units)[:k])

    def _write(self, name: str, calls: list[dict], keep: np.ndarray, n_units: int) -> None:
        labelled, claimed = self.labels is not None, False
        for i, c in enumerate(calls):
            x, g = c["x"], c["g"]
            b = x.shape[0]
            own = b == n_units and not claimed       # the batch itself; other calls (e.g. a buffer pass) are extra
            claimed |= own
            rows = keep if own else np.sort(np.random.default_rng([self.seed, self.step, i]).permutation(b)[
                : round(len(keep) * b / max(n_units, 1))])
            tokens = int(np.prod(x.shape[1:-1])) if x.dim() > 2 else 1
            sel = torch.as_tensor(rows, dtype=torch.long, device=x.device)
            xs = (x if len(rows) == b else x.index_select(0, sel)).reshape(-1, x.shape[-1])
            gs = (g if len(rows) == b else g.index_select(0, sel)).reshape(-1, g.shape[-1])
            meta = np.empty((len(rows) * tokens, len(pattern_store.META_COLUMNS)), np.int64)
            meta[:, 0], meta[:, 1] = self.step, self.experience
            unknown = np.full(len(rows), -1)          # per kept row, each repeated over its tokens
            meta[:, 2] = np.repeat(self.writer.samples_seen + rows if own else unknown, tokens)
            meta[:, 3] = np.repeat(self.labels.numpy()[rows] if own and labelled else unknown, tokens)
            meta[:, 4] = np.tile(np.arange(tokens), len(rows))
            self.writer.append(name, xs, gs, meta)

    # ------------------------------------------------------------------------------------------------ results
    def close(self, complete: bool = True) -> None:
        for layer in self.layers.values():
            layer.handle.remove()
        if self.writer is not None and not self.writer.complete:
            self.writer.close(complete)

    def store(self) -> PatternStore:
        """The store as written so far (flushed first)."""
        if not self.writer.complete:
            self.writer.flush()
        return PatternStore(self.storage_dir / "patterns")

    def reconstruct(self, layer: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``(W_0 + Σ_t e_t x_tᵀ, b_0 + Σ_t e_t)`` for the steps recorded so far (exact recordings only)."""
        store = self.store()
        if not store.manifest["complete"] and store.fraction == 1.0:
            store.manifest["complete"] = True        # still recording: everything so far is on disk
        return reconstruct(store, layer)


__all__ = ["DualFormError", "PatternRecorder", "coefficients", "reconstruct", "values"]
