"""Weight tying (one ``nn.Parameter`` used by an ``nn.Embedding`` as input lookup and by an ``nn.Linear`` as output
projection, PyTorch's idiom ``output.weight = item_emb.weight``): phantom clipping (Ding et al., ICML 2024, Sec. 4).

Sample ``i``'s gradient of the shared ``E: (V, d)`` is the sum of both uses::

    ∇E_i = Σ_t e_{id_t} g_tᵀ   +   G_iᵀ H_i                  g_t = ∂L_i/∂x_t ∈ R^d,  G_i = ∂L_i/∂S_i ∈ R^{T_o×V}
    ‖∇E_i‖² = Σ_{t,t'} 1[id_t = id_t'] ⟨g_t, g_t'⟩           (input side: the Embedding rule)
            + Σ_{s,s'} ⟨h_s, h_s'⟩ ⟨G_s, G_s'⟩               (output side: the Linear rule, Gram form)
            + 2 Σ_{t,s} G_{s, id_t} ⟨h_s, g_t⟩                (the cross term between the two uses: here)

so the tied matrix is clipped as ONE parameter, without untying it and without forming ``∇E_i: (V, d)``; the book-kept
weighted sum is the sum of both rules' sums. :class:`~clbench.privacy.tape.Tape` finds ties by parameter identity.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from clbench.privacy.rules import UnsupportedLayerError


def tie(owners: list[tuple[nn.Module, str, str]]) -> tuple[nn.Embedding, nn.Linear]:
    """The ``(embedding, linear)`` pair sharing one parameter, from its owners ``[(module, qualified name,
    parameter name)]``; any other sharing is refused with a message naming the modules."""
    kinds = {type(m): (m, n) for m, _, n in owners}
    if (len(owners) == 2 and set(kinds) == {nn.Embedding, nn.Linear}
            and all(n == "weight" for _, _, n in owners)):
        return kinds[nn.Embedding][0], kinds[nn.Linear][0]
    names = ", ".join(f"{q}.{n} ({type(m).__name__})" for m, q, n in owners)
    raise UnsupportedLayerError(f"one parameter is shared by {names}: per-sample norms support sharing between an "
                                f"nn.Embedding's and an nn.Linear's weight (tied input/output embeddings) only.")


def cross_sq_norms(lookups: tuple[Tensor, Tensor], projections: tuple[Tensor, Tensor]) -> Tensor:
    """``2 ⟨Σ_t e_{id_t} g_tᵀ, G_iᵀ H_i⟩ = 2 Σ_{s,t} G_i[s, id_t] ⟨h_s, g_t⟩`` per sample -> ``(B,)``, from the
    Embedding rule's operands ``ids: (B, T)``, ``g: (B, T, d)`` and the Linear rule's ``H: (B, S, d)``,
    ``G: (B, S, V)``."""
    (ids, g_in), (h, g_out) = lookups, projections
    picked = torch.gather(g_out, 2, ids.unsqueeze(1).expand(-1, g_out.shape[1], -1))     # (B, S, T)
    return 2 * (picked * torch.bmm(h, g_in.transpose(1, 2))).sum((1, 2))


__all__ = ["cross_sq_norms", "tie"]
