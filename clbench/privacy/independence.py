"""Sample independence, checked before the first private step: per-sample gradients exist only when each sample's
output depends on that sample alone. A model that mixes the samples of a batch in its forward (batch statistics:
``nn.BatchNorm`` in training, ``F.batch_norm(..., training=True)``, ``z - z.mean(0)``) has no per-sample gradient,
so no clipping of "per-sample" norms bounds one sample's influence and the ε reported would not hold: it is refused.

The test: replay each recorded forward call of the tape's models (:class:`RootCall`: its arguments and the random
number generator's state before it) twice without gradients, with the same generator state (dropout draws the same
masks), once as it was and once with the second half of the batch replaced by copies of the first half's samples
(index ``π = [0, 1, …, h−1, 0, 1, …]``, ``h = ⌊B/2⌋``; an argument is split by sample when its leading dimension is
``B``). If no sample's output depends on another's, the outputs of the first ``h`` samples are the same in both
(to :func:`~clbench.privacy.tape.relative_tolerance` of their largest entry). Outputs without a sample dimension
(packed rows, :mod:`clbench.privacy.packing`) are not compared: their rows cannot be told apart here. When they
differ, the two replays run again under a ``TorchFunctionMode`` that keeps
each operation's result on the first ``h`` samples; the first operation whose result differs is the one that mixes
the samples, named with the module whose forward made it.

Cost: two forwards without gradients, once per training call (and in every
:func:`~clbench.privacy.tape.per_sample_grad_norms`). The models' buffers (BatchNorm's running statistics) and the
generator's state are restored after the replays (a buffer only when the replay changed it). Other forward hooks
on the models see the two replays, run without gradients: a hook that records training calls (the dual-form
PatternRecorder records only outputs that require grad) skips them; one that counts every call counts two more at the
first step. A batch of one sample cannot be tested (nothing to mix with);
the check then waits for the first batch of at least two.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from clbench.privacy.rules import UnsupportedLayerError


@dataclass
class RootCall:
    """One forward call of a model: ``root(*args, **kwargs)``, the CPU (and CUDA) generator states before it, and
    which of its output tensors carried a gradient (by position among the output's tensors)."""

    root: nn.Module
    args: tuple
    kwargs: dict
    cpu_state: Tensor
    cuda_states: list[Tensor] | None
    traced: list[int]

    @classmethod
    def before(cls, root: nn.Module, args: tuple, kwargs: dict) -> RootCall:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(root, args, kwargs, torch.get_rng_state(), cuda, [])


def _tensors(out: Any) -> list[Tensor]:
    return [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]


def _permuted(value: Any, index: Tensor, batch: int) -> Any:
    return tree_map(lambda t: t[index.to(t.device)] if isinstance(t, Tensor) and t.dim() and t.shape[0] == batch
                    else t, value)


@contextmanager
def _restored(roots: list[nn.Module], call: RootCall) -> Iterator[None]:
    """Run with the generator states ``call`` saw, then put back the generators and every buffer of ``roots``."""
    buffers = [(b, b.detach().clone()) for root in roots for b in root.buffers()]
    devices = list(range(len(call.cuda_states))) if call.cuda_states is not None else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.set_rng_state(call.cpu_state)
        if call.cuda_states is not None:
            torch.cuda.set_rng_state_all(call.cuda_states)
        try:
            yield
        finally:
            for b, saved in buffers:
                if not torch.equal(b, saved):             # untouched buffers keep their version (autograd)
                    b.copy_(saved)


def _run(roots: list[nn.Module], call: RootCall, index: Tensor | None, batch: int,
         mode: TorchFunctionMode | None = None) -> list[Tensor]:
    """The call's output tensors (those that carried a gradient), replayed with the batch as it was (``index``
    None) or re-indexed by sample (under ``mode`` when given)."""
    args, kwargs = (call.args, call.kwargs) if index is None else (_permuted(call.args, index, batch),
                                                                     _permuted(call.kwargs, index, batch))
    with _restored(roots, call), mode or nullcontext():
        outs = _tensors(call.root(*args, **kwargs))
    return [outs[k] for k in call.traced]


def _differ(a: Tensor, b: Tensor, batch: int, half: int, batched_only: bool = False) -> bool:
    """Whether ``a`` and ``b`` differ on the first ``half`` samples (all of them when there is no sample
    dimension, unless ``batched_only``), beyond rounding."""
    if batched_only and not (a.dim() and a.shape[0] == batch):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    if not (a.is_floating_point() or a.is_complex()):
        a, b = a.double(), b.double()
    if a.dim() and a.shape[0] == batch:
        a, b = a[:half], b[:half]
    scale = a.abs().max() if a.numel() else 0.0
    tolerance = float(torch.finfo(a.dtype if a.is_floating_point() else torch.float64).eps) ** 0.5
    return bool(a.numel()) and bool((a - b).abs().max() > tolerance * max(float(scale), 1e-30))


class _Operations(TorchFunctionMode):
    """Keeps ``(operation, module path, results)`` of every operation of a forward, results on the first ``half``
    samples (whole when they have no sample dimension)."""

    def __init__(self, stack: list[str], batch: int, half: int) -> None:
        super().__init__()
        self.stack, self.batch, self.half = stack, batch, half
        self.seen: list[tuple[str, str, list[Tensor]]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        with torch._C.DisableTorchFunction():
            kept = [t[:self.half].clone() if t.dim() and t.shape[0] == self.batch else t.clone()
                    for t in _tensors(out)]
        self.seen.append((getattr(func, "__name__", str(func)), self.stack[-1], kept))
        return out


def _culprit(roots: list[nn.Module], call: RootCall, index: Tensor, batch: int, half: int) -> str:
    """``'<operation>' in the forward of <Type> at '<path>'``: the first operation of the call whose results on the
    first samples differ between the two replays."""
    names = {m: f"{type(m).__qualname__} at {n or '<root>'!r}" for n, m in call.root.named_modules()}
    stack = [names[call.root]]

    def enter(m: nn.Module, args: tuple) -> None:
        stack.append(names.get(m, type(m).__qualname__))

    def leave(m: nn.Module, args: tuple, out: Any) -> None:
        stack.pop()
    handles = [h for m in names for h in (m.register_forward_pre_hook(enter),
                                          m.register_forward_hook(leave, always_call=True))]
    runs = []
    try:
        for ix in (None, index):
            mode = _Operations(stack, batch, half)
            stack[:] = [names[call.root]]
            _run(roots, call, ix, batch, mode)
            runs.append(mode.seen)
    finally:
        for h in handles:
            h.remove()
    for (op, where, first), (_, _, second) in zip(*runs):
        if len(first) != len(second) or any(_differ(a, b, batch, half) for a, b in zip(first, second)):
            return f"{op!r} in the forward of {where}"
    return f"the forward of {names[call.root]} (no single operation found)"


def check_independent(calls: list[RootCall], batch: int) -> bool:
    """Raise :class:`~clbench.privacy.rules.UnsupportedLayerError` naming the operation that mixes samples when a
    replayed call's outputs for some samples depend on the others (see the module docstring); False when the batch
    is too small to test (one sample), True when tested."""
    if batch < 2:
        return False
    half = batch // 2
    index = torch.arange(batch)
    index[half:] = torch.arange(batch - half) % half
    roots = list({id(c.root): c.root for c in calls}.values())
    for call in calls:
        plain, changed = _run(roots, call, None, batch), _run(roots, call, index, batch)
        if any(_differ(a, b, batch, half, batched_only=True) for a, b in zip(plain, changed)):
            raise UnsupportedLayerError(
                f"per-sample gradients do not exist for this model: {_culprit(roots, call, index, batch, half)} "
                f"mixes the samples of a batch (a sample's output changed when other samples of the batch were "
                f"replaced); private training needs each sample's loss to depend on that sample alone: use a "
                f"per-sample normalization (LayerNorm, GroupNorm) instead of batch statistics.")
    return True


__all__ = ["RootCall", "check_independent"]
