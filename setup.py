"""Package layout (pyproject.toml holds everything else): the core library ``clbench/`` plus the shipped method and
benchmark families in the top-level folders ``strategies/`` and ``scenarios/``, installed as ``clbench.strategies`` and
``clbench.scenarios`` (package-dir mapping; there is no top-level ``strategies`` import name)."""

from setuptools import find_namespace_packages, setup

MAPPED = {"clbench.strategies": "strategies", "clbench.scenarios": "scenarios"}

setup(
    packages=find_namespace_packages(include=["clbench", "clbench.*"], exclude=["*.__pycache__"]) + sorted(MAPPED),
    package_dir=MAPPED,
)
