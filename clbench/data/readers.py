"""One reader per on-disk format. Every image reader returns ``uint8`` arrays of shape ``(N, H, W, C)``.

- idx (``.gz`` or not): the MNIST format, a big-endian header ``0 0 <dtype> <ndim>`` and ``ndim`` int32 sizes;
- npz: named arrays (``numpy.load``);
- CIFAR-100 python pickle (``cifar-100-python/{train,test}``, what torchvision downloads): ``data (N, 3072)`` in
  channel-major order and ``fine_labels``;
- image folders: ``<folder>/<class>/*.{JPEG,jpg,jpeg,png}``, decoded to RGB, optionally resized, held in memory;
  a flat folder (ImageNet's official ``val/``: the images directly in it) labelled by its ground-truth file
  (:data:`GROUND_TRUTH_FILES`);
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


def image_files(folder: Path) -> list[Path]:
    """The images of ``folder`` (:data:`IMAGE_SUFFIXES`), in sorted name order."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def read_image_folder(folder: Path, classes: Sequence[str], size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Images of ``folder/<classes[i]>/`` with label ``i``: ``(N, S, S, 3)`` uint8 and ``(N,)`` int64.

    Files are taken in sorted name order. ``size`` resizes every image to ``size x size`` (bilinear); without it
    all images must already share one size (e.g. Tiny-ImageNet's 64 x 64).
    """
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = image_files(folder / name)
        if not found:
            raise ValueError(f"{folder / name}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}).")
        files += found
        labels += [label] * len(found)
    return read_images(folder, files, size), np.asarray(labels, dtype=np.int64)


def read_images(folder: Path, files: Sequence[Path], size: int | None = None) -> np.ndarray:
    """``files`` decoded to RGB, resized to ``size x size`` when given, as one ``(N, S, S, 3)`` uint8 array; without
    ``size``, images of different sizes are refused (a ``ValueError`` naming ``image_size``, the scenarios' name for
    ``size``)."""
    images: list[np.ndarray] = []
    for file in files:
        with Image.open(file) as image:
            image = image.convert("RGB")
            if size is not None:
                image = image.resize((size, size), Image.Resampling.BILINEAR)
            images.append(np.asarray(image, dtype=np.uint8))
    _check_one_size(folder, {im.shape[:2] for im in images})
    return np.stack(images)


def _check_one_size(folder: Path, shapes: set[tuple[int, int]]) -> None:
    """Refuse images of more than one ``(H, W)`` in ``shapes``, naming ``image_size`` (the fix)."""
    if len(shapes) > 1:
        shapes = sorted(shapes)
        raise ValueError(f"{folder}: images of different sizes ({', '.join(f'{w}x{h}' for h, w in shapes[:3])}"
                         f"{', ...' if len(shapes) > 3 else ''}); set the scenario's image_size (e.g. image_size: 64) "
                         f"to resize them all.")


def check_image_sizes(folder: Path, files: Sequence[Path]) -> None:
    """:func:`read_images`' refusal of mixed sizes, from the files' headers alone (nothing decoded)."""
    sizes = set()
    for file in files:
        with Image.open(file) as image:
            sizes.add(image.size[::-1])
    _check_one_size(folder, sizes)


GROUND_TRUTH_FILES = {"LOC_val_solution.csv": "ImageId,PredictionString", "val_annotations.txt": "file<TAB>wnid"}
"""Files that give the class (wnid) of each image of a flat validation folder (images directly in ``val/``), by
name, with their line format: ImageNet's localization solution (Kaggle's ILSVRC copy; the first token of
PredictionString is the wnid) and Tiny-ImageNet's ``val_annotations.txt`` (its images in ``val/images/``)."""


def flat_images(folder: Path) -> list[Path]:
    """The images lying directly in ``folder`` (or in ``folder/images``, Tiny-ImageNet's validation layout)."""
    for place in (folder, folder / "images"):
        found = sorted(p for p in place.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES) \
            if place.is_dir() else []
        if found:
            return found
    return []


def ground_truth(folder: Path) -> dict[str, str] | None:
    """``{image file stem: wnid}`` from the first of :data:`GROUND_TRUTH_FILES` found in ``folder`` or beside it;
    None when there is none."""
    for name in GROUND_TRUTH_FILES:
        for path in (folder / name, folder.parent / name):
            if not path.is_file():
                continue
            lines = path.read_text().splitlines()
            if name.endswith(".csv"):
                rows = [line.split(",", 1) for line in lines[1:] if line.strip()]
                return {image: label.split()[0] for image, label in rows}
            return {Path(cells[0]).stem: cells[1] for cells in (line.split("\t") for line in lines) if len(cells) > 1}
    return None


def flat_ground_truth(folder: Path) -> dict[str, str]:
    """:func:`ground_truth` of a flat image folder; a ``ValueError`` with the fix when it has none."""
    truth = ground_truth(folder)
    if truth is None:
        raise ValueError(f"{folder} holds its images directly, without class folders, and no ground-truth file "
                         f"({' or '.join(f'{n} ({f})' for n, f in GROUND_TRUTH_FILES.items())}) lies in it or beside "
                         f"it: put ImageNet's LOC_val_solution.csv beside {folder.name}/, or sort the images into "
                         f"{folder.name}/<wnid>/ folders.")
    return truth


def read_flat_image_folder(folder: Path, classes: Sequence[str], size: int | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
    """The images lying directly in ``folder`` (:func:`flat_images`) whose class, read from its ground-truth file
    (:func:`ground_truth`), is one of ``classes`` (label ``i`` for ``classes[i]``); images of other classes are left
    out. A ``ValueError`` with the fix when there is no ground-truth file, an image has no line in it, or a class
    has no image."""
    files = flat_images(folder)
    truth = flat_ground_truth(folder)
    unlabelled = [f.name for f in files if f.stem not in truth]
    if unlabelled:
        raise ValueError(f"{folder}: {len(unlabelled)} image(s) have no line in its ground-truth file (first: "
                         f"{unlabelled[0]}); use the ground-truth file of these images.")
    label = {name: i for i, name in enumerate(classes)}
    kept = [(f, label[truth[f.stem]]) for f in files if truth[f.stem] in label]
    empty = sorted(set(classes) - {truth[f.stem] for f, _ in kept})
    if empty:
        raise ValueError(f"{folder}: no validation image of class {empty[0]} ({len(empty)} class(es) without one) in "
                         f"its ground-truth file; check that it belongs to these images.")
    return read_images(folder, [f for f, _ in kept], size), np.asarray([i for _, i in kept], dtype=np.int64)


def read_class_list(path: Path) -> list[str]:
    """Class names listed in a text file, in file order (see the module docstring for the accepted lines)."""
    names: dict[str, None] = {}
    for line in path.read_text().splitlines():
        tokens = line.split()
        if tokens and not tokens[0].startswith("#"):
            token = Path(tokens[0])
            names[token.parent.name if token.parent.name else token.name] = None
    return list(names)
