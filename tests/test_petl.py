"""PETL modules in the unified view (clbench.petl): zero-init equivalence with the base ViT (bitwise), the prefix /
gated-attention identity (float64, hand-computed per head), LoRA against an explicitly modified weight matrix and
merged vs unmerged, the per-head adapter against a per-head loop, closed-form trainable counts (and hand-computed
numbers), and the config's refusal of combinations outside the unified view."""

import copy
import math

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from torch.nn import functional as F

from clbench.petl import (
    METHODS,
    MethodArgs,
    Modification,
    PETLConfig,
    PETLSet,
    ViTShape,
    build_method,
    inject,
    modification_count,
)

ARGS = MethodArgs(size=3, prefix_length=4, placement="both")


def _vit(fused: bool = True, dtype=torch.float32, seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=0)
    for block in vit.blocks:
        block.attn.fused_attn = fused
    return vit.to(dtype).eval()


def _randomize(petl: PETLSet, seed: int = 1) -> None:
    """Non-zero values everywhere (zero-initialized modules would hide a wrong formula)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in petl.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def _images(dtype=torch.float32) -> torch.Tensor:
    return torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(7)).to(dtype)


CONTROLS = ("head_only", "full_finetune")          # the family's controls: no PETL module


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", [n for n in METHODS.names() if n not in ("prefix", "mam", *CONTROLS)])
def test_zero_initialized_methods_return_the_base_output_bitwise(name, fused):
    vit = _vit(fused)
    x = _images()
    base = vit(x)
    config = build_method(name, ARGS)
    model = inject(vit, config)
    petl = PETLSet(config, model.shape)
    with model.use(petl):
        out = model(x)
        _randomize(petl)                                  # the modules are really in the forward pass
        changed = model(x)
    assert torch.equal(out, base)
    assert not torch.allclose(changed, base, atol=1e-3)


@pytest.mark.parametrize("fused", [True, False])
def test_mam_at_init_equals_its_prefix_alone(fused):
    """MAM = prefix + scaled parallel FFN adapter; the zero-initialized adapter adds exactly nothing."""
    x = _images()
    mam, prefix = build_method("mam", ARGS), build_method("prefix", MethodArgs(size=ARGS.prefix_length))
    mam_model, prefix_model = inject(_vit(fused), mam), inject(_vit(fused), prefix)
    mam_set, prefix_set = PETLSet(mam, mam_model.shape), PETLSet(prefix, prefix_model.shape)
    prefix_set.prefix.load_state_dict(mam_set.prefix.state_dict())
    with mam_model.use(mam_set), prefix_model.use(prefix_set):
        assert torch.equal(mam_model(x), prefix_model(x))
        assert not torch.allclose(mam_model(x), _vit(fused)(x), atol=1e-3)


def _softmax_attention(q, k, v):
    """Attn(Q, K, V) = softmax(Q K^T / sqrt(d_h)) V for one head: (N, d_h), (M, d_h), (M, d_h) -> (N, d_h)."""
    return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("reparam", [0, 5])
def test_prefix_equals_the_gated_attention_form(fused, reparam):
    """Per head i: (1 - λ(x)) Attn(x W_q, x W_k, x W_v) + λ(x) Attn(x W_q, P_k, P_v) with
    λ(x) = Σ_j exp(q P_k,j^T) / (Σ_j exp(q P_k,j^T) + Σ_j exp(q k_j^T)), then W_o: float64 to 1e-10."""
    vit = _vit(fused, torch.float64)
    config = build_method("prefix", MethodArgs(size=5, prefix_reparam=reparam))
    model = inject(vit, config)
    petl = PETLSet(config, model.shape).double()
    _randomize(petl)
    attention = vit.blocks[1].attn                                        # the hook
    base = attention.base
    x = torch.randn(2, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with model.use(petl):
        out = attention(x)
    prefixes = petl.prefix(1)[0, 1]                                      # (2, l, d) of block 1
    heads, d_h = base.num_heads, base.head_dim
    w_q, w_k, w_v = base.qkv.weight.split(32)
    b_q, b_k, b_v = base.qkv.bias.split(32)
    expected = torch.zeros(2, 7, 32, dtype=torch.float64)
    for b in range(2):
        q, k, v = F.linear(x[b], w_q, b_q), F.linear(x[b], w_k, b_k), F.linear(x[b], w_v, b_v)
        for i in range(heads):
            cols = slice(i * d_h, (i + 1) * d_h)
            qi, ki, vi = q[:, cols], k[:, cols], v[:, cols]
            pk, pv = prefixes[0][:, cols], prefixes[1][:, cols]
            on_prefix = torch.exp(qi @ pk.T / math.sqrt(d_h)).sum(1, keepdim=True)
            on_tokens = torch.exp(qi @ ki.T / math.sqrt(d_h)).sum(1, keepdim=True)
            lam = on_prefix / (on_prefix + on_tokens)
            expected[b, :, cols] = ((1 - lam) * _softmax_attention(qi, ki, vi)
                                    + lam * _softmax_attention(qi, pk, pv))
    expected = F.linear(expected, base.proj.weight, base.proj.bias)
    assert (out - expected).abs().max() < 1e-10
    assert (out - base(x)).abs().max() > 1e-3                            # the prefix takes attention mass


def test_lora_on_q_and_v_equals_the_explicitly_updated_fused_weight():
    """W_qkv' = W_qkv with s B_q A_q added to the q rows and s B_v A_v to the v rows (k rows untouched)."""
    vit = _vit(dtype=torch.float64)
    config = build_method("lora", MethodArgs(size=3, lora_alpha=6.0))
    model = inject(vit, config)
    petl = PETLSet(config, model.shape).double()
    _randomize(petl)
    lora = petl.blocks[0]["qkv"]
    a_q, a_v = lora.A.split(3)
    b_q, b_v = lora.B.split(32)
    hook = vit.blocks[0].attn.qkv
    weight = hook.base.weight.detach().clone()
    weight[:32] += 2.0 * b_q @ a_q                                        # s = α / r = 6 / 3
    weight[64:] += 2.0 * b_v @ a_v
    x = torch.randn(4, 5, 32, dtype=torch.float64)
    with model.use(petl):
        out = hook(x)
    expected = F.linear(x, weight, hook.base.bias)
    assert (out - expected).abs().max() < 1e-12
    assert torch.equal(out[..., 32:64], F.linear(x, hook.base.weight, hook.base.bias)[..., 32:64])


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_lora_merged_equals_unmerged_and_unmerge_restores_the_weights_bitwise(dtype, tol):
    vit = _vit(dtype=dtype)
    config = build_method("lora", MethodArgs(size=3, placement="both"))
    model = inject(vit, config)
    petl = PETLSet(config, model.shape).to(dtype)
    _randomize(petl)
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    x = _images(dtype)
    with model.use(petl):
        unmerged = model(x)
        model.merge()
        merged = model(x)
        changed = [k for k, v in vit.state_dict().items() if not torch.equal(v, before[k])]
        with pytest.raises(RuntimeError, match="unmerge"):
            model.activate(None)
        model.unmerge()
        again = model(x)
    assert (merged - unmerged).abs().max() < tol * unmerged.abs().max()
    assert len(changed) == 3 * 2                                          # qkv, fc1, fc2 in both blocks
    assert all(torch.equal(v, before[k]) for k, v in vit.state_dict().items())
    assert torch.equal(again, unmerged)


