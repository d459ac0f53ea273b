"""Per-sample gradient norms of ``nn.MultiheadAttention`` — and so of ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer`` (whose other layers are Linear, LayerNorm and Dropout) — as the user built them.

torch's attention uses its parameters inside one functional call (``F.multi_head_attention_forward``), where no hook
sees the projections. While a :class:`~clbench.privacy.tape.Tape` is installed, the module's ``forward`` is
:func:`traced_forward` (an instance attribute, removed with the tape; parameters, buffers, ``state_dict`` and type
stay the same): the same computation in the same layout (``(T, B, E)``, sample second, as torch computes it), with
its projections visible. Without a gradient to record (evaluation, ``no_grad``) it is torch's own forward.

Shapes: query ``x_q: (T, B, E)``, key/value ``x_k, x_v: (S, B, ·)``; ``q = x_q W_qᵀ + b_q``, ``k``, ``v`` likewise
(``W_q; W_k; W_v`` are the row blocks of ``in_proj_weight``, or ``q/k/v_proj_weight`` when ``kdim``/``vdim``
differ from ``E``); per head ``h`` ``O_h = softmax(q_h k_hᵀ/√d_h + M) v_h`` (``M``: masks; optional ``bias_k``,
``bias_v`` appended to ``k``, ``v`` as one more key position and a zero position with ``add_zero_attn``); output
``y = O W_oᵀ + b_o``. Each projection is a linear layer on the tokens (:class:`~clbench.privacy.rules.Outer`)::

    ∇W_{q,i} = G_{q,i}ᵀ X_{q,i}     ∇b_{q,i} = Σ_t G_{q,i,t}    (k, v, and W_o on O, likewise)
    ∇bias_k,i = G_{k,i,S}            (the gradient of the appended key position)

The blocks of ``in_proj_weight`` are disjoint rows, so their squared norms add; a module called several times in one
forward has its calls joined along ``T`` per block (cross terms included).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clbench.privacy.rules import (
    SEQUENCE_FIRST,
    Call,
    DirectParts,
    LinearParts,
    Recorder,
    Rule,
    UnsupportedLayerError,
    as_sequence,
    join,
    own,
    parts_rule,
    register_rule,
    stack_rows,
    summed,
    traced,
    trained_parts,
)

UNITS = {"qkv": (0, 3), "q": (0, 1), "k": (1, 2), "v": (2, 3), "kv": (1, 3)}
"""A projection call's role -> the ``E``-row blocks of ``in_proj_weight`` it uses (q = 0, k = 1, v = 2)."""


