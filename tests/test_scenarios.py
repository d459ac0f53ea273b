"""Real-data scenarios: class splits, sizes, class orders and renumbering, normalization, transforms.

Construction logic is also checked on in-memory arrays and a tiny image folder (always run). The checks on the real
datasets need ``$CLBENCH_DATA`` (CI sets ``../shared/data``) and are skipped, with the reason, when it is absent.
Real builds use subsets (``max_per_class``) except one full MNIST build; each is built once per module.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from clbench import data
from clbench.augment import CropFlip
from clbench.data import roots
from clbench.data.catalog import SplitArrays
from clbench.data.orders import CIFAR100_ORDERS, IMAGENET100_ORDER1, resolve_class_order
from clbench.data.tensors import channel_stats, image_class_incremental, to_normalized
from clbench.protocol import ClassificationInfo
from clbench.registry import SCENARIOS
from clbench.scenarios.cifar import CIFAR100_MEAN, CIFAR100_STD, cifar100_transfer, split_cifar100
from clbench.scenarios.imagenet import split_imagenet_subset
from clbench.scenarios.mnist import (
    FASHION_MNIST_STATS,
    JOINT_STATS,
    MNIST_STATS,
    mnist_fmnist,
    mnist_transfer,
    split_fmnist,
    split_mnist,
)

REAL = os.environ.get("CLBENCH_DATA")


def real_root(folder: str) -> Path:
    if not REAL or not (Path(REAL) / folder).is_dir():
        pytest.skip(f"real data not available: set CLBENCH_DATA to a root holding {folder}/ (e.g. ../shared/data)")
    return Path(REAL)


def experiences(stream):
    """``[(x, y), ...]`` of a stream's stored tensors (eval transform group: no augmentation)."""
    out = []
    for exp in stream:
        ds = exp.dataset.eval()
        xs, ys = zip(*((x, y) for x, y, *_ in ds))
        out.append((torch.stack(xs), torch.as_tensor(ys)))
    return out


def assert_class_incremental(scenario, train_sizes=None):
    """Experience t holds exactly ``info.class_range(t)`` in train and test; classes are disjoint across steps."""
    info = scenario.info
    for stream in (scenario.train_stream, scenario.test_stream):
        seen: set[int] = set()
        for t, (_, y) in enumerate(experiences(stream)):
            labels = set(y.tolist())
            assert labels == set(info.class_range(t)), (stream, t)
            assert not labels & seen
            seen |= labels
        assert seen == set(range(info.n_classes))
    if train_sizes is not None:
        assert [len(e.dataset) for e in scenario.train_stream] == train_sizes


def test_all_scenarios_are_registered():
    assert {"split_mnist", "split_fmnist", "mnist_fmnist", "split_cifar100", "split_imagenet_subset"} <= set(
        SCENARIOS.names())


# --- construction on in-memory arrays (no real data needed) ---------------------------------------------------

def tiny_arrays(n_classes=6, per_class=3, size=4) -> SplitArrays:
    """Image ``k`` of class ``c`` is constant ``10 * c + k`` (uint8, RGB), so every sample says where it came from."""
    y = np.repeat(np.arange(n_classes), per_class)
    k = np.tile(np.arange(per_class), n_classes)
    x = np.broadcast_to((10 * y + k).astype(np.uint8)[:, None, None, None], (len(y), size, size, 3)).copy()
    return SplitArrays(x, y, x.copy(), y.copy())


def test_subset_of_classes_is_renumbered_by_position_in_the_order_and_the_original_order_reported():
    arrays = tiny_arrays()
    order = [5, 2, 3, 0]                                      # a prefix of some longer order: classes 1 and 4 dropped
    info = ClassificationInfo(name="t", n_classes=4, classes_per_experience=(2, 2), input_shape=(3, 4, 4),
                        mean=(0.0,) * 3, std=(1 / 255,) * 3)  # std 1/255: tensors hold the raw pixel values
    scenario = image_class_incremental(info, arrays, order, max_per_class=2)
    assert scenario.info.class_order == (5, 2, 3, 0) and scenario.info.input_shape == (3, 4, 4)
    assert_class_incremental(scenario, train_sizes=[4, 4])
    for x, y in experiences(scenario.train_stream):
        for image, label in zip(x, y):
            original, k = divmod(round(image[0, 0, 0].item()), 10)
            assert original == order[label] and k < 2          # renumbered label c is original class order[c]


