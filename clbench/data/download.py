"""Explicit downloads through torchvision's own download code (mirrors, archive md5 checks, extraction).

Called only when downloads are enabled (``clbench.data.configure(download=True)``, the CLI's ``--download``);
nothing here runs otherwise. Each function fetches one dataset into ``root`` in torchvision's layout:
``root/MNIST/raw/``, ``root/FashionMNIST/raw/`` (idx files, ``.gz`` and uncompressed), ``root/cifar-100-python/``.
"""

from __future__ import annotations

from pathlib import Path


def download_mnist(root: Path) -> None:
    from torchvision.datasets import MNIST
    MNIST(root, train=True, download=True)


def download_fashion_mnist(root: Path) -> None:
    from torchvision.datasets import FashionMNIST
    FashionMNIST(root, train=True, download=True)


def download_cifar100(root: Path) -> None:
    from torchvision.datasets import CIFAR100
    CIFAR100(root, train=True, download=True)
