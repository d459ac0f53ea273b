"""clbench: a continual-learning benchmark suite (scenarios, strategies, standardized metrics, leaderboards)."""

__version__ = "0.1.0"
