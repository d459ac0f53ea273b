"""CropFlip: the per-sample path is torchvision's v2 crop-and-flip bit for bit; the batch path draws from the same
distribution (crop offsets and flips decoded from the outputs, per-pixel means) and is reproducible from the seed."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from clbench.augment import CropFlip
from clbench.data.tensors import crop_flip

SIZE, PAD = 6, 2                       # 5 x 5 offsets x 2 flips = 50 outcomes, each with probability 1/50
N_DRAWS = 5000


def _image() -> torch.Tensor:
    """A (2, 6, 6) image whose every pixel differs from the others and from the zero padding."""
    return torch.arange(1, 2 * SIZE * SIZE + 1, dtype=torch.float32).view(2, SIZE, SIZE)


def _outcomes(image: torch.Tensor) -> torch.Tensor:
    """The 50 possible outputs, ``(50, 2, 6, 6)``, index ``(top * 5 + left) * 2 + flip``."""
    padded = torch.nn.functional.pad(image, (PAD,) * 4)
    crops = [padded[:, t:t + SIZE, s:s + SIZE] for t in range(2 * PAD + 1) for s in range(2 * PAD + 1)]
    return torch.stack([c.flip(-1) if f else c for c in crops for f in (False, True)])


def _counts(outputs: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """How often each of the 50 outcomes occurs among ``outputs`` ``(N, 2, 6, 6)`` (each must be one of them)."""
    match = (outputs[:, None] == _outcomes(image)[None]).flatten(2).all(-1)          # (N, 50)
    assert bool(match.any(1).all()), "an output that no crop and flip of the image gives"
    return match.float().argmax(1).bincount(minlength=50)


def test_per_sample_path_is_torchvision_v2_bit_for_bit():
    reference = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])
    images = torch.randn(64, 3, 32, 32)
    torch.manual_seed(5)
    expected = [reference(x) for x in images]
    torch.manual_seed(5)
    got = [crop_flip(32, padding=4)(x) for x in images]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_per_sample_path_leaves_the_global_generator_where_v2_does():
    reference = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])
    x = torch.randn(3, 32, 32)
    torch.manual_seed(2)
    reference(x)
    after_v2 = torch.rand(4)
    torch.manual_seed(2)
    CropFlip(32, 4)(x)
    assert torch.equal(torch.rand(4), after_v2)


@pytest.mark.parametrize("path", ["sample", "batch"])
def test_every_offset_and_flip_is_drawn_with_probability_one_fiftieth(path):
    image, augment = _image(), CropFlip(SIZE, PAD)
    torch.manual_seed(0)
    if path == "sample":
        outputs = torch.stack([augment(image) for _ in range(N_DRAWS)])
    else:
        outputs = augment.batch(image.expand(N_DRAWS, -1, -1, -1))
    counts = _counts(outputs, image)
    expected, sd = N_DRAWS / 50, (N_DRAWS / 50 * (1 - 1 / 50)) ** 0.5
    assert bool(((counts - expected).abs() < 5 * sd).all()), counts.tolist()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 100, chi2                       # 49 degrees of freedom: P(chi2 > 100) < 1e-4


def test_batch_and_per_sample_paths_agree_on_per_pixel_means():
    """Mean output image over many draws of a random 32 x 32 image, both paths, within 5 standard errors."""
    torch.manual_seed(1)
    image, augment, n = torch.randn(3, 32, 32), CropFlip(32, 4), 4000
    per_sample = torch.stack([augment(image) for _ in range(n)])
    batched = augment.batch(image.expand(n, -1, -1, -1))
    se = ((per_sample.var(0) + batched.var(0)) / n).sqrt().clamp_min(1e-6)
    z = (per_sample.mean(0) - batched.mean(0)).abs() / se
    assert float(z.max()) < 5.5, float(z.max())


def test_batch_is_reproducible_from_the_seed_and_each_sample_is_one_of_its_crops():
    images = torch.randn(16, 2, SIZE, SIZE)
    torch.manual_seed(7)
    first = CropFlip(SIZE, PAD).batch(images)
    torch.manual_seed(7)
    second = CropFlip(SIZE, PAD).batch(images)
    assert torch.equal(first, second)
    for b in range(16):
        assert bool((first[b][None] == _outcomes(images[b])).flatten(1).all(1).any())


def test_crop_larger_than_the_padded_image_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        CropFlip(40, 2)(torch.zeros(1, 32, 32))
    with pytest.raises(ValueError, match="padding >= 0"):
        CropFlip(32, -1)


def test_augmented_samples_draw_what_the_per_sample_dataset_transform_drew_bit_for_bit():
    """Pretraining's path (:class:`~clbench.augment.AugmentedSamples` over a scenario whose crop and flip are its
    batch augmentation) yields the minibatches, bit for bit and draw for draw, that the same scenario built with
    the per-sample train transform gave: its checkpoints stay those made before the batched path."""
    from torch.utils.data import ConcatDataset, DataLoader

    from clbench.augment import AugmentedSamples
    from clbench.protocol import ClassificationInfo
    from clbench.streams import class_incremental

    x, y = torch.randn(24, 3, 8, 8), torch.arange(4).repeat_interleave(6)
    info = ClassificationInfo(name="tiny", n_classes=4, classes_per_experience=(2, 2), input_shape=(3, 8, 8))
    augment = CropFlip(8, padding=1)
    old = class_incremental(info, x, y, x, y, class_order=[0, 1, 2, 3], train_transform=augment)
    new = class_incremental(info, x, y, x, y, class_order=[0, 1, 2, 3])
    datasets = {"per-sample transform": ConcatDataset([e.dataset.train() for e in old.train_stream]),
                "AugmentedSamples": ConcatDataset([AugmentedSamples(e.dataset.train(), augment)
                                                   for e in new.train_stream])}
    def draws(dataset) -> list[torch.Tensor]:
        torch.manual_seed(3)
        loader = DataLoader(dataset, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(0))
        return [t for _ in range(2) for batch in loader for t in batch] + [torch.rand(1)]   # and the RNG after

    before, after = (draws(d) for d in datasets.values())
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))
    plain = draws(ConcatDataset([e.dataset.train() for e in new.train_stream]))
    assert not torch.equal(plain[0], after[0])                                 # the samples were augmented