def test_multi_head_adapter_adds_each_heads_adapter_before_the_output_projection():
    """Against a per-head loop: z_i += f(x W_down^(i) + b_down^(i)) W_up^(i) + b_up^(i), then W_o."""
    vit = _vit(False, torch.float64)
    config = build_method("mh_par_adapter", MethodArgs(size=3))
    model = inject(vit, config)
    petl = PETLSet(config, model.shape).double()
    _randomize(petl)
    hook = vit.blocks[0].attn
    mh = petl.blocks[0]["heads"]
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    base = hook.base
    q, k, v = F.linear(x, base.qkv.weight, base.qkv.bias).split(32, dim=-1)
    z = torch.zeros_like(x)
    for i in range(4):
        cols = slice(8 * i, 8 * (i + 1))
        for b in range(2):
            z[b, :, cols] = _softmax_attention(q[b, :, cols], k[b, :, cols], v[b, :, cols])
        z[:, :, cols] += F.relu(x @ mh.w_down[i] + mh.b_down[i]) @ mh.w_up[i] + mh.b_up[i]
    with model.use(petl):
        out = hook(x)
    assert (out - F.linear(z, base.proj.weight, base.proj.bias)).abs().max() < 1e-10


def test_sequential_adapter_reads_the_sublayer_output_and_parallel_its_input():
    vit = _vit(dtype=torch.float64)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    for insertion in ("sequential", "parallel"):
        config = PETLConfig((Modification("adapter", "ffn", insertion, "scaled", 3, scale=4.0),))
        vit = _vit(dtype=torch.float64)
        model = inject(vit, config)
        petl = PETLSet(config, model.shape).double()
        _randomize(petl)
        hook, adapter = vit.blocks[0].mlp, petl.blocks[0]["ffn"]
        h = hook.base(x)
        z = h if insertion == "sequential" else x
        with model.use(petl):
            out = hook(x)
        expected = h + 4.0 * (F.relu(z @ adapter.down.weight.T + adapter.down.bias) @ adapter.up.weight.T
                              + adapter.up.bias)
        assert (out - expected).abs().max() < 1e-12


