"""The package is layered: no import cycle between clbench modules and no import from a higher layer (:data:`LAYERS`),
counting every import statement — at module level, inside functions (a late binding is still an arrow a reader must
follow) and under ``if TYPE_CHECKING:`` (a typing-only arrow too: the module's types depend on the other's); and
the Layout of docs/explanation/architecture.md names every module.

What a process imports before it trains, checked without timing it (the times and memory are measured by
``benchmarks/startup.py``): a strategy that uses no Avalanche template does not import ``avalanche.training``
(seconds and over a GB), the callbacks bridge into templates only when one asks for it, and a run of the sequence
model on MovieLens imports no Avalanche at all, nor timm. (A classification scenario builds an Avalanche benchmark, and
``avalanche.benchmarks`` imports ``avalanche.training`` itself.)"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
# folder -> the package name it installs as (setup.py's package-dir mapping)
FOLDERS = {REPO / "clbench": "clbench", REPO / "strategies": "clbench.strategies",
           REPO / "scenarios": "clbench.scenarios"}


def _module_name(path: Path) -> str:
    folder = next(f for f in FOLDERS if f in path.parents)
    parts = (FOLDERS[folder], *path.relative_to(folder).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, package: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` (a module of ``package``) imports anywhere: at module level, in
    functions, under ``if TYPE_CHECKING:``; ``from pkg import sub`` depends on ``pkg.sub`` when that is a module, on
    ``pkg`` otherwise."""
    deps = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            deps |= subs or {base}
    return deps & modules