def test_normalization_uses_info_statistics_per_channel():
    x = np.zeros((1, 2, 2, 3), np.uint8)
    x[..., 1] = 255
    out = to_normalized(x, mean=(0.5, 0.5, 0.0), std=(0.5, 0.25, 1.0))
    assert out.shape == (1, 3, 2, 2)
    assert out[0, :, 0, 0].tolist() == [-1.0, 2.0, 0.0]


def test_class_order_choices():
    assert resolve_class_order("fixed", 5, seed=0) == [0, 1, 2, 3, 4]
    assert resolve_class_order("random", 10, seed=1) == resolve_class_order("random", 10, seed=1)
    assert resolve_class_order("random", 10, seed=1) != resolve_class_order("random", 10, seed=2)
    for k in (1, 2, 3):
        assert sorted(CIFAR100_ORDERS[k]) == list(range(100))
        assert resolve_class_order(k, 100, 0, CIFAR100_ORDERS) == list(CIFAR100_ORDERS[k])
    assert CIFAR100_ORDERS[1][:5] == (87, 0, 52, 58, 44)      # iCaRL's order, DER/DyTox order 1
    assert CIFAR100_ORDERS[2][:3] == (58, 30, 93) and CIFAR100_ORDERS[3][:3] == (71, 54, 45)
    assert sorted(IMAGENET100_ORDER1) == list(range(100))
    with pytest.raises(ValueError, match="'fixed', 'random', 1"):
        resolve_class_order(4, 100, 0, {1: CIFAR100_ORDERS[1]})
    with pytest.raises(ValueError, match="not a permutation"):
        resolve_class_order(1, 10, 0, {1: IMAGENET100_ORDER1})


def make_imagenet_like(root: Path, n_classes=4, train=3, val=2) -> list[str]:
    wnids = [f"n0{c}" for c in range(n_classes)]
    for split, count in (("train", train), ("val", val)):
        for c, wnid in enumerate(wnids):
            (root / split / wnid).mkdir(parents=True)
            for k in range(count):
                image = np.full((8, 8, 3), 40 * c + k, np.uint8)
                Image.fromarray(image).save(root / split / wnid / f"{wnid}_{k}.JPEG", format="PNG")
    return wnids


def test_imagenet_subset_on_an_image_folder_with_a_class_list(tmp_path, monkeypatch):
    monkeypatch.setattr(roots, "SYSTEM_ROOTS", ())
    make_imagenet_like(tmp_path / "data" / "inet")
    (tmp_path / "data" / "inet" / "subset.txt").write_text("n03\tthird\nn01\tfirst\nn02\tsecond\n")
    scenario = split_imagenet_subset(root="inet", class_list="subset.txt", n_experiences=3,
                                     data_root=tmp_path / "data")
    info = scenario.info
    assert info.extra["wnids"] == ("n01", "n02", "n03")         # label i = i-th listed wnid in sorted order
    assert info.n_classes == 3 and info.input_shape == (3, 8, 8) and info.classes_per_experience == (1, 1, 1)
    assert_class_incremental(scenario, train_sizes=[3, 3, 3])
    assert [len(e.dataset) for e in scenario.test_stream] == [2, 2, 2]
    with pytest.raises(ValueError, match="not a permutation"):
        split_imagenet_subset(root="inet", class_order=1, data_root=tmp_path / "data")


def test_scenario_without_data_raises_dataset_not_found(tmp_path, monkeypatch):
    monkeypatch.delenv("CLBENCH_DATA", raising=False)
    monkeypatch.setattr(roots, "SYSTEM_ROOTS", ())
    with pytest.raises(data.DatasetNotFound, match="--download"):
        split_mnist(data_root=tmp_path)
    with pytest.raises(data.DatasetNotFound, match="no automatic download"):
        split_imagenet_subset(root="imagenet100", data_root=tmp_path)


# --- MNIST family --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mnist_full():
    return split_mnist(data_root=real_root("mnist"))


def test_split_mnist_full_sizes_classes_and_normalization(mnist_full):
    info = mnist_full.info
    assert info.classes_per_experience == (2,) * 5 and info.input_shape == (1, 28, 28) and info.mean == MNIST_STATS[0]
    sizes = [len(e.dataset) for e in mnist_full.train_stream]
    assert sum(sizes) == 60000 and sum(len(e.dataset) for e in mnist_full.test_stream) == 10000
    assert sizes[0] == 5923 + 6742                              # the official counts of digits 0 and 1
    x = torch.cat([x for x, _ in experiences(mnist_full.train_stream)])
    assert abs(x.mean().item()) < 1e-3 and abs(x.std().item() - 1) < 1e-3
    assert_class_incremental(mnist_full)


