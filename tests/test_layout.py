"""The tests mirror the code (tests/README.md): every ``tests/test_<name>.py`` is named after what it tests, a
module (``clbench/<module>.py`` -> ``test_<module>.py``, ``clbench/<package>/<module>.py`` ->
``test_<package>_<module>.py``, ``strategies/<module>.py`` -> ``test_strategies_<module>.py``, the same for
``scenarios/`` and ``benchmarks/``), a package as a whole (``test_<package>.py``), a helper of tests/ itself, or one
of the few files of :data:`NOT_A_MODULE`, each with its reason. A file named after a round of work or a theme fails
here with the names it could take."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NOT_A_MODULE = {
    "test_conformance.py": "the registries' contract: every strategy, scenario, model and callback by name",
    "test_imports.py": "the imports of the whole package, not one module: its layers, and what a process imports "
                       "before it trains",
    "test_docs_site.py": "the documentation site built from docs/ and mkdocs.yml",
    "test_readme_example.py": "the examples of README.md and the how-to guides, run as written",
    "test_example_plugin.py": "examples/clbench-example-plugin, installed and run as a user does",
    "test_layout.py": "this file: the layout of tests/ itself",
}


def module_names() -> set[str]:
    """What a test file may be named after: ``<package>_<module>`` of every module of clbench (without the
    ``clbench`` prefix), strategies/, scenarios/ and benchmarks/, every package, and tests/'s own helper modules."""
    names = set()
    for path in (ROOT / "clbench").rglob("*.py"):
        parts = path.relative_to(ROOT / "clbench").with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.add("_".join(parts))
    for folder in ("strategies", "scenarios", "benchmarks"):
        names.add(folder)
        names |= {f"{folder}_{p.stem}" for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"}
    names |= {p.stem for p in (ROOT / "clbench").iterdir() if p.is_dir() and not p.name.startswith("__")}
    names |= {p.stem for p in (ROOT / "tests").glob("*.py") if not p.stem.startswith(("test_", "_", "conftest"))}
    return names


def test_every_test_file_is_named_after_a_module_a_package_or_a_listed_reason():
    names = module_names()
    stray = sorted(p.name for p in (ROOT / "tests").glob("test_*.py")
                   if p.name not in NOT_A_MODULE and p.stem.removeprefix("test_") not in names)
    assert not stray, f"test files named after no module (tests/README.md says how to name them): {stray}"


def test_every_reason_given_is_for_a_file_that_exists():
    assert not [name for name in NOT_A_MODULE if not (ROOT / "tests" / name).exists()]
