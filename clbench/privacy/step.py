"""The private step (DP-SGD, Abadi et al. 2016; DP-Adam = the same gradient fed to Adam) as a training callback, so it
works in every loop (:func:`clbench.training.fit`, Avalanche templates through :func:`clbench.callbacks.bridge`).

Per minibatch ``b`` (Poisson-sampled at rate ``q``, expected size ``B̄ = q·n``; actual size ``B``), with ``g_i`` the
gradient of sample ``i``'s loss, clipping norm ``R`` and noise multiplier ``σ``::

    C_i = min(1, R / (‖g_i‖ + 1e-6))            flat clipping (Abadi et al.)
    C_i = R / (‖g_i‖ + γ)                        automatic clipping (Bu et al., NeurIPS 2023; γ = 0.01)
    ĝ  = (Σ_i C_i g_i + N(0, σ²R² I)) / B̄       then the loop's optimizer steps on ĝ (SGD: DP-SGD, Adam: DP-Adam)

The loop's backward has already put ``∇(1/B Σ_i L_i) + r`` into ``.grad`` (``r``: terms that do not depend on
the batch, e.g. a ridge penalty on ``Δ``). The callback's hooks (:class:`~clbench.privacy.tape.Tape`) saw each
layer's ``A`` and ``G``; ``‖g_i‖`` comes from the ghost norms (× B, undoing the mean), and the clipped sum is
book-kept from the same ``A``, ``G`` without per-sample gradients::

    .grad ← .grad + Σ_i (C_i·B/B̄ − 1)·(g_i/B) + N(0, σ²R²/B̄² I)       = ĝ + r

CONTRACT with the loop: its loss is the MEAN over the batch's samples of per-sample losses (plus batch-independent
terms), and each sample's data touches only its own training call (experience or shard): the privacy of a sample
is then that of the one call that used it (parallel composition over disjoint data), and the run's ε is the largest
ε over its training calls. Strategies known to train that way declare it on their class (``private = True``, part
of the strategy contract, :class:`clbench.protocol.StrategyBase`); the suite loader
refuses ``dp`` on the others (replay and joint training reuse samples across calls). A strategy whose calls all use
the same samples (a user's data in every time period) says so (:meth:`PrivateTraining.share_samples`): the run's ε
is then the composition of all its calls (sequential composition, RDP), and each call's σ is calibrated so that the
calls made, this one and those still to come (assumed to repeat its schedule) stay within ε.

σ is calibrated per training call before its first step from the target ε, δ (default ``1/n``, ``n`` the stream's
training samples), ``q = b/n_call`` and ``steps = epochs·⌈n_call/b⌉`` (:mod:`clbench.privacy.accountant`), unless
``noise_multiplier`` is given. Every call's ``(σ, q, steps)`` is written to ``<artifacts>/privacy/`` (member jobs may
run in other processes) and the run's ε is reported as the ``epsilon`` extra metric. When it calibrates a call, the
callback also hands that call's noise to every module that tracks errors for Re-Attention (``set_error_prior``,
:mod:`clbench.privacy.reattention`).

A strategy that needs a statistic of a call's data before training it (Re-Attention's token-frequency prior) asks
the callback for it (:meth:`PrivateTraining.release`): the Gaussian mechanism, whose cost ``(σ_f, 1, 1)`` joins the
next call's record, its σ calibration and the run's ε (:mod:`clbench.privacy.accountant`).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Annotated

import torch
from torch import Tensor, nn

from clbench.callbacks import CALLBACKS, BatchPlan, Callback, CallbackContext
from clbench.privacy.accountant import epsilon, noise_multiplier
from clbench.privacy.config import DECLARED, DPConfig, PrivacyBudgetError, not_private
from clbench.privacy.reattention import ErrorPrior, ErrorTracking, with_noise
from clbench.privacy.rules import UnsupportedLayerError
from clbench.privacy.sampling import PoissonPlan
from clbench.privacy.tape import Tape
from clbench.registry import STRATEGIES, load_plugins

CLIPPING: dict[str, Callable[[Tensor, float, float], Tensor]] = {
    "flat": lambda norms, clip, gamma: (clip / (norms + 1e-6)).clamp(max=1.0),
    "automatic": lambda norms, clip, gamma: clip / (norms + gamma),
}
"""Clipping factor ``C_i`` from the per-sample norms ``‖g_i‖``, the clipping norm ``R`` and automatic clipping's ``γ``
(each bounds ``‖C_i g_i‖ ≤ R``)."""

def check_private_strategy(strategy: str) -> None:
    """Refuse ``dp`` for a strategy whose class does not declare ``private = True`` (its ε would be wrong): a private
    strategy's training calls each use their own disjoint data (one experience, or one shard of it) and its loss is a
    batch mean (the contract above); the refusal lists the private ones (every strategy module is loaded for it)."""
    if not STRATEGIES.get(strategy).private:
        load_plugins()
        raise not_private(strategy, sorted(name for name in STRATEGIES.names() if STRATEGIES.get(name).private))


@dataclass
class TrainingCall:
    """One private training call (a fit call or an Avalanche experience): its data size, schedule and noise."""

    n: int
    batch_size: int
    epochs: int
    sample_rate: float
    steps: int
    sigma: float
    member: str = ""
    steps_taken: int = 0
    releases: list[tuple[float, float, int]] = field(default_factory=list)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def history(self) -> list[tuple[float, float, int]]:
        """The mechanisms this call applied to its data, for the accountant: ``[(σ, q, steps), *releases]``."""
        return [(self.sigma, self.sample_rate, self.steps), *map(tuple, self.releases)]


LEDGER: dict[str, dict[str, TrainingCall]] = {}
"""run id -> {call id: call record} for the training calls made in THIS process (files cover the others)."""


@CALLBACKS.register("dp")
class PrivateTraining(Callback):
    """Differentially private training (DP-SGD / DP-Adam step with ghost clipping, Poisson batches, RDP
    accounting); arguments: :class:`~clbench.privacy.config.DPConfig`'s fields, with its declarations (the
    suite loader checks them from the index). Reports ``epsilon`` (and ``noise_multiplier``)."""

    def __init__(self, epsilon: Annotated[float | None, DECLARED["epsilon"]] = None,
                 delta: Annotated[float | None, DECLARED["delta"]] = None,
                 clip: Annotated[float, DECLARED["clip"]] = 1.0,
                 clipping: Annotated[str, DECLARED["clipping"]] = "flat",
                 noise_multiplier: Annotated[float | None, DECLARED["noise_multiplier"]] = None,
                 gamma: Annotated[float, DECLARED["gamma"]] = 0.01) -> None:
        self.config = DPConfig(epsilon, delta, clip, clipping, noise_multiplier, gamma)
        self.tape: Tape | None = None
        self.call: TrainingCall | None = None
        self.batch = 0
        self.noise: torch.Generator | None = None
        self.releases: list[tuple[float, float, int]] = []
        self.shared_calls = 0                   # > 0: the run's calls all use the same samples (share_samples)
        self.unchecked = False                  # the first step of a call checks the rules explain the gradient
        self.reference: dict[nn.Parameter, Tensor] | None = None

    # ------------------------------------------------------------------------------------------------ set-up
    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        if self.config.delta is None and context.n_train < 2:
            raise PrivacyBudgetError("dp: delta is not given and the run's number of training samples is unknown; "
                                     "set dp.delta.")
        self.delta = self.config.delta if self.config.delta is not None else 1.0 / context.n_train
        if not context.member:                        # the run's own process: a fresh ledger for this run
            LEDGER[context.run_id] = {}
            for path in self._folder().glob("*.json") if self._folder() else ():
                path.unlink()

    def _folder(self):
        return None if self.context.artifacts is None else self.context.artifacts / "privacy"

    def batch_sampler(self, n: int, batch_size: int, epochs: int) -> BatchPlan:
        """Calibrate σ for this call and install the hooks; its minibatches are Poisson draws."""
        plan = PoissonPlan.for_batch_size(n, batch_size)
        steps = epochs * plan.steps_per_epoch
        releases, self.releases = tuple(self.releases), []
        if self.config.noise_multiplier is not None:
            sigma = self.config.noise_multiplier
        else:
            earlier = [c.history() for c in self.calls()] if self.shared_calls else []
            later = max(self.shared_calls - len(earlier) - 1, 0)
            applied = (*releases, *(m for history in earlier for m in history))
            sigma = noise_multiplier(self.config.epsilon, self.delta, plan.sample_rate, steps * (1 + later), applied)
        self.call = TrainingCall(n, batch_size, epochs, plan.sample_rate, steps, sigma, self.context.member,
                                 releases=list(releases))
        LEDGER.setdefault(self.context.run_id, {})[self.call.id] = self.call
        self._install()
        self._set_error_priors()

        def draws(generator: torch.Generator):
            if self.noise is None:                    # the noise stream is seeded from the loop's generator
                self.noise = torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=generator)))
            return plan(generator)
        return draws

    def share_samples(self, calls: int) -> None:
        """Declare that this run's ``calls`` training calls all use the same samples (e.g. every time period holds
        a window of each user): ε is composed over the calls instead of taking the largest (see the module)."""
        if calls < 1:
            raise ValueError(f"dp: share_samples needs the number of training calls (>= 1), got {calls}.")
        self.shared_calls = calls

    def release(self, values: Tensor, sensitivity: float, noise_multiplier: float) -> Tensor:
        """The Gaussian mechanism on a statistic of the NEXT training call's data: ``values + N(0, σ_f² Δ² I)``, with
        ``Δ = sensitivity`` the most one sample can change ``values`` in L2 norm and ``σ_f = noise_multiplier``. Its
        cost ``(σ_f, 1, 1)`` is composed into that call: the call's σ is calibrated for the composition and the run's
        ε includes it. The noise comes from torch's global generator (seeded per run)."""
        if not (math.isfinite(sensitivity) and sensitivity > 0):
            raise PrivacyBudgetError(f"dp: a released statistic needs a finite sensitivity > 0, got {sensitivity}.")
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise PrivacyBudgetError(f"dp: a released statistic needs a finite noise multiplier > 0, got "
                                     f"{noise_multiplier}.")
        self.releases.append((float(noise_multiplier), 1.0, 1))
        return values + torch.randn(values.shape, dtype=values.dtype).to(values.device) * (noise_multiplier *
                                                                                           sensitivity)

    def _install(self) -> None:
        if self.tape is not None:
            self.tape.close()
        self.tape = Tape(*self.context.modules().values())
        self.tape.keep_outputs = self.unchecked = True

    def _set_error_priors(self) -> None:
        """Re-Attention's prior (:mod:`clbench.privacy.reattention`): every module among the strategy's modules that
        holds an ``ErrorPrior`` (``set_error_prior``) gets this call's ``σ``, ``R`` and expected batch ``B̄`` (dense
        ``σ_eff = σR/B̄``, the std of the noise added to each coordinate of ``ĝ``), keeping the token frequencies
        and scale its owner set."""
        call = self.call
        for root in self.context.modules().values():
            for module in root.modules():
                if isinstance(module, ErrorTracking) and isinstance(module.error_prior, ErrorPrior):
                    module.set_error_prior(with_noise(module.error_prior, call.sigma, self.config.clip,
                                                      call.sample_rate * call.n))

    # --------------------------------------------------------------------------------------------- the step
    def on_batch_start(self, x: Tensor, y: Tensor) -> None:
        if self.tape is None:
            raise RuntimeError("dp: this training loop did not ask the callbacks for its minibatches "
                               "(Callback.batch_sampler), so it cannot draw Poisson batches; use clbench.training.fit "
                               "or an Avalanche template bridged with clbench.callbacks.bridge.")
        self.batch = len(y)
        self.tape.reset()

    def after_forward(self, loss: Tensor) -> None:
        """At a call's first step: autograd's gradient of the loss's batch part, for the invariant (:meth:`check`)."""
        if self.unchecked and self.tape is not None and loss.requires_grad:
            self.reference = self.tape.batch_gradient(loss)

    def after_backward(self, model: nn.Module) -> None:
        self.privatize([p for p in model.parameters() if p.requires_grad and p.grad is not None])

    def check(self, params: list[nn.Parameter]) -> None:
        """The first-step checks. Sample independence: no sample's output depends on the other samples of the batch
        (:mod:`clbench.privacy.independence`; a batch of one cannot tell, and the checks then run again at the next
        step). The invariant: the rules' batch sum ``Σ_i ∇θ_i`` (of the backpropagated batch-mean loss:
        ``∇θ_i = ∇L_i / B``) must equal autograd's gradient for every parameter
        (:meth:`~clbench.privacy.tape.Tape.explain`), else the run stops before the step with one line naming the
        parameter and its unaccounted use. Autograd's side is the loss's part that flows through the models'
        outputs (:meth:`~clbench.privacy.tape.Tape.batch_gradient`), or ``.grad`` when no model forward was seen."""
        reference = self.reference if self.reference is not None else {p: p.grad for p in params}
        tested = self.tape.check_independent(self.batch)
        self.tape.explain(reference, reference[next(iter(reference))].new_ones(self.batch))
        self.unchecked, self.reference, self.tape.keep_outputs, self.tape.outputs = not tested, None, not tested, []

    def privatize(self, params: list[nn.Parameter]) -> Tensor:
        """Replace each ``p.grad`` (the mean-loss gradient of this batch) by the private gradient; returns the
        per-sample gradient norms ``‖g_i‖``."""
        call, tape, batch = self.call, self.tape, self.batch
        tape.check_explained(params, batch)
        if self.unchecked:
            self.check(params)
        norms = batch * tape.sq_norms(batch).clamp_min(0).sqrt()
        expected = call.sample_rate * call.n
        factors = CLIPPING[self.config.clipping](norms, self.config.clip, self.config.gamma)
        summed = tape.weighted_grads(factors * (batch / expected) - 1)
        missing = [tuple(p.shape) for p in params if p not in summed]
        if missing:
            raise UnsupportedLayerError(f"dp: the layer rules gave no per-sample gradient for parameters of shapes "
                                        f"{missing}; they would be updated without clipping or noise.")
        std = call.sigma * self.config.clip / expected
        for p in params:
            noise = torch.randn(p.shape, generator=self.noise, dtype=p.dtype).to(p.device)
            p.grad.add_(summed[p]).add_(noise, alpha=std)
        call.steps_taken += 1
        return norms

    # ---------------------------------------------------------------------------------------------- results
    def close(self) -> None:
        if self.tape is not None:
            self.tape.close()
            self.tape = None
        folder = self._folder()
        mine = [asdict(c) for c in LEDGER.get(self.context.run_id, {}).values() if c.member == self.context.member]
        if folder is not None and mine:
            folder.mkdir(parents=True, exist_ok=True)
            name = self.context.member or "run"
            (folder / f"{name}-{uuid.uuid4().hex[:8]}.json").write_text(json.dumps(mine))

    def calls(self) -> list[TrainingCall]:
        """Every training call of this run: this process's and those written by member jobs elsewhere."""
        calls = dict(LEDGER.get(self.context.run_id, {}))
        folder = self._folder()
        for path in sorted(folder.glob("*.json")) if folder is not None and folder.exists() else ():
            calls.update({c["id"]: TrainingCall(**c) for c in json.loads(path.read_text()) if c["id"] not in calls})
        return list(calls.values())

    def extra_metrics(self) -> dict[str, float]:
        """``epsilon``: the largest ε of the run's training calls (each used disjoint data; a call's ε includes the
        statistics released from its data), or, when the calls share samples, the ε of all of them composed; at the
        run's δ."""
        if self.context.member:
            return {}
        if self.releases:
            raise RuntimeError(f"dp: {len(self.releases)} statistic(s) were released without a training call after "
                               f"them, so the run's epsilon would leave them out.")
        calls = self.calls()
        if not calls:
            raise RuntimeError("dp: no private training call was recorded for this run, so no epsilon can be "
                               "reported.")
        if self.shared_calls:
            spent = [epsilon([m for c in calls for m in c.history()], self.delta)]
        else:
            spent = [epsilon(c.history(), self.delta) for c in calls]
        return {"epsilon": max(spent), "noise_multiplier": max(c.sigma for c in calls), "delta": self.delta}


__all__ = ["CLIPPING", "PrivateTraining", "TrainingCall", "check_private_strategy"]
