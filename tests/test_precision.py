"""``--amp``: bf16 autocast (:mod:`clbench.precision`), tested on CPU, where it is the same autocast as on CUDA.

The GPU check of the quick suite found every ``--amp`` run untrained: one autocast region around the run kept the
bf16 copy of the initial weights (autocast's weight cache), so the loss never moved and evaluation scored the initial
model (joint last_acc 7.96 vs 94.07). Here every quick-suite row that trains without dp runs 1 epoch per step on
split digits in float32 and under ``--amp`` and must learn the task just trained as the float32 run does; CUDA
autocast's refusal of ``binary_cross_entropy`` (which CPU autocast runs in float32) is imposed on those runs, so
iCaRL's loss has to leave autocast on CPU as it must on CUDA. Private rows and mps are refused with ``--amp``
where runs are made (``SuiteSpec.run_specs``): by the command line and the API alike, before any run.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block

from clbench import api, runner
from clbench.cli import main
from clbench.errors import ConfigError
from clbench.precision import autocast, in_float32
from clbench.registry import STRATEGIES
from clbench.suite_file import load_suite
from clbench.tangent.layers import TangentBlock
from tests._cli import one_error_line

QUICK = load_suite("quick")
PRIVATE = [e for e in QUICK.strategies if any(c["name"] == "dp" for c in e.callbacks)]
TRAINED = [e for e in QUICK.strategies if e not in PRIVATE]
FEWEST = {"epochs": 1, "first_epochs": 1, "finetune_epochs": 1, "retrain_epochs": 1, "stage_2_epochs": 1,
          "n_inner_steps": 1}
"""Each strategy's passes set to one where its Config has the field (MER: one inner step per sample)."""
CPU = torch.device("cpu")


@pytest.fixture
def cuda_refusals(monkeypatch):
    """``F.binary_cross_entropy`` refused under autocast, as CUDA autocast refuses it (CPU autocast would silently
    run it in float32), and the dtypes of every ``F.linear`` output recorded (``dtypes``)."""
    dtypes = set()
    bce, linear = F.binary_cross_entropy, F.linear

    def refused(*args, **kwargs):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("binary_cross_entropy is unsafe to autocast (as CUDA autocast says)")
        return bce(*args, **kwargs)

    def recorded(*args, **kwargs):
        out = linear(*args, **kwargs)
        dtypes.add(out.dtype)
        return out

    monkeypatch.setattr(F, "binary_cross_entropy", refused)
    monkeypatch.setattr(F, "linear", recorded)
    return dtypes


@functools.cache
def _record(key: str, amp: bool) -> runner.RunRecord:
    """Quick-suite row ``key``, seed 0, :data:`FEWEST` passes, on CPU with or without ``--amp``; finished."""
    entry = next(e for e in QUICK.strategies if e.key == key)
    fields = {f.name for f in dataclasses.fields(STRATEGIES.get(entry.name).Config)}
    entry = dataclasses.replace(entry, args={**entry.args, **{k: v for k, v in FEWEST.items() if k in fields}})
    (spec,) = dataclasses.replace(QUICK, strategies=(entry,), seeds=(0,)).run_specs(device="cpu", amp=amp)
    record = runner.execute(spec)
    assert record.status == "finished", record.reason
    return record


def _just_trained(record: runner.RunRecord) -> float:
    """Mean accuracy on the task just trained: ``mean_i R[i, i]`` (an offline run's one row: its mean)."""
    matrix = record.accuracy_matrix
    scores = matrix[0] if len(matrix) == 1 else [matrix[i][i] for i in range(len(matrix))]
    return sum(scores) / len(scores)


@pytest.mark.parametrize("key", [e.key for e in TRAINED])
def test_every_quick_strategy_trains_under_amp_as_in_float32(key, cuda_refusals):
    fp32 = _record(key, False)
    assert torch.bfloat16 not in cuda_refusals
    amp = _record(key, True)
    assert torch.bfloat16 in cuda_refusals                     # autocast was on: the products ran in bf16
    assert _just_trained(amp) == pytest.approx(_just_trained(fp32), abs=0.1)


def test_joint_and_naive_learn_under_amp_and_joint_ends_where_float32_does(cuda_refusals):
    """The autocast cache bug gave joint 7.96 (chance: 10) for 94.07; after one epoch joint is at ~89 either way."""
    joint, joint_fp32 = _record("joint", True), _record("joint", False)
    assert joint.metrics["last_acc"] >= 80 and joint.metrics["last_acc"] == pytest.approx(
        joint_fp32.metrics["last_acc"], abs=3)
    assert _just_trained(_record("naive", True)) >= 0.85      # chance: 1/2 at the first step, less after


