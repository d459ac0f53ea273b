"""Known datasets: where they may lie under a data root, which files they need, their checksums, how to read them.

A :class:`DatasetSpec` lists one or more :class:`Layout` s (e.g. our ``mnist/`` folder of idx files, or
torchvision's ``MNIST/raw/``). :func:`locate` tries every data root (see :mod:`clbench.data.roots`) and every layout
in order, takes the first one whose files all exist (an idx file may be stored as ``name`` or ``name.gz``),
verifies the known files' content checksums, and otherwise downloads (only when enabled) or raises
:class:`DatasetNotFound`. :func:`load` then reads the arrays with the layout's reader.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clbench.data import download, readers
from clbench.data.checksums import verify
from clbench.data.errors import DatasetNotFound
from clbench.data.roots import ENV_VAR, download_enabled, download_root, search_roots

PathLike = str | os.PathLike


@dataclass(frozen=True)
class SplitArrays:
    """A dataset in memory: images ``(N, H, W, C)`` uint8, labels ``(N,)`` int64 in ``0..n_classes-1``."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    """``folder`` (relative to a data root, or absolute) holding ``files`` (name -> content md5, ``None`` when not
    checked, e.g. sub-folders); ``read`` turns the found paths (by name) into arrays. With ``gzip_ok`` a file may
    also be stored as ``name.gz``."""

    folder: str
    files: Mapping[str, str | None]
    read: Callable[[dict[str, Path]], SplitArrays]
    gzip_ok: bool = False

    def find(self, root: Path) -> dict[str, Path] | None:
        """The path of every file under ``root / folder``, or None if one is missing."""
        found = {}
        for name in self.files:
            candidates = [root / self.folder / name] + ([root / self.folder / f"{name}.gz"] if self.gzip_ok else [])
            hit = next((p for p in candidates if p.exists()), None)
            if hit is None:
                return None
            found[name] = hit
        return found

    def describe(self) -> str:
        suffix = "[.gz]" if self.gzip_ok else ""
        return f"{self.folder}/{{{', '.join(name + suffix for name in self.files)}}}"


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    layouts: tuple[Layout, ...]
    download: Callable[[Path], None] | None = None
    how_to_get: str = ""          # shown when there is no automatic download


def not_found(spec: DatasetSpec, roots: Sequence[Path], data_root: PathLike | None) -> DatasetNotFound:
    """The error for a dataset no data root holds: it names every path searched and the files expected."""
    searched = dict.fromkeys(str(root / layout.folder) for root in roots for layout in spec.layouts)
    expected = " or ".join(layout.describe() for layout in spec.layouts)
    fetch = (f", or rerun with --download (fetches it into {download_root(data_root)})" if spec.download
             else f" (no automatic download: {spec.how_to_get})")
    return DatasetNotFound(
        f"dataset {spec.name!r} not found. Searched:\n" + "".join(f"  {p}\n" for p in searched)
        + f"Expected under a data root: {expected}.\n"
        f"To fix: set {ENV_VAR}=<a root holding it>, pass --data-root <root>{fetch}.")


def locate(spec: DatasetSpec, data_root: PathLike | None = None) -> tuple[Layout, dict[str, Path]]:
    """The first layout found under the search roots and its verified file paths (downloading only if enabled)."""
    roots = search_roots(data_root)
    hit = _first_hit(spec, roots)
    if hit is None and spec.download is not None and download_enabled():
        target = download_root(data_root)
        target.mkdir(parents=True, exist_ok=True)
        spec.download(target)
        hit = _first_hit(spec, [target])
    if hit is None:
        raise not_found(spec, roots, data_root)
    layout, paths = hit
    for name, md5 in layout.files.items():
        if md5 is not None:
            verify(paths[name], md5)
    return layout, paths


_recent: OrderedDict[tuple, SplitArrays] = OrderedDict()
KEEP_RECENT = 2          # mnist_fmnist reads two datasets; a suite builds the same scenario for every seed


def load(spec: DatasetSpec, data_root: PathLike | None = None) -> SplitArrays:
    """Locate, verify and read ``spec``. The last :data:`KEEP_RECENT` datasets read stay in memory (keyed by reader
    and file identity), so building a scenario for each seed reads the files once; their arrays are read-only."""
    layout, paths = locate(spec, data_root)
    key = (layout.read, *((str(p), p.stat().st_mtime_ns) for p in paths.values()))
    if key not in _recent:
        arrays = layout.read(paths)
        for array in (arrays.x_train, arrays.y_train, arrays.x_test, arrays.y_test):
            array.flags.writeable = False
        _recent[key] = arrays
        while len(_recent) > KEEP_RECENT:
            _recent.popitem(last=False)
    _recent.move_to_end(key)
    return _recent[key]


def _first_hit(spec: DatasetSpec, roots: Sequence[Path]) -> tuple[Layout, dict[str, Path]] | None:
    for root in roots:
        for layout in spec.layouts:
            paths = layout.find(root)
            if paths is not None:
                return layout, paths
    return None


# --- idx datasets (MNIST, Fashion-MNIST) -----------------------------------------------------------------------

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _read_idx_split(paths: dict[str, Path]) -> SplitArrays:
    x_train, y_train, x_test, y_test = (readers.read_idx(paths[name]) for name in IDX_FILES)
    return SplitArrays(x_train[..., None], y_train.astype(np.int64), x_test[..., None], y_test.astype(np.int64))


def _idx_dataset(name: str, folders: Sequence[str], md5s: Sequence[str], fetch: Callable[[Path], None]) -> DatasetSpec:
    files = dict(zip(IDX_FILES, md5s))
    return DatasetSpec(name, tuple(Layout(folder, files, _read_idx_split, gzip_ok=True) for folder in folders), fetch)


# md5 of the uncompressed idx bytes (the official contents; .gz bytes differ between re-compressions)
MNIST = _idx_dataset("mnist", ("mnist", "MNIST/raw"),
                     ("6bbc9ace898e44ae57da46a324031adb", "a25bea736e30d166cdddb491f175f624",
                      "2646ac647ad5339dbf082846283269ea", "27ae3e4e09519cfbb04c329615203637"),
                     download.download_mnist)
FASHION_MNIST = _idx_dataset("fashion_mnist", ("fashion-mnist", "FashionMNIST/raw"),
                             ("f4a8712d7a061bf5bd6d2ca38dc4d50a", "9018921c3c673c538a1fc5bad174d6f9",
                              "8181f5470baa50b63fa0f6fddb340f0a", "15d484375f8d13e6eb1aabb0c3f46965"),
                             download.download_fashion_mnist)


# --- CIFAR-100 -------------------------------------------------------------------------------------------------

def _read_cifar_npz(paths: dict[str, Path]) -> SplitArrays:
    arrays = readers.read_npz(paths["cifar100.npz"])
    return SplitArrays(arrays["x_train"], arrays["y_train"].astype(np.int64),
                       arrays["x_test"], arrays["y_test"].astype(np.int64))


def _read_cifar_pickles(paths: dict[str, Path]) -> SplitArrays:
    return SplitArrays(*readers.read_cifar_pickle(paths["train"]), *readers.read_cifar_pickle(paths["test"]))


CIFAR100 = DatasetSpec("cifar100", (
    # the official python pickles, as torchvision downloads them (md5s from torchvision.datasets.CIFAR100)
    Layout("cifar-100-python", {"train": "16019d7e3df5f24257cddd939b257f8d",
                                "test": "f0ef6b0ae62326f3e7ffdfab6717acfc"}, _read_cifar_pickles),
    # a known re-split: x_train (50000, 32, 32, 3), y_train, x_test (10000, 32, 32, 3), y_test; stratified
    # 500/100 images per class drawn from all 60,000 images (NOT the official train/test split)
    Layout("cifar100", {"cifar100.npz": "ae65c9503ccd551e5da0205329b70f8a"}, _read_cifar_npz),
), download.download_cifar100)


# --- ImageNet-style image folders ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageFolderRead:
    """Reads ``train/`` and ``val/`` of an image-folder root (``val/`` with class folders, or flat with a ground-truth
    file: :func:`clbench.data.readers.read_flat_image_folder`). The classes are the wnids listed in ``class_list``
    (see :func:`clbench.data.readers.read_class_list`; a relative path is looked up in the dataset folder), else all
    folders of ``train/``; label ``i`` is the ``i``-th of them in sorted order (ImageFolder's convention)."""

    class_list: str | None = None
    size: int | None = None

    def classes(self, paths: dict[str, Path]) -> list[str]:
        """The selected wnids, sorted."""
        if self.class_list is None:
            return readers.list_classes(paths["train"])
        return sorted(readers.read_class_list(paths["train"].parent / self.class_list))

    def check(self, paths: dict[str, Path], per_class: int = 2) -> None:
        """What reading would refuse that can be seen without decoding, in its words, in well under a second: a flat
        ``val/`` without a ground-truth file and, without ``size``, images of different sizes among the first
        ``per_class`` of each class (and of ``val/``) read from their headers (the read checks every image)."""
        classes = self.classes(paths)
        if not any((paths["val"] / name).is_dir() for name in classes):
            readers.flat_ground_truth(paths["val"])
            val = readers.flat_images(paths["val"])[:per_class * len(classes)]
        else:
            val = [f for name in classes for f in readers.image_files(paths["val"] / name)[:per_class]]
        if self.size is None:
            files = [f for name in classes for f in readers.image_files(paths["train"] / name)[:per_class]]
            readers.check_image_sizes(paths["train"].parent, files + val)

    def __call__(self, paths: dict[str, Path]) -> SplitArrays:
        classes = self.classes(paths)
        x_train, y_train = readers.read_image_folder(paths["train"], classes, self.size)
        flat = not any((paths["val"] / name).is_dir() for name in classes)    # ImageNet's official val/ layout
        read_val = readers.read_flat_image_folder if flat else readers.read_image_folder
        x_test, y_test = read_val(paths["val"], classes, self.size)
        if x_test.shape[1:] != x_train.shape[1:]:
            raise ValueError(f"{paths['val']}: its images are {x_test.shape[2]}x{x_test.shape[1]} and those of "
                             f"{paths['train']} {x_train.shape[2]}x{x_train.shape[1]}; set the scenario's image_size "
                             f"(e.g. image_size: 64) to resize them all.")
        return SplitArrays(x_train, y_train, x_test, y_test, class_names=tuple(classes))


def image_folder_dataset(folder: str, class_list: str | None = None, size: int | None = None) -> DatasetSpec:
    """An ImageNet-style root ``<folder>/{train,val}/<wnid>/*.JPEG``; ``folder`` is relative to a data root, or
    absolute (then it is the only place searched). ``class_list`` and ``size``: see :class:`ImageFolderRead`."""
    return DatasetSpec(folder, (Layout(folder, {"train": None, "val": None}, ImageFolderRead(class_list, size)),),
                       how_to_get="ImageNet cannot be downloaded automatically (licence); place an image-folder copy "
                                  f"with train/ and val/ sub-folders at {_place(folder)}")


def check_image_folder(*, root: str, class_list: str | None = None, image_size: int | None = None,
                       data_root: PathLike | None = None, **_: object) -> None:
    """An image-folder scenario's data checked before its run is imported (``split_imagenet_subset``'s
    ``data_check``, :func:`clbench.preflight.check_suite_datasets`): found under the data roots
    (:class:`DatasetNotFound` otherwise), then :meth:`ImageFolderRead.check`. Needs no torch."""
    spec = image_folder_dataset(root, class_list, image_size)
    layout, paths = locate(spec, data_root)
    layout.read.check(paths)


def _place(folder: str) -> str:
    return folder if Path(folder).is_absolute() else f"<root>/{folder}"