def import_graph() -> dict[str, set[str]]:
    """``{module: clbench modules it imports anywhere in its source}``."""
    modules = {_module_name(p): p for folder in FOLDERS for p in folder.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imports_of(path.read_text(), package, set(modules)) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if not state.get(dep) and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if not state.get(node) and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_clbench_modules():
    graph = import_graph()
    assert len(graph) > 40 and "clbench.callbacks" in graph["clbench.training"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {**import_graph(), "clbench.registry": {"clbench.runner"}}      # runner imports registry already
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and "clbench.registry" in cycle


def test_imports_inside_functions_and_type_checking_blocks_are_arrows():
    """A late binding in a function and a typing-only import count like a module-level one (a circle through them
    is still a circle)."""
    source = """
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from clbench.metrics import MetricSpec
def f():
    from clbench.models import vit
    import clbench.runner
"""
    known = {"clbench.metrics", "clbench.models", "clbench.models.vit", "clbench.runner", "clbench.registry"}
    assert imports_of(source, "clbench", known) == {"clbench.metrics", "clbench.models.vit", "clbench.runner"}


LAYERS = (
    ("core", ("clbench", "clbench.errors", "clbench.typecheck", "clbench.names", "clbench.files", "clbench.metrics",
              "clbench.plugins", "clbench.registry", "clbench.config", "clbench.protocol", "clbench.callbacks",
              "clbench.evaluation", "clbench.streams", "clbench.specs", "clbench.fingerprint", "clbench.training",
              "clbench.pretraining", "clbench.environment", "clbench.records", "clbench.progress",
              "clbench.artifacts", "clbench.loggers", "clbench.workers", "clbench.tasks", "clbench.leaderboard",
              "clbench.report", "clbench.suite_report", "clbench.precision", "clbench.optional", "clbench.adequacy",
              "clbench.recorded", "clbench.snapshots", "clbench.escaping", "clbench.replaced", "clbench.augment",
              "clbench.estimates", "clbench.class_literal")),
    ("privacy", ("clbench.privacy",)),
    ("parts", ("clbench.cl", "clbench.models", "clbench.data")),
    ("methods", ("clbench.petl", "clbench.tangent", "clbench.analysis")),
    ("plugins", ("clbench.strategies", "clbench.scenarios")),
    ("runs", ("clbench.runner", "clbench.executors", "clbench.api", "clbench.suite_file", "clbench.html_report",
              "clbench.preflight")),
    ("command line", ("clbench.cli", "clbench.__main__", "clbench.commands", "clbench.docsite")),
)
"""The layers, lowest first: a module is in the layer of the longest name here that is itself or a package above
it. A module imports only from its own layer and the ones below (the privacy rules sit under the models, which
register their layers' rules; suite loading sits with the runs, as it checks private-training settings; the tables
and plots read records only, report.html also paired differences)."""


def layer_of(module: str) -> int:
    matches = [(len(name), index) for index, (_, names) in enumerate(LAYERS) for name in names
               if module == name or module.startswith(name + ".") and name != "clbench"]   # the package: itself only
    assert matches, f"{module} is in no layer of tests/test_imports.py's LAYERS: add it where it belongs"
    return max(matches)[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} ({LAYERS[layer_of(module)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
            for module, deps in sorted(graph.items()) for dep in sorted(deps) if layer_of(dep) > layer_of(module)]


def test_no_module_imports_from_a_higher_layer():
    graph = import_graph()
    assert {"clbench.plugins", "clbench.commands.run", "clbench.cl.template"} <= set(graph)
    assert upward_imports(graph) == []


def test_a_module_in_no_layer_is_named():
    with pytest.raises(AssertionError, match="clbench.brand_new is in no layer"):
        layer_of("clbench.brand_new")
    assert LAYERS[layer_of("clbench.privacy.tape")][0] == "privacy" and LAYERS[layer_of("clbench")][0] == "core"


def test_an_upward_import_is_found():
    """A registry that called back into the command line (the kind of arrow the layers forbid) is reported."""
    graph = {**import_graph(), "clbench.registry": {"clbench.commands.lists"}}
    assert upward_imports(graph) == ["clbench.registry (core) imports clbench.commands.lists (command line)"]


def layout_paths(readme: str) -> set[str]:
    """The module paths (``cl/template.py``) and packages (``cl/``) that a Layout block names."""
    block = readme.split("## Layout\n", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return set(re.findall(r"(?<![\w/.*])(?:[a-z_]+/)*[a-z_]+\.py\b", block)) | \
        set(re.findall(r"^([a-z_]+/) ", block, flags=re.MULTILINE))


def test_readme_layout_names_every_module_and_only_modules_that_exist():
    folder = REPO / "clbench"
    modules = {str(p.relative_to(folder)) for p in folder.rglob("*.py")
               if p.name != "__init__.py" or p.parent == folder}
    packages = {f"{p.parent.relative_to(folder)}/" for p in folder.rglob("__init__.py") if p.parent != folder}
    listed = layout_paths((REPO / "docs" / "explanation" / "architecture.md").read_text())
    assert sorted((modules | packages) - listed) == [], "modules missing from docs/explanation/architecture.md"
    assert sorted(listed - modules - packages) == [], "docs/explanation/architecture.md names modules that do not exist"


def test_the_layout_reader_sees_paths_and_packages():
    text = "## Layout\n```text\ncli.py api.py   x\ncl/    cl/memory.py, a.b.py `run_bench.py`\n  c/d.py\n```\n"
    assert layout_paths(text) == {"cli.py", "api.py", "cl/", "cl/memory.py", "c/d.py", "run_bench.py"}


ROOT = Path(__file__).parents[1]


REPORT = "print(sorted({m.split('.')[0] + ('.training' if m.startswith('avalanche.training') else '') " \
         "for m in sys.modules if m.startswith(('avalanche', 'torch', 'timm'))}))"


def _imported(code: str) -> list[str]:
    """The top-level packages (``avalanche.training`` apart) that ``code`` leaves imported in a fresh process."""
    done = subprocess.run([sys.executable, "-c", f"import sys\n{code}\n{REPORT}"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.splitlines()[-1])  # noqa: S307 - our own print of a list of strings


def _left_by_loading(suites: str) -> set[str]:
    """The top-level packages among avalanche, continuum and torch that loading ``suites`` (Python text of an
    iterable of suite names) leaves imported in a fresh process."""
    code = (f"import sys\nfrom clbench.suite_file import load_suite, shipped_suites\n"
            f"for name in {suites}: load_suite(name)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            f"('avalanche', 'continuum', 'torch')}}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return set(eval(done.stdout.splitlines()[-1]))  # noqa: S307 - our own print of a list of strings


def test_strategies_without_a_template_import_no_avalanche_training():
    """The runner with TAFT's or the sequence model's strategy: torch, no ``avalanche.training``; naive (a template)
    does import it, so the check can tell."""
    for name in ("taft", "seqrec", "nlft"):
        imported = _imported(f"import clbench.runner\nfrom clbench.registry import STRATEGIES\n"
                             f"STRATEGIES.get({name!r})")
        assert "torch" in imported and "avalanche.training" not in imported, name
    assert "avalanche.training" in _imported("from clbench.registry import STRATEGIES\nSTRATEGIES.get('naive')")


def test_the_callbacks_bridge_imports_avalanche_when_asked_for():
    """``clbench.callbacks`` alone imports no Avalanche; its ``CallbackPlugin`` is an Avalanche plugin, made once."""
    assert "avalanche.training" not in _imported("import clbench.callbacks")
    code = ("from clbench.callbacks import CallbackPlugin, CallbackBridge\nimport clbench.callbacks as c\n"
            "from avalanche.training.plugins import SupervisedPlugin\n"
            "assert issubclass(CallbackPlugin, (CallbackBridge, SupervisedPlugin)) and c.CallbackPlugin is "
            "CallbackPlugin")
    assert "avalanche.training" in _imported(code)


def test_a_sequence_model_run_imports_no_avalanche():
    """Building the MovieLens scenario's module and the sequence model, as a one-run suite does, imports neither
    Avalanche nor timm (whose per-sample norm rules clbench.models.vit registers)."""
    imported = _imported("import clbench.runner\nfrom clbench.registry import SCENARIOS, STRATEGIES\n"
                         "STRATEGIES.get('seqrec'); SCENARIOS.get('movielens_seqrec')")
    assert not {"avalanche", "avalanche.training", "timm"} & set(imported) and "torch" in imported


def test_parsing_a_suite_imports_no_continuum_nor_avalanche_for_its_scenarios():
    """Loading every shipped suite imports no continuum (1.7 s), and suites whose strategies use no Avalanche
    template import no Avalanche at all (8.5 s; issue 53): the scenarios' split and benchmark code imports them when
    data are split, not when a suite file is parsed. (The template strategies' modules still import Avalanche.)"""
    assert "continuum" not in _left_by_loading("sorted(shipped_suites())")
    assert _left_by_loading("('dp_seqrec', 'tangent_one_task', 'unlearning', 'dp_seqrec_games')") == {"torch"}