def test_split_mnist_random_order_renumbers_labels():
    root = real_root("mnist")
    scenario = split_mnist(seed=3, class_order="random", max_per_class=5, data_root=root)
    order = scenario.info.class_order
    assert sorted(order) == list(range(10)) and list(order) == resolve_class_order("random", 10, 3)
    assert_class_incremental(scenario, train_sizes=[10] * 5)
    raw = data.load(data.MNIST, root)
    first = {c: int(np.flatnonzero(raw.y_train == c)[0]) for c in range(10)}
    x0, y0 = experiences(scenario.train_stream)[0]
    for renumbered in (0, 1):
        expected = to_normalized(raw.x_train[first[order[renumbered]]][None], *MNIST_STATS)[0]
        torch.testing.assert_close(x0[y0 == renumbered][0], expected)


def test_split_fmnist_subset():
    scenario = split_fmnist(n_experiences=2, max_per_class=20, data_root=real_root("fashion-mnist"))
    assert scenario.info.classes_per_experience == (5, 5)
    assert_class_incremental(scenario, train_sizes=[100, 100])
    assert [len(e.dataset) for e in scenario.test_stream] == [100, 100]


@pytest.mark.parametrize("mode", ["class", "domain"])
def test_mnist_then_fashion_mnist(mode):
    root = real_root("mnist") and real_root("fashion-mnist")
    scenario = mnist_fmnist(mode=mode, max_per_class=10, data_root=root)
    info = scenario.info
    assert info.classes_per_experience == (10, 10) and info.mean == JOINT_STATS[0]
    assert info.domain_incremental == (mode == "domain") and info.n_classes == (20 if mode == "class" else 10)
    train = experiences(scenario.train_stream)
    offset = 10 if mode == "class" else 0
    assert set(train[0][1].tolist()) == set(range(10)) and set(train[1][1].tolist()) == set(range(offset, offset + 10))
    assert info.n_seen(1) == info.n_classes
    fashion = data.load(data.FASHION_MNIST, root)
    first_coat = int(np.flatnonzero(fashion.y_train == 4)[0])
    expected = to_normalized(fashion.x_train[first_coat][None], *JOINT_STATS)[0]
    torch.testing.assert_close(train[1][0][train[1][1] == 4 + offset][0], expected)
    assert [len(e.dataset) for e in scenario.test_stream] == [100, 100]


def test_mnist_normalization_constants_are_the_training_set_statistics():
    mnist = data.load(data.MNIST, real_root("mnist")).x_train
    fashion = data.load(data.FASHION_MNIST, real_root("fashion-mnist")).x_train
    assert channel_stats(mnist) == MNIST_STATS
    assert channel_stats(fashion) == FASHION_MNIST_STATS
    assert channel_stats(np.concatenate([mnist, fashion])) == JOINT_STATS


# --- CIFAR-100 -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [1, 2, 3])
def test_split_cifar100_dytox_orders(order):
    root = real_root("cifar100")
    scenario = split_cifar100(class_order=order, n_experiences=10, max_per_class=2, data_root=root)
    assert scenario.info.class_order == CIFAR100_ORDERS[order] and scenario.info.default_model == "resnet32"
    assert_class_incremental(scenario, train_sizes=[20] * 10)
    raw = data.load(data.CIFAR100, root)
    x, y = experiences(scenario.train_stream)[3]                 # experience 3 = classes order[30:40]
    original = CIFAR100_ORDERS[order][30]
    expected = to_normalized(raw.x_train[np.flatnonzero(raw.y_train == original)[:1]], CIFAR100_MEAN, CIFAR100_STD)
    torch.testing.assert_close(x[y == 30][0], expected[0])


@pytest.mark.parametrize("kwargs, steps", [
    (dict(n_experiences=11, initial_classes=50), (50,) + (5,) * 10),     # B50, 10 steps
    (dict(n_experiences=6, initial_classes=50), (50,) + (10,) * 5),      # B50, 5 steps
    (dict(n_experiences=20), (5,) * 20),
    (dict(n_experiences=50), (2,) * 50),
    (dict(n_experiences=5, classes=10), (2,) * 5),
])
def test_split_cifar100_steps(kwargs, steps):
    scenario = split_cifar100(max_per_class=1, data_root=real_root("cifar100"), **kwargs)
    assert scenario.info.classes_per_experience == steps
    assert_class_incremental(scenario, train_sizes=list(steps))


def test_split_cifar100_rejects_uneven_steps():
    with pytest.raises(ValueError, match="divide evenly"):
        split_cifar100(n_experiences=7, max_per_class=1, data_root=real_root("cifar100"))


