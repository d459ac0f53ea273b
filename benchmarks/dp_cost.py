"""Cost of one private training step (clbench.privacy's ``dp`` callback: ghost-norm clipping + book-kept clipped sum)
against the non-private step, opacus's per-sample-gradient mode (GradSampleModule hooks + DPOptimizer) and opacus's
fast gradient clipping (GradSampleModuleFastGradientClipping, ghost clipping + second backward), on

- ``vit``: the suite's small ViT (timm, dim 64, depth 2, 4 heads, patch 4) on 3×32×32 images, 100 classes
  (``--dim`` widens it, e.g. 192 = ViT-Tiny's width, heads ``dim / 16``);
- ``seq``: a 2-block, d=64, 1-head transformer over item sequences (length 50) with vocabulary 1682 (+ padding) and
  SHARED input/output item embeddings (``output.weight is items.weight``; the #13 seqrec shape, built here);
- ``games``: the product's :class:`~clbench.models.seqrec.SeqRec` (tied item embeddings, 2 blocks, d = 64) on a
  batch of 256 real Amazon Games training windows (``$CLBENCH_DATA/amazon-games``, 23,715 items, length 50; most
  positions are padding) trained on EVERY position that has a target, in four modes interleaved step by step:
  today's layout (scores at all ``B·L`` positions, :func:`~clbench.models.seqrec.next_item_loss`) and the packed
  layout (scores at the target rows only, ``forward(items, targets=y)``, :func:`~clbench.models.seqrec.target_loss`,
  the same loss), each non-private and private (the ``dp`` callback). Printed, in wall-clock time and in this
  process's CPU time (one thread: what the step itself used, less disturbed by other processes on a shared machine):
  packed / today's time (private and not), private / non-private on the packed step, and the cost of the first-step
  invariant (a step with the check / a step without; :meth:`~clbench.privacy.step.PrivateTraining.check`). No memory
  column for this model.

Time: median seconds per step, the four modes interleaved step by step in ONE process (the machine is shared: ratios
are more trustworthy than seconds). Memory: each (model, mode) runs in its own subprocess; the number is the peak
resident memory during two steps minus the resident memory before them (CPU: the kernel's high-water mark VmHWM,
reset through ``/proc/self/clear_refs`` before the steps), or ``max_memory_allocated`` on CUDA. Also checked and
printed: our per-sample norms against opacus's per-sample gradients (hooks mode), and what opacus's ghost mode does
with the shared embedding, and the CEILING of "memory vs opacus's per-sample mode": opacus's extra memory over the
non-private step's (a private step that runs the model's ordinary forward and backward holds at least the
non-private step's activations and gradients, so no such clipping method can be further below opacus than that
ratio on this workload).

- the transformer zoo of tests/_transformer_zoo.py (models written the usual PyTorch way: nn.TransformerEncoderLayer
  / nn.TransformerDecoderLayer, bare positional tables and class tokens, tied embeddings) at :data:`ZOO_SIZES`, batch
  :data:`ZOO_BATCH`: ``encoder_batch_first``, ``encoder_sequence_first``, ``tied_causal_lm``, ``decoder_batch_first``,
  ``vit_cls_token_pos_table`` (``--models zoo`` runs all five). opacus runs them after ``ModuleValidator.fix``
  (its own attention module in place of nn.MultiheadAttention), or reports why it cannot.

- ``vit_ratio``: the private / non-private step on the small ViT alone (``--batch``, default 64), the two interleaved
  step by step in one process after a warm-up step each (the private one runs the first-step checks): the median of
  the per-round ratios, in wall-clock and in this process's CPU time.
- ``fallback``: the exact fallback's cost per module (:mod:`clbench.privacy.fallback`) for the layers of
  :func:`fallback_modules` at batch :data:`FALLBACK_BATCH`: the replay of one recorded call (``vmap`` of ``vjp``,
  the per-sample gradients of the module's own parameters) against one forward + backward of the module over the
  batch, interleaved (median of the per-round ratios, CPU time), and the ``B × |θ|`` numbers the replay forms.

- ``phantom_ghost``: Phantom Clipping against Ghost Clipping (Ding et al.'s headline comparison, their Figure 8) on
  64 real Games windows, every position trained: ours on the tied SeqRec (d = 64) against opacus's ghost clipping
  (``GradSampleModuleFastGradientClipping``) on the paper's workaround for a method that cannot share the embedding,
  the untied model at half the width (d = 32, about the same number of parameters); time and memory ratios.

    python benchmarks/dp_cost.py [--models vit seq games phantom_ghost zoo vit_ratio fallback ...] [--steps 5]
        [--threads 1] [--dim 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block
from torch import nn

from clbench.callbacks import CallbackContext
from clbench.models.seqrec import SeqRec, next_item_loss, target_loss
from clbench.models.vit import vit
from clbench.privacy import PrivateTraining, per_sample_grad_norms
from clbench.privacy.tape import Tape
from clbench.protocol import ClassificationInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))        # the repository's tests/ (the zoo) first
from tests._transformer_zoo import ZOO, Sizes  # noqa: E402

MODES = ("nonprivate", "ours", "opacus_hooks", "opacus_ghost")
CLIP, SIGMA = 1.0, 1.0
ZOO_SIZES = Sizes(vocab=2000, length=32, dim=64, heads=4, ff=256, layers=2, classes=10, image=32, features=16)
ZOO_BATCH = 64
ZOO_MODELS = ("encoder_batch_first", "encoder_sequence_first", "tied_causal_lm", "decoder_batch_first",
              "vit_cls_token_pos_table")


class SeqModel(nn.Module):
    """``ids (B, T) -> scores (B, T, V)``: tied item embeddings, learned positions, ``depth`` timm blocks."""

    def __init__(self, vocab: int = 1683, length: int = 50, dim: int = 64, depth: int = 2, heads: int = 1) -> None:
        super().__init__()
        self.items = nn.Embedding(vocab, dim, padding_idx=0)
        self.positions = nn.Embedding(length, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        for block in self.blocks:
            block.attn.fused_attn = False
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.output.weight = self.items.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        return self.output(self.norm(self.blocks(self.items(ids) + self.positions(positions))))


class SeqLoss(nn.Module):
    """Cross-entropy summed over positions per sample; ``reduction`` ``mean`` (over samples) or ``none`` (opacus
    sets it)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        per_sample = F.cross_entropy(scores.transpose(1, 2), targets, reduction="none").sum(1)
        return per_sample if self.reduction == "none" else per_sample.mean()


