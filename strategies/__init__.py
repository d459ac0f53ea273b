"""Continual-learning strategies: one module per family, each registering its names in
``clbench.registry.STRATEGIES``."""