@pytest.mark.parametrize("name", METHODS.names())
@pytest.mark.parametrize("args", [MethodArgs(size=1), MethodArgs(size=7, prefix_length=2, placement="both"),
                                  MethodArgs(size=5, prefix_reparam=6, placement="both")])
def test_trainable_parameters_equal_the_closed_form(name, args):
    vit = _vit()
    config = build_method(name, args)
    model = inject(vit, config)
    petl = PETLSet(config, model.shape)
    assert sum(p.numel() for p in petl.parameters()) == config.trainable_count(model.shape)
    assert not any(p.requires_grad for p in vit.parameters())


def test_closed_form_counts_by_hand():
    """d = 32, L = 2, N_h = 4, d_h = 8, m = 128, r = 3, l = 4, k = 5."""
    s = ViTShape(depth=2, dim=32, heads=4, mlp_hidden=128)
    counts = {
        ("prefix", "heads", "parallel", "gated", 4, 1.0, 0): 2 * 2 * 4 * 32,                          # 2Lld
        ("prefix", "heads", "parallel", "gated", 4, 1.0, 5): 4 * 32 + 32 * 5 + 5 + 5 * 128 + 128,   # + MLP
        ("adapter", "ffn", "parallel", "add", 3, 1.0, 0): 2 * (96 + 3 + 96 + 32),
        ("adapter", "heads", "parallel", "add", 3, 1.0, 0): 2 * 4 * (96 + 3 + 24 + 8),
        ("lora", "attn", "parallel", "scaled", 3, 2.0, 0): 2 * (2 * 3 * 32 + 2 * 32 * 3),
        ("lora", "ffn", "parallel", "scaled", 3, 2.0, 0): 2 * (3 * 32 + 128 * 3 + 3 * 128 + 32 * 3),
    }
    for fields, expected in counts.items():
        assert modification_count(Modification(*fields), s) == expected


@pytest.mark.parametrize("fields, message", [
    (("adapter", "ffn", "parallel", "gated", 3), "composition"),
    (("prefix", "attn", "parallel", "gated", 3), "representation"),
    (("lora", "attn", "sequential", "scaled", 3), "insertion"),
    (("adapter", "heads", "sequential", "add", 3), "parallel"),
    (("adapter", "ffn", "parallel", "add", 0), "size"),
])
def test_combinations_outside_the_unified_view_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Modification(*fields)
    with pytest.raises(ValueError, match="scale"):
        Modification("adapter", "ffn", "parallel", "add", 3, scale=2.0)
    with pytest.raises(ValueError, match="same place"):
        PETLConfig((Modification("adapter", "ffn", "parallel", "add", 3),
                    Modification("adapter", "ffn", "sequential", "add", 3)))


def test_mam_default_is_he_et_al_allocation_a_small_prefix_and_a_large_scaled_ffn_adapter():
    """He et al.'s MAM: prefix l = 30 (reparametrized) + scaled parallel FFN adapter r = 512, s = 4; at their
    d = 1024 (mBART-large, 12 blocks per stack) the merged prefix is ~5% of MAM's parameters."""
    prefix, adapter = build_method("mam").modifications
    assert (prefix.form, prefix.size, prefix.reparam) == ("prefix", 30, 512)
    assert (adapter.representation, adapter.insertion, adapter.composition, adapter.size, adapter.scale) == (
        "ffn", "parallel", "scaled", 512, 4.0)
    s = ViTShape(depth=12, dim=1024, heads=16, mlp_hidden=4096)
    config = build_method("mam")
    share = modification_count(Modification("prefix", "heads", "parallel", "gated", 30), s) / config.deployed_count(s)
    assert 0.04 < share < 0.07


