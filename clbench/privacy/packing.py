"""Packed rows: a layer called on rows gathered from several samples, each row tagged with its sample.

A model that needs a layer only at some positions of each sample (the output layer at the positions that have a
target; packed sequences) gathers those rows into one ``(N, d)`` tensor and calls the layer inside
:func:`rows_of`, giving each row's sample index::

    mask = targets > 0                                   # (B, L)
    index = mask.nonzero()[:, 0]                         # (N,) the sample of each row
    with rows_of(index):
        scores = self.output(h[mask])                    # (N, V): one row per target, not B·L rows

Outside private training this is a plain call (a context variable is set and reset). While a
:class:`~clbench.privacy.tape.Tape` is installed, every hooked call made inside the block records the index, and
its rule (one that supports packed rows: ``nn.Linear``, LayerNorm, LayerScale, a bare product with a weight) forms
each sample's gradient from that sample's rows only. For ``y_r = W a_r`` on rows ``r`` with sample ``s(r)``::

    ∇W_i = Σ_{r: s(r) = i} g_r a_rᵀ
    ‖∇W_i‖² = Σ_{r, r': s(r) = s(r') = i} ⟨a_r, a_r'⟩ ⟨g_r, g_r'⟩          (the ghost Gram within sample i's rows)

computed per group of samples with the same number of rows (no padding), or through per-sample matrices when a
sample has many rows (the same choice as :class:`~clbench.privacy.rules.Outer`); the weighted sum
``Σ_i w_i ∇W_i = Σ_r w_{s(r)} g_r a_rᵀ`` is one GEMM over the ``N`` rows. Rows of one sample need not be adjacent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from torch import Tensor

ROWS: ContextVar[Tensor | None] = ContextVar("clbench_packed_rows", default=None)
"""The sample index ``(N,)`` of the rows passed to the layers called in the current :func:`rows_of` block."""


@contextmanager
def rows_of(index: Tensor) -> Iterator[None]:
    """Layers called in this block get rows (dimension 0) belonging to samples ``index: (N,)`` (int, values in
    ``0..B-1``) instead of one sample per leading entry."""
    if index.dim() != 1 or index.dtype.is_floating_point or index.dtype.is_complex:
        raise ValueError(f"rows_of: the sample index must be a 1-d integer tensor (one entry per row), got "
                         f"{index.dtype} of shape {tuple(index.shape)}.")
    token = ROWS.set(index)
    try:
        yield
    finally:
        ROWS.reset(token)


__all__ = ["ROWS", "rows_of"]
