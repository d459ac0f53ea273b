"""The one Avalanche-template setup of the strategies that train in phases (DyTox, DER, PETL).

:class:`PhasedTemplate` is Avalanche's ``SupervisedTemplate`` set up once for all of them: no loggers and no
evaluation inside the template (the runner's evaluator scores every strategy the same way), a placeholder optimizer
and criterion (a subclass builds the real optimizer in ``make_optimizer`` when an experience starts, with
:func:`clbench.training.build_optimizer` from the phase's schedule, and computes its loss in
:meth:`PhasedTemplate.criterion`), Avalanche's "No loggers specified" notice and deprecation noise silenced, and one
:class:`~clbench.cl.finetune.Phase` trained per :meth:`PhasedTemplate.run_phase` call, at the rates of its
:class:`~clbench.training.Schedule` (set here, per epoch or per step).

:class:`PhasedStrategy` is the strategy side shared by DyTox and DER: a class-incremental network whose output has
``.logits`` over every class seen, a rehearsal memory filled from :meth:`PhasedStrategy.features`, and the template
bridged to the strategy's callbacks.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from clbench.callbacks import bridge
from clbench.cl.data import dataset_features
from clbench.cl.finetune import Phase, freeze
from clbench.cl.memory import Memory, build_memory
from clbench.protocol import ParamCount, ScenarioInfo, StrategyBase


class PhasedTemplate(SupervisedTemplate):
    """``SupervisedTemplate`` that trains one :class:`Phase` per :meth:`run_phase` call.

    - dataset adaptation: ``D_t ∪ M`` (``M = self.memory.dataset()``), or ``M`` alone for a ``memory_only`` phase,
      with train transforms;
    - model adaptation: Avalanche's, then the :meth:`feature_extractor` frozen for a ``freeze_extractor`` phase
      (:func:`freeze`). It stays frozen after the phase (parameter counts taken after the step see the state
      the phase trained in) and is restored when the next phase starts;
    - the rate of every optimizer group set from ``phase.schedule`` before every epoch (``per="epoch"``) or every
      step (``per="step"``, ``T = epochs · len(dataloader)``).

    A subclass defines :meth:`make_optimizer` (:func:`~clbench.training.build_optimizer` over the parameters a phase
    trains, with ``self.phase.schedule``), :meth:`criterion` (the loss of ``self.mb_output`` against ``self.mb_y``)
    and, if it has a freezing phase, :meth:`feature_extractor`.
    """

    def __init__(self, *, model: nn.Module, memory: Memory, phase: Phase, batch_size: int, eval_batch_size: int,
                 device: torch.device) -> None:
        """``phase``: the phase to start with; minibatches of ``batch_size`` in training, ``eval_batch_size`` in
        Avalanche's own evaluation calls."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No loggers specified")
            super().__init__(model=model, optimizer=torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.0),
                             criterion=nn.Identity(), train_mb_size=batch_size, train_epochs=1,
                             eval_mb_size=eval_batch_size, device=device, evaluator=EvaluationPlugin(loggers=[]),
                             eval_every=-1)
        self.memory, self.phase = memory, phase
        self._restore_extractor: Callable[[], None] | None = None

    def feature_extractor(self) -> nn.Module:
        """The module that balanced fine-tuning freezes (DyTox: the encoder; DER: all feature extractors)."""
        raise NotImplementedError(f"{type(self).__name__} must define feature_extractor()")

    def make_optimizer(self, **kwargs) -> None:
        """``self.optimizer = build_optimizer(name, parameters, self.phase.schedule, ...)`` over what the phase
        trains."""
        raise NotImplementedError(f"{type(self).__name__} must define make_optimizer()")

    def criterion(self) -> Tensor:
        """The training loss of the current minibatch (``self.mb_output``, ``self.mb_y``): a scalar."""
        raise NotImplementedError(f"{type(self).__name__} must define criterion()")

    def run_phase(self, phase: Phase, experience) -> bool:
        """Train ``phase`` on ``experience``; returns whether it ran. A phase of 0 epochs, and a ``memory_only``
        phase on the first experience or with an empty memory, do not run. Avalanche's deprecation warnings are
        dropped; any other warning is passed on."""
        skip = phase.memory_only and (experience.current_experience == 0 or len(self.memory) == 0)
        if phase.epochs <= 0 or skip:
            return False
        if self._restore_extractor is not None:
            self._restore_extractor()
            self._restore_extractor = None
        self.phase, self.train_epochs = phase, phase.epochs
        with warnings.catch_warnings(record=True) as caught:
            self.train(experience, eval_streams=[])
        for w in caught:
            if not issubclass(w.category, DeprecationWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return True

    def train_dataset_adaptation(self, **kwargs) -> None:
        memory = self.memory.dataset()
        if self.phase.memory_only:
            data = memory
        else:
            data = self.experience.dataset if memory is None else self.experience.dataset.concat(memory)
        self.adapted_dataset = data.train()

    def model_adaptation(self, model=None):
        model = super().model_adaptation(model)
        if self.is_training and self.phase.freeze_extractor:
            self._restore_extractor = freeze(self.feature_extractor())
        return model

    def _before_training_epoch(self, **kwargs) -> None:
        super()._before_training_epoch(**kwargs)
        if self.phase.schedule.per == "epoch":
            self.phase.schedule.apply(self.optimizer, self.clock.train_exp_epochs, self.phase.epochs)

    def _before_training_iteration(self, **kwargs) -> None:
        if self.phase.schedule.per == "step":
            self.phase.schedule.apply(self.optimizer, self.clock.train_exp_iterations,
                                      self.phase.epochs * len(self.dataloader))
        super()._before_training_iteration(**kwargs)


class PhasedStrategy(StrategyBase):
    """A class-incremental strategy trained through a :class:`PhasedTemplate` (task labels are ignored;
    :meth:`predict` scores every class seen so far), with a rehearsal memory of kind ``config.memory`` and budget
    ``config.mem_size``. Built in this order: :meth:`build_model` (its output has ``.logits``, ``(B, |C_1:t|)``),
    the memory, :meth:`build_template` (bridged to the strategy's callbacks). A subclass also defines
    :meth:`features` (the herding features) and ``feature_batch_size`` (the batch size of :meth:`dataset_features`)."""

    offline = False
    feature_batch_size: int

    def __init__(self, info: ScenarioInfo, device: torch.device | str, config: Any) -> None:
        super().__init__(info, device, config)
        self.model = self.build_model()
        self.memory = build_memory(config.memory, config.mem_size)
        self.template = self.build_template()
        bridge(self.template, self.callbacks)

    def build_model(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must define build_model()")

    def build_template(self) -> PhasedTemplate:
        """The template training ``self.model`` with ``self.memory``."""
        raise NotImplementedError(f"{type(self).__name__} must define build_template()")

    def features(self, x: Tensor) -> Tensor:
        """Herding features of a batch ``x``: ``(B, D)``."""
        raise NotImplementedError(f"{type(self).__name__} must define features()")

    def dataset_features(self, dataset) -> Tensor:
        """:meth:`features` of every sample of an Avalanche dataset (eval transforms): ``(n, D)`` on CPU."""
        return dataset_features(dataset, self.features, self.feature_batch_size, self.device)

    @torch.no_grad()
    def predict(self, x: Tensor, task_labels: Tensor | None) -> Tensor:
        self.model.eval()
        return self.model(x.to(self.device)).logits

    def num_parameters(self) -> ParamCount:
        """The network only (training-time heads, such as DyTox's divergence head and DER's auxiliary head, are
        not part of it)."""
        return ParamCount.of(self.model)


__all__ = ["PhasedStrategy", "PhasedTemplate"]
