"""A tiny image scenario whose batch augmentation marks what it augments, and a run that records every input the
model's backbone was given: which training forwards of a strategy's buffer samples went through the scenario's
batch augmentation (``tests/test_strategies_<module>.py``).

The inputs are ``randn`` images; :class:`Mark` adds :data:`MARK` to each, so an input's mark count is
``round(mean / MARK)``: 0 untouched, 1 augmented once, 2 twice."""

from __future__ import annotations

import functools

import torch

MARK = 10.0


class Mark:
    """A batch augmentation (:meth:`batch`, as :class:`~clbench.augment.CropFlip`'s) that adds :data:`MARK` and
    counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def batch(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + MARK


def marks(x: torch.Tensor) -> list[int]:
    """The mark count of each input of ``x (B, ...)``."""
    return (x.detach().flatten(1).mean(1) / MARK).round().long().tolist()


@functools.cache
def recorded_run(name: str, args: tuple) -> dict:
    """``name`` trained (batch 4, one epoch) on two experiences of two classes, 12 random 3x4x4 images per class,
    whose batch augmentation is a :class:`Mark`, and evaluated after each. Returns ``{(phase, mode): {marks:
    inputs}}`` over the backbone's forwards (phase ``train0``, ``eval0``, ``train1``, ``eval1``; mode ``T`` in train
    mode, ``E`` in eval mode) and ``"eval_calls"``: the augmentation's calls made while evaluating."""
    from clbench.config import build_config
    from clbench.protocol import ClassificationInfo
    from clbench.registry import STRATEGIES
    from clbench.runner import seed_everything
    from clbench.streams import class_incremental

    seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 3, 4, 4, generator=g), torch.arange(4).repeat_interleave(12)
    mark = Mark()
    info = ClassificationInfo(name="tiny_marked", n_classes=4, classes_per_experience=(2, 2), input_shape=(3, 4, 4),
                              default_model="mlp", batch_augment=mark)
    scenario = class_incremental(info, x, y, x[::3], y[::3], class_order=[0, 1, 2, 3])
    config = build_config(name, "cpu", {"epochs": 1, "batch_size": 4, "model_args": {"hidden": [8]}, **dict(args)})
    strategy = STRATEGIES.get(name)(info, torch.device("cpu"), config)
    phase, seen, eval_calls = ["train0"], {}, 0

    def record(module, inputs) -> None:
        counts = seen.setdefault((phase[0], "T" if module.training else "E"), {})
        for m in marks(inputs[0]):
            counts[m] = counts.get(m, 0) + 1

    strategy.model.feature_extractor.register_forward_pre_hook(record)
    for step, experience in enumerate(scenario.train_stream):
        phase[0] = f"train{step}"
        strategy.train(experience)
        phase[0], calls = f"eval{step}", mark.calls
        scenario.evaluator(strategy, scenario, step, torch.device("cpu"))
        eval_calls += mark.calls - calls
    return {**seen, "eval_calls": eval_calls}


def assert_buffer_augmented(run: dict, eval_mode_marks: int | None = None) -> None:
    """Every input of a train-mode forward while training was augmented exactly once, and the second experience
    forwarded more inputs than the first (its buffer samples: the check reads them); ``eval_mode_marks``: the mark
    count every eval-mode forward made while training must have (None: no such forward)."""
    for step in (0, 1):
        assert set(run[(f"train{step}", "T")]) == {1}, run
        if eval_mode_marks is None:
            assert (f"train{step}", "E") not in run, run
    if eval_mode_marks is not None:
        assert set(run[("train1", "E")]) == {eval_mode_marks}, run
    rows = [sum(c for key, counts in run.items() if key != "eval_calls" and key[0] == f"train{step}"
                for c in counts.values()) for step in (0, 1)]
    assert rows[1] > rows[0], run


def assert_evaluation_untouched(run: dict) -> None:
    """The evaluator's forwards got the stored test inputs, and the augmentation was not called while evaluating."""
    assert run["eval_calls"] == 0
    for step in (0, 1):
        assert set(run[(f"eval{step}", "E")]) == {0} and (f"eval{step}", "T") not in run, run


def assert_training_augmented_once(run: dict, forwarded: dict[str, int]) -> None:
    """Every input of every backbone forward while training (train mode ``T`` and eval mode ``E``: an importance or
    feature-storing pass over the experience's data, a per-iteration gradient) was augmented exactly once, and each
    experience's training forwarded ``forwarded[mode]`` inputs in each mode (so the pass that the check reads was
    made; 0 where a mode is absent)."""
    for step in (0, 1):
        for mode in ("T", "E"):
            counts = run.get((f"train{step}", mode), {})
            assert sum(counts.values()) == forwarded.get(mode, 0), (step, mode, run)
            assert set(counts) <= {1}, (step, mode, run)
