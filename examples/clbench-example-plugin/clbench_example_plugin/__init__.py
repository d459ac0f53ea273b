"""An example clbench plugin package: :mod:`.strategy` registers ``nearest_mean``, :mod:`.scenario` registers
``rings``; ``pyproject.toml`` declares both modules under the entry-point group ``clbench.plugins``."""
