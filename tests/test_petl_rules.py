"""The PETL modules under private training: per-sample gradient norms of every method's trainable parameters (and
the head) from clbench.privacy's rules (clbench/petl/rules.py) against torch.func's vmap(grad) per-sample
gradients, in float64 on a frozen injected ViT; the book-kept clipped sum against a naive per-sample clip-and-sum;
a PETL strategy with ``dp`` through the runner to its record; the refusals that keep ε honest."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clbench.petl import METHODS, MethodArgs, PETLSet, build_method, inject
from clbench.privacy import per_sample_grad_norms
from clbench.privacy.rules import RULES
from clbench.privacy.tape import Tape
from clbench.strategies.petl import PETLClassifier
from tests.test_petl import _randomize, _vit
from tests.test_privacy_rules import RTOL, ce, vmap_norms

# every method with PETL modules; the controls (head_only, full_finetune: no module, the copy of the backbone made by
# PETLViT.new_set) are checked against vmap in tests/test_strategies_petl.py
CASES = [(name, MethodArgs(size=3, prefix_length=4, placement="both", prefix_reparam=0)) for name in METHODS.names()
         if build_method(name).modifications]
CASES += [(name, MethodArgs(size=3, prefix_length=4, prefix_reparam=5)) for name in ("prefix", "mam")]
IDS = [name + ("_reparam" if args.prefix_reparam else "") for name, args in CASES]


pytestmark = pytest.mark.usefixtures("float64")          # every test in float64 (tests/conftest.py)


def petl_model(name: str, args: MethodArgs, fused: bool = False) -> PETLClassifier:
    """A frozen dim-32 ViT with the method's randomized modules (every parameter reaches the loss) and a head."""
    backbone = inject(_vit(fused, torch.float64), build_method(name, args))
    petl = PETLSet(build_method(name, args), backbone.shape).double()
    _randomize(petl)
    torch.manual_seed(2)
    return PETLClassifier(backbone, petl, nn.Linear(32, 5)).train()


def data(b: int = 4):
    g = torch.Generator().manual_seed(5)
    return torch.randn(b, 3, 16, 16, generator=g, dtype=torch.float64), torch.randint(0, 5, (b,), generator=g)


@pytest.mark.parametrize("name, args", CASES, ids=IDS)
def test_every_method_per_sample_norms_match_vmap(name, args):
    """Norms over the module set and the head equal vmap(grad)'s to 1e-6 relative; the PETL parameters carry
    some of it (the check is not only the head's)."""
    model = petl_model(name, args)
    x, y = data()
    ours = per_sample_grad_norms(model, ce, x, y)
    reference = vmap_norms(model, ce, x, y)
    torch.testing.assert_close(ours, reference, rtol=RTOL, atol=0)
    model.head.requires_grad_(False)
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=RTOL,
                               atol=0)


@pytest.mark.parametrize("name, args", [CASES[IDS.index(i)] for i in ("lora", "mh_par_adapter", "prefix",
                                                                     "mam_reparam")],
                         ids=["lora", "mh_par_adapter", "prefix", "mam_reparam"])
def test_book_kept_weighted_sum_equals_the_per_sample_sum(name, args):
    """Σ_i w_i ∇θ_i from the rules equals the sum of per-sample gradients (one backward per sample) weighted by
    w, for every trainable parameter (fused attention in the backbone); catches a transposed or misplaced block."""
    model = petl_model(name, args, fused=True)
    x, y = data()
    w = torch.tensor([0.5, -1.0, 2.0, 0.25])
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    expected = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(len(x)):
        grads = torch.autograd.grad(ce(model(x[i:i + 1]), y[i:i + 1]).sum(), list(params.values()))
        for (n, _), g in zip(params.items(), grads):
            expected[n] += w[i] * g
    with Tape(model) as tape:
        ce(model(x), y).sum().backward()
        summed = tape.weighted_grads(w)
    assert {id(p) for p in summed} == {id(p) for p in params.values()}
    for n, p in params.items():
        torch.testing.assert_close(summed[p], expected[n], rtol=1e-9, atol=1e-12)


def test_the_prefix_bank_covers_its_mlp_and_no_rule_sees_its_linears_alone():
    """The bank's rule answers for its re-parametrization MLP (a subtree), so the tape hooks the bank and not
    its two Linear layers (whose inputs have no batch dimension)."""
    model = petl_model("prefix", MethodArgs(size=3, prefix_reparam=5))
    assert RULES[type(model.petl.prefix)].subtree
    with Tape(model) as tape:
        hooked = set(tape.names.values())
    assert "petl.prefix" in hooked and not any(n.startswith("petl.prefix.") for n in hooked)


@pytest.mark.parametrize("name, args, frozen", [
    ("lora", MethodArgs(size=3, placement="both"), ("blocks.0.qkv.B", "blocks.1.fc1.A")),
    ("mh_par_adapter", MethodArgs(size=3), ("blocks.0.heads.b_down", "blocks.1.heads.w_up")),
    ("prefix", MethodArgs(size=3, prefix_reparam=5), ("prefix.embedding", "prefix.mlp.2.bias")),
    ("prefix", MethodArgs(size=3, prefix_reparam=0), ("prefix.prefix",)),
], ids=["lora", "mh_par_adapter", "prefix_reparam", "prefix_free"])
def test_frozen_parts_of_a_module_set_are_left_out(name, args, frozen):
    """A frozen PETL parameter gets no noise and no clipping share: the norms equal vmap's over the trained ones."""
    model = petl_model(name, args)
    params = dict(model.petl.named_parameters())
    for p in frozen:
        params[p].requires_grad_(False)
    x, y = data()
    torch.testing.assert_close(per_sample_grad_norms(model, ce, x, y), vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)


@pytest.mark.parametrize("name, args", [CASES[IDS.index(i)] for i in ("lora", "mh_par_adapter", "prefix_reparam")],
                         ids=["lora", "mh_par_adapter", "prefix_reparam"])
def test_evaluation_without_gradients_records_nothing(name, args):
    """Under no_grad (evaluation) no PETL call is recorded (a hook on a tensor without gradient would fail)."""
    model = petl_model(name, args)
    with Tape(model) as tape, torch.no_grad():
        model(data()[0])
        assert tape.calls == {}


def test_a_prefix_bank_evaluated_twice_in_one_backward_is_refused():
    """Two forwards before one backward evaluate the bank twice: refused with the exact line, not mixed up."""
    from clbench.privacy import UnsupportedLayerError

    model = petl_model("prefix", MethodArgs(size=3))
    x, y = data()
    with Tape(model) as tape:
        (ce(model(x), y).sum() + ce(model(x), y).sum()).backward()
        with pytest.raises(UnsupportedLayerError, match="^PrefixBank: evaluated 2 times in one forward; per-sample "
                                                        "norms expect one evaluation per forward \\(the hooks' "
                                                        "cache\\).$"):
            tape.sq_norms(len(x))
