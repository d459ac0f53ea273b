"""Train augmentation of image tensors: random crop after zero padding, then a random horizontal flip.

:class:`CropFlip` is one distribution with two ways to draw from it:

- ``crop_flip(x)`` on ONE ``(C, H, W)`` sample (a dataset's per-sample train transform). It draws exactly what
  ``v2.Compose([v2.RandomCrop(size, padding=p), v2.RandomHorizontalFlip()])`` draws from torch's global generator,
  in the same order (the crop's top, its left, then ``u ~ U[0, 1)``: flipped when ``u < 0.5``), and returns the
  same tensor bit for bit, without v2's per-call dispatch (the transform every scenario's dataset applied before).
- :meth:`CropFlip.batch` on a ``(B, C, H, W)`` batch on any device: the same per-sample distribution (independent
  top, left uniform on ``0 .. H + 2p - size`` / ``0 .. W + 2p - size``, flip with probability 1/2), drawn as three
  ``(B,)`` vectors from torch's global CPU generator (so the same seed gives the same batch on every device) and
  applied as one gather on the batch's device. Its draws differ from ``B`` per-sample calls: a loop that switches
  from one to the other changes its random numbers, not their distribution.

**Where each is used.** The image scenarios declare a ``CropFlip`` as their batch augmentation
(:attr:`clbench.protocol.ClassificationInfo.batch_augment`; their datasets have no per-sample train transform) and
every training loop applies :meth:`CropFlip.batch` to each training minibatch once, before the forward
(:meth:`clbench.callbacks.CallbackList.augment_batch`: the template bridge and :func:`clbench.training.fit_dataset`).
Pretraining keeps the per-sample path (:class:`AugmentedSamples`, ``__call__`` per sample in the data loader), so
its checkpoints stay bit-identical to those made with the per-sample dataset transform.

The zero fill is the mean colour of normalized inputs. Shapes: out ``(C, size, size)`` / ``(B, C, size, size)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset


@dataclass(frozen=True)
class CropFlip:
    """Random ``size x size`` crop of the input zero-padded by ``padding`` on every side, then a horizontal flip
    with probability 1/2 (see the module docstring)."""

    size: int
    padding: int

    def __post_init__(self) -> None:
        if self.size < 1 or self.padding < 0:
            raise ValueError(f"CropFlip: size must be >= 1 and padding >= 0, got size={self.size}, "
                             f"padding={self.padding}.")

    def _ranges(self, height: int, width: int) -> tuple[int, int]:
        """The number of possible tops and lefts of the crop in the padded ``(height, width)`` image."""
        rows, cols = height + 2 * self.padding - self.size + 1, width + 2 * self.padding - self.size + 1
        if rows < 1 or cols < 1:
            raise ValueError(f"CropFlip: a {self.size}x{self.size} crop does not fit a {height}x{width} image "
                             f"padded by {self.padding}.")
        return rows, cols

    def __call__(self, x: Tensor) -> Tensor:
        """One ``(C, H, W)`` sample -> ``(C, size, size)``, the draws of torchvision's v2 pair (module docstring)."""
        rows, cols = self._ranges(x.shape[-2], x.shape[-1])
        top = int(torch.randint(0, rows, size=())) if rows > 1 else 0
        left = int(torch.randint(0, cols, size=())) if cols > 1 else 0
        flip = bool(torch.rand(1) < 0.5)
        padded = F.pad(x, (self.padding,) * 4) if self.padding else x
        out = padded[..., top:top + self.size, left:left + self.size]
        return out.flip(-1) if flip else out.clone()

    def batch(self, x: Tensor) -> Tensor:
        """A ``(B, C, H, W)`` batch -> ``(B, C, size, size)`` on ``x.device``: sample ``b`` is
        ``pad(x_b)[:, top_b + r, left_b + c']`` with ``c' = size - 1 - c`` where ``flip_b`` else ``c``."""
        n = x.shape[0]
        rows, cols = self._ranges(x.shape[-2], x.shape[-1])
        top = torch.randint(0, rows, (n,))
        left = torch.randint(0, cols, (n,))
        flip = torch.rand(n) < 0.5
        offsets = torch.arange(self.size)
        row_index = (top[:, None] + offsets).to(x.device)                                   # (B, size)
        col_index = (left[:, None] + torch.where(flip[:, None], offsets.flip(0), offsets)).to(x.device)
        padded = F.pad(x, (self.padding,) * 4) if self.padding else x
        b, c, _, width = padded.shape
        rows_kept = padded.gather(2, row_index[:, None, :, None].expand(b, c, self.size, width))
        return rows_kept.gather(3, col_index[:, None, None, :].expand(b, c, self.size, self.size))


class AugmentedSamples(Dataset):
    """``(augment(x), y, *rest)`` for each sample ``(x, y, *rest)`` of ``dataset``: a per-sample train transform put
    back on a dataset whose scenario declares it as a batch augmentation (``augment`` None: the samples as they are).
    Drawn in the data loader's order, sample by sample, exactly as the dataset's own train transform drew."""

    def __init__(self, dataset: Any, augment: CropFlip | None) -> None:
        self.dataset, self.augment = dataset, augment

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple:
        x, *rest = self.dataset[index]
        return (x if self.augment is None else self.augment(x), *rest)


__all__ = ["AugmentedSamples", "CropFlip"]
