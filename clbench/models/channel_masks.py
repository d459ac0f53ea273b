"""DER's channel-level masks for pruning a new feature extractor (Yan et al., CVPR 2021, "dynamic expansion with
pruning"; HAT-style gates, Serrà et al., ICML 2018), on the CIFAR ResNets of :mod:`clbench.models.backbones`.

Every convolution's BatchNorm output ``f_l`` ``(B, c_l, H, W)`` is gated channel-wise,

    f'_l = f_l ⊙ m_l,        m_l = σ(s · e_l),   e_l ∈ R^{c_l} learned

while training; in eval mode (inference, and every frozen extractor) the mask is binary, ``m_l = 1[e_l > 0]`` (the
limit of ``σ(s e_l)`` as ``s`` grows), so a channel either exists or does not. Within each epoch ``s`` is annealed
over the ``B`` batches, ``s_b = 1/s_max + (s_max - 1/s_max)(b - 1)/(B - 1)`` (:func:`annealed_scale`). The sparsity
loss is the soft fraction of convolution weights in use,

    L_S = Σ_l K_l ‖m_{l-1}‖₁ ‖m_l‖₁ / Σ_l K_l c_{l-1} c_l

over the convolutions ``l`` (``K_l`` = kernel area; ``m_{l-1}`` the mask of the layer's input channels: all ones
for the image, the union ``a + b - a·b`` of the two branches after a residual sum). With binary masks ``L_S`` equals
the kept fraction of convolution weights, and :func:`kept_parameters` counts the network with the masked channels
removed (convolutions, BatchNorm affine parameters and the features the classifier reads).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from clbench.models.backbones import BasicBlock, CifarResNet


class GatedNorm(nn.Module):
    """``bn(x) ⊙ m`` with ``m = σ(s·e)`` (training) or ``1[e > 0]`` (eval): ``(B, C, H, W) -> (B, C, H, W)``."""

    def __init__(self, norm: nn.BatchNorm2d, init: float) -> None:
        super().__init__()
        self.norm = norm
        self.e = nn.Parameter(torch.full((norm.num_features,), float(init), device=norm.weight.device))
        self.s = 1.0

    def mask(self) -> Tensor:
        return torch.sigmoid(self.s * self.e) if self.training else self.hard_mask()

    def hard_mask(self) -> Tensor:
        return (self.e > 0).to(self.e.dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x) * self.mask().view(1, -1, 1, 1)


def add_gates(extractor: nn.Module, init: float) -> nn.Module:
    """Wrap every ``BatchNorm2d`` of a CIFAR ResNet in a :class:`GatedNorm` (in place); returns the extractor.
    Raises ``ValueError`` (one line) for any other backbone."""
    if not isinstance(extractor, CifarResNet):
        raise ValueError(f"prune: true needs a CIFAR ResNet extractor (model resnet18 or resnet32), got "
                         f"{type(extractor).__name__}; set prune: false or choose one of them.")
    for parent in list(extractor.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, name, GatedNorm(child, init))
    return extractor


def gates(extractor: nn.Module) -> list[GatedNorm]:
    return [m for m in extractor.modules() if isinstance(m, GatedNorm)]


def reset_gates(extractor: nn.Module, init: float) -> None:
    """Every gate of ``extractor`` back to ``e = init`` (all channels open): a new extractor copied from the last
    one learns its own masks."""
    with torch.no_grad():
        for gate in gates(extractor):
            gate.e.fill_(init)


def set_scale(extractor: nn.Module, s: float) -> None:
    for gate in gates(extractor):
        gate.s = s


def annealed_scale(batch: int, n_batches: int, s_max: float) -> float:
    """``s_b = 1/s_max + (s_max - 1/s_max)(b - 1)/(B - 1)`` for the ``b``-th of ``B`` batches (1-based)."""
    if n_batches <= 1:
        return s_max
    return 1 / s_max + (s_max - 1 / s_max) * (batch - 1) / (n_batches - 1)


def _mask(gate: nn.Module, hard: bool) -> Tensor:
    return gate.hard_mask() if hard else gate.mask()


def _union(a: Tensor, b: Tensor) -> Tensor:
    return a + b - a * b


def conv_masks(net: CifarResNet, hard: bool = False) -> tuple[list[tuple[nn.Conv2d, Tensor, Tensor]], Tensor]:
    """``([(conv_l, m_{l-1}, m_l), ...], m_out)``: every convolution of a gated CIFAR ResNet with the masks of its
    input and output channels, in order, and the mask of the output features. ``hard``: binary masks."""
    stem_conv, stem_gate = net.stem[0], net.stem[1]
    image = torch.ones(stem_conv.in_channels, device=stem_gate.e.device)
    alive = _mask(stem_gate, hard)
    convs = [(stem_conv, image, alive)]
    for block in net.layers:
        convs += list(_block_masks(block, alive, hard))
        a_out = _mask(block.bn2, hard)
        if isinstance(block.shortcut, nn.Identity):
            alive = _union(a_out, alive)
        else:
            alive = _union(a_out, _mask(block.shortcut[1], hard))
    return convs, alive


def _block_masks(block: BasicBlock, m_in: Tensor, hard: bool) -> Iterator[tuple[nn.Conv2d, Tensor, Tensor]]:
    m1, m2 = _mask(block.bn1, hard), _mask(block.bn2, hard)
    yield block.conv1, m_in, m1
    yield block.conv2, m1, m2
    if not isinstance(block.shortcut, nn.Identity):
        yield block.shortcut[0], m_in, _mask(block.shortcut[1], hard)


def sparsity_loss(net: CifarResNet) -> Tensor:
    """``L_S = Σ_l K_l ‖m_{l-1}‖₁ ‖m_l‖₁ / Σ_l K_l c_{l-1} c_l`` with the current (soft or eval-mode) masks."""
    convs, _ = conv_masks(net)
    used = sum(_area(conv) * m_in.sum() * m_out.sum() for conv, m_in, m_out in convs)
    total = sum(_area(conv) * conv.in_channels * conv.out_channels for conv, _, _ in convs)
    return used / total


def _area(conv: nn.Conv2d) -> int:
    return conv.kernel_size[0] * conv.kernel_size[1]


def kept_parameters(net: CifarResNet) -> tuple[int, int]:
    """``(parameters of the pruned extractor, features it keeps)``: convolution weights ``K_l·|m_{l-1}|·|m_l|`` and
    BatchNorm ``γ, β`` of kept channels (the masks themselves fold into the binary structure)."""
    convs, alive = conv_masks(net, hard=True)
    count = sum(_area(conv) * int(m_in.sum()) * int(m_out.sum()) + 2 * int(m_out.sum()) for conv, m_in, m_out in convs)
    return count, int(alive.sum())
