"""Per-layer rules: each sample's gradient norm and the weighted sum of per-sample gradients of ONE module's own
parameters, from what its forward saw (activations ``A``) and the gradient of its output (``G``), without forming
per-sample gradients (ghost clipping; Li et al. 2022, Bu et al. 2023; phantom clipping for tied embeddings in
:mod:`clbench.privacy.tied`, Ding et al. 2024).

Shapes: sample ``i`` of a batch of ``B``; a layer applied at ``T`` positions (tokens, patches; ``T = 1`` for a
plain vector) has ``A_i ∈ R^{T×d}`` and ``G_i ∈ R^{T×p}``. For ``y = W a + b``::

    ∇W_i = G_iᵀ A_i                     ‖∇W_i‖² = ‖a_i‖² ‖g_i‖²                          (T = 1)
                                                = ‖G_iᵀ A_i‖²                            (d·p ≤ T(d+p))
                                                = Σ_{t,t'} (A_iA_iᵀ)_{tt'} (G_iG_iᵀ)_{tt'}   (Gram form, otherwise)
    ∇b_i = Σ_t G_{i,t}                  ‖∇b_i‖² = ‖Σ_t G_{i,t}‖²

and the book-kept weighted sum ``Σ_i w_i ∇W_i`` is ``Σ_i w_i M_i`` of the per-sample matrices ``M_i = G_iᵀA_i``
when they were formed for the norms, else ``(w ⊙ G)ᵀ A``, one GEMM over the ``B·T`` rows (:class:`Outer`). A module
called several times in one forward (weight sharing) contributes ``Σ_calls G_cᵀ A_c`` — the calls are concatenated
along ``T``, so the cross terms between calls are included.

:data:`RULES` maps a module TYPE (exact, not subclasses: a subclass may compute something else) to its rule;
:func:`register_rule` adds one. A module type that owns trainable parameters and has no rule is refused by
:class:`~clbench.privacy.tape.Tape` with :class:`UnsupportedLayerError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.utils.hooks import RemovableHandle

from clbench.privacy.packing import ROWS

if TYPE_CHECKING:
    from timm.models.vision_transformer import VisionTransformer

GRAM_CHUNK = 64          # samples per chunk when two uses' per-sample matrices are formed (clbench.privacy.tied)

REPLAYING: ContextVar[bool] = ContextVar("clbench_privacy_replaying", default=False)
"""True while :mod:`clbench.privacy.fallback` re-runs a module's forward per sample: the tape's hooks record
nothing then (the replay is not the model's forward)."""


class UnsupportedLayerError(TypeError):
    """A module owns trainable parameters for which no per-sample-norm rule exists (or uses them in a way the rule
    cannot follow); the message names the module and its parameters."""


@dataclass
class Call:
    """One forward call of a hooked module: what the rule saved (``saved``, detached), the tensor whose gradient
    is needed (``out``; dropped once its gradient hook is set) and, after the backward, that gradient (``grad``,
    same shape as ``out``). ``role`` names which use of the module's parameters the call records, for a rule that
    records several per forward (attention's projections). ``index``: the sample of each row when the call was made
on packed rows (:func:`clbench.privacy.packing.rows_of`; dimension 0 of ``out`` is then rows, not samples), and
    ``batch`` the batch size those rows belong to (set by the tape before the rule's operands are formed)."""

    saved: tuple[Tensor, ...]
    out: Tensor | None
    grad: Tensor | None = None
    role: Any = None
    index: Tensor | None = None
    batch: int | None = None


class Recorder:
    """What a rule's hook calls with each :class:`Call` of one module (named ``where`` in its model, for messages):
    keeps the gradient of ``call.out`` when the backward reaches it, then hands the call to ``store``.
    ``sample_second``: the module's tensors are ``(T, B, ...)`` and reach the rule as ``(B, T, ...)`` views;
    ``follow(call, out)`` is shown each call's output before it is dropped (:class:`~clbench.privacy.uses.Watch`)."""

    def __init__(self, store: Callable[[Call], None], where: str, sample_second: bool,
                 follow: Callable[[Call, Any], None] | None = None) -> None:
        self.store, self.where, self.sample_second, self.follow = store, where, sample_second, follow

    def __call__(self, call: Call) -> None:
        if REPLAYING.get():
            return
        sample_second = self.sample_second
        call.index = ROWS.get()
        if call.index is not None and sample_second:
            raise UnsupportedLayerError(f"the layer at {self.where!r} works on sample-second tensors and was called "
                                        f"on packed rows (rows_of): call it outside rows_of, or batch first.")

        def keep(grad: Tensor) -> None:
            call.grad = grad.transpose(0, 1) if sample_second else grad
        if sample_second:
            call.saved = tuple(s.transpose(0, 1) for s in call.saved)
        call.out.register_hook(keep)
        if self.follow is not None and not sample_second:
            self.follow(call, call.out)
        call.out = None                       # the gradient is what is needed; holding the output would keep it alive
        self.store(call)


@dataclass
class Rule:
    """How one module type's own parameters get per-sample squared norms and weighted gradient sums.

    ``capture(module, args, output) -> Call | None`` (None: nothing to record, e.g. no gradient will flow);
    ``operands(module, calls)``: what the two results are computed from (e.g. ``A, G``), formed once per batch;
    ``sq_norms(module, ops) -> (B,)`` ``Σ_params ‖∇θ_i‖²``; ``weighted(module, ops, w) -> {name: Σ_i w_i ∇θ_i}``.
    ``hook(module, record, rule) -> handles`` installs the capture (default: a forward hook on the module).
    ``subtree``: the rule covers the parameters of the module's descendants too (named as ``named_parameters``
    names them, e.g. ``mlp.0.weight``); the tape then hooks none of them separately. ``packed``: its operands
    accept calls on packed rows (``Call.index``, :mod:`clbench.privacy.packing`); the tape refuses such calls to a
    rule without it."""

    capture: Callable[[nn.Module, tuple, Any], Call | None]
    operands: Callable[[nn.Module, list[Call]], Any]
    sq_norms: Callable[[nn.Module, Any], Tensor]
    weighted: Callable[[nn.Module, Any, Tensor], dict[str, Tensor]]
    hook: Callable[[nn.Module, Recorder, Rule], list[RemovableHandle]] | None = None
    subtree: bool = False
    packed: bool = False

    def install(self, module: nn.Module, record: Recorder) -> list[RemovableHandle]:
        return (self.hook or forward_hook)(module, record, self)


RULES: dict[type, Rule] = {}

SEQUENCE_FIRST: dict[type, Callable[[nn.Module], bool]] = {}
"""Module types whose forward (own rule and every descendant's) works on tensors laid out ``(T, B, ...)``, sample
dimension second (e.g. ``nn.TransformerEncoderLayer(batch_first=False)``): type -> ``predicate(module)``. The tape
hands such calls to the rules sample-first (``(B, T, ...)`` views)."""


def register_rule(*types: type) -> Callable[[Rule], Rule]:
    """``register_rule(MyLayer)(Rule(capture, operands, sq_norms, weighted))``: the rule for modules of exactly these
    types."""
    def add(rule: Rule) -> Rule:
        for t in types:
            RULES[t] = rule
        return rule
    return add


def forward_hook(module: nn.Module, record: Recorder, rule: Rule) -> list[RemovableHandle]:
    """The default installation: a forward hook that records ``rule.capture(module, args, output)``."""
    def hook(m: nn.Module, args: tuple, output: Any) -> None:
        call = rule.capture(m, args, output)
        if call is not None:
            record(call)
    return [module.register_forward_hook(hook)]


def traced(out: Tensor | None) -> bool:
    """True when a gradient can flow back to ``out`` (training, not ``no_grad`` evaluation)."""
    return out is not None and out.requires_grad


# ----------------------------------------------------------------------------------------------- shared algebra
def as_sequence(t: Tensor) -> Tensor:
    """``(B, d) -> (B, 1, d)``, ``(B, ..., d) -> (B, T, d)`` with ``T`` the product of the middle dimensions."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


def join(parts: list[Tensor]) -> Tensor:
    """``parts`` joined along dimension 1 (a single part as it is: no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def sequences(module: nn.Module, calls: list[Call]) -> tuple[Tensor, Tensor]:
    """``A, G: (B, T_total, ·)``: the saved input and the output gradient of every call, joined along ``T``."""
    return join([as_sequence(c.saved[0]) for c in calls]), join([as_sequence(c.grad) for c in calls])


class Outer:
    """Per-sample gradients ``∇W_i = G_iᵀ A_i`` of a weight applied at ``T`` positions, from ``A: (n, T, d)`` and
    ``G: (n, T, p)`` with ``n = B·groups``: a block-diagonal weight of ``groups`` blocks ``(p, d)`` (a Conv's channel
    groups; 1 for a Linear), block ``j`` of sample ``i`` at row ``i·groups + j``. The cheaper exact form is chosen
    once, and both results come from it::

        T = 1           ‖∇W_i‖² = ‖a_i‖² ‖g_i‖²                      Σ_i w_i ∇W_i: one GEMM over the B rows
        d·p ≤ T(d+p)    M_i = G_iᵀ A_i formed (B·T·d·p multiply-adds) ‖M_i‖²,  Σ_i w_i M_i (B·d·p)
        otherwise       ‖∇W_i‖² = Σ (A_iA_iᵀ) ⊙ (G_iG_iᵀ)  (Gram: B·T²(d+p) < B·T·d·p)
                        Σ_i w_i ∇W_i = (w ⊙ G)ᵀ A: one GEMM over the B·T rows

    The per-sample matrices (``n·p·d`` numbers) are formed only when they are no larger than ``A`` and ``G``
    (``n·T·(d+p)``), at the first result asked for, and kept for the other; the Gram matrices (``n·T²``) only when
    ``T < d·p/(d+p) ≤ min(d, p)``, smaller still."""

    def __init__(self, a: Tensor, g: Tensor, groups: int = 1) -> None:
        self.a, self.g, self.groups = a, g, groups
        t, d, p = a.shape[1], a.shape[2], g.shape[2]
        self.formed = t > 1 and d * p <= t * (d + p)
        self._matrices: Tensor | None = None
        self._summed: Tensor | None = None

    def summed(self) -> Tensor:
        """``Σ_t G_{i,t}: (n, p)`` (a bias's per-sample gradient), formed once."""
        if self._summed is None:
            self._summed = summed(self.g)
        return self._summed

    def matrices(self) -> Tensor:
        """``M_i = G_iᵀ A_i: (n, p, d)``, formed once."""
        if self._matrices is None:
            self._matrices = torch.bmm(self.g.transpose(1, 2), self.a)
        return self._matrices

    def sq_norms(self) -> Tensor:
        """``‖∇W_i‖²: (B,)`` (the blocks of sample ``i`` summed)."""
        a, g = self.a, self.g
        if self.formed:
            total = sq(self.matrices())
        elif a.shape[1] == 1:
            total = sq(a) * sq(g)
        else:
            total = torch.linalg.vecdot(torch.bmm(a, a.transpose(1, 2)).flatten(1),
                                        torch.bmm(g, g.transpose(1, 2)).flatten(1))
        return total.view(-1, self.groups).sum(1)

    def weighted(self, w: Tensor) -> Tensor:
        """``Σ_i w_i ∇W_i: (groups·p, d)`` for ``w: (B,)`` (the blocks stacked by rows)."""
        a, g, groups = self.a, self.g, self.groups
        if self.formed:
            return torch.tensordot(w, self.matrices().view(len(w), -1, a.shape[-1]), dims=([0], [0]))
        if groups > 1:
            t = a.shape[1]
            return torch.einsum("bjtp,bjtd->jpd", (g * w.repeat_interleave(groups)[:, None, None]).view(
                -1, groups, t, g.shape[-1]), a.view(-1, groups, t, a.shape[-1])).flatten(0, 1)
        if g.shape[-1] > a.shape[-1]:
            return g.flatten(0, 1).t() @ (a * w[:, None, None]).flatten(0, 1)
        return (g * w[:, None, None]).flatten(0, 1).t() @ a.flatten(0, 1)


@dataclass
class Rows:
    """A linear layer's operands over rows of several samples (packed rows, :mod:`clbench.privacy.packing`):
    inputs ``a: (N, d)``, output gradients ``g: (N, p)``, the sample of each row ``index: (N,)``, batch size
    ``batch``; sample ``i``'s weight gradient is ``Σ_{r: index_r = i} g_r a_rᵀ``."""

    a: Tensor
    g: Tensor
    index: Tensor
    batch: int

    def groups(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``(samples (k,), a (k, n, d), g (k, n, p))`` for each group of the ``k`` samples that have exactly ``n``
        rows (``n ≥ 1``), each sample's rows in their order: sample ``i``'s rows with no padding."""
        order = torch.argsort(self.index, stable=True)
        index = self.index[order]
        counts = torch.bincount(index, minlength=self.batch)
        per_row = counts[index]
        for n in torch.unique(per_row).tolist():
            keep = per_row == n
            rows = order[keep]
            yield index[keep][::n], self.a[rows].view(-1, n, self.a.shape[-1]), self.g[rows].view(-1, n,
                                                                                                 self.g.shape[-1])

    def summed(self) -> Tensor:
        """``Σ_{r of i} g_r: (B, p)``."""
        return self.g.new_zeros(self.batch, self.g.shape[-1]).index_add_(0, self.index, self.g)


def rows(parts: list[tuple[Tensor, Tensor, Tensor | None]], batch: int) -> Rows:
    """:class:`Rows` from calls' ``(A, G, index)``: a packed call's ``A: (N, ..., d)`` rows as they are, a batched
    call's ``(B, T, d)`` as ``B·T`` rows of samples ``0..B-1``."""
    a, g, index = [], [], []
    for ai, gi, ii in parts:
        if ii is None:
            ai, gi = as_sequence(ai), as_sequence(gi)
            ii = torch.arange(batch, device=gi.device).repeat_interleave(gi.shape[1])
        else:
            per_row = gi[0].numel() // gi.shape[-1] if len(gi) else 1
            ii = ii.repeat_interleave(per_row)
        a.append(ai.reshape(-1, ai.shape[-1]))
        g.append(gi.reshape(-1, gi.shape[-1]))
        index.append(ii)
    return Rows(*(t[0] if len(t) == 1 else torch.cat(t) for t in (a, g, index)), batch)


def rows_sq_norms(r: Rows) -> Tensor:
    """``‖Σ_{r of i} g_r a_rᵀ‖²: (B,)``, group by group of samples with equal row counts
    (:class:`Outer`: the Gram within each sample's rows, or its per-sample matrices)."""
    out = r.g.new_zeros(r.batch)
    for samples, a, g in r.groups():
        out[samples] = Outer(a, g).sq_norms()
    return out


def rows_weighted(r: Rows, w: Tensor) -> Tensor:
    """``Σ_i w_i ∇W_i = Σ_r w_{s(r)} g_r a_rᵀ: (p, d)``, one GEMM over the rows (the narrower side scaled)."""
    if r.g.shape[-1] > r.a.shape[-1]:
        return r.g.t() @ (r.a * w[r.index, None])
    return (r.g * w[r.index, None]).t() @ r.a


def summed(g: Tensor) -> Tensor:
    """``Σ_t G_{i,t}: (B, p)`` (gradient of a bias or of any parameter added at every position)."""
    return g.sum(1)


def elementwise(x: Tensor, g: Tensor) -> Tensor:
    """``Σ_t X_{i,t} ⊙ G_{i,t}: (B, d)`` (gradient of a per-feature scale)."""
    return (x * g).sum(1)


def sq(v: Tensor) -> Tensor:
    """``‖v_i‖²`` of per-sample vectors ``(B, ...)`` -> ``(B,)`` (one reduction, no squared copy)."""
    return torch.linalg.vector_norm(v.flatten(1), dim=1).square()


def weighted_sum(v: Tensor, w: Tensor) -> Tensor:
    """``Σ_i w_i v_i`` over the first dimension."""
    return torch.tensordot(w, v, dims=([0], [0]))


def parametrized(module: nn.Module) -> bool:
    """``torch.nn.utils.parametrize.is_parametrized(module)``, read from the module's children (the torch function's
    ``getattr`` of a missing attribute raises and catches an error inside ``Module.__getattr__``: slow, per call)."""
    return isinstance(module._modules.get("parametrizations"), nn.ModuleDict) and parametrize.is_parametrized(module)


def own(module: nn.Module) -> dict[str, nn.Parameter]:
    """The trained parameters its rule answers for: the module's own (not its children's), or, for a type whose rule
    covers its ``subtree`` and for a parametrized module (``weight_norm``, ...; its originals live in children),
    every one under it."""
    rule = RULES.get(type(module))
    if (rule is not None and rule.subtree) or parametrized(module):
        return {n: p for n, p in module.named_parameters() if p.requires_grad}
    out: dict[str, nn.Parameter] = {}
    for n, p in module._parameters.items():        # named_parameters(recurse=False) without its generator machinery
        if p is not None and p.requires_grad and all(p is not q for q in out.values()):
            out[n] = p
    return out


# ------------------------------------------------------------------------------------------------------- Linear
Operands = Callable[[nn.Module, list[Call]], tuple[Tensor, Tensor]]


def _affine_capture(module: nn.Module, args: tuple, output: Any) -> Call | None:
    out = output[1] if isinstance(output, tuple) else output        # tangent layers: (y, ẏ); Δ acts on ẏ
    return Call((args[0].detach(),), out) if traced(out) else None


def affine_rule(operands: Operands = sequences, capture: Callable = _affine_capture) -> Rule:
    """A rule for ``y = W a + b`` with ``W: (p, ...)``; ``operands(module, calls) -> (A: (B, T, d), G: (B, T, p))``
    (default: the saved inputs and the output gradients of the calls, joined along ``T``; calls on packed rows:
    :class:`Rows`, and the rule accepts them)."""
    def sq_norms(module: nn.Module, ops: Outer | Rows) -> Tensor:
        params = own(module)
        if isinstance(ops, Rows):
            total = rows_sq_norms(ops) if "weight" in params else ops.g.new_zeros(ops.batch)
            return total + sq(ops.summed()) if "bias" in params else total
        total = ops.sq_norms() if "weight" in params else ops.g.new_zeros(len(ops.g))
        return total + sq(ops.summed()) if "bias" in params else total

    def weighted(module: nn.Module, ops: Outer | Rows, w: Tensor) -> dict[str, Tensor]:
        params = own(module)
        packed = isinstance(ops, Rows)
        if "weight" in params:
            value = rows_weighted(ops, w) if packed else ops.weighted(w)
            out = {"weight": value.view_as(params["weight"])}
        else:
            out = {}
        if "bias" in params:
            out["bias"] = weighted_sum(ops.summed(), w)
        return out

    def joined(module: nn.Module, calls: list[Call]) -> Outer | Rows:
        if operands is sequences and any(c.index is not None for c in calls):
            return rows([(c.saved[0], c.grad, c.index) for c in calls], calls[0].batch)
        return Outer(*operands(module, calls))

    return Rule(capture, joined, sq_norms, weighted, packed=operands is sequences)


def vector_rule(capture: Callable, grads: Callable[[nn.Module, list[Call]], dict[str, Tensor]],
                hook: Callable | None = None) -> Rule:
    """A rule for parameters whose per-sample gradients are small enough to form: ``grads(module, calls) ->
    {name: (B, *param.shape)-like}``; norms and weighted sums are read off them."""
    return Rule(capture, grads,
                lambda module, ops: torch.stack([sq(v) for v in ops.values()]).sum(0),
                lambda module, ops, w: {n: weighted_sum(v, w).view_as(own(module)[n]) for n, v in ops.items()},
                hook)


# Operands of a rule whose parameters act in several parts: ``linear`` = {parameter name: ([(A, G), ...], stack)}
# for parameters that act as linear maps A -> G on the tokens (per-sample gradient Σ_parts G_iᵀA_i over DISJOINT
# blocks of the parameter; ``stack`` lays the parts' weighted sums out in the parameter's shape), and ``direct`` =
# {parameter name: per-sample gradient (B, ...)} for the rest (biases, inputs-as-parameters); formed once per batch,
# for the trained parameters only. :func:`parts_rule` turns each pair into an :class:`Outer`.
LinearParts = dict[str, tuple[list[tuple[Tensor, Tensor]], Callable[[list[Tensor]], Tensor]]]
DirectParts = dict[str, Tensor]
OuterParts = dict[str, tuple[list[Outer], Callable[[list[Tensor]], Tensor]]]


def parts_sq_norms(module: nn.Module, ops: tuple[OuterParts, DirectParts]) -> Tensor:
    """``Σ_params ‖∇θ_i‖²`` from the linear parts (each a disjoint block) and :data:`DirectParts`."""
    linear, direct = ops
    parts = [outer.sq_norms() for outers, _ in linear.values() for outer in outers]
    parts += [sq(v) for v in direct.values()]
    return torch.stack(parts).sum(0)


def parts_weighted(module: nn.Module, ops: tuple[OuterParts, DirectParts], w: Tensor) -> dict[str, Tensor]:
    """``{name: Σ_i w_i ∇θ_i}`` from the same operands."""
    linear, direct = ops
    params = own(module)
    out = {n: stack([outer.weighted(w) for outer in outers]) for n, (outers, stack) in linear.items()}
    out.update({n: weighted_sum(v, w).view_as(params[n]) for n, v in direct.items()})
    return out


def stack_rows(parts: list[Tensor]) -> Tensor:
    """Blocks stacked by rows (a single part as it is)."""
    return torch.cat(parts, 0)


def trained_parts(module: nn.Module, linear: LinearParts, direct: DirectParts) -> tuple[LinearParts, DirectParts]:
    """The operands of the module's trained parameters only."""
    params = own(module)
    return {n: v for n, v in linear.items() if n in params}, {n: v for n, v in direct.items() if n in params}


def parts_rule(capture: Callable, operands: Callable[[nn.Module, list[Call]], tuple[LinearParts, DirectParts]],
               hook: Callable | None = None, subtree: bool = False) -> Rule:
    """A rule whose ``operands`` give :data:`LinearParts` and :data:`DirectParts`."""
    def outers(module: nn.Module, calls: list[Call]) -> tuple[OuterParts, DirectParts]:
        linear, direct = operands(module, calls)
        return {n: ([Outer(a, g) for a, g in pairs], stack) for n, (pairs, stack) in linear.items()}, direct

    return Rule(capture, outers, parts_sq_norms, parts_weighted, hook, subtree)


LINEAR = register_rule(nn.Linear)(affine_rule())
"""``nn.Linear``: ``y = W a + b`` (a tangent linear layer registers it too, :mod:`clbench.tangent.rules`)."""


def _patches(module: nn.Module, x: Tensor) -> Tensor:
    """``im2col`` patches of a Conv1d/Conv2d input ``x: (B, C, *S)`` -> ``(B, L, C·Πk)`` over the ``L`` output
    positions (the module's padding, of any mode, applied first; a Conv1d as a Conv2d of height 1)."""
    pad = module._reversed_padding_repeated_twice
    if any(pad):
        x = F.pad(x, pad, mode="constant" if module.padding_mode == "zeros" else module.padding_mode)
    if isinstance(module, nn.Conv1d):
        x, kernel, dilation, stride = x.unsqueeze(2), (1, *module.kernel_size), (1, *module.dilation), \
            (1, *module.stride)
    else:
        kernel, dilation, stride = module.kernel_size, module.dilation, module.stride
    return F.unfold(x, kernel, dilation, 0, stride).transpose(1, 2)


def _conv_operands(module: nn.Module, calls: list[Call]) -> tuple[Outer, Tensor]:
    """The weight's :class:`Outer` over patches ``A: (B·g, L, C/g·Πk)`` and output gradients ``G: (B·g, L, p/g)``
    per sample and channel group ``g`` (group ``j`` of sample ``i`` at row ``i·g + j``), and the bias's per-sample
    gradient ``Σ_l G_{i,l}: (B, p)``."""
    a = join([_patches(module, c.saved[0]) for c in calls])
    g = join([c.grad.flatten(2).transpose(1, 2) for c in calls])
    groups, (b, n) = module.groups, g.shape[:2]
    return Outer(a.view(b, n, groups, -1).transpose(1, 2).reshape(b * groups, n, -1),
                 g.view(b, n, groups, -1).transpose(1, 2).reshape(b * groups, n, -1), groups), summed(g)


def _conv_sq_norms(module: nn.Module, ops: tuple[Outer, Tensor]) -> Tensor:
    outer, bias = ops
    params = own(module)
    total = outer.sq_norms() if "weight" in params else bias.new_zeros(len(bias))
    return total + sq(bias) if "bias" in params else total


def _conv_weighted(module: nn.Module, ops: tuple[Outer, Tensor], w: Tensor) -> dict[str, Tensor]:
    outer, bias = ops
    params = own(module)
    out = {}
    if "weight" in params:
        out["weight"] = outer.weighted(w).reshape(params["weight"].shape)
    if "bias" in params:
        out["bias"] = weighted_sum(bias, w)
    return out


CONV = register_rule(nn.Conv1d, nn.Conv2d)(Rule(_affine_capture, _conv_operands, _conv_sq_norms, _conv_weighted))
"""``nn.Conv1d`` / ``nn.Conv2d`` (any padding mode, stride, dilation and groups) as a linear layer on the unfolded
patches of each channel group ``j``: ``A_{i,j} = unfold(x_i)_jᵀ: (L, C/g·Πk)``, ``G_{i,j}: (L, p/g)`` over the ``L``
output positions, ``∇W_{i,j} = G_{i,j}ᵀ A_{i,j}`` (the rows of group ``j``), ``∇b_i = Σ_l G_{i,l}``."""


# ----------------------------------------------------------------------------------------- per-feature affine maps
def scale_rule(features: Callable[[nn.Module, Tensor], Tensor], weight: str = "weight",
               channels_first: bool = False) -> Rule:
    """A rule for ``y = γ ⊙ x̃ + β`` per feature, ``x̃ = features(module, saved input)`` (features last)::

        ∇γ_i = Σ_t x̃_{i,t} ⊙ G_{i,t}          ∇β_i = Σ_t G_{i,t}

    (on packed rows: the sums over sample ``i``'s rows). ``channels_first``: the module's output holds the features
    at dimension 1 (``(B, C, *S)``, GroupNorm), moved last for the sums."""
    def grads(module: nn.Module, calls: list[Call]) -> dict[str, Tensor]:
        params = own(module)
        if any(c.index is not None for c in calls):
            r = rows([(features(module, c.saved[0]), c.grad, c.index) for c in calls], calls[0].batch)
            per_sample = {weight: Rows(r.a, r.a * r.g, r.index, r.batch), "bias": r}
            return {n: v.summed() for n, v in per_sample.items() if n in params}
        g = join([as_sequence(c.grad.movedim(1, -1) if channels_first else c.grad) for c in calls])
        out = {}
        if weight in params:
            x = join([as_sequence(features(module, c.saved[0])) for c in calls])
            out[weight] = elementwise(x, g)
        if "bias" in params:
            out["bias"] = summed(g)
        return out

    rule = vector_rule(_affine_capture, grads)
    rule.packed = not channels_first
    return rule


def normalized(module: nn.Module, x: Tensor) -> Tensor:
    """``x̂ = (x − μ)/σ`` over the normalized (last) dimensions, flattened to one feature axis."""
    shape = tuple(module.normalized_shape) if isinstance(module, nn.LayerNorm) else tuple(x.shape[-1:])
    return F.layer_norm(x, shape, None, None, module.eps).flatten(x.dim() - len(shape))


def rms_normalized(module: nn.RMSNorm, x: Tensor) -> Tensor:
    """``x̂ = x / √(mean(x²) + ε)`` over the normalized (last) dimensions, flattened to one feature axis."""
    shape = tuple(module.normalized_shape)
    return F.rms_norm(x, shape, None, module.eps).flatten(x.dim() - len(shape))


def group_normalized(module: nn.GroupNorm, x: Tensor) -> Tensor:
    """``x̂ = (x − μ_g)/σ_g`` per sample and channel group, channels moved last: ``(B, C, *S) -> (B, *S, C)``."""
    return F.group_norm(x, module.num_groups, None, None, module.eps).movedim(1, -1)


LAYER_NORM = register_rule(nn.LayerNorm)(scale_rule(normalized))
RMS_NORM = register_rule(nn.RMSNorm)(scale_rule(rms_normalized))
GROUP_NORM = register_rule(nn.GroupNorm)(scale_rule(group_normalized, channels_first=True))
LAYER_SCALE = scale_rule(lambda module, x: x, weight="gamma")
"""LayerNorm ``y = γ ⊙ x̂ + β`` (torch's; timm's, which computes the same, and timm's LayerScale ``y = γ ⊙ x`` are
registered by :mod:`clbench.models.vit`, the owner of the timm models: importing timm takes seconds that a model
without it, such as the sequence model, does not pay); RMSNorm ``y = γ ⊙ x/rms(x)``; GroupNorm ``y = γ_c x̂ + β_c``
with ``x̂`` normalized per sample and channel group (channels at dimension 1)."""


# ---------------------------------------------------------------------------------------------------- Embedding
def _embedding_capture(module: nn.Embedding, args: tuple, output: Tensor) -> Call | None:
    if module.max_norm is not None or module.scale_grad_by_freq or module.sparse:
        raise UnsupportedLayerError(f"Embedding {module}: per-sample norms do not support max_norm, "
                                    f"scale_grad_by_freq or sparse gradients.")
    return Call((args[0].detach(),), output) if traced(output) else None


def embedding_ids_grads(module: nn.Module, calls: list[Call]) -> tuple[Tensor, Tensor]:
    """``ids: (B, T)`` and ``G: (B, T, d)`` of every lookup call; positions holding ``padding_idx`` (which gets no
    gradient) have ``G = 0``."""
    ids = join([c.saved[0].reshape(len(c.saved[0]), -1) for c in calls])
    g = join([as_sequence(c.grad) for c in calls])
    if getattr(module, "padding_idx", None) is not None:
        g = g * (ids != module.padding_idx).unsqueeze(-1).to(g.dtype)
    return ids, g


def embedding_sq_norms(ids: Tensor, g: Tensor) -> Tensor:
    """``‖∇E_i‖² = Σ_{t,t'} 1[id_t = id_t'] (G_iG_iᵀ)_{tt'}`` (rows hit several times add up) -> ``(B,)``."""
    same = (ids.unsqueeze(2) == ids.unsqueeze(1)).to(g.dtype)
    return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


def embedding_weighted(ids: Tensor, g: Tensor, w: Tensor, num_embeddings: int) -> Tensor:
    """``Σ_i w_i ∇E_i: (V, d)``: the weighted output gradients scattered into their rows."""
    out = g.new_zeros(num_embeddings, g.shape[-1])
    return out.index_add_(0, ids.flatten(), (g * w[:, None, None]).flatten(0, 1))


register_rule(nn.Embedding)(Rule(
    _embedding_capture, embedding_ids_grads,
    lambda module, ops: embedding_sq_norms(*ops),
    lambda module, ops, w: {"weight": embedding_weighted(*ops, w, module.num_embeddings)}))
"""``nn.Embedding``: ``∇E_i = Σ_t e_{id_t} G_{i,t}ᵀ`` (rows of the one-hot ids)."""


# ------------------------------------------------------------------------------- additive parameters of a model
def additive_rule(positions: Callable[[nn.Module], dict[str, slice]], site: Callable[[nn.Module], nn.Module],
                  use_input: int | None = 0) -> Rule:
    """Parameters ADDED to a token tensor ``X: (B, N, D)``: the per-sample gradient of a parameter added at
    positions ``s`` (broadcast over the batch) is ``G_{i,s}``, the gradient of ``X`` there.

    ``site(module)`` is the submodule whose forward receives ``X`` (its argument ``use_input``): a forward
    pre-hook records it. ``positions(module) -> {param name: slice of N}`` (the parameter's shape is
    ``(1, |s|, D)`` or ``(|s|, D)``)."""
    def hook(module: nn.Module, record: Recorder, rule: Rule) -> list[RemovableHandle]:
        def pre(m: nn.Module, args: tuple) -> None:
            x = args[use_input]
            if traced(x):
                record(Call((), x))
        return [site(module).register_forward_pre_hook(pre)]

    def grads(module: nn.Module, calls: list[Call]) -> dict[str, Tensor]:
        if len(calls) != 1:
            raise UnsupportedLayerError(f"{type(module).__name__}: its additive parameters were used "
                                        f"{len(calls)} times in one forward; per-sample norms expect one use.")
        params, g = own(module), calls[0].grad
        return {n: g[:, s] for n, s in positions(module).items() if n in params}

    return vector_rule(lambda *a: None, grads, hook)


def _vit_positions(vit: VisionTransformer) -> dict[str, slice]:
    if vit.reg_token is not None or vit.no_embed_class or vit.dynamic_img_size:
        raise UnsupportedLayerError("VisionTransformer with register tokens, no_embed_class or dynamic image size: "
                                    "per-sample norms of cls_token/pos_embed follow timm's default layout only.")
    return {"cls_token": slice(0, 1), "pos_embed": slice(None)}


VIT_TOKENS = additive_rule(_vit_positions, lambda vit: vit.pos_drop)
"""timm ``VisionTransformer``'s own ``cls_token`` (concatenated at position 0) and ``pos_embed`` (added at every
position): ``∇cls_i = G_{i,0}``, ``∇pos_i = G_i``, with ``G`` the gradient of the tokens entering ``pos_drop``
(registered by :mod:`clbench.models.vit`)."""


__all__ = ["CONV", "GROUP_NORM", "LAYER_NORM", "LAYER_SCALE", "LINEAR", "REPLAYING", "RMS_NORM", "RULES",
           "SEQUENCE_FIRST", "VIT_TOKENS", "Call", "DirectParts", "LinearParts", "Outer", "OuterParts", "Recorder",
           "Rows", "Rule", "UnsupportedLayerError", "additive_rule", "affine_rule", "embedding_ids_grads",
           "embedding_sq_norms", "embedding_weighted", "group_normalized", "normalized", "parts_rule", "parts_sq_norms",
           "parts_weighted", "register_rule", "rms_normalized", "rows", "rows_sq_norms", "rows_weighted", "scale_rule",
           "stack_rows", "trained_parts", "vector_rule"]
