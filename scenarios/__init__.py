"""Benchmark scenarios: one module per family, each registering its names in ``clbench.registry.SCENARIOS``."""