class _Restore:
    """Removes the traced forward (the handle a tape keeps)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)


def _install(module: nn.MultiheadAttention, record: Recorder, rule: Rule) -> list[_Restore]:
    if "forward" in module.__dict__:
        raise UnsupportedLayerError(f"{type(module).__name__}: its forward is already replaced (another Tape on "
                                    f"the same model?); close that tape first.")

    def forward(*args, **kwargs):
        return traced_forward(module, record, *args, **kwargs)

    module.forward = forward
    return [_Restore(module)]


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, role: str, record: Recorder) -> Tensor:
    y = F.linear(x, weight, bias)
    if traced(y):
        record(Call((x.detach(),), y, role=role))
    return y


def _heads(t: Tensor, batch: int, num_heads: int, head_dim: int) -> Tensor:
    """``(S, B, E) -> (B·H, S, d_h)``."""
    return t.view(t.shape[0], batch * num_heads, head_dim).transpose(0, 1)


def _project(m: nn.MultiheadAttention, query: Tensor, key: Tensor, value: Tensor,
             record: Recorder) -> tuple[Tensor, Tensor, Tensor]:
    """``q, k, v`` in torch's order of operations: one packed GEMM for self-attention, q and a packed kv for
    key is value, three otherwise."""
    e = m.embed_dim
    if not m._qkv_same_embed_dim:
        b = (None,) * 3 if m.in_proj_bias is None else m.in_proj_bias.chunk(3)
        return (_linear(query, m.q_proj_weight, b[0], "q", record), _linear(key, m.k_proj_weight, b[1], "k", record),
                _linear(value, m.v_proj_weight, b[2], "v", record))
    w, b = m.in_proj_weight, m.in_proj_bias
    if key is value and query is key:
        proj = _linear(query, w, b, "qkv", record)
        proj = proj.unflatten(-1, (3, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
        return proj[0], proj[1], proj[2]
    if key is value:
        w_q, w_kv = w.split([e, 2 * e])
        b_q, b_kv = (None, None) if b is None else b.split([e, 2 * e])
        kv = _linear(key, w_kv, b_kv, "kv", record)
        kv = kv.unflatten(-1, (2, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
        return _linear(query, w_q, b_q, "q", record), kv[0], kv[1]
    ws, bs = w.chunk(3), (None,) * 3 if b is None else b.chunk(3)
    return tuple(_linear(x, wi, bi, role, record) for x, wi, bi, role in zip((query, key, value), ws, bs, "qkv"))


def _append_bias(t: Tensor, bias: Tensor, role: str, record: Recorder) -> Tensor:
    """``[t; bias]`` along the key positions (``bias: (1, 1, E)`` repeated over the batch)."""
    rows = bias.repeat(1, t.shape[1], 1)
    if traced(rows):
        record(Call((), rows, role=role))
    return torch.cat([t, rows])


def traced_forward(m: nn.MultiheadAttention, record: Recorder, query: Tensor, key: Tensor,
                   value: Tensor, key_padding_mask: Tensor | None = None, need_weights: bool = True,
                   attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                   is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
    """``nn.MultiheadAttention.forward`` with its projections recorded (arguments and results as torch's)."""
    if not (torch.is_grad_enabled() and any(p.requires_grad for p in m.parameters())):
        return type(m).forward(m, query, key, value, key_padding_mask, need_weights, attn_mask,
                               average_attn_weights, is_causal)
    if query.dim() != 3:
        raise UnsupportedLayerError(f"{type(m).__name__}: per-sample norms need batched inputs, got a query of shape "
                                    f"{tuple(query.shape)}.")
    if m.batch_first:                                     # to (T, B, E), keeping which inputs are the same tensor
        same_kv, same_qk = key is value, query is key
        query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        key = query if same_qk else key
        value = key if same_kv else value
    key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                         other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                         target_type=query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None                                  # the hint alone, as torch's functional does
    else:
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                      target_type=query.dtype, check_other=False)
        is_causal = is_causal and key_padding_mask is None
    tgt_len, batch, e = query.shape
    heads, head_dim = m.num_heads, m.head_dim

    q, k, v = _project(m, query, key, value, record)
    if attn_mask is not None and attn_mask.dim() == 2:
        attn_mask = attn_mask.unsqueeze(0)
    if m.bias_k is not None:
        k, v = _append_bias(k, m.bias_k, "bias_k", record), _append_bias(v, m.bias_v, "bias_v", record)
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
    q, k, v = _heads(q, batch, heads, head_dim), _heads(k, batch, heads, head_dim), _heads(v, batch, heads, head_dim)
    if m.add_zero_attn:
        zeros = torch.zeros((batch * heads, 1, head_dim), dtype=k.dtype, device=k.device)
        k, v = torch.cat([k, zeros], dim=1), torch.cat([v, zeros], dim=1)
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
    src_len = k.size(1)
    if key_padding_mask is not None:
        padding = key_padding_mask.view(batch, 1, 1, src_len).expand(-1, heads, -1, -1).reshape(
            batch * heads, 1, src_len)
        attn_mask = padding if attn_mask is None else attn_mask + padding
    dropout = m.dropout if m.training else 0.0

    if need_weights:
        scores = q * math.sqrt(1.0 / float(head_dim))
        scores = torch.bmm(scores, k.transpose(-2, -1)) if attn_mask is None else \
            torch.baddbmm(attn_mask, scores, k.transpose(-2, -1))
        weights = F.softmax(scores, dim=-1)
        if dropout > 0.0:
            weights = F.dropout(weights, p=dropout)
        o = torch.bmm(weights, v).transpose(0, 1).reshape(tgt_len * batch, e)
        weights = weights.view(batch, heads, tgt_len, src_len)
        weights = weights.mean(dim=1) if average_attn_weights else weights
    else:
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0) if attn_mask.size(0) == 1 and attn_mask.dim() == 3 else \
                attn_mask.view(batch, heads, -1, src_len)
        o = F.scaled_dot_product_attention(q.view(batch, heads, tgt_len, head_dim),
                                           k.view(batch, heads, src_len, head_dim),
                                           v.view(batch, heads, src_len, head_dim), attn_mask, dropout, is_causal)
        o = o.permute(2, 0, 1, 3).reshape(batch * tgt_len, e)
        weights = None
    y = F.linear(o, m.out_proj.weight, m.out_proj.bias).view(tgt_len, batch, e)
    if traced(y):
        record(Call((o.view(tgt_len, batch, e).detach(),), y, role="out"))
    return (y.transpose(1, 0) if m.batch_first else y), weights


