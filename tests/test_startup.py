"""What a process imports before it trains, checked without timing it (the times and memory are measured by
``benchmarks/startup.py``): a strategy that uses no Avalanche template does not import ``avalanche.training``
(seconds and over a GB), the callbacks bridge into templates only when one asks for it, and a run of the sequence
model on MovieLens imports no Avalanche at all, nor timm. (A classification scenario builds an Avalanche benchmark, and
``avalanche.benchmarks`` imports ``avalanche.training`` itself.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
REPORT = "print(sorted({m.split('.')[0] + ('.training' if m.startswith('avalanche.training') else '') " \
         "for m in sys.modules if m.startswith(('avalanche', 'torch', 'timm'))}))"


def _imported(code: str) -> list[str]:
    """The top-level packages (``avalanche.training`` apart) that ``code`` leaves imported in a fresh process."""
    done = subprocess.run([sys.executable, "-c", f"import sys\n{code}\n{REPORT}"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.splitlines()[-1])  # noqa: S307 - our own print of a list of strings


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


def test_parsing_a_suite_imports_no_continuum_nor_avalanche_for_its_scenarios():
    """Loading every shipped suite imports no continuum (1.7 s), and suites whose strategies use no Avalanche
    template import no Avalanche at all (8.5 s; issue 53): the scenarios' split and benchmark code imports them when
    data are split, not when a suite file is parsed. (The template strategies' modules still import Avalanche.)"""
    assert "continuum" not in _left_by_loading("sorted(shipped_suites())")
    assert _left_by_loading("('dp_seqrec', 'tangent_one_task', 'unlearning', 'dp_seqrec_games')") == {"torch"}
