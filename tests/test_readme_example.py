"""The README's "Adding a strategy" example works as written: one file, one decorator, one suite entry."""

import re
from pathlib import Path

from clbench.config import parse_suite
from clbench.executors import LocalExecutor


def test_readme_strategy_example_registers_and_runs(tmp_path):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"```python\n# clbench/strategies/my_method.py\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "clbench/strategies/my_method.py", "exec"), {"__name__": "my_method"})
    suite = parse_suite({"suite": "readme", "scenarios": [{"name": "synthetic"}],
                         "strategies": [{"name": "my_method", "preset": "cpu", "args": {"mem_size": 20}}]})
    (record,) = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert record.status == "finished", record.reason
    assert record.strategy_config["mem_size"] == 20 and len(record.accuracy_matrix) == 3
