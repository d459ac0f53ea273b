"""clbench.privacy.config: the dp budget's rules, declared on DPConfig's fields and read without torch, so that the
suite loader refuses a bad or impossible budget before the heavy imports (it came after 9-13 s of imports, and an
impossible ε only when each run calibrated its noise)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clbench import typecheck
from clbench.privacy.config import CLIPPING_MODES, DECLARED, DPConfig, PrivacyBudgetError, check_reachable
from clbench.privacy.rdp import smallest_epsilon

ROOT = Path(__file__).resolve().parents[1]

CHILD = """import json, sys
from clbench import suite_file
from clbench.errors import ConfigError
out = []
for scenario, dp in json.loads(sys.argv[1]):
    try:
        suite_file.parse_suite({"suite": "s", "scenarios": [scenario], "strategies": [{"name": "naive", "dp": dp}]},
                               "s.yaml")
        out.append(None)
    except ConfigError as exc:
        out.append(str(exc))
    if out[-1] is None:
        break
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'avalanche', 'continuum', 'numpy', 'opacus'))
print(json.dumps([out, heavy]))
"""


def test_bad_and_impossible_budgets_are_refused_before_the_heavy_imports():
    """ε out of range, δ outside (0, 1), R ≤ 0, unknown clipping, ε and σ both or neither, and an ε under the floor
    no noise gets below at the stream's δ = 1/n (split_digits: 1,257 training samples, recorded in the index) are
    refused in one line by the torch-free phase of the suite loader: no torch, numpy or opacus imported."""
    digits = {"name": "split_digits"}
    cases = [
        (digits, {"epsilon": 0.0}, "(naive): dp: epsilon must be a finite number > 0, got 0.0."),
        (digits, {"epsilon": 3.0, "delta": 1.0}, "dp: delta must lie in (0, 1) (default 1/n), got 1.0."),
        (digits, {"epsilon": 3.0, "clip": -1}, "dp: clip (the clipping norm R) must be > 0, got -1.0."),
        (digits, {"epsilon": 3.0, "clipping": "adaptive"}, "dp: clipping must be one of ['automatic', 'flat']"),
        (digits, {"epsilon": 3.0, "clipp": 1.0}, "unknown key 'clipp'"),
        (digits, {"epsilon": 3.0, "noise_multiplier": 1.0}, "give exactly one of epsilon"),
        (digits, {"clip": 2.0}, "give exactly one of epsilon"),
        (digits, {"epsilon": 0.02}, "dp: no noise multiplier reaches epsilon=0.02 at delta=1/n=0.000796 (1,257 "
                                    "training samples in scenarios[0] (split_digits)): the RDP accountant's epsilon "
                                    "there is above 0.03228"),
        (digits, {"epsilon": 0.3, "delta": 1e-12}, "no noise multiplier reaches epsilon=0.3 at delta=1e-12"),
    ]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([[s, dp] for s, dp, _ in cases])], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    messages, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    for (_, _, expected), message in zip(cases, messages, strict=True):
        assert message is not None and expected in message and "\n" not in message, (expected, message)
    assert heavy == [], heavy


def test_a_reachable_budget_passes_and_the_floor_is_the_refusal_line():
    check_reachable(DPConfig(epsilon=smallest_epsilon(1e-5) + 1e-6, delta=1e-5), None)
    with pytest.raises(PrivacyBudgetError, match="set epsilon above 0.1029, or raise delta"):
        check_reachable(DPConfig(epsilon=smallest_epsilon(1e-5), delta=1e-5), None)
    with pytest.raises(PrivacyBudgetError, match=r"delta=1/n=0\.001 \(1,000 training samples in the stream\)"):
        check_reachable(DPConfig(epsilon=0.01), 1000)
    check_reachable(DPConfig(epsilon=0.01), None)          # δ = 1/n with n unknown: the run's calibration decides
    check_reachable(DPConfig(noise_multiplier=0.01, delta=1e-5), None)     # no target ε: nothing to reach


def test_the_config_and_the_formulas_import_no_torch():
    code = ("import sys, clbench.privacy.config, clbench.privacy.rdp; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_dp_callback_takes_the_config_fields_with_their_declarations_and_defaults():
    """The callback's keyword parameters (what the index records and the loader checks) are DPConfig's fields, in
    order, with the same defaults and declarations, and its clipping factors are the declared modes."""
    from clbench.privacy.step import CLIPPING, PrivateTraining

    params = list(inspect.signature(PrivateTraining).parameters.values())
    fields = dataclasses.fields(DPConfig)
    assert [(p.name, p.default) for p in params] == [(f.name, f.default) for f in fields]
    assert typecheck.parameter_declarations(PrivateTraining) == DECLARED
    assert sorted(CLIPPING) == sorted(CLIPPING_MODES)