def workload(name: str, batch: int, device: torch.device, dim: int = 64):
    """``(model, loss, x, y)`` for ``vit`` (width ``dim``, ``dim / 16`` heads), ``seq`` or a zoo model."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name in ZOO:
        build, inputs, targets = ZOO[name]
        loss = SeqLoss() if name == "tied_causal_lm" else nn.CrossEntropyLoss()
        x, y = inputs(ZOO_SIZES, batch), targets(ZOO_SIZES, batch)
        return build(ZOO_SIZES).to(device), loss, x.to(device), y.to(device)
    if name == "vit":
        info = ClassificationInfo(name="b", n_classes=100, classes_per_experience=(100,), input_shape=(3, 32, 32))
        model = vit(info, embed_dim=dim, depth=2, num_heads=dim // 16, patch_size=4, fused_attn=False)
        x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 100, (batch,), generator=g)
        loss = nn.CrossEntropyLoss()
    else:
        vocab = 1683
        model = SeqModel(vocab)
        x, y = torch.randint(1, vocab, (batch, 50), generator=g), torch.randint(1, vocab, (batch, 50), generator=g)
        loss = SeqLoss()
    return model.to(device), loss, x.to(device), y.to(device)


def make_step(mode: str, model: nn.Module, loss: nn.Module, batch: int):
    """A function ``(x, y) -> None`` doing one training step in ``mode``."""
    if mode == "nonprivate":
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(x, y):
            optimizer.zero_grad(set_to_none=True)
            loss(model(x), y).backward()
            optimizer.step()
        return step
    if mode == "ours":
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        dp = PrivateTraining(noise_multiplier=SIGMA, delta=1e-5, clip=CLIP)
        dp.setup(CallbackContext(run_id="bench", modules=lambda: {"model": model}, n_train=batch * 100))
        dp.batch_sampler(batch * 100, batch, 1)

        def step(x, y):
            dp.on_batch_start(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss(model(x), y).backward()
            dp.after_backward(model)
            optimizer.step()
        return step
    from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
    from opacus.validators import ModuleValidator

    if any(isinstance(m, nn.MultiheadAttention) for m in model.modules()):
        model = ModuleValidator.fix(model)              # opacus's DPMultiheadAttention in place of torch's
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    if mode == "opacus_hooks":
        wrapped = GradSampleModule(model)
        optimizer = DPOptimizer(torch.optim.SGD(wrapped.parameters(), lr=1e-3), noise_multiplier=SIGMA,
                                max_grad_norm=CLIP, expected_batch_size=batch)

        def step(x, y):
            optimizer.zero_grad(set_to_none=True)
            loss(wrapped(x), y).backward()
            optimizer.step()
        return step
    wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=CLIP, use_ghost_clipping=True)
    optimizer = DPOptimizerFastGradientClipping(torch.optim.SGD(wrapped.parameters(), lr=1e-3),
                                                noise_multiplier=SIGMA, max_grad_norm=CLIP,
                                                expected_batch_size=batch)
    criterion = DPLossFastGradientClipping(wrapped, optimizer, type(loss)(reduction="mean"))

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        criterion(wrapped(x), y).backward()
        optimizer.step()
    return step


def memory_child(name: str, mode: str, batch: int, steps: int, dim: int) -> None:
    """Run in a subprocess: print the extra peak memory (MB) of ``steps`` steps, as JSON."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "ghost":
        step, x, y = ghost_runner(mode, batch)
    else:
        model, loss, x, y = workload(name, batch, device, dim)
        step = make_step(mode, model, loss, batch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = status_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:       # resets VmHWM to the current resident size
            f.write("5")
    for _ in range(steps):
        step(x, y)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else status_mb("VmHWM")
    print(json.dumps({"extra_mb": peak - base}))


def status_mb(key: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of this process, MB."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def memory(name: str, mode: str, batch: int, threads: int, dim: int) -> float | str:
    cmd = [sys.executable, __file__, "--memory-child", name, mode, "--batch", str(batch), "--threads", str(threads),
           "--dim", str(dim)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return f"failed: {done.stderr.strip().splitlines()[-1][:150]}"
    return json.loads(done.stdout.strip().splitlines()[-1])["extra_mb"]


def timing(name: str, batch: int, steps: int, device: torch.device, dim: int) -> dict[str, float | str]:
    """Median step time per mode, the modes interleaved step by step (one warm-up step each)."""
    runners, failed = {}, {}
    for mode in MODES:
        model, loss, x, y = workload(name, batch, device, dim)
        try:
            runners[mode] = (make_step(mode, model, loss, batch), x, y)
            runners[mode][0](x, y)
        except Exception as exc:  # noqa: BLE001 - a mode opacus cannot run is reported, not fatal
            failed[mode] = f"failed: {type(exc).__name__}: {str(exc)[:150]}"
            runners.pop(mode, None)
    times = {mode: [] for mode in runners}
    for _ in range(steps):
        for mode, (step, x, y) in runners.items():
            start = time.perf_counter()
            step(x, y)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[mode].append(time.perf_counter() - start)
    return {**{m: statistics.median(t) for m, t in times.items()}, **failed}


def shared_embedding_check(batch: int = 8) -> dict[str, float | bool]:
    """On the tied sequence model (small batch): our norms vs opacus's per-sample gradients (hooks mode sums the
    two uses' per-sample gradients of the shared parameter), and opacus ghost mode's norms vs the true ones."""
    from opacus.grad_sample import GradSampleModule

    model, loss, x, y = workload("seq", batch, torch.device("cpu"))
    per_sample = SeqLoss("none")
    ours = per_sample_grad_norms(model, per_sample, x, y)
    hooks = GradSampleModule(model)
    loss(hooks(x), y).backward()
    params = {id(p): p for p in hooks.parameters() if p.requires_grad}.values()   # the tied weight once
    true = torch.cat([p.grad_sample.flatten(1) for p in params], 1).norm(dim=1)   # opacus rescales the mean
    hooks._close()
    model.zero_grad(set_to_none=True)
    try:
        make_step("opacus_ghost", model, loss, batch)(x, y)
        ghost = "trained the tied model"
    except Exception as exc:  # noqa: BLE001 - what opacus does is the result
        ghost = f"{type(exc).__name__}: {exc}"
    return {"ours_vs_opacus_hooks_max_rel_err": float(((ours - true).abs() / true).max()),
            "tie_kept": model.output.weight is model.items.weight, "opacus_ghost": ghost}


GAMES_BATCH = 256
GAMES_MODES = ("today_nonprivate", "today_private", "packed_nonprivate", "packed_private")


def games_windows(batch: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``batch`` training windows ``(x, y)`` of Amazon Games drawn with seed 0 (the games_seqrec scenario's
    windows), the number of items and of training windows."""
    from clbench.scenarios.recommendation import games_seqrec

    scenario = games_seqrec()
    data = scenario.train_stream[0].dataset
    pick = torch.randperm(len(data.y), generator=torch.Generator().manual_seed(0))[:batch]
    return data.x[pick], data.y[pick], scenario.info.extra["n_items"], len(data.y)


def games_step(mode: str, model: SeqRec, batch: int, n: int):
    """A function ``(x, y) -> None`` doing one training step of ``mode`` (:data:`GAMES_MODES`); and the dp callback
    (None when not private)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    dp = None
    if mode.endswith("_private"):
        dp = PrivateTraining(noise_multiplier=SIGMA, delta=1e-5, clip=CLIP)
        dp.setup(CallbackContext(run_id=f"bench-{mode}", modules=lambda: {"model": model}, n_train=n))
        dp.batch_sampler(n, batch, 1)
    packed = mode.startswith("packed")

    def step(x, y):
        if dp is not None:
            dp.on_batch_start(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss = target_loss(model(x, targets=y)) if packed else next_item_loss(model(x), y)
        if dp is not None:
            dp.after_forward(loss)
        loss.backward()
        if dp is not None:
            dp.after_backward(model)
        optimizer.step()
    return step, dp


def games(steps: int) -> None:
    """The packed every-position step against today's (module docstring), ratios from this one run."""
    x, y, items, n = games_windows(GAMES_BATCH)
    torch.manual_seed(0)
    model = SeqRec(items, x.shape[1])
    with torch.no_grad():
        model.eval()
        same = torch.equal(target_loss(model(x, targets=y)), next_item_loss(model(x), y))
        model.train()
    print(f"\ngames: SeqRec (23,715 items, d 64, 2 blocks), batch {GAMES_BATCH} real windows of length {x.shape[1]}, "
          f"{int((y > 0).sum())} target positions of {y.numel()}; packed loss == every-position loss: {same}")
    runners = {}
    for mode in GAMES_MODES:
        replica = SeqRec(items, x.shape[1])
        replica.load_state_dict(model.state_dict())
        runners[mode] = games_step(mode, replica.train(), GAMES_BATCH, n)
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    times = {clock: {mode: [] for mode in GAMES_MODES} for clock in clocks}
    for k in range(steps + 1):                      # round 0: warm-up (and the private modes' checked first step)
        for mode, (step, _) in runners.items():
            start = {clock: now() for clock, now in clocks.items()}
            step(x, y)
            if k:
                for clock, now in clocks.items():
                    times[clock][mode].append(now() - start[clock])
    step, dp = runners["packed_private"]
    dp.unchecked = dp.tape.keep_outputs = True      # one more step with the first-step invariant
    start = {clock: now() for clock, now in clocks.items()}
    step(x, y)
    checked = {clock: now() - start[clock] for clock, now in clocks.items()}
    for clock in clocks:                            # wall: elapsed; cpu: this process's CPU time (1 thread)
        med = {mode: statistics.median(t) for mode, t in times[clock].items()}
        print(f"\n{clock} time\n{'mode':<20}{'step s (median)':>16}   all steps")
        for mode in GAMES_MODES:
            print(f"{mode:<20}{med[mode]:>16.3f}   {', '.join(f'{t:.2f}' for t in times[clock][mode])}")
        print(f"today / packed, non-private: {med['today_nonprivate'] / med['packed_nonprivate']:.2f}x")
        print(f"today / packed, private:     {med['today_private'] / med['packed_private']:.2f}x")
        print(f"packed: private / non-private: {med['packed_private'] / med['packed_nonprivate']:.2f}x")
        print(f"first-step invariant: a packed private step with the check {checked[clock]:.3f} s / without "
              f"{med['packed_private']:.3f} s = {checked[clock] / med['packed_private']:.2f}x")


GHOST_BATCH = 64
GHOST_MODES = ("nonprivate", "phantom", "ghost")


class NextItemLoss(nn.Module):
    """:func:`~clbench.models.seqrec.next_item_loss` as a criterion with a ``reduction`` attribute (opacus sets
    ``none``: the per-sample sums)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return next_item_loss(scores, targets, "sample" if self.reduction == "none" else self.reduction)


class ContiguousIds(nn.Module):
    """An Embedding called on a contiguous copy of its ids (opacus's ghost norm of an Embedding fails on the expanded
    position ids SeqRec passes: ``view size is not compatible``)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.embedding = embedding

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids.contiguous())


def ghost_runner(mode: str, batch: int):
    """``(step, x, y)`` of one mode of :data:`GHOST_MODES` on ``batch`` real Games windows, every position trained
    (today's layout, the paper's objective): ``nonprivate`` and ``phantom`` (ours: ghost norms with phantom clipping
    of the tied embedding) on the tied SeqRec (d = 64); ``ghost``: opacus's ghost clipping (fast gradient clipping)
    on the paper's workaround, the UNTIED model at half the width (d = 32: about the same number of parameters)."""
    x, y, items, n = games_windows(batch)
    torch.manual_seed(0)
    if mode != "ghost":
        return games_step(f"today_{'private' if mode == 'phantom' else 'nonprivate'}",
                          SeqRec(items, x.shape[1]).train(), batch, n)[0], x, y
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    model = SeqRec(items, x.shape[1], dim=32).train()
    model.output.weight = nn.Parameter(model.item_emb.weight.detach().clone())       # untied
    model.pos_emb = ContiguousIds(model.pos_emb)     # opacus's embedding norms view the ids: no expanded ids
    wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=CLIP, use_ghost_clipping=True)
    optimizer = DPOptimizerFastGradientClipping(torch.optim.SGD(wrapped.parameters(), lr=1e-3), noise_multiplier=SIGMA,
                                                max_grad_norm=CLIP, expected_batch_size=batch)
    criterion = DPLossFastGradientClipping(wrapped, optimizer, NextItemLoss())

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        criterion(wrapped(x), y).backward()
        optimizer.step()
    return step, x, y


def phantom_vs_ghost(steps: int, threads: int) -> None:
    """Phantom clipping (ours, tied) against Ghost Clipping (opacus, untied half width) on the Games shape: median
    step time interleaved in this process, extra peak memory per mode in its own process (module docstring)."""
    runners = {mode: ghost_runner(mode, GHOST_BATCH) for mode in GHOST_MODES}
    times = {mode: [] for mode in GHOST_MODES}
    for k in range(steps + 1):
        for mode, (step, x, y) in runners.items():
            start = time.perf_counter()
            step(x, y)
            if k:
                times[mode].append(time.perf_counter() - start)
    med = {mode: statistics.median(t) for mode, t in times.items()}
    mems = {mode: memory("ghost", mode, GHOST_BATCH, threads, 0) for mode in GHOST_MODES}
    print(f"\nphantom vs ghost clipping: Games windows, batch {GHOST_BATCH}, every position trained")
    print(f"{'mode':<14}{'step s':>10}{'extra MB':>10}   all steps")
    for mode in GHOST_MODES:
        m = mems[mode]
        print(f"{mode:<14}{med[mode]:>10.3f}{(f'{m:.0f}' if isinstance(m, float) else m):>10}   "
              f"{', '.join(f'{t:.2f}' for t in times[mode])}")
    print(f"ghost / phantom: time {med['ghost'] / med['phantom']:.2f}x"
          + (f", memory {mems['ghost'] / mems['phantom']:.2f}x" if all(isinstance(mems[m], float) for m in
                                                                       ("ghost", "phantom")) else ""))
    print(f"phantom / non-private: time {med['phantom'] / med['nonprivate']:.2f}x"
          + (f", memory {mems['phantom'] / mems['nonprivate']:.2f}x" if all(isinstance(mems[m], float) for m in
                                                                            ("phantom", "nonprivate")) else ""))


def vit_ratio(batch: int, steps: int, dim: int) -> None:
    """The private / non-private ViT step, interleaved (module docstring): median of the per-round ratios."""
    runners = {}
    for mode in ("nonprivate", "ours"):
        model, loss, x, y = workload("vit", batch, torch.device("cpu"), dim)
        runners[mode] = (make_step(mode, model, loss, batch), x, y)
        runners[mode][0](x, y)                       # warm-up (the private step's first-step checks)
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    ratios = {clock: [] for clock in clocks}
    for _ in range(steps):
        took = {}
        for mode, (step, x, y) in runners.items():
            start = {clock: now() for clock, now in clocks.items()}
            step(x, y)
            took[mode] = {clock: now() - start[clock] for clock, now in clocks.items()}
        for clock in clocks:
            ratios[clock].append(took["ours"][clock] / took["nonprivate"][clock])
    print(f"\nvit_ratio: small ViT (dim {dim}), batch {batch}, {steps} interleaved rounds after a warm-up step")
    for clock, values in ratios.items():
        print(f"private / non-private ({clock} time): {statistics.median(values):.2f}x (median; rounds "
              f"{', '.join(f'{r:.2f}' for r in values)})")


FALLBACK_BATCH = 64


class Bare(nn.Module):
    """``tanh(F.linear(x, W))`` with a bare ``W: (256, 64)`` on ``(B, T, 64)`` tokens: no ghost rule follows it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 64) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.linear(x, self.w))


class Pair(nn.Module):
    """``bilinear(x, x)``: an ``nn.Bilinear`` called on one input twice."""

    def __init__(self) -> None:
        super().__init__()
        self.bilinear = nn.Bilinear(64, 64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bilinear(x, x)


def fallback_modules() -> dict[str, tuple[nn.Module, nn.Module, torch.Tensor]]:
    """name -> ``(root, the module the fallback replays, input)`` at batch :data:`FALLBACK_BATCH`; tokens are
    ``(B, 65, 64)`` (the small ViT's)."""
    g = torch.Generator().manual_seed(0)
    b = FALLBACK_BATCH
    tokens, vectors = torch.randn(b, 65, 64, generator=g), torch.randn(b, 64, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked = nn.utils.weight_norm(nn.Linear(64, 256))
    parametrized = nn.utils.parametrizations.weight_norm(nn.Linear(64, 256))
    bare, pair, prelu, conv3d = Bare(), Pair(), nn.PReLU(64), nn.Conv3d(4, 8, 3)
    return {"F.linear on a bare weight (256x64), tokens": (bare, bare, tokens),
            "weight_norm Linear 64->256 (parametrization), tokens": (parametrized, parametrized, tokens),
            "weight_norm Linear 64->256 (old hook), tokens": (hooked, hooked, tokens),
            "nn.Bilinear(64, 64, 64), vectors": (pair, pair.bilinear, vectors),
            "nn.PReLU(64), vectors": (prelu, prelu, vectors),
            "nn.Conv3d(4, 8, 3) on 4x8x8x8": (conv3d, conv3d, torch.randn(b, 4, 8, 8, 8, generator=g))}


def fallback_cost(steps: int) -> None:
    """The fallback's replay of one recorded call against one forward + backward of the module (module docstring)."""
    print(f"\nfallback: cost per module call, batch {FALLBACK_BATCH}, {steps} interleaved rounds (CPU time)")
    print(f"{'module':<55}{'|θ|':>8}{'fwd+bwd ms':>12}{'replay ms':>11}{'replay / fwd+bwd':>18}")
    for name, (root, module, x) in fallback_modules().items():
        with Tape(root) as tape:
            out = root(x)
            g = torch.randn_like(out)
            out.backward(g)
            calls, rule = tape.calls[module], tape.rules[module]
        base, replay = [], []
        for _ in range(steps + 1):
            start = time.process_time()
            root.zero_grad(set_to_none=True)
            root(x).backward(g)
            base.append(time.process_time() - start)
            start = time.process_time()
            rule.operands(module, calls)
            replay.append(time.process_time() - start)
        base, replay = base[1:], replay[1:]               # the first round: warm-up
        size = sum(p.numel() for p in module.parameters() if p.requires_grad)
        ratio = statistics.median(r / b for r, b in zip(replay, base))
        print(f"{name:<55}{size:>8}{statistics.median(base) * 1e3:>12.1f}{statistics.median(replay) * 1e3:>11.1f}"
              f"{ratio:>17.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vit", "seq"],
                        choices=["vit", "seq", "games", "phantom_ghost", "zoo", "vit_ratio", "fallback", *ZOO])
    parser.add_argument("--batch", type=int, default=0, help="default: 256 for vit, 64 for seq (games: 256)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=64, help="the ViT's width (vit only; heads = dim / 16)")
    parser.add_argument("--memory-child", nargs=2, metavar=("MODEL", "MODE"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    if args.memory_child:
        memory_child(*args.memory_child, args.batch, 2, args.dim)
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device {device}, torch threads {args.threads}, {args.steps} timed steps per mode (interleaved)")
    for name in [m for given in args.models for m in (ZOO_MODELS if given == "zoo" else (given,))]:
        if name == "games":
            games(args.steps)
            continue
        if name == "phantom_ghost":
            phantom_vs_ghost(args.steps, args.threads)
            continue
        if name == "vit_ratio":
            vit_ratio(args.batch or 64, args.steps, args.dim)
            continue
        if name == "fallback":
            fallback_cost(args.steps)
            continue
        batch = args.batch or (ZOO_BATCH if name in ZOO else {"vit": 256, "seq": 64}[name])
        times = timing(name, batch, args.steps, device, args.dim)
        mems = {mode: memory(name, mode, batch, args.threads, args.dim) for mode in MODES}
        print(f"\n{name} (batch {batch}{f', dim {args.dim}' if name == 'vit' else ''})")
        print(f"{'mode':<14}{'step s':>10}{'extra MB':>10}{'time/ours':>11}{'mem/ours':>10}")
        for mode in MODES:
            t, m = times[mode], mems[mode]
            ratio_t = f"{t / times['ours']:.2f}" if isinstance(t, float) else "–"
            ratio_m = f"{m / mems['ours']:.2f}" if isinstance(m, float) and isinstance(mems["ours"], float) else "–"
            if not isinstance(t, float):
                print(f"{mode:<14}{t}")
                continue
            show_m = f"{m:.0f}" if isinstance(m, float) else m
            print(f"{mode:<14}{t:>10.3f}{show_m:>10}{ratio_t:>11}{ratio_m:>10}")
        base_t, base_m = times["nonprivate"], mems["nonprivate"]
        print(f"ours / non-private: time {times['ours'] / base_t:.2f}x, memory {mems['ours'] / base_m:.2f}x")
        if all(isinstance(mems[m], float) for m in ("opacus_hooks", "ours", "nonprivate")):
            print(f"ceiling of memory vs opacus per-sample (opacus / non-private): "
                  f"{mems['opacus_hooks'] / base_m:.2f}x; ours reaches {mems['opacus_hooks'] / mems['ours']:.2f}x")
    if "seq" in args.models:
        print("\nshared embedding:", json.dumps(shared_embedding_check()))


if __name__ == "__main__":
    main()
