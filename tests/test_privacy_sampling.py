"""Poisson sampling of minibatches (:mod:`clbench.privacy.sampling`): the plan's rate and steps per epoch, the draws
of each step, and the batch sizes they average."""

from __future__ import annotations

import pytest
import torch

from clbench.privacy.sampling import PoissonPlan
from tests._dp_ledger import _ledger, exact  # noqa: F401 - _ledger: an autouse fixture


# ------------------------------------------------------------------------------------------------ Poisson sampling
@pytest.mark.parametrize("n, batch_size, rate, steps", [(10, 4, 0.4, 3), (12, 4, 1 / 3, 3), (5, 8, 1.0, 1),
                                                         (1, 1, 1.0, 1)])
def test_poisson_plan_rate_and_steps_per_epoch(n, batch_size, rate, steps):
    """q = min(1, b/n) and ⌈n/b⌉ steps per epoch (computed by hand); catches a rate above 1 or a floored count."""
    plan = PoissonPlan.for_batch_size(n, batch_size)
    assert (plan.n, plan.sample_rate, plan.steps_per_epoch) == (n, pytest.approx(rate, rel=1e-15), steps)


@pytest.mark.parametrize("n, batch_size", [(0, 4), (4, 0), (-1, -1)])
def test_poisson_plan_refuses_empty_data_or_batches(n, batch_size):
    """n < 1 or b < 1: the exact line with both values; catches a weakened check."""
    with pytest.raises(ValueError, match=exact(f"Poisson sampling needs n >= 1 and batch_size >= 1, got n={n}, "
                                                f"batch_size={batch_size}")):
        PoissonPlan.for_batch_size(n, batch_size)


def test_poisson_draws_take_each_sample_whose_uniform_is_below_the_rate():
    """One uniform per sample per step from the loop's generator, the sample taken when it is below q (the
    Bernoulli(q) draw the accountant assumes): the batches are reproducible from the seed; catches another
    stream, a step too many or too few, or indices of the samples left out."""
    plan = PoissonPlan(n=8, sample_rate=0.4, steps_per_epoch=5)
    uniforms = torch.rand(5, 8, generator=torch.Generator().manual_seed(4))
    expected = [[i for i in range(8) if u[i] < 0.4] for u in uniforms]
    assert all(expected)                                 # no empty step for this seed
    assert [b.tolist() for b in plan(torch.Generator().manual_seed(4))] == expected


def test_a_sample_whose_uniform_equals_the_rate_is_left_out():
    """Strict ``u < q``: with q set to exactly the float32 uniform drawn for sample 3 (uniforms lie on the grid
    k·2⁻²⁴, so a tie has probability 2⁻²⁴ per draw, not 0), sample 3 is not taken, so P(taken) = q exactly for a q
    on the grid; catches ``<=`` (which takes it, P = q + 2⁻²⁴)."""
    uniforms = torch.rand(6, generator=torch.Generator().manual_seed(2))
    rate = float(uniforms[3])
    expected = [i for i in range(6) if uniforms[i] < uniforms[3]]
    assert 3 not in expected and len(expected) not in (0, 5)     # a tie that decides, not an all-or-nothing draw
    (batch,) = PoissonPlan(6, rate, 1)(torch.Generator().manual_seed(2))
    assert batch.tolist() == expected


def test_poisson_draws_skip_empty_steps_and_take_everything_at_rate_one():
    """q = 0 gives no batch at all (empty draws are skipped, not yielded); q = 1 gives every sample each step."""
    assert list(PoissonPlan(4, 0.0, 3)(torch.Generator().manual_seed(0))) == []
    assert [b.tolist() for b in PoissonPlan(4, 1.0, 3)(torch.Generator().manual_seed(0))] == [[0, 1, 2, 3]] * 3


def test_poisson_batch_sizes_average_the_expected_batch():
    """Sizes vary (Binomial) and average b: over 200 steps of n = 1000, q = 0.05, the mean is 50 ± 1.5 (4 standard
    errors of sqrt(1000·0.05·0.95/200) = 0.35)."""
    plan = PoissonPlan.for_batch_size(1000, 50)
    generator = torch.Generator().manual_seed(0)
    sizes = [len(b) for _ in range(10) for b in plan(generator)]
    assert len(sizes) == 200 and len(set(sizes)) > 5 and abs(sum(sizes) / 200 - 50) < 1.5
