"""Whole linearized ViTs against torch.func.jvp (float64), composition linearity and exact forgetting."""

import copy

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from torch.func import functional_call, jvp

from clbench.tangent import (
    ShardComposition,
    average_deltas,
    cache_prefix,
    compose,
    linearize,
    reset_blocks,
    split_shards,
)

pytestmark = pytest.mark.usefixtures("float64")    # every check runs in float64 (tests/conftest.py)


def tiny_vit(depth=3, heads=2, dim=16, qkv_bias=True, img=8, init_values=None, global_pool="token", seed=0):
    torch.manual_seed(seed)
    vit = VisionTransformer(img_size=img, patch_size=4, in_chans=3, num_classes=5, embed_dim=dim, depth=depth,
                            num_heads=heads, mlp_ratio=2.0, qkv_bias=qkv_bias, init_values=init_values,
                            global_pool=global_pool).double()
    with torch.no_grad():  # a generic linearization point, not the init (LayerNorm γ=1, β=0, zero biases)
        for p in vit.parameters():
            p.add_(0.1 * torch.randn_like(p))
    for block in vit.blocks:
        block.attn.fused_attn = False
    return vit.eval()


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def jvp_reference(vit, x, delta):
    """f(x; w0) + J_w f(x; w0)·Δ with torch.func.jvp; Δ keyed by the original parameter names."""
    w0 = {n: p.detach() for n, p in vit.named_parameters()}
    tangents = {n: delta.get(n, torch.zeros_like(p)) for n, p in w0.items()}
    y, yd = jvp(lambda w: functional_call(vit, w, (x,)), (w0,), (tangents,))
    return y + yd


CASES = [  # depth, heads, dim, qkv_bias, last_blocks, linearize_cls, init_values, global_pool
    (1, 1, 16, True, 1, False, None, "token"),
    (3, 2, 16, False, 1, False, None, "token"),
    (3, 4, 32, True, 2, True, None, "token"),
    (4, 2, 16, True, 4, False, 0.3, "token"),
    (2, 2, 16, True, 1, True, 0.3, "avg"),
    (3, 2, 16, True, 0, False, None, "token"),
]


@pytest.mark.parametrize("depth,heads,dim,qkv_bias,k,cls,init_values,pool", CASES)
def test_linearized_vit_matches_jvp(depth, heads, dim, qkv_bias, k, cls, init_values, pool):
    vit = tiny_vit(depth, heads, dim, qkv_bias, init_values=init_values, global_pool=pool)
    model = linearize(vit, last_blocks=k, linearize_cls=cls).randomize_deltas(0.05, seed=1)
    x = torch.randn(4, 3, 8, 8)
    delta = model.delta_state()
    expected = {f"blocks.{i}.{n}" for i in range(depth - k, depth)
                for n, _ in vit.blocks[i].named_parameters()} | ({"cls_token"} if cls else set())
    expected |= {n for n, _ in vit.named_parameters() if n.startswith(("norm.", "fc_norm.", "head."))}
    assert set(delta) == expected
    assert all(delta[n].shape == p.shape for n, p in vit.named_parameters() if n in delta)
    assert rel_err(model(x), jvp_reference(vit, x, delta)) < 1e-9


def test_zero_delta_is_the_original_model():
    vit = tiny_vit()
    x = torch.randn(4, 3, 8, 8)
    assert rel_err(linearize(vit, last_blocks=2)(x), vit(x)) < 1e-12


def test_reset_linearizes_around_reinitialized_blocks():
    vit = tiny_vit(depth=3, img=16)
    torch.manual_seed(7)
    model = linearize(vit, last_blocks=2, reset=True).randomize_deltas(0.05, seed=1)
    torch.manual_seed(7)
    reset_vit = copy.deepcopy(vit)
    reset_blocks(reset_vit, 2)
    assert not torch.equal(reset_vit.blocks[2].mlp.fc1.weight, vit.blocks[2].mlp.fc1.weight)
    assert torch.equal(reset_vit.blocks[0].mlp.fc1.weight, vit.blocks[0].mlp.fc1.weight)
    x = torch.randn(3, 3, 16, 16)
    assert rel_err(model(x), jvp_reference(reset_vit, x, model.delta_state())) < 1e-9


