"""Per-sample norm rules for the PETL modules (:mod:`clbench.petl.modules`), so that every PETL strategy's trainable
parameters can be clipped privately; ghost norms from the modules' inputs and output gradients, as in
:mod:`clbench.privacy.rules` (the adapters' ``nn.Linear`` layers are covered there already). Registered when
:mod:`clbench.petl` is imported (its ``__init__`` imports this module).

Shapes: tokens ``x: (B, T, d)``; ``G`` the gradient of the module's output; ``s`` the module's scale.

- :class:`~clbench.petl.modules.LoRA`: ``Δy_t = s B_t A_t x`` on the rows of target ``t``; with ``h_t = A_t x`` and
  ``G_t = s G[..., rows_t]``: ``∇B_t = G_tᵀ h_t`` and ``∇A_t = (G_t B_t)ᵀ x``, each a linear layer on the ``T``
  tokens (:class:`~clbench.privacy.rules.Outer`); ``A`` and ``B`` stack the targets' blocks by rows.
- :class:`~clbench.petl.modules.MultiHeadAdapter`: per head ``i``, ``u = x W_down^(i) + b_down^(i)``,
  ``Δz = s (relu(u) W_up^(i) + b_up^(i))``: ``∇W_up^(i) = relu(u)ᵀ (s G_i)``, ``∇b_up^(i) = Σ_t s G_{i,t}``, and with
  ``Ĝ = (s G_i W_up^(i)ᵀ) ⊙ 1[u > 0]``: ``∇W_down^(i) = xᵀ Ĝ``, ``∇b_down^(i) = Σ_t Ĝ_t``.
- :class:`~clbench.petl.modules.PrefixBank` (its whole subtree): the bank's output is expanded over the batch, so
  its gradient ``P_i: (L, 2, l, d)`` is sample ``i``'s gradient of the prefixes. Free prefixes: ``∇prefix_i = P_i``.
  Re-parametrized ``MLP(E) = tanh(E W_1ᵀ + b_1) W_2ᵀ + b_2`` with ``O_i`` = ``P_i`` laid out as the MLP's output
  ``(l, 2Ld)`` and ``a = tanh(E W_1ᵀ + b_1)`` (the same for every sample): ``∇W_2 = O_iᵀ a``, ``∇b_2 = Σ O_i``,
  ``Ĝ_i = (O_i W_2) ⊙ (1 − a²)``, ``∇W_1 = Ĝ_iᵀ E``, ``∇b_1 = Σ Ĝ_i``, ``∇E = Ĝ_i W_1``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from clbench.petl.modules import LoRA, MultiHeadAdapter, PrefixBank
from clbench.privacy.rules import (
    Call,
    DirectParts,
    LinearParts,
    UnsupportedLayerError,
    join,
    parts_rule,
    register_rule,
    stack_rows,
    summed,
    traced,
    trained_parts,
)


def _per_head(parts: list[Tensor]) -> Tensor:
    """``(p, d)`` weighted sums per head -> ``(N_h, d, p)``, the adapter's per-head ``W`` layout."""
    return torch.stack([part.t() for part in parts])


def _input_capture(module: nn.Module, args: tuple, output: Tensor) -> Call | None:
    return Call((args[0].detach(),), output) if traced(output) else None


def _tokens(calls: list[Call], index: int = 0) -> Tensor:
    return join([c.saved[index] for c in calls])


# ---------------------------------------------------------------------------------------------------------- LoRA
def _lora_capture(module: LoRA, args: tuple, output: Tensor) -> Call | None:
    return Call((args[1].detach(),), output) if traced(output) else None


def _lora_operands(module: LoRA, calls: list[Call]) -> tuple[LinearParts, DirectParts]:
    x, g = _tokens(calls), join([c.grad for c in calls])                       # (B, T, in), (B, T, out)
    x, g = x.reshape(len(x), -1, x.shape[-1]), g.reshape(len(g), -1, g.shape[-1])
    a_parts, b_parts = [], []
    for (start, stop), a, b in zip(module.segments, module.A.split(module.r), module._b_blocks()):
        g_t = module.scale * g[..., start:stop]
        a_parts.append((x, g_t @ b.detach()))
        b_parts.append((F.linear(x, a.detach()), g_t))
    return trained_parts(module, {"A": (a_parts, stack_rows), "B": (b_parts, stack_rows)}, {})


register_rule(LoRA)(parts_rule(_lora_capture, _lora_operands))


# -------------------------------------------------------------------------------------------- multi-head adapter
def _heads_operands(module: MultiHeadAdapter, calls: list[Call]) -> tuple[LinearParts, DirectParts]:
    x, g = _tokens(calls), join([c.grad for c in calls])                       # (B, T, d), (B, T, N_h, d_h)
    w_down, w_up = module.w_down.detach(), module.w_up.detach()
    u = torch.einsum("btd,hdr->bthr", x, w_down) + module.b_down.detach()
    g = module.scale * g
    g_u = torch.einsum("bthk,hrk->bthr", g, w_up) * (u > 0)
    heads = range(w_down.shape[0])
    linear = {"w_up": ([(F.relu(u[:, :, i]), g[:, :, i]) for i in heads], _per_head),
              "w_down": ([(x, g_u[:, :, i]) for i in heads], _per_head)}
    return trained_parts(module, linear, {"b_up": summed(g), "b_down": summed(g_u)})


register_rule(MultiHeadAdapter)(parts_rule(_input_capture, _heads_operands))


# ------------------------------------------------------------------------------------------------------- prefix
def _bank_capture(module: PrefixBank, args: tuple, output: Tensor) -> Call | None:
    return Call((), output) if traced(output) else None


def _bank_operands(module: PrefixBank, calls: list[Call]) -> tuple[LinearParts, DirectParts]:
    if len(calls) != 1:
        raise UnsupportedLayerError(f"PrefixBank: evaluated {len(calls)} times in one forward; per-sample norms "
                                    f"expect one evaluation per forward (the hooks' cache).")
    p = calls[0].grad                                                          # (B, L, 2, l, d)
    if not hasattr(module, "mlp"):
        return trained_parts(module, {}, {"prefix": p})
    batch = len(p)
    o = p.permute(0, 3, 1, 2, 4).reshape(batch, module.length, -1)          # (B, l, 2Ld): the MLP's output
    first, last = module.mlp[0], module.mlp[2]
    e = module.embedding.detach()
    a = torch.tanh(first(e)).detach()                                          # (l, k)
    g_a = (o @ last.weight.detach()) * (1 - a.square())                      # (B, l, k)
    linear = {"mlp.2.weight": ([(a.expand(batch, *a.shape), o)], stack_rows),
              "mlp.0.weight": ([(e.expand(batch, *e.shape), g_a)], stack_rows)}
    direct = {"mlp.2.bias": summed(o), "mlp.0.bias": summed(g_a), "embedding": g_a @ first.weight.detach()}
    return trained_parts(module, linear, direct)


register_rule(PrefixBank)(parts_rule(_bank_capture, _bank_operands, subtree=True))


__all__: list[str] = []
