"""Mixed precision (``--amp``): the run's bf16 autocast, and the float32 escapes of the code that must not run in bf16.

:func:`autocast` is the one autocast region the runner puts around a run. Inside it matrix products (``linear``,
``matmul``, ``bmm``, convolutions) run in bf16 and leave bf16 outputs. A loss built from such outputs with its own
in-place writes, ``exp``/``log`` chains or ops that CUDA autocast refuses (``binary_cross_entropy``) either fails on
mixed dtypes or loses the digits it needs (``log(1 − p)`` with ``p`` rounded to 1 in bf16's 8-bit mantissa is
``-inf``): :func:`in_float32` calls it with autocast off and its bf16/fp16 tensor arguments cast to float32
(:func:`float32`); the cast is differentiable, so gradients flow back to the bf16 outputs. Without autocast and with
float32 or float64 arguments both are plain calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

HALF = (torch.float16, torch.bfloat16)


def autocast(amp: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """``--amp``: one bf16 autocast region around the whole run (every training and evaluation step), on CPU and
    CUDA alike, with autocast's weight cache OFF (``cache_enabled=False``); without ``amp`` a null context.

    The cache keeps the bf16 copy of each fp32 leaf weight until the OUTERMOST autocast region exits, so with one
    region around the run every forward pass would use the bf16 copy of the INITIAL weights: the loss does not move
    and evaluation scores the initial model (the quick suite on an H200: joint last_acc 7.96 vs 94.07 in fp32).
    Without the cache each op casts the weight it reads as it is now. Entering autocast per forward pass instead
    would need one entry in every training loop (Avalanche's templates and their plugins' own forwards, ``fit``,
    MER's inner steps, the evaluators); one region here covers them all. Backward passes and optimizer steps run
    inside the region too: backward ops run in the dtype of their forward ops whatever the region (PyTorch's
    autocast notes) and optimizer updates are not autocast ops, so they stay in the parameters' float32. No
    gradient scaling: bf16 has float32's exponent range."""
    if not amp:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


def float32(value: Any) -> Any:
    """A bf16/fp16 tensor cast to float32; anything else (float32/float64 tensors, integers, non-tensors) as is."""
    return value.float() if isinstance(value, Tensor) and value.dtype in HALF else value


def in_float32(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with autocast disabled on the device of the first tensor argument (CPU without one)
    and every bf16/fp16 tensor argument cast to float32 (:func:`float32`)."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
    device = tensors[0].device.type if tensors else "cpu"
    with torch.autocast(device, enabled=False):
        return fn(*map(float32, args), **{k: float32(v) for k, v in kwargs.items()})


__all__ = ["HALF", "autocast", "float32", "in_float32"]
