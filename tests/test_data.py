"""Data layer: readers, content checksums, search-order precedence, missing-data errors, explicit downloads.

Fixtures are built in ``tmp_path``; the checks against the real files need ``$CLBENCH_DATA`` (CI sets it to
``../shared/data``) and are skipped, with the reason, when it is absent.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clbench.data import catalog, checksums, download, readers, roots
from clbench.data.catalog import DatasetNotFound, DatasetSpec, Layout, SplitArrays
from clbench.data.checksums import ChecksumMismatch

REAL_DATA = os.environ.get("CLBENCH_DATA")          # read before the fixtures below isolate the environment


def real_root(folder: str) -> Path:
    """``$CLBENCH_DATA`` if it holds ``folder``, else skip the test (with the reason)."""
    env = REAL_DATA
    if not env or not (Path(env) / folder).is_dir():
        pytest.skip(f"real data not available: set CLBENCH_DATA to a root holding {folder}/ (e.g. ../shared/data)")
    return Path(env)


@pytest.fixture(autouse=True)
def isolated_roots(tmp_path, monkeypatch):
    """No test sees the machine's real roots unless it sets them; settings are reset afterwards."""
    monkeypatch.delenv("CLBENCH_DATA", raising=False)
    monkeypatch.setattr(roots, "SYSTEM_ROOTS", (tmp_path / "cache", tmp_path / "system"))
    roots.configure()
    yield
    roots.configure()


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write ``array`` (uint8) in the idx format, gzipped when the name ends with ``.gz``."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# --- readers ---------------------------------------------------------------------------------------------------

def test_idx_reader_reads_plain_and_gzipped_files_identically(tmp_path):
    images = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    write_idx(tmp_path / "images-idx3-ubyte", images)
    write_idx(tmp_path / "images-idx3-ubyte.gz", images)
    plain, gz = readers.read_idx(tmp_path / "images-idx3-ubyte"), readers.read_idx(tmp_path / "images-idx3-ubyte.gz")
    assert plain.shape == (3, 4, 5) and plain.dtype == np.uint8
    np.testing.assert_array_equal(plain, images)
    np.testing.assert_array_equal(gz, images)


