"""Training cost of every PETL method relative to full fine-tuning of the same ViT, and LoRA's inference cost
before/after merging, all measured in one run (ratios only: absolute seconds are not comparable on shared machines).

    python benchmarks/petl_cost.py [--dim 64 --depth 3 --heads 4 --size 8 --batch 32 --repeats 9 --threads 1]

Prints, per method (CPU-time ratios: median over back-to-back pairs, alternating order; see ``tangent_speed.Ratio``):
  1. training step time (forward + cross-entropy + backward + AdamW step) / full fine-tuning's step
  2. training memory / full fine-tuning's, where training memory = bytes of the tensors autograd saves for the
     backward pass (counted with ``torch.autograd.graph.saved_tensors_hooks``; weights excluded, they are the same
     for all) + gradients + AdamW state. This is the part of the peak that PETL changes; on CPU there is no allocator
     peak counter, and the process's RSS is dominated by the allocator's caching.
  3. LoRA inference: forward with unmerged LoRA / base ViT, and with LoRA merged into W / base ViT  [merged <= 1.05]

Every PETL module is filled with non-zero values, so no branch is skipped.
"""

from __future__ import annotations

import argparse
import copy

import torch
from tangent_speed import ratio
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.nn import functional as F

from clbench.petl import METHODS, MethodArgs, PETLSet, build_method, inject


def training_memory(step) -> int:
    """Bytes saved for backward (non-parameter tensors, each storage counted once) + grads + optimizer state
    after one ``step()`` (``step`` returns ``(loss, params, optimizer)`` before calling backward)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, params, optimizer = step(backward=False)
    weights = {p.untyped_storage().data_ptr() for p in params}
    saved = sum(n for ptr, n in storages.items() if ptr not in weights)
    loss.backward()
    optimizer.step()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state = sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
                if torch.is_tensor(v) and v.dim() > 0)
    return saved + grads + state


def trainer(model: nn.Module, params: list[nn.Parameter], x: torch.Tensor, y: torch.Tensor):
    """A training step of ``model`` on ``(x, y)`` over ``params`` with AdamW."""
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step(backward: bool = True):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        if not backward:
            return loss, params, optimizer
        loss.backward()
        optimizer.step()
        return loss, params, optimizer

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--img", type=int, default=32)
    parser.add_argument("--size", type=int, default=8, help="r of adapters and LoRA, l of prefixes (MAM: l = r)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--eval-batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9, help="timed pairs per ratio")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=args.img, patch_size=4, num_classes=50, embed_dim=args.dim, depth=args.depth,
                            num_heads=args.heads)
    x, y = torch.randn(args.batch, 3, args.img, args.img), torch.randint(0, 50, (args.batch,))
    backbone = sum(p.numel() for n, p in vit.named_parameters() if not n.startswith("head"))
    print(f"ViT dim {args.dim}, depth {args.depth}, {args.heads} heads, {args.img}px patch 4 ({backbone} backbone "
          f"parameters), batch {args.batch}, {args.threads} thread(s), float32, size {args.size}. Ratios: median over "
          f"{args.repeats} back-to-back pairs of CPU-time ratios.")

    full = copy.deepcopy(vit).train()
    full_step = trainer(full, list(full.parameters()), x, y)
    full_memory = training_memory(full_step)
    print("method | trainable % of backbone | step time / full FT | training memory / full FT")
    for name in METHODS.names():
        config = build_method(name, MethodArgs(size=args.size, prefix_length=args.size, prefix_reparam=0))
        if not config.modifications:        # the family's controls: full FT is the reference, head-only no module
            continue
        model = inject(copy.deepcopy(vit), config)
        petl = PETLSet(config, model.shape)
        with torch.no_grad():
            for p in petl.parameters():
                p.normal_(0, 0.02)
        model.activate(petl)
        model.vit.head.requires_grad_(True)
        params = [*petl.parameters(), *model.vit.head.parameters()]
        step = trainer(model, params, x, y)
        memory = training_memory(step)
        pct = 100 * config.trainable_count(model.shape) / backbone
        print(f"{name} | {pct:.2f} | {ratio(step, full_step, args.repeats)} | {memory / full_memory:.3f}")

    eval_x = torch.randn(args.eval_batch, 3, args.img, args.img)
    base = copy.deepcopy(vit).eval()
    config = build_method("lora", MethodArgs(size=args.size, placement="both"))
    lora = inject(copy.deepcopy(vit), config).eval()
    petl = PETLSet(config, lora.shape)
    with torch.no_grad():
        for p in petl.parameters():
            p.normal_(0, 0.02)
    lora.activate(petl)
    with torch.no_grad():
        unmerged = ratio(lambda: lora(eval_x), lambda: base(eval_x), args.repeats)
        reference = lora(eval_x)
        lora.merge()
        error = (lora(eval_x) - reference).abs().max().item()
        merged = ratio(lambda: lora(eval_x), lambda: base(eval_x), args.repeats)
    print(f"LoRA (W_q, W_v, W_1, W_2; r = {args.size}) inference, batch {args.eval_batch}:\n"
          f"  unmerged / base: {unmerged}\n  merged / base: {merged}  [<= 1.05]\n"
          f"  max |merged - unmerged| = {error:.2e}")


if __name__ == "__main__":
    main()
