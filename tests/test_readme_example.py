"""The documented examples work as written: the strategy of docs/how-to/add-a-strategy.md (the full contract, written
from that page alone) registers and runs through a suite, and README's "Python API" snippet runs."""

import re
from pathlib import Path

from clbench.executors import LocalExecutor
from clbench.suite_file import parse_suite

README = (Path(__file__).parents[1] / "README.md").read_text()
GUIDE = (Path(__file__).parents[1] / "docs" / "how-to" / "add-a-strategy.md").read_text()


def test_readme_strategy_example_registers_and_runs(tmp_path):
    code = re.search(r"```python\n# strategies/my_method.py\n(.*?)```", GUIDE, re.S).group(1)
    exec(compile(code, "strategies/my_method.py", "exec"), {"__name__": "my_method"})
    suite = parse_suite({"suite": "readme", "scenarios": [{"name": "synthetic"}],
                         "strategies": [{"name": "my_method", "preset": "cpu", "args": {"hidden": 16},
                                         "callbacks": [{"name": "hook_trace"}]}]})
    (record,) = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert record.status == "finished", record.reason
    assert record.strategy_config == {"hidden": 16, "epochs": 2, "batch_size": 32, "lr": 1e-3, "optimizer": "adam"}
    assert len(record.accuracy_matrix) == 3 and record.accuracy_matrix[0][0] > 0.5  # above chance on its 2 classes
    assert (tmp_path / "artifacts" / record.run_id / "hooks.jsonl").exists()        # its loop fires the callbacks


def test_readme_python_api_snippet_runs(capsys):
    code = re.search(r"```python\nfrom clbench import api\n(.*?)```", README, re.S).group(0)[len("```python\n"):-3]
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    status, avg, last = lines[0].split()
    assert status == "finished" and 0 < float(last) <= float(avg) <= 100
    assert len(eval(lines[1])) == 5 and len(eval(lines[2])) == 5