@pytest.mark.parametrize("suite", ["petl", "petl_transfer"])
def test_shipped_mam_rows_give_the_prefix_a_small_share_of_the_budget(suite):
    """Every MAM entry of the shipped PETL suites: the merged prefix is at most 10% of MAM's parameters, the scaled
    FFN adapter the rest (the issue: l = 10 had taken 49%)."""
    from clbench.config import build_config
    from clbench.strategies.petl import vit_shape
    from clbench.suite_file import load_suite
    spec = load_suite(suite)
    rows = [e for e in spec.strategies if e.name.startswith("mam")]
    assert rows
    for entry in rows:
        config = build_config(entry.name, entry.preset, entry.args)
        shape = vit_shape(config.model_args)
        prefix, adapter = build_method("mam", config).modifications
        merged = modification_count(Modification("prefix", "heads", "parallel", "gated", prefix.size), shape)
        assert merged / build_method("mam", config).deployed_count(shape) <= 0.10, entry.label
        assert adapter.composition == "scaled" and adapter.scale == 4.0


def test_reparametrized_prefix_merges_into_the_mlp_output():
    """After training the MLP is dropped: the merged free vectors equal MLP(E) exactly, the model's output is
    unchanged, and the set holds 2Lld parameters (the deployed count)."""
    vit = _vit(dtype=torch.float64)
    config = build_method("prefix", MethodArgs(size=5, prefix_reparam=7))
    model = inject(vit, config)
    petl = PETLSet(config, model.shape).double()
    _randomize(petl)
    x = _images(torch.float64)
    mlp_out = petl.prefix.mlp(petl.prefix.embedding).detach()                  # (l, 2Ld)
    with model.use(petl):
        before = model(x)
    assert petl.merge_prefix() is petl and not petl.prefix.reparametrized
    L, d = model.shape.depth, model.shape.dim
    assert torch.equal(petl.prefix.prefix.detach(), mlp_out.view(5, L, 2, d).permute(1, 2, 0, 3))
    with model.use(petl):
        assert torch.equal(model(x), before)
    assert sum(p.numel() for p in petl.parameters()) == 2 * L * 5 * d == config.deployed_count(model.shape)
    assert config.trainable_count(model.shape) > config.deployed_count(model.shape)


def test_controls_have_no_module_and_full_finetuning_runs_a_trainable_copy_of_the_backbone():
    """head_only: an empty set, the frozen ViT's output bitwise, no hook. full_finetune: the set holds a copy of the
    ViT with every weight trainable (its count is the ViT's), the copy runs while the set is active (a change to
    it changes the output) and the frozen ViT is untouched; a copy on a PETL set, or modules on full fine-tuning,
    are refused."""
    vit = _vit()
    x = _images()
    base = vit(x)
    for name in CONTROLS:
        assert build_method(name).modifications == ()
    head = inject(copy.deepcopy(vit), build_method("head_only"))
    petl = head.new_set(build_method("head_only"))
    assert sum(p.numel() for p in petl.parameters()) == 0 and petl.backbone is None
    with head.use(petl):
        assert torch.equal(head(x), base)
    config = build_method("full_finetune")
    model = inject(vit, config)
    petl = model.new_set(config)
    own = dict(vit.named_parameters())
    assert sum(p.numel() for p in petl.parameters()) == sum(p.numel() for p in own.values())
    assert all(p.requires_grad and torch.equal(p, own[n]) for n, p in petl.backbone.named_parameters())
    assert not any(p.requires_grad for p in vit.parameters()) and not petl.train().backbone.training
    with model.use(petl):
        assert torch.equal(model(x), base)
        with torch.no_grad():
            petl.backbone.norm.bias.add_(1.0)
        assert not torch.allclose(model(x), base, atol=1e-3)
    assert torch.equal(model(x), base)                       # no set active: the frozen ViT
    with pytest.raises(ValueError, match="full fine-tuning"):
        PETLConfig((Modification("adapter", "ffn", "parallel", "add", 3),), train_backbone=True)
    with pytest.raises(ValueError, match="backbone copy"):
        PETLSet(build_method("lora", ARGS), model.shape, backbone=copy.deepcopy(vit))


def test_unset_sizes_take_the_method_default_and_set_ones_are_used_as_written():
    assert build_method("lora").modifications[0].size == 8
    assert build_method("prefix").modifications[0].size == 30
    assert build_method("prefix", MethodArgs(prefix_reparam=0)).modifications[0].reparam == 0   # free: an option
    with pytest.raises(ValueError, match="size"):
        MethodArgs(size=0)
    with pytest.raises(ValueError, match="prefix_length"):
        MethodArgs(prefix_length=-3)
    assert {m.representation for m in build_method("lora", MethodArgs(placement="ffn")).modifications} == {"ffn"}
