"""One optimization loop for every fine-tuning variant (tangent Δ, non-linear tail): minibatch epochs over tensors."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": lambda params, c: torch.optim.Adam(params, lr=c.lr, weight_decay=c.weight_decay),
    "adamw": lambda params, c: torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay),
    "sgd": lambda params, c: torch.optim.SGD(params, lr=c.lr, momentum=0.9, weight_decay=c.weight_decay),
}


@dataclass(frozen=True)
class FitSettings:
    """``epochs`` over minibatches of ``batch_size``; step schedule ``lr_e = lr · lr_decay^{|{m ∈ lr_milestones :
    m < e}|}`` for 0-based epoch ``e`` (the official TAFT code's ``step`` schedule; no milestones: constant lr)."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "adam"
    weight_decay: float = 0.0
    lr_milestones: tuple[int, ...] = ()
    lr_decay: float = 0.1

    def lr_at(self, epoch: int) -> float:
        return self.lr * self.lr_decay ** sum(m < epoch for m in self.lr_milestones)


def fit(forward: Callable[[Tensor], Tensor], params: Iterable[nn.Parameter], inputs: Tensor, targets: Tensor,
        objective: Callable[[Tensor, Tensor], Tensor], settings: FitSettings, seed: int) -> int:
    """Minimize ``objective(forward(inputs[b]), targets[b])`` over shuffled minibatches ``b`` (order drawn from
    ``seed``) for ``settings.epochs`` epochs; ``inputs: (M, ...)``, ``targets: (M,)``. Returns the number of steps."""
    params = list(params)
    optimizer = OPTIMIZERS[settings.optimizer](params, settings)
    generator = torch.Generator().manual_seed(seed)
    steps = 0
    for epoch in range(settings.epochs):
        for group in optimizer.param_groups:
            group["lr"] = settings.lr_at(epoch)
        for batch in torch.randperm(len(targets), generator=generator).split(settings.batch_size):
            batch = batch.to(inputs.device)
            loss = objective(forward(inputs[batch]), targets[batch])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite training loss {loss.item()} after {steps} steps")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
    return steps