def test_cached_prefix_gives_the_same_logits():
    vit = tiny_vit(depth=3)
    model = linearize(vit, last_blocks=1).randomize_deltas(0.05, seed=1)
    x = torch.randn(10, 3, 8, 8)
    assert torch.equal(model.from_prefix(cache_prefix(model, x, batch_size=4)), model(x))
    with pytest.raises(ValueError):
        cache_prefix(linearize(vit, last_blocks=1, linearize_cls=True), x)


def test_composition_equals_weighted_output_average():
    vit = tiny_vit(depth=3)
    base = linearize(vit, last_blocks=2, linearize_cls=True)
    members = [copy.deepcopy(base).randomize_deltas(0.05, seed=s) for s in range(4)]
    lambdas = [0.1, 0.2, 0.3, 0.4]
    x = torch.randn(5, 3, 8, 8)
    ensemble = sum(lam * m(x) for lam, m in zip(lambdas, members))
    assert rel_err(compose(members, lambdas)(x), ensemble) < 1e-9
    uniform = sum(m(x) for m in members) / len(members)
    assert rel_err(compose(members)(x), uniform) < 1e-9


def test_composition_needs_one_linearization_point():
    a = linearize(tiny_vit(seed=0), last_blocks=1)
    b = linearize(tiny_vit(seed=1), last_blocks=1)
    with pytest.raises(ValueError):
        compose([a, b])


def test_forget_by_subtraction_equals_composition_of_remaining_shards():
    vit = tiny_vit(depth=2)
    base = linearize(vit, last_blocks=1)
    shards = split_shards(103, 6, seed=0)
    assert sorted(torch.cat(shards).tolist()) == list(range(103))
    deltas = [copy.deepcopy(base).randomize_deltas(0.05, seed=s).delta_state() for s in range(6)]
    sizes = [len(s) for s in shards]
    composition = ShardComposition()
    for i, (delta, size) in enumerate(zip(deltas, sizes)):
        composition.add(i, delta, size)
    composition.subtract([1, 4])
    keep = [0, 2, 3, 5]
    remaining = average_deltas([deltas[i] for i in keep], [sizes[i] for i in keep])
    got = composition.delta()
    assert composition.shards == keep
    assert max((got[n] - remaining[n]).abs().max().item() for n in got) < 1e-12
    x = torch.randn(3, 3, 8, 8)
    members = []
    for i in keep:
        m = copy.deepcopy(base)
        m.load_delta(deltas[i])
        members.append(m)
    forgotten = copy.deepcopy(base)
    forgotten.load_delta(got)
    assert rel_err(forgotten(x), compose(members, [sizes[i] for i in keep])(x)) < 1e-9


def test_reattention_vit_is_refused_by_the_tangent_and_tail_models():
    """The tangent layers and TailModel run vanilla attention: a Re-Attention ViT would silently lose its
    correction, so both refuse it with the line that says what to set."""
    from clbench.models.vit import vit
    from clbench.protocol import ClassificationInfo
    from clbench.tangent.tail import TailModel

    info = ClassificationInfo(name="t", n_classes=4, classes_per_experience=(2, 2), input_shape=(1, 8, 8))
    model = vit(info, embed_dim=16, depth=2, num_heads=2, attention="reattention")
    with pytest.raises(ValueError, match=r"^linearize\(\) cannot handle this VisionTransformer: Re-Attention \(the "
                                         r"tangent layers linearize vanilla attention; set model_args attention: "
                                         r"vanilla\)\.$"):
        linearize(model, last_blocks=1)
    with pytest.raises(ValueError, match="^TailModel runs the ViT's blocks with vanilla attention and cannot run "
                                         "Re-Attention: set model_args attention: vanilla.$"):
        TailModel(model, last_blocks=1)
    vanilla = vit(info, embed_dim=16, depth=2, num_heads=2)
    linearize(vanilla, last_blocks=1)
    TailModel(vanilla, last_blocks=1)