def test_split_cifar100_normalization_and_train_augmentation():
    scenario = split_cifar100(class_order="random", seed=5, max_per_class=100, n_experiences=5,
                              data_root=real_root("cifar100"))
    x = torch.cat([x for x, _ in experiences(scenario.train_stream)])
    assert x.shape == (10000, 3, 32, 32)
    stats = channel_stats(data.load(data.CIFAR100, real_root("cifar100")).x_train)     # the whole re-split
    assert np.allclose(stats, (CIFAR100_MEAN, CIFAR100_STD), atol=1e-3)
    mean, std = x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.zeros(3), atol=0.03) and torch.allclose(std, torch.ones(3), atol=0.03)
    exp = scenario.train_stream[0]
    stored = exp.dataset.eval()[0][0]
    # the crop and flip are the batch augmentation of the training loops, not a per-sample dataset transform
    assert scenario.info.batch_augment == CropFlip(32, padding=4)
    assert all(torch.equal(exp.dataset.train()[0][0], stored) for _ in range(5))
    augmented = [scenario.info.batch_augment.batch(stored[None])[0] for _ in range(20)]
    assert all(a.shape == (3, 32, 32) for a in augmented)
    assert any(not torch.equal(a, stored) for a in augmented)     # crops/flips change the image
    assert torch.equal(exp.dataset.eval()[0][0], stored)          # evaluation sees the stored image


# --- Tiny-ImageNet-100 as an ImageNet subset ----------------------------------------------------------------

def test_imagenet_subset_on_tiny_imagenet_100():
    root = real_root("tiny-imagenet-100")
    scenario = split_imagenet_subset(class_list="classes.tsv", class_order=1, n_experiences=11, initial_classes=50,
                                     data_root=root)
    info = scenario.info
    assert info.n_classes == 100 and info.input_shape == (3, 64, 64) and len(info.extra["wnids"]) == 100
    assert info.class_order == IMAGENET100_ORDER1 and info.classes_per_experience == (50,) + (5,) * 10
    assert_class_incremental(scenario, train_sizes=[1500] + [150] * 10)
    assert [len(e.dataset) for e in scenario.test_stream] == [500] + [50] * 10
    small = split_imagenet_subset(image_size=32, classes=10, n_experiences=2, max_per_class=4, data_root=root)
    assert small.info.input_shape == (3, 32, 32) and small.info.classes_per_experience == (5, 5)
    assert [len(e.dataset) for e in small.train_stream] == [20, 20]


def _by_label(pairs):
    """(x, y) of several experiences concatenated and sorted by label (stable), to compare streams."""
    x, y = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    order = torch.sort(y, stable=True).indices
    return x[order], y[order]


def test_cifar100_transfer_is_classes_0_to_49_in_one_experience():
    """He et al.'s single-task protocol: one experience holding exactly the images that the 5-step split of the
    first 50 classes (fixed order) spreads over its steps; classes 50-99 (the pre-training source) refused."""
    root = real_root("cifar100")
    scenario = cifar100_transfer(max_per_class=2, data_root=root)
    assert scenario.info.classes_per_experience == (50,) and scenario.info.name == "cifar100_transfer"
    assert len(scenario.train_stream) == len(scenario.test_stream) == 1
    split = split_cifar100(n_experiences=5, class_order="fixed", classes=50, max_per_class=2, data_root=root)
    for mine, theirs in ((scenario.train_stream, split.train_stream), (scenario.test_stream, split.test_stream)):
        (x, y), = experiences(mine)
        x_ref, y_ref = _by_label(experiences(theirs))
        assert set(y.tolist()) == set(range(50))
        x, y = _by_label([(x, y)])
        assert torch.equal(y, y_ref) and torch.equal(x, x_ref)
    with pytest.raises(ValueError, match="classes must be in 1..50"):
        cifar100_transfer(classes=51, max_per_class=1, data_root=root)


def test_mnist_transfer_is_the_ten_digits_in_one_experience():
    root = real_root("mnist")
    scenario = mnist_transfer(max_per_class=3, data_root=root)
    assert scenario.info.classes_per_experience == (10,) and len(scenario.train_stream) == 1
    split = split_mnist(max_per_class=3, data_root=root)
    (x, y), = experiences(scenario.train_stream)
    x_ref, y_ref = _by_label(experiences(split.train_stream))
    x, y = _by_label([(x, y)])
    assert torch.equal(y, y_ref) and torch.equal(x, x_ref) and set(y.tolist()) == set(range(10))