def _projection_pairs(calls: list[Call], e: int) -> dict[tuple[int, int], tuple[Tensor, Tensor]]:
    """``{(first, last) block of E rows: (A, G)}`` over the in-projection calls, joined along ``T`` per block;
    blocks of different calls that overlap (e.g. self- and cross-attention through one module) are split into the
    q, k and v blocks."""
    spans = sorted({UNITS[c.role] for c in calls})
    disjoint = all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    blocks: dict[tuple[int, int], list[tuple[Tensor, Tensor]]] = {}
    for c in calls:
        a, g = as_sequence(c.saved[0]), as_sequence(c.grad)
        lo, hi = UNITS[c.role]
        if disjoint:
            blocks.setdefault((lo, hi), []).append((a, g))
        else:
            for u in range(lo, hi):
                blocks.setdefault((u, u + 1), []).append((a, g[..., (u - lo) * e:(u - lo + 1) * e]))
    return {span: (join([a for a, _ in parts]), join([g for _, g in parts])) for span, parts in sorted(blocks.items())}


def _operands(m: nn.MultiheadAttention, calls: list[Call]) -> tuple[LinearParts, DirectParts]:
    by_role: dict[str, list[Call]] = {}
    for c in calls:
        by_role.setdefault(c.role, []).append(c)
    pairs = _projection_pairs([c for c in calls if c.role in UNITS], m.embed_dim)
    linear: LinearParts = {}
    direct: DirectParts = {}
    if m._qkv_same_embed_dim:
        linear["in_proj_weight"] = (list(pairs.values()), stack_rows)
    else:
        for name, span in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), ((0, 1), (1, 2), (2, 3))):
            linear[name] = ([pairs[span]], stack_rows)
    direct["in_proj_bias"] = torch.cat([summed(g) for _, g in pairs.values()], 1)
    a_out = join([as_sequence(c.saved[0]) for c in by_role["out"]])
    g_out = join([as_sequence(c.grad) for c in by_role["out"]])
    linear["out_proj.weight"] = ([(a_out, g_out)], stack_rows)
    direct["out_proj.bias"] = summed(g_out)
    for name in ("bias_k", "bias_v"):
        if name in by_role:
            direct[name] = summed(join([as_sequence(c.grad) for c in by_role[name]]))
    missing = sorted(set(own(m)) - set(linear) - set(direct))
    if missing:
        raise UnsupportedLayerError(f"{type(m).__name__}: no per-sample rule for its parameters {missing}.")
    return trained_parts(m, linear, direct)


MULTIHEAD_ATTENTION = register_rule(nn.MultiheadAttention)(
    parts_rule(lambda *args: None, _operands, hook=_install, subtree=True))
"""``nn.MultiheadAttention`` (its ``out_proj`` included): see the module docstring."""

SEQUENCE_FIRST[nn.MultiheadAttention] = lambda m: True          # records torch's (T, B, ·) layout whatever the input
for _layer in (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer):
    SEQUENCE_FIRST[_layer] = lambda layer: not layer.self_attn.batch_first
SEQUENCE_FIRST[nn.TransformerEncoder] = lambda stack: not stack.layers[0].self_attn.batch_first
SEQUENCE_FIRST[nn.TransformerDecoder] = lambda stack: not stack.layers[0].self_attn.batch_first
SEQUENCE_FIRST[nn.Transformer] = lambda model: not model.batch_first

__all__ = ["MULTIHEAD_ATTENTION", "traced_forward"]
