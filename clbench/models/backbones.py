"""Feature extractors for CPU-scale and paper-scale runs: MLP, a small CNN, CIFAR ResNets.

Every factory takes the scenario's :class:`~clbench.protocol.ClassificationInfo` and returns an ``nn.Module`` mapping
``x: (B, *info.input_shape)`` to features ``(B, D)`` with ``D`` stored as ``module.out_features``.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from clbench.protocol import ClassificationInfo
from clbench.registry import MODELS


class MLP(nn.Sequential):
    """``flatten -> [Linear(h) -> ReLU -> Dropout] x len(hidden)``; ``out_features = hidden[-1]``."""

    def __init__(self, in_features: int, hidden: tuple[int, ...] = (256, 256), dropout: float = 0.0) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.ReLU(inplace=True)]
            if dropout:
                layers.append(nn.Dropout(dropout))
            in_features = width
        super().__init__(*layers)
        self.out_features = in_features


@MODELS.register("mlp")
def mlp(info: ClassificationInfo, *, hidden: tuple[int, ...] = (256, 256), dropout: float = 0.0) -> MLP:
    """Multi-layer perceptron on the flattened input (the default for digits and MNIST-sized scenarios)."""
    return MLP(math.prod(info.input_shape), tuple(hidden), dropout)


class SmallCNN(nn.Module):
    """Two ``conv3x3 -> BN -> ReLU -> maxpool`` stages, global average pooling, ``out_features = 2 * width``."""

    def __init__(self, in_channels: int, width: int = 32) -> None:
        super().__init__()
        def stage(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*stage(in_channels, width), nn.MaxPool2d(2), *stage(width, 2 * width),
                                  nn.MaxPool2d(2), *stage(2 * width, 2 * width),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_features = 2 * width

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


@MODELS.register("cnn")
def cnn(info: ClassificationInfo, *, width: int = 32) -> SmallCNN:
    """Small 3-stage CNN (conv-BN-ReLU, two max-pools, global average pooling)."""
    return SmallCNN(info.input_shape[0], width)


class BasicBlock(nn.Module):
    """ResNet basic block ``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))`` (He et al., 2016)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Identity() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet with a 3x3 stem (no max-pool) for small images; ``blocks[i]`` basic blocks in stage ``i`` with
    widths ``width * 2**i`` and stride 2 from the second stage on; ``out_features`` = last width."""

    def __init__(self, in_channels: int, blocks: tuple[int, ...], width: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        layers, cin = [], width
        for i, n in enumerate(blocks):
            cout = width * 2 ** i
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_features = cin

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.layers(self.stem(x)))


@MODELS.register("resnet18")
def resnet18(info: ClassificationInfo, *, width: int = 64) -> CifarResNet:
    """Reduced ResNet-18 (2-2-2-2 blocks); ``width=20`` is the reduced variant of GEM/DER, 64 the standard."""
    return CifarResNet(info.input_shape[0], (2, 2, 2, 2), width)


@MODELS.register("resnet32")
def resnet32(info: ClassificationInfo, *, width: int = 16) -> CifarResNet:
    """CIFAR ResNet-32 (3 stages x 5 blocks, widths 16/32/64), the iCaRL/DER/PyCIL CIFAR-100 backbone."""
    return CifarResNet(info.input_shape[0], (5, 5, 5), width)
