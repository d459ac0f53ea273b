"""Avalanche 0.6 methods that exist only as plugins, clbench's fixes to six of Avalanche's plugins, and its MER
template with the training hooks fired (:class:`HookedMER`).

:class:`PluginStrategy` is Avalanche's ``Naive`` template plus one plugin built from the strategy's config: the
strategies of :mod:`clbench.strategies.regularization` and :mod:`clbench.strategies.rehearsal` use it where Avalanche
has no template (RWalk) or where clbench replaces Avalanche's plugin by one of the fixed plugins below:

- :class:`ClonedSynapticIntelligencePlugin` — Avalanche's SI keeps its reference weights as
  ``param.detach().cpu().flatten()``; on CPU that is a VIEW of the live parameter, so the importances are always 0
  and SI trains exactly like naive.
- :class:`FiniteRWalkPlugin` — Avalanche's RWalk divides its path-integral scores by their maximum, which is 0 when
  an experience had fewer than ``delta_t`` iterations: 0/0 made every penalty NaN.
- :class:`OfflineCoPEPlugin` — Avalanche's CoPE stops an experience after ``max_it_cnt`` (1) mini-batches and
  updates its prototypes once per experience: it is written for online streams whose experiences are single
  mini-batches; on class-incremental experiences it trained on one mini-batch per experience.
- :class:`OfflineMIRPlugin` — Avalanche's MIR leaves the classes of an experience's last mini-batch out of the replay
  buffer (in an online stream the next mini-batches still bring them); on class-incremental experiences that keeps
  the whole previous experience out of replay.
- :class:`CorrectedBiCPlugin` — Avalanche's BiC distils towards ``softmax(z_old / 2, dim=0)``: a softmax over the
  mini-batch instead of the classes, at a fixed temperature 2 whatever ``T`` says; and it writes its reduced training
  set to ``experience.dataset``, read-only on the experiences of Avalanche's new-style benchmarks, and passes
  ``verbose`` to ``MultiStepLR``, which torch 2.14 no longer accepts (it failed on both).
- :class:`CleanGradientGSSPlugin` — Avalanche's GSS computes its selection gradients after the forward pass and leaves
  the last of them in ``param.grad``, where the training step adds it to the mini-batch gradient.

Coverage of ``avalanche.training`` (the ``SupervisedTemplate`` subclasses Avalanche 0.6 exports):

======================================  ==============================================================================
Registered in ``baselines.py``          Naive, Cumulative, JointTraining, Replay, EWC, LwF, ICaRL, DER, GDumb
Registered in ``regularization.py``     SynapticIntelligence (``si``), MAS, LFL, EWC ``mode="online"``
                                        (``ewc_online``), and RWalk (``RWalkPlugin``; Avalanche has no template)
Registered in ``rehearsal.py``          AGEM, GEM, ER_ACE, ER_AML, MIR, GSS_greedy (``gss``), BiC, CoPE,
                                        FeatureReplay, MER
Skipped: not classification             AETraining, VAETraining (autoencoders, no labels predicted)
Skipped: needs downloaded weights       AR1 (ImageNet-pretrained MobileNetV1 with batch renormalization),
                                        ExpertGateStrategy (pretrained AlexNet), LearningToPrompt (pretrained timm ViT)
Skipped: its own fixed architecture     PNNStrategy (its PNN columns replace clbench's backbone; task labels only),
                                        PackNet (needs a ``PackNetModel``-wrapped backbone and task labels at test)
Skipped: needs a pretrained backbone    StreamingLDA (a frozen pretrained feature extractor + streaming LDA head),
                                        CWRStar (freezes the backbone after experience 0; trained from scratch here
                                        with a bias-free output layer, only experience 0's classes were ever
                                        predicted: last-step accuracy 1.0 / 0.996 on experience 0, 0 on the others,
                                        split digits / split MNIST 500 per class, 2 epochs)
Not wrapped yet                         GenerativeReplay (needs a VAE generator built for the input shape; Avalanche's
                                        default is MNIST-only), SCR (needs an ``SCRModel`` projection head, tensor
                                        augmentations and its nearest-class-mean eval hook in ``predict``),
                                        FromScratchTraining (a reference point beside naive: re-initializes the model
                                        every experience; it belongs with the baselines)
Not separate strategies                 OnlineNaive (Naive for online streams; clbench's experiences are offline);
                                        LwF has one variant in Avalanche 0.6 (registered as ``lwf``)
======================================  ==============================================================================
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
from types import SimpleNamespace
from typing import ClassVar
from unittest import mock

import torch
from avalanche.models.bic_model import BiasLayer
from avalanche.training import MER, Naive
from avalanche.training.plugins import (
    BiCPlugin,
    CoPEPlugin,
    GSS_greedyPlugin,
    MIRPlugin,
    RWalkPlugin,
    SupervisedPlugin,
    SynapticIntelligencePlugin,
)
from avalanche.training.plugins import bic as avalanche_bic
from avalanche.training.plugins.mir import cycle
from avalanche.training.templates import SupervisedTemplate
from avalanche.training.utils import ParamData
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import MultiStepLR

from clbench.precision import in_float32
from clbench.protocol import ClassificationInfo
from clbench.strategies.baselines import AvalancheStrategy, augmented_buffer, train_augment, unaugmented_minibatch


class PluginStrategy(AvalancheStrategy):
    """Avalanche's ``Naive`` template plus ``plugin_cls(**template_kwargs())`` (the config's own fields)."""

    template_cls = Naive
    plugin_cls: ClassVar[type[SupervisedPlugin]]

    def plugin(self) -> SupervisedPlugin:
        return self.plugin_cls(**self.template_kwargs())

    def make_template(self, model: nn.Module, common: dict) -> SupervisedTemplate:
        return Naive(model=model, criterion=nn.CrossEntropyLoss(), **{**common,
                                                                        "plugins": [*common["plugins"], self.plugin()]})


def require_single_head(name: str, info: ClassificationInfo) -> None:
    """Methods whose plugins call ``model(x)`` or swap the output layer need one shared head."""
    if info.task_aware:
        raise ValueError(f"{name} needs one shared head (class- or domain-incremental); scenario {info.name!r} is "
                         f"task-incremental (one head per task).")


def _own(data: dict[str, ParamData]) -> None:
    """Replace every tensor of ``data`` by a copy (Avalanche's may be views of live parameters)."""
    for param_data in data.values():
        param_data.data = param_data.data.clone()


class ClonedSynapticIntelligencePlugin(SynapticIntelligencePlugin):
    """Avalanche 0.6's SI plugin with its reference weights copied instead of viewed.

    SI (Zenke et al., 2017) penalizes ``c/2 · Σ_k Ω_k (θ_k - θ*_k)²`` with the path integral
    ``Ω_k = Σ_steps -g_k · Δθ_k / ((θ_k(end) - θ_k(start))² + ξ)``. Avalanche stores ``θ(start)`` (``ewc_data[0]``)
    and ``θ`` before each step (``syn_data["old_theta"]``) as ``param.detach().cpu().flatten()``, which is the
    parameter itself on CPU: every ``Δθ`` and every penalty term is then 0. Both are copied right after Avalanche
    takes them; everything else (the importance clipping at 1e-3, Maltoni & Lomonaco's variant) is Avalanche's.
    """

    def before_training_exp(self, strategy, **kwargs):
        super().before_training_exp(strategy, **kwargs)
        _own(self.ewc_data[0])

    def before_training_iteration(self, strategy, **kwargs):
        super().before_training_iteration(strategy, **kwargs)
        _own(self.syn_data["old_theta"])


class FiniteRWalkPlugin(RWalkPlugin):
    """RWalk (Chaudhry et al., 2018) whose penalty is the normalized Fisher alone when no positive path-integral
    score exists (Avalanche divides the scores by their maximum: 0/0 when the experience had fewer than
    ``delta_t`` iterations).

    Avalanche takes the iteration's gradient (for its Fisher and path-integral scores) on the minibatch in
    ``before_training_iteration``, which runs before the bridge's (appended last) has applied the scenario's batch
    augmentation: here the same step runs at ``before_forward`` instead, on the augmented minibatch the training
    forward then sees (as the per-sample train transform gave both the same rows), its gradients cleared after it
    as the template's ``zero_grad`` cleared them. Avalanche's ``_update_grad`` leaves the model in eval mode
    (``model.eval()`` with no ``model.train()`` after it), so RWalk trains in eval mode from the first iteration
    on; that is Avalanche 0.6's behaviour and is kept.
    """

    def before_training_iteration(self, strategy, *args, **kwargs):
        """Nothing: the step runs at :meth:`before_forward`."""

    def before_forward(self, strategy, *args, **kwargs):
        super().before_training_iteration(strategy, *args, **kwargs)
        strategy.optimizer.zero_grad()

    def after_training_exp(self, strategy, *args, **kwargs):
        super().after_training_exp(strategy, *args, **kwargs)
        if max(float(score.data.max()) for score in self.exp_scores.values()) <= 0:
            top = max(float(imp.data.max()) for imp in self.exp_importance.values())
            for name, penalty in self.exp_penalties.items():
                penalty.data = self.exp_importance[name].data / top


class OfflineCoPEPlugin(CoPEPlugin):
    """CoPE (De Lange & Tuytelaars, 2021) on experiences of many mini-batches.

    The paper learns from a stream of mini-batches: after each one, the prototype of each class ``c`` in it moves
    to ``normalize(α p_c + (1 - α) normalize(mean of the batch's embeddings of c)))``. Avalanche's plugin treats an
    experience as ONE such mini-batch: it stops training after ``max_it_cnt`` (1) iterations and moves the
    prototypes once per experience. Here every mini-batch of the experience is trained on (once per epoch, each with
    a replayed mini-batch) and is followed by the prototype update; prototypes are created when a class is first
    seen (``p_init_adaptive``), so predictions are made among the classes seen so far; the "Using the
    Pseudo-Prototypical-Proxy loss" print is silenced.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.p_init_adaptive = True

    def before_training(self, strategy, **kwargs):
        """Avalanche's set-up (its print silenced), the PPP loss then computed in float32 outside autocast
        (:func:`clbench.precision.in_float32`): in bf16 its ``log(1 − P)`` is ``-inf`` once ``P`` rounds to 1."""
        with contextlib.redirect_stdout(io.StringIO()):
            super().before_training(strategy, **kwargs)
        strategy._criterion = functools.partial(in_float32, self.ppp_loss)

    def after_training_iteration(self, strategy, **kwargs):
        """The prototype update after every mini-batch, instead of Avalanche's early stop."""
        self._update_prototypes()

    @torch.no_grad()
    def similarities(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``(B, P)`` L2-normalized embeddings -> ``(B, C)`` dot products with the prototypes of classes ``0..C-1``
        (the nearest prototype is Avalanche's prediction)."""
        classes = sorted(self.p_mem)
        if classes != list(range(len(classes))):
            raise RuntimeError(f"CoPE prototypes exist for classes {classes}, not for 0..{len(classes) - 1}.")
        return embeddings @ torch.cat([self.p_mem[c] for c in classes]).to(embeddings.device).T


class OfflineMIRPlugin(MIRPlugin):
    """MIR (Aljundi et al., 2019) whose replay buffer keeps every class stored so far.

    Avalanche builds the buffer after each experience without the classes of the experience's last mini-batch; on
    class-incremental experiences those are the classes of the experience just learnt, never replayed while the
    next one is learnt. The candidates drawn from it go through the scenario's batch augmentation
    (:func:`~clbench.strategies.baselines.augmented_buffer`) before they are scored and replayed.
    """

    def after_training_exp(self, strategy, **kwargs):
        self.storage_policy.update(strategy, **kwargs)
        buffer = self.storage_policy.buffer
        self.replay_loader = (augmented_buffer(strategy, cycle(torch.utils.data.DataLoader(
            buffer, batch_size=self.subsample, shuffle=True))) if len(buffer) > self.batch_size_mem else None)


class CastBiasLayer(BiasLayer):
    """BiC's bias layer ``y_c = α x_c + β`` on the classes ``c`` of the last experience, ``y_c = x_c`` on the others
    (``x, y: (B, C)``), with ``α, β`` cast to ``x``'s dtype: under ``--amp`` the logits are bf16 and Avalanche's
    layer writes the float32 ``α, β`` into bf16 tensors, which torch refuses."""

    def forward(self, x: Tensor) -> Tensor:
        alpha, beta = torch.ones_like(x), torch.zeros_like(x)
        alpha[:, self.clss] = self.alpha.to(x.dtype)
        beta[:, self.clss] = self.beta.to(x.dtype)
        return alpha * x + beta


class CorrectedBiCPlugin(BiCPlugin):
    """BiC (Wu et al., 2019) distilling towards the previous model's class distribution at temperature ``T``,
    ``CE(z_new / T, softmax(z_old / T))`` over the old classes (Avalanche 0.6: ``softmax(z_old / 2, dim=0)``, each
    class's logits normalized over the mini-batch), on experiences whose ``dataset`` is read-only, with torch 2.14."""

    def before_train_dataset_adaptation(self, strategy, **kwargs):
        """Avalanche's hook replaces ``strategy.experience.dataset`` by the experience minus the samples it holds
        out for the bias layer; it runs on a stand-in and the template continues with a copy of the experience that
        holds the reduced dataset."""
        experience = strategy.experience
        strategy.experience = SimpleNamespace(dataset=experience.dataset)
        super().before_train_dataset_adaptation(strategy, **kwargs)
        reduced = strategy.experience.dataset
        strategy.experience = copy.copy(experience)
        strategy.experience._dataset = reduced

    def bias_correction_step(self, strategy, **kwargs):
        """Avalanche's stage 2, its ``MultiStepLR(..., verbose=False)`` built without ``verbose``, its bias layer
        a :class:`CastBiasLayer` and the held-out samples it trains the bias layer on through the scenario's batch
        augmentation (:func:`~clbench.strategies.baselines.augmented_buffer`), as their train transform was."""
        def scheduler(optimizer, milestones, gamma, verbose=False):
            return MultiStepLR(optimizer, milestones=milestones, gamma=gamma)

        def loader(*args, **loader_kwargs):
            return augmented_buffer(strategy, torch.utils.data.DataLoader(*args, **loader_kwargs))

        with (mock.patch.object(avalanche_bic, "MultiStepLR", scheduler),
              mock.patch.object(avalanche_bic, "BiasLayer", CastBiasLayer),
              mock.patch.object(avalanche_bic, "DataLoader", loader)):
            super().bias_correction_step(strategy, **kwargs)

    def cross_entropy(self, new_outputs: Tensor, old_outputs: Tensor) -> Tensor:
        return F.cross_entropy(new_outputs / self.T, F.softmax(old_outputs / self.T, dim=1))


class CleanGradientGSSPlugin(GSS_greedyPlugin):
    """GSS-greedy whose sample-selection backward passes leave no gradient behind for the training step (Avalanche
    0.6 runs them between the optimizer's ``zero_grad`` and the mini-batch's backward).

    With the scenario's batch augmentation, the memory holds the minibatch rows as the data loader gave them
    (:func:`~clbench.strategies.baselines.unaugmented_minibatch`), and every forward of the selection goes through
    the augmentation once: the replayed rows, joined to later minibatches by the replay data loader, are augmented
    there by the bridge, once, as a stored row carried its per-sample transform once before (storing the augmented
    rows would augment them again at every replay). The selection's forwards of the minibatch rows and of the memory
    subsets see one augmentation each, as they did with the per-sample transform.
    """

    def after_forward(self, strategy, **kwargs):
        raw, augment = unaugmented_minibatch(strategy), train_augment(strategy)
        if raw is None or augment is None:
            super().after_forward(strategy, **kwargs)
        else:
            augmented, model = strategy.mbatch[0], strategy.model
            strategy.mbatch[0], forward = raw, model.forward
            model.forward = lambda x: forward(augment(x))
            try:
                super().after_forward(strategy, **kwargs)
            finally:
                del model.forward
                strategy.mbatch[0] = augmented
        strategy.optimizer.zero_grad()

    def get_rand_mem_grads(self, strategy, grad_dims, gss_batch_size):
        """Avalanche 0.6 draws ``min(mem_strength, stored // batch)`` memory subsets: none (and then a ``max()`` of an
        empty sequence) while the memory holds fewer samples than one replay-augmented mini-batch. Subsets of at most
        ``stored`` samples keep at least one."""
        return super().get_rand_mem_grads(strategy, grad_dims, min(gss_batch_size, self.ext_mem_list_current_index))


class HookedMER(MER):
    """Avalanche 0.6's MER template whose per-sample inner steps fire the backward and update hooks.

    MER (Riemer et al., 2019) trains each mini-batch by ``n_inner_steps`` passes of one SGD step per sample (the new
    samples plus a memory batch), interpolated by Reptile's β and γ. Avalanche's ``_inner_updates`` calls
    ``loss.backward()`` and ``optimizer.step()`` itself, so no plugin saw a loss, a gradient or an update: clbench's
    callbacks (the NaN guard, the training log, ``hook_trace``, a ``dual_form`` recorder) saw none of MER's training.
    Here each inner step fires ``before_backward`` with ``self.loss`` = that sample's loss (through the criterion),
    ``after_backward`` and ``before_update`` just before the optimizer's step and ``after_update`` just after it
    (through the optimizer's step hooks): one ``after_forward`` / ``after_backward`` / ``after_step`` per optimizer
    step, ``on_batch_start`` once per mini-batch. The steps themselves are Avalanche's, unchanged (the hooks only
    read; tests/test_strategies.py compares with Avalanche's own MER). The memory batch each inner pass joins to the
    minibatch goes through the scenario's batch augmentation (:func:`~clbench.strategies.baselines.train_augment`;
    the minibatch itself was augmented by the bridge).
    """

    def _inner_updates(self, **kwargs):
        criterion = self._criterion
        augment, get_batch = train_augment(self), self.buffer.get_batch

        def augmented_get_batch(x: Tensor, y: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            mixed_x, mixed_y, mixed_t = get_batch(x, y, t)
            if len(mixed_x) > len(x):
                mixed_x = torch.cat([mixed_x[:len(x)], augment(mixed_x[len(x):])])
            return mixed_x, mixed_y, mixed_t

        def hooked(pred: Tensor, target: Tensor) -> Tensor:
            self.loss = criterion(pred, target)
            self._before_backward(**kwargs)
            return self.loss

        def before_step(optimizer, args, step_kwargs) -> None:
            self._after_backward(**kwargs)
            self._before_update(**kwargs)

        handles = [self.optimizer.register_step_pre_hook(before_step),
                   self.optimizer.register_step_post_hook(lambda optimizer, args, step_kwargs: self._after_update(
                       **kwargs))]
        self._criterion = hooked
        if augment is not None:
            self.buffer.get_batch = augmented_get_batch
        try:
            super()._inner_updates(**kwargs)
        finally:
            self._criterion = criterion
            if augment is not None:
                del self.buffer.get_batch
            for handle in handles:
                handle.remove()
