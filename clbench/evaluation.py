"""Evaluators owned by scenarios: one routine per kind of task, the same for every strategy.

An evaluator is called after each training step ``i`` and returns row ``i`` of each of its score matrices
(:class:`~clbench.protocol.Scores`, part of the evaluator contract); its :class:`~clbench.metrics.MetricSpec` s tell
the runner, the leaderboard and the plots what the matrices mean. Every evaluation runs under
``torch.inference_mode`` (no autograd bookkeeping; tensors it makes cannot enter a later backward pass, so a
strategy's ``predict`` must not keep them for training).

- :class:`AccuracyEvaluator` (classification; class-, task- and domain-incremental): ``accuracy``; also the accuracy
  on the data a step has just trained on (:meth:`AccuracyEvaluator.train_accuracy`, for
  :mod:`clbench.adequacy`).
- :class:`RankingEvaluator` (next-item recommendation): ``ndcg@k`` and ``hit@k`` over the full item catalogue. It
  does not score training data: a recommendation model's training targets are the next items of the same histories,
  and their ranking is not a "did it learn" measure comparable to chance, so adequacy records no accuracy there.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from clbench.errors import NonFiniteLossError
from clbench.metrics import ACCURACY, MetricSpec
from clbench.protocol import ClassificationInfo, Scenario, Scores, StrategyBase, StrategyContractError, checked


def _scores(strategy: StrategyBase, x: Tensor, t: Tensor, device: torch.device, columns: range, where: str) -> Tensor:
    """``strategy.predict(x, t)[:, columns]`` as float, checked: a tensor ``(B, >= columns.stop)`` whose scored
    columns are finite."""
    logits = checked(strategy.predict(x.to(device), t.to(device)), Tensor, strategy, "predict")
    if logits.ndim != 2 or logits.shape[0] != len(x) or logits.shape[1] < columns.stop:
        raise StrategyContractError(f"{type(strategy).__name__}.predict returned shape {tuple(logits.shape)} for "
                                    f"{len(x)} inputs; at least {columns.stop} columns must be scored {where}.")
    scores = logits[:, columns.start: columns.stop].float()
    if not torch.isfinite(scores).all():
        raise NonFiniteLossError(f"predictions {where}", float("nan"))
    return scores


class AccuracyEvaluator:
    """Accuracy on every test experience after training step ``step``.

    Class-incremental (and domain-incremental): the prediction is the argmax over the classes seen so far,
    ``0 .. info.n_seen(step) - 1``. Task-incremental (``info.task_aware``): the argmax over test experience ``j``'s
    own classes ``info.class_range(j)``, the task label being given.

    In class-incremental scenarios a future experience ``j > step`` holds only classes that cannot be predicted
    yet, so ``R[step, j] = 0`` exactly; it is filled in without running the model.
    """

    specs = (ACCURACY,)

    def __init__(self, batch_size: int = 512) -> None:
        self.batch_size = batch_size

    @torch.inference_mode()
    def __call__(self, strategy: StrategyBase, scenario: Scenario, step: int, device: torch.device) -> Scores:
        info: ClassificationInfo = scenario.info
        n_seen = info.n_seen(step)
        accuracies, sizes = [], []
        for j, experience in enumerate(scenario.test_stream):
            if j > step and not (info.task_aware or info.domain_incremental):
                accuracies.append(0.0)
                sizes.append(len(experience.dataset))
                continue
            allowed = info.class_range(j) if info.task_aware else range(n_seen)
            loader = DataLoader(experience.dataset.eval(), batch_size=self.batch_size, shuffle=False)
            correct = total = 0
            for x, y, t in loader:
                scores = _scores(strategy, x, t, device, allowed, f"on test experience {j} after step {step}")
                pred = scores.argmax(dim=1).cpu() + allowed.start
                correct += int((pred == y).sum())
                total += len(y)
            accuracies.append(correct / total)
            sizes.append(total)
        return Scores({ACCURACY.name: accuracies}, sizes)


    @torch.inference_mode()
    def train_accuracy(self, strategy: StrategyBase, scenario: Scenario, step: int, device: torch.device,
                       experiences: list[int], sample: int, seed: int) -> tuple[float, int]:
        """Accuracy on the TRAINING data of ``experiences`` (the ones step ``step`` has just trained on), with the
        prediction rule of :meth:`__call__` after step ``step``: a fixed subsample of at most ``sample`` items,
        spread over the experiences in proportion to their sizes, drawn without replacement by a
        ``torch.Generator`` seeded with ``seed`` (the global random state is not touched), evaluated in the
        datasets' eval transforms (no augmentation). Returns ``(train_acc, n)``::

            train_acc = (1 / n) * sum over the n sampled (x, y, t) of 1[argmax_{c in allowed} predict(x, t)_c = y]
        """
        info: ClassificationInfo = scenario.info
        stream = list(scenario.train_stream)
        generator = torch.Generator().manual_seed(seed)
        sizes = [len(stream[j].dataset) for j in experiences]
        correct = total = 0
        for j, size in zip(experiences, sizes):
            take = min(size, max(1, round(sample * size / sum(sizes))))
            indices = torch.randperm(size, generator=generator)[:take].sort().values.tolist()
            allowed = info.class_range(j) if info.task_aware else range(info.n_seen(step))
            loader = DataLoader(torch.utils.data.Subset(stream[j].dataset.eval(), indices),
                                batch_size=self.batch_size, shuffle=False)
            for x, y, t in loader:
                scores = _scores(strategy, x, t, device, allowed, f"on training experience {j} after step {step}")
                correct += int((scores.argmax(dim=1).cpu() + allowed.start == y).sum())
                total += len(y)
        return correct / total, total


class RankingEvaluator:
    """Next-item ranking: each test sample is ``(history, next_item, task)``; the strategy scores all
    ``n_items`` items (``predict -> (B, n_items)``) and the rank ``r`` (0-based, ties counted against the target)
    of the true next item gives

        HIT@k  = 1[r < k]
        NDCG@k = 1[r < k] / log2(r + 2)          (one relevant item, so the ideal DCG is 1)

    averaged over the experience's test samples. Items of every experience are always rankable (no masking).
    """

    def __init__(self, n_items: int, k: int = 10, batch_size: int = 512) -> None:
        self.n_items, self.k, self.batch_size = n_items, k, batch_size
        self.specs = (MetricSpec(f"ndcg@{k}", primary=True), MetricSpec(f"hit@{k}"))

    @torch.inference_mode()
    def __call__(self, strategy: StrategyBase, scenario: Scenario, step: int, device: torch.device) -> Scores:
        ndcg, hit, sizes = [], [], []
        for j, experience in enumerate(scenario.test_stream):
            gain = hits = 0.0
            total = 0
            for x, y, t in DataLoader(experience.dataset, batch_size=self.batch_size, shuffle=False):
                scores = _scores(strategy, x, t, device, range(self.n_items),
                                 f"on test experience {j} after step {step}")
                target = scores.gather(1, y.to(scores.device).view(-1, 1))
                rank = (scores >= target).sum(dim=1) - 1            # other items scored at least as high
                top = rank < self.k
                hits += float(top.sum())
                gain += float((top / torch.log2(rank.double() + 2)).sum())
                total += len(y)
            ndcg.append(gain / total)
            hit.append(hits / total)
            sizes.append(total)
        return Scores({self.specs[0].name: ndcg, self.specs[1].name: hit}, sizes)


__all__ = ["AccuracyEvaluator", "RankingEvaluator", "Scores"]
