"""One reader per on-disk format. Every image reader returns ``uint8`` arrays of shape ``(N, H, W, C)``.

- idx (``.gz`` or not): the MNIST format, a big-endian header ``0 0 <dtype> <ndim>`` and ``ndim`` int32 sizes;
- npz: named arrays (``numpy.load``);
- CIFAR-100 python pickle (``cifar-100-python/{train,test}``, what torchvision downloads): ``data (N, 3072)`` in
  channel-major order and ``fine_labels``;
- image folders: ``<folder>/<class>/*.{JPEG,jpg,jpeg,png}``, decoded to RGB, optionally resized, held in memory;
- class-list files: one class per line, its first whitespace-separated token (``classes.tsv``'s ``wnid<TAB>name``);
  a token that is a file path (``train/n01440764/n01440764_10026.JPEG 0``, the PODNet/DER ImageNet-100 split
  files) names the class by its parent folder. Duplicates are dropped, first occurrence kept.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IMAGE_SUFFIXES = frozenset({".jpeg", ".jpg", ".png"})


def read_idx(path: Path) -> np.ndarray:
    """An idx file as an array of its stored shape (images ``(N, H, W)``, labels ``(N,)``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise ValueError(f"{path}: not an idx file (magic bytes {raw[:4].hex()}).")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = 4 + 4 * ndim + dtype.itemsize * int(np.prod(shape))
    if len(raw) != expected:
        raise ValueError(f"{path}: {len(raw)} bytes, expected {expected} for shape {shape}.")
    return np.frombuffer(raw, dtype, offset=4 + 4 * ndim).reshape(shape).astype(dtype.newbyteorder("="))


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file, by name (no pickled objects)."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def read_cifar_pickle(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR-100 python batch file: images ``(N, 32, 32, 3)`` uint8 and fine labels ``(N,)`` int64."""
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    x = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x), np.asarray(batch["fine_labels"], dtype=np.int64)


def list_classes(folder: Path) -> list[str]:
    """Class folder names of an image folder, sorted (label ``i`` is the ``i``-th name, as in ImageFolder)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


def read_image_folder(folder: Path, classes: Sequence[str], size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Images of ``folder/<classes[i]>/`` with label ``i``: ``(N, S, S, 3)`` uint8 and ``(N,)`` int64.

    Files are taken in sorted name order. ``size`` resizes every image to ``size x size`` (bilinear); without it
    all images must already share one size (e.g. Tiny-ImageNet's 64 x 64).
    """
    images: list[np.ndarray] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (folder / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"{folder / name}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}).")
        for file in files:
            with Image.open(file) as image:
                image = image.convert("RGB")
                if size is not None:
                    image = image.resize((size, size), Image.Resampling.BILINEAR)
                images.append(np.asarray(image, dtype=np.uint8))
        labels += [label] * len(files)
    shapes = {im.shape for im in images}
    if len(shapes) > 1:
        raise ValueError(f"{folder}: images of different sizes {sorted(shapes)[:3]}...; pass a size to resize them.")
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def read_class_list(path: Path) -> list[str]:
    """Class names listed in a text file, in file order (see the module docstring for the accepted lines)."""
    names: dict[str, None] = {}
    for line in path.read_text().splitlines():
        tokens = line.split()
        if tokens and not tokens[0].startswith("#"):
            token = Path(tokens[0])
            names[token.parent.name if token.parent.name else token.name] = None
    return list(names)
