"""An installed plugin package, as pip writes one, for the tests and benchmarks that need a real entry point."""

from __future__ import annotations

from pathlib import Path

STRATEGY_MODULE = """
from dataclasses import dataclass

from clbench.protocol import StrategyBase
from clbench.registry import STRATEGIES


@dataclass
class PlainConfig:
    lr: float = 0.1


@STRATEGIES.register("test_cached_plain")
class Plain(StrategyBase):
    \"\"\"Not private (StrategyBase's default).\"\"\"

    Config = PlainConfig

    def train(self, experience):
        pass

    def predict(self, x, task_labels):
        pass

    def num_parameters(self):
        pass


@STRATEGIES.register("test_cached_private")
class Private(Plain):
    \"\"\"Private.\"\"\"

    private = True
"""
"""A plugin module registering two valid strategies: ``test_cached_plain`` (not private: StrategyBase's default) and
``test_cached_private`` (``private = True``)."""


def installed_package(site: Path, distribution: str, module: str, code: str) -> Path:
    """``site`` holding distribution ``distribution 0.1`` as pip installs it (a dist-info folder) whose
    ``clbench.plugins`` entry point names ``module``, written with ``code``; on ``sys.path`` (or ``PYTHONPATH``) it
    is discovered as an installed plugin package."""
    info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[clbench.plugins]\nmethods = {module}\n")
    (site / f"{module}.py").write_text(code)
    return site