def test_the_autocast_region_sees_each_update_of_the_weights():
    """Two forward passes in one region with an optimizer step between them: the second reads the new weights
    (autocast's weight cache would give it the bf16 copy of the old ones)."""
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(8, 4), torch.randn(3, 8)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    with autocast(True, CPU):
        first = layer(x)
        first.float().square().sum().backward()
        optimizer.step()
        second = layer(x)
    assert first.dtype == second.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    assert torch.equal(second, F.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()))
    assert not torch.equal(first, second)
    with autocast(False, CPU):
        assert layer(x).dtype == torch.float32


def test_in_float32_calls_outside_autocast_with_half_tensors_made_float32():
    seen = {}

    def loss(a, b, *, c):
        seen.update(a=a.dtype, b=b.dtype, c=c.dtype, on=torch.is_autocast_enabled("cpu"))
        return a.sum()

    with autocast(True, CPU):
        in_float32(loss, torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.float64),
                   c=torch.ones(2, dtype=torch.float16))
    assert seen == {"a": torch.float32, "b": torch.float64, "c": torch.float32, "on": False}


def test_a_tangent_block_under_amp_gives_the_float32_pair_to_bf16_precision():
    """``(y, ẏ)`` of a linearized transformer block with trained ``Δ`` and a tangent input, under autocast, against
    float32; ``Δ`` gets a gradient (the tangent model trains under ``--amp``)."""
    torch.manual_seed(0)
    block = TangentBlock(Block(dim=16, num_heads=2, init_values=0.1))
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x, xd = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    y, yd = block(x, xd)
    with autocast(True, CPU):
        y_amp, yd_amp = block(x, xd)
        yd_amp.float().sum().backward()
    for ours, exact in ((y_amp, y), (yd_amp, yd)):
        assert ours.float().sub(exact).norm() <= 0.02 * exact.norm()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in block.parameters())


def _dp_refusal(keys: str) -> str:
    return ("--amp (amp=True) with private training (dp) is refused: its per-sample norms are checked against "
            "autograd's gradients to float32 precision, which bf16 products do not meet; leave out "
            f"{keys} (--strategy) or run without amp.")


MPS_REFUSAL = "--amp (amp=True) is bf16 autocast on cpu and cuda, not on mps; run without it."


@pytest.fixture
def no_run(monkeypatch):
    """The API's runner entry points fail the test: a refusal must come before any run starts."""
    def started(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(api, "execute", started)
    monkeypatch.setattr(api, "run_and_write", started)


def test_amp_with_private_training_is_refused_by_run_specs_naming_every_private_row():
    with pytest.raises(ConfigError) as info:
        QUICK.run_specs(device="cpu", amp=True)
    assert str(info.value) == _dp_refusal(", ".join(e.key for e in PRIVATE))
    assert all(not s.amp for s in QUICK.run_specs(device="cpu"))


def test_amp_with_private_training_is_refused_by_the_api_before_the_run(no_run, tmp_path):
    with pytest.raises(ConfigError) as info:
        api.run("synthetic", "naive", preset="cpu", device="cpu", amp=True, out=tmp_path / "out",
                callbacks=[{"name": "dp", "args": {"epsilon": 8.0, "clip": 1.0}}])
    assert str(info.value) == _dp_refusal("naive")
    assert not (tmp_path / "out").exists()


def test_amp_with_private_training_is_refused_by_the_command_line_before_any_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--suite", "quick", "--strategy", *(e.key for e in PRIVATE), "--seeds", "0", "--device", "cpu",
                 "--amp", "--out", str(out), "--quiet"]) == 2
    assert one_error_line(capsys) == "error: " + _dp_refusal(", ".join(e.key for e in PRIVATE))
    assert not out.exists()


@pytest.mark.parametrize("device", ["mps", "mps:0"])
def test_amp_is_refused_on_mps_by_run_specs_and_the_api(device, no_run):
    trained = dataclasses.replace(QUICK, strategies=tuple(TRAINED))
    with pytest.raises(ConfigError) as info:
        trained.run_specs(device, amp=True)
    assert str(info.value) == MPS_REFUSAL
    with pytest.raises(ConfigError) as info:
        api.run("synthetic", "naive", preset="cpu", device=device, amp=True)
    assert str(info.value) == MPS_REFUSAL


def test_amp_is_accepted_on_cpu_cuda_and_auto_and_mps_without_amp():
    trained = dataclasses.replace(QUICK, strategies=tuple(TRAINED))
    for device in ("auto", "cpu", "cuda", "cuda:1"):
        assert all(s.amp and s.device == device for s in trained.run_specs(device, amp=True))
    assert all(s.device == "mps" for s in QUICK.run_specs("mps"))