def test_idx_reader_rejects_bad_magic_and_truncated_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="not an idx file"):
        readers.read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((4, 2), dtype=np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(ValueError, match="expected"):
        readers.read_idx(tmp_path / "short")


def test_npz_reader_returns_every_array(tmp_path):
    np.savez(tmp_path / "d.npz", x_train=np.ones((2, 3, 3, 3), np.uint8), y_train=np.array([4, 7]))
    arrays = readers.read_npz(tmp_path / "d.npz")
    assert set(arrays) == {"x_train", "y_train"}
    assert arrays["x_train"].shape == (2, 3, 3, 3) and arrays["y_train"].tolist() == [4, 7]


def test_cifar_pickle_reader_converts_channel_major_rows_to_nhwc(tmp_path):
    rows = np.zeros((2, 3072), dtype=np.uint8)
    rows[1, 0], rows[1, 1024], rows[1, 2048] = 10, 20, 30      # R, G, B of pixel (0, 0) of image 1
    rows[1, 1023] = 99                                         # R of pixel (31, 31)
    with open(tmp_path / "train", "wb") as f:
        pickle.dump({"data": rows, "fine_labels": [3, 97], "coarse_labels": [0, 1]}, f)
    x, y = readers.read_cifar_pickle(tmp_path / "train")
    assert x.shape == (2, 32, 32, 3) and x.dtype == np.uint8
    assert x[1, 0, 0].tolist() == [10, 20, 30] and x[1, 31, 31, 0] == 99
    assert y.tolist() == [3, 97] and y.dtype == np.int64


def make_image_folder(folder: Path, classes: dict[str, int], size: int = 8) -> None:
    """``folder/<class>/img<k>.png`` with ``count`` images per class; pixel value = 10 * class index + k."""
    for c, (name, count) in enumerate(classes.items()):
        (folder / name).mkdir(parents=True)
        for k in range(count):
            Image.fromarray(np.full((size, size, 3), 10 * c + k, np.uint8)).save(folder / name / f"img{k}.png")
    (folder / list(classes)[0] / "notes.txt").write_text("not an image")


def test_image_folder_reader_labels_by_class_list_and_resizes(tmp_path):
    make_image_folder(tmp_path, {"n02": 2, "n01": 3})
    assert readers.list_classes(tmp_path) == ["n01", "n02"]
    x, y = readers.read_image_folder(tmp_path, ["n01", "n02"])
    assert x.shape == (5, 8, 8, 3) and x.dtype == np.uint8
    assert y.tolist() == [0, 0, 0, 1, 1]
    assert x[:, 0, 0, 0].tolist() == [10, 11, 12, 0, 1]          # n01 was written as class 1, n02 as class 0
    small, _ = readers.read_image_folder(tmp_path, ["n02"], size=4)
    assert small.shape == (2, 4, 4, 3)


def _imagenet_tree(root: Path, val_sizes: dict[str, int]) -> None:
    """``root/train/<wnid>/`` (two 8 px JPEGs a class) and a flat ``root/val/`` of real JPEGs (ImageNet's official
    validation layout), one per ``val_sizes`` entry ``file stem -> size``, with ``LOC_val_solution.csv`` beside it."""
    make_image_folder(root / "train", {"n01": 2, "n02": 2})
    (root / "val").mkdir()
    truth = {"ILSVRC2012_val_00000001": "n02", "ILSVRC2012_val_00000002": "n01", "ILSVRC2012_val_00000003": "n03"}
    for k, (stem, size) in enumerate(val_sizes.items()):
        Image.fromarray(np.full((size, size, 3), 40 + 50 * k, np.uint8)).save(root / "val" / f"{stem}.JPEG")
    (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "".join(
        f"{stem},{wnid} 1 2 30 40 {wnid} 5 6 7 8\n" for stem, wnid in truth.items()))


def test_imagenet_official_flat_val_is_labelled_by_its_ground_truth_file(tmp_path):
    """JPEGs directly in val/ (was a raw FileNotFoundError in every run): labels from LOC_val_solution.csv, images
    of classes not selected left out."""
    from clbench.data.catalog import ImageFolderRead

    _imagenet_tree(tmp_path, {f"ILSVRC2012_val_0000000{k}": 8 for k in (1, 2, 3)})
    arrays = ImageFolderRead()({"train": tmp_path / "train", "val": tmp_path / "val"})
    assert arrays.class_names == ("n01", "n02") and arrays.y_test.tolist() == [1, 0]
    assert [abs(int(v) - want) <= 3 for v, want in zip(arrays.x_test[:, 4, 4, 0], (40, 90))] == [True, True]
    (tmp_path / "LOC_val_solution.csv").unlink()
    with pytest.raises(ValueError, match="holds its images directly, without class folders, and no ground-truth "
                                         "file .* put ImageNet's LOC_val_solution.csv beside val/"):
        ImageFolderRead()({"train": tmp_path / "train", "val": tmp_path / "val"})


def test_images_of_mixed_sizes_are_refused_naming_image_size(tmp_path):
    from clbench.data.catalog import ImageFolderRead

    _imagenet_tree(tmp_path, {"ILSVRC2012_val_00000001": 8, "ILSVRC2012_val_00000002": 12})
    paths = {"train": tmp_path / "train", "val": tmp_path / "val"}
    with pytest.raises(ValueError, match=r"images of different sizes \(8x8, 12x12\); set the scenario's image_size"):
        ImageFolderRead()(paths)
    assert ImageFolderRead(size=6)(paths).x_test.shape == (2, 6, 6, 3)
    (tmp_path / "val" / "ILSVRC2012_val_00000002.JPEG").unlink()
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(tmp_path / "val" / "ILSVRC2012_val_00000002.JPEG")
    (tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG").unlink()
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG")
    with pytest.raises(ValueError, match=r"its images are 12x12 and those of .*train 8x8; set the scenario's "
                                         r"image_size"):
        ImageFolderRead()(paths)


def test_an_image_folder_is_checked_from_its_listing_and_headers_before_it_is_read(tmp_path, monkeypatch):
    """ImageFolderRead.check refuses, in the read's words and without decoding an image, a flat val/ without its
    ground-truth file and images of different sizes (unless ``size`` resizes them); a good folder passes."""
    from clbench.data.catalog import ImageFolderRead

    _imagenet_tree(tmp_path, {"ILSVRC2012_val_00000001": 8, "ILSVRC2012_val_00000002": 12})
    paths = {"train": tmp_path / "train", "val": tmp_path / "val"}
    monkeypatch.setattr(Image.Image, "convert", lambda *a: pytest.fail("an image was decoded"))
    with pytest.raises(ValueError, match=r"images of different sizes \(8x8, 12x12\); set the scenario's image_size"):
        ImageFolderRead().check(paths)
    ImageFolderRead(size=6).check(paths)
    (tmp_path / "LOC_val_solution.csv").unlink()
    with pytest.raises(ValueError, match="holds its images directly, without class folders, and no ground-truth "
                                         "file .* put ImageNet's LOC_val_solution.csv beside val/"):
        ImageFolderRead(size=6).check(paths)
    good = tmp_path / "good"
    make_image_folder(good / "train", {"n01": 2, "n02": 2})
    make_image_folder(good / "val", {"n01": 1, "n02": 1})
    ImageFolderRead().check({"train": good / "train", "val": good / "val"})


def test_class_list_reader_accepts_wnid_lines_and_split_file_lines(tmp_path):
    (tmp_path / "classes.tsv").write_text("n01\tgoldfish, Carassius\n\n# comment\nn03\tfrog\nn01\tagain\n")
    assert readers.read_class_list(tmp_path / "classes.tsv") == ["n01", "n03"]
    (tmp_path / "train_100.txt").write_text("train/n05/n05_1.JPEG 0\ntrain/n05/n05_2.JPEG 0\ntrain/n04/n04_9.JPEG 1\n")
    assert readers.read_class_list(tmp_path / "train_100.txt") == ["n05", "n04"]


# --- checksums -------------------------------------------------------------------------------------------------

def test_content_md5_is_the_md5_of_the_uncompressed_bytes(tmp_path):
    data = b"some official bytes" * 100
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "f.gz").write_bytes(gzip.compress(data, compresslevel=1))
    assert checksums.content_md5(tmp_path / "f") == checksums.content_md5(tmp_path / "f.gz") == md5(data)
    checksums.verify(tmp_path / "f.gz", md5(data))


def test_corrupted_file_is_rejected_with_path_and_both_checksums(tmp_path):
    data = b"official" * 50
    (tmp_path / "f").write_bytes(data[:-1] + b"X")
    with pytest.raises(ChecksumMismatch) as err:
        checksums.verify(tmp_path / "f", md5(data))
    message = str(err.value)
    assert str(tmp_path / "f") in message and md5(data) in message and md5(data[:-1] + b"X") in message
    assert "--download" in message


def test_truncated_gzip_is_rejected_as_a_checksum_failure(tmp_path):
    (tmp_path / "f.gz").write_bytes(gzip.compress(b"x" * 1000)[:-10])
    with pytest.raises(ChecksumMismatch, match="cannot be read"):
        checksums.content_md5(tmp_path / "f.gz")


def test_known_dataset_with_wrong_content_is_rejected_when_loaded(tmp_path):
    folder = tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    for name in catalog.IDX_FILES:
        write_idx(folder / f"{name}.gz", np.zeros((2, 2), np.uint8))
    with pytest.raises(ChecksumMismatch, match="train-images-idx3-ubyte.gz: content md5 is"):
        catalog.load(catalog.MNIST, tmp_path / "data")


# --- search order, missing data, downloads ---------------------------------------------------------------------

def marker_spec(download_fn=None) -> DatasetSpec:
    """A dataset ``ds/marker.txt`` whose 'arrays' record the folder it was read from."""
    def read(paths):
        return SplitArrays(*(np.array([str(paths["marker.txt"].parent)]),) * 4)
    return DatasetSpec("ds", (Layout("ds", {"marker.txt": None}, read),), download_fn, how_to_get="ask a friend")


def put_marker(root: Path) -> str:
    (root / "ds").mkdir(parents=True)
    (root / "ds" / "marker.txt").write_text("x")
    return str(root / "ds")


def test_search_order_explicit_then_configured_then_env_then_cache_then_system(tmp_path, monkeypatch):
    spec = marker_spec()
    where = {name: put_marker(tmp_path / name) for name in ("explicit", "configured", "env", "cache", "system")}
    monkeypatch.setenv("CLBENCH_DATA", str(tmp_path / "env"))
    roots.configure(data_root=tmp_path / "configured")
    assert catalog.load(spec, data_root=tmp_path / "explicit").x_train[0] == where["explicit"]
    assert catalog.load(spec).x_train[0] == where["configured"]
    roots.configure()
    assert catalog.load(spec).x_train[0] == where["env"]
    monkeypatch.delenv("CLBENCH_DATA")
    assert catalog.load(spec).x_train[0] == where["cache"]
    (tmp_path / "cache" / "ds" / "marker.txt").unlink()
    assert catalog.load(spec).x_train[0] == where["system"]


def test_missing_dataset_error_names_every_path_every_file_and_the_fixes(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_DATA", str(tmp_path / "env"))
    with pytest.raises(DatasetNotFound) as err:
        catalog.load(catalog.MNIST, data_root=tmp_path / "mine")
    message = str(err.value)
    for root in ("mine", "env", "cache", "system"):
        for folder in ("mnist", "MNIST/raw"):
            assert str(tmp_path / root / folder) in message
    for name in catalog.IDX_FILES:
        assert f"{name}[.gz]" in message
    assert "CLBENCH_DATA" in message and "--data-root" in message and "--download" in message
    assert str(tmp_path / "mine") in message.split("--download")[1]         # where a download would go


def test_dataset_without_download_says_so(tmp_path):
    with pytest.raises(DatasetNotFound, match="no automatic download: ask a friend"):
        catalog.load(marker_spec(), data_root=tmp_path)


def test_download_runs_only_when_enabled_and_into_the_chosen_root(tmp_path):
    calls = []

    def fetch(root: Path) -> None:
        calls.append(root)
        put_marker(root)

    spec = marker_spec(fetch)
    with pytest.raises(DatasetNotFound):
        catalog.load(spec, data_root=tmp_path / "mine")
    assert calls == []
    roots.configure(data_root=tmp_path / "mine", download=True)
    assert catalog.load(spec).x_train[0] == str(tmp_path / "mine" / "ds")
    assert calls == [tmp_path / "mine"]
    catalog.load(spec)
    assert len(calls) == 1                                                   # found now: no second download


@pytest.mark.parametrize("function, class_name", [(download.download_mnist, "MNIST"),
                                                  (download.download_fashion_mnist, "FashionMNIST"),
                                                  (download.download_cifar100, "CIFAR100")])
def test_downloads_go_through_torchvision_with_download_true(function, class_name, tmp_path, monkeypatch):
    import torchvision.datasets

    seen = []
    monkeypatch.setattr(torchvision.datasets, class_name, lambda root, **kw: seen.append((root, kw)))
    function(tmp_path)
    assert seen == [(tmp_path, {"train": True, "download": True})]


def test_known_layouts_match_torchvision_download_folders():
    folders = {spec.name: [layout.folder for layout in spec.layouts]
               for spec in (catalog.MNIST, catalog.FASHION_MNIST, catalog.CIFAR100)}
    assert "MNIST/raw" in folders["mnist"] and "FashionMNIST/raw" in folders["fashion_mnist"]
    assert "cifar-100-python" in folders["cifar100"]


# --- the real files --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [catalog.MNIST, catalog.FASHION_MNIST, catalog.CIFAR100], ids=lambda s: s.name)
def test_real_files_pass_their_content_checksums(spec):
    folder = {"mnist": "mnist", "fashion_mnist": "fashion-mnist", "cifar100": "cifar100"}[spec.name]
    root = real_root(folder)
    layout, paths = catalog.locate(spec, data_root=root)               # verifies every known file
    assert layout.folder == folder and all(p.exists() for p in paths.values())


def test_real_mnist_train_images_have_the_canonical_content_md5():
    root = real_root("mnist")
    assert checksums.content_md5(root / "mnist" / "train-images-idx3-ubyte.gz") == "6bbc9ace898e44ae57da46a324031adb"
