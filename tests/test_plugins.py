"""Plugin loading fails well: a module that cannot be imported (a missing optional dependency, a strategy that
breaks the contract) is skipped whole, listed with its reason, and every other command keeps working."""

import pytest

from clbench.cli import main
from clbench.registry import MODELS, STRATEGIES, UNAVAILABLE, UnknownNameError, import_plugin

MISSING_DEPENDENCY = '''
from clbench.registry import MODELS, STRATEGIES
from tests._fakes import IncreasingLogits


@MODELS.register("test_half_model")
def half_model():
    """Registered before the failing import."""


@STRATEGIES.register("test_half_strategy")
class Half(IncreasingLogits):
    """Registered before the failing import."""


import opacus_is_not_installed_here  # noqa: E402,F401
'''

BROKEN_CONTRACT = '''
from dataclasses import dataclass

from clbench.protocol import StrategyBase
from clbench.registry import STRATEGIES


@dataclass
class C:
    lr: float = 0.1


@STRATEGIES.register("test_no_predict")
class NoPredict(StrategyBase):
    Config = C

    def train(self, experience):
        pass

    def num_parameters(self):
        return None
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        return name

    yield write
    for name in [m for m in UNAVAILABLE if m.startswith("test_plugin_")]:
        del UNAVAILABLE[name]


def test_module_with_a_missing_dependency_is_skipped_whole_and_listed(plugin, capsys):
    name = plugin("test_plugin_missing", MISSING_DEPENDENCY)
    assert import_plugin(name) is False
    assert "test_half_strategy" not in STRATEGIES and "test_half_model" not in MODELS     # nothing half-loaded
    assert UNAVAILABLE[name] == "ModuleNotFoundError: No module named 'opacus_is_not_installed_here'"
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert f"{name}" in listed and "UNAVAILABLE: ModuleNotFoundError: No module named 'opacus_is_not_in" in listed
    assert "naive" in listed and "split_digits" in listed                                  # the rest still there
    with pytest.raises(UnknownNameError, match=f"Unavailable plugin modules: .*{name} \\(ModuleNotFoundError"):
        STRATEGIES.get("test_half_strategy")
    assert main(["config", "replay", "--preset", "cpu"]) == 0                             # other commands work


def test_strategy_that_breaks_the_contract_makes_its_module_unavailable(plugin):
    name = plugin("test_plugin_contract", BROKEN_CONTRACT)
    assert import_plugin(name) is False
    assert "test_no_predict" not in STRATEGIES
    assert UNAVAILABLE[name].startswith("StrategyContractError: strategy 'test_no_predict' (test_plugin_contract."
                                        "NoPredict) does not implement predict")
