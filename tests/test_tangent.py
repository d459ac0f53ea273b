"""The tangent package (clbench/tangent/) as a whole: a method library that registers its commands from its own
module and never imports the command line."""

import ast
from pathlib import Path

import clbench.tangent


def test_the_tangent_package_imports_nothing_from_the_command_line():
    """Method libraries register commands from their own module (clbench/commands/), never import clbench.cli."""
    for path in Path(clbench.tangent.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "clbench.cli" or n.startswith("clbench.cli.") for n in names), path.name
