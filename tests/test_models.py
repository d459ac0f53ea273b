import pytest
import torch

from clbench.models.checkpoint import load_weights, save_weights
from clbench.models.classifier import build_classifier
from clbench.protocol import ClassificationInfo
from clbench.registry import MODELS

INFO = ClassificationInfo(name="x", n_classes=10, classes_per_experience=(5, 5), input_shape=(3, 16, 16))


@pytest.mark.parametrize("name, args", [("mlp", {}), ("cnn", {"width": 8}), ("resnet32", {"width": 4}),
                                        ("resnet18", {"width": 4}), ("vit", {"embed_dim": 16, "depth": 1})])
def test_backbones_produce_features_and_logits(name, args):
    model = build_classifier(INFO, name, args, head="fixed")
    x = torch.randn(2, 3, 16, 16)
    assert model.feature_extractor(x).shape == (2, model.feature_extractor.out_features)
    assert model(x).shape == (2, 10)


def test_resnet32_has_the_cifar_size():
    n = sum(p.numel() for p in MODELS.get("resnet32")(INFO).parameters())
    assert 0.45e6 < n < 0.48e6            # ResNet-32 for CIFAR: 0.46M parameters


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_checkpoint_round_trip_skips_other_heads(tmp_path, suffix):
    source = MODELS.get("vit")(INFO, embed_dim=16, depth=1, num_classes=7)
    path = save_weights(source, tmp_path / f"w{suffix}")
    target = MODELS.get("vit")(INFO, embed_dim=16, depth=1)
    skipped = load_weights(target, path)
    assert sorted(skipped) == ["head.bias", "head.weight"]
    assert torch.equal(target.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)


def test_checkpoint_of_another_width_is_refused_naming_the_file(tmp_path):
    """A backbone of another width: every tensor's shape differs, so skipping them would train from scratch."""
    path = save_weights(MODELS.get("vit")(INFO, embed_dim=16, depth=1), tmp_path / "w16.safetensors")
    with pytest.raises(ValueError, match=r"w16\.safetensors does not fit this model: .*backbone tensor"):
        load_weights(MODELS.get("vit")(INFO, embed_dim=32, depth=1), path)


def test_missing_checkpoint_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="run_bench.py pretrain"):
        load_weights(MODELS.get("vit")(INFO, embed_dim=16, depth=1), tmp_path / "nope.safetensors")
