"""clbench: a continual-learning benchmark suite (scenarios, strategies, standardized metrics, leaderboards)."""

import os

# OpenMP threads that spin while waiting starve each other on a loaded CPU: on a 2-core machine running three jobs,
# a 2-thread MLP training step ran 16x slower with the default policy than with PASSIVE (measured, see README).
# Takes effect only when set before torch first loads OpenMP; an explicit user setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from clbench import optional  # noqa: E402 - after the environment setting above

optional.install()      # a missing or broken wandb/tensorboard breaks only their callbacks (clbench.optional)

__version__ = "0.1.0"
