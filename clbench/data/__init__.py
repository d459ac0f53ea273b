"""Local dataset roots, content checksums, readers and explicit downloads.

API for the CLI::

    clbench.data.configure(data_root=args.data_root, download=args.download)   # --data-root PATH, --download

after which every scenario finds its data through :func:`load` / :func:`locate`, searching (first match wins)
the ``data_root`` argument or the configured one, ``$CLBENCH_DATA``, ``~/.cache/clbench``, ``/usr/share/datasets``.
Nothing is ever downloaded unless ``download=True`` was configured; a missing dataset raises
:class:`DatasetNotFound` naming every path searched, the files expected and how to fix it, and a known file with
the wrong content raises :class:`ChecksumMismatch` (a :class:`DatasetNotFound` too: either stops a suite once, before
its next run). ``clbench.data.search_roots()`` lists the roots in order.

Modules: ``roots`` (search order, settings), ``errors``, ``checksums`` (content md5), ``readers`` (idx, npz, CIFAR
pickle, image folders, class lists), ``catalog`` (known datasets: layouts, checksums, :func:`load`, the in-memory
cache of the last datasets read), ``download`` (torchvision's download code), ``orders`` (DER/DyTox class orders),
``tensors`` (uint8 arrays -> normalized tensors -> class-incremental scenario). Set-up guide: ``docs/data.md``.
"""

from importlib import import_module

from clbench.data.errors import ChecksumMismatch, DatasetNotFound
from clbench.data.roots import configure, search_roots

_CATALOG = frozenset({"CIFAR100", "FASHION_MNIST", "MNIST", "DatasetSpec", "Layout", "SplitArrays",
                      "image_folder_dataset", "load", "locate"})
"""Names of :mod:`clbench.data.catalog` (which reads numpy), imported on first use: the data roots and the errors
import nothing heavy, so that a missing dataset is refused before numpy is imported."""


def __getattr__(name: str):
    if name not in _CATALOG:
        raise AttributeError(f"module 'clbench.data' has no attribute {name!r}")
    value = getattr(import_module("clbench.data.catalog"), name)
    globals()[name] = value
    return value


__all__ = ["CIFAR100", "FASHION_MNIST", "MNIST", "ChecksumMismatch", "DatasetNotFound", "DatasetSpec", "Layout",
           "SplitArrays", "configure", "image_folder_dataset", "load", "locate", "search_roots"]
