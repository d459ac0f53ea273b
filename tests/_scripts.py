"""A benchmark script imported as a module for its tests, with ``benchmarks/`` on the path while it is in use (the
scripts import each other)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def benchmark_script(name: str):
    """Yield ``benchmarks/<name>.py`` loaded as module ``name`` (a pytest fixture body), registered in
    ``sys.modules`` while it is in use (a dataclass defined in a script looks its module up there)."""
    sys.path.insert(0, str(BENCHMARKS))
    before = sys.modules.get(name)
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))
        if before is None:
            del sys.modules[name]
        else:
            sys.modules[name] = before
