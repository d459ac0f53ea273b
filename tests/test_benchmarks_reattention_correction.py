"""benchmarks/reattention_correction.py --runs reads a suite's own private Re-Attention models: the prior's sigma from
the record's extra metrics, the model from its snapshot; the total variation by which the correction moves each
query row's attention, checked against the module's own scores recomputed with and without the correction."""

from __future__ import annotations

import pytest
import torch

from tests._scripts import benchmark_script


@pytest.fixture(scope="module")
def script():
    yield from benchmark_script("reattention_correction")


def private_run(tmp_path, attention: str):
    from clbench.executors import LocalExecutor
    from clbench.suite_file import parse_suite

    entry = {"name": "seqrec", "args": {"dim": 16, "epochs": 2, "batch_size": 16, "heads": 2, "attention": attention},
             "callbacks": ["model_snapshot"], "dp": {"epsilon": 8.0, "clip": 1.0}}
    suite = parse_suite({"suite": "s", "seeds": [0], "scenarios": [{"name": "test_seqrec_cycles"}],
                         "strategies": [entry]})
    (record,) = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path / attention)
    assert record.status == "finished", record.reason
    return tmp_path / attention / "artifacts" / record.run_id, record


def test_runs_read_sigma_from_the_records_extra_metrics_and_give_each_blocks_tv(script, tmp_path, capsys):
    from tests.test_strategies_seqrec import cycles

    folder, record = private_run(tmp_path, "reattention")
    sigma = record.metrics["extra"]["reattention_sigma_dp"]
    assert sigma > 0
    scenario = cycles()
    found = script.runs_tv([str(folder)], scenario, ("test_seqrec_cycles", {}), users=10)
    tvs = found[record.run_id]
    assert len(tvs) == 2                                                        # one per block (depth 2)
    x = scenario.test_stream[0].dataset.x[:10]
    assert all(len(tv) == int((x != 0).sum()) * 2 for tv in tvs)               # every non-padding query, 2 heads
    assert all(float(tv.min()) >= 0 and float(tv.max()) <= 1 for tv in tvs)
    assert any(float(tv.max()) > 0 for tv in tvs)                              # the correction moves some row
    assert f"sigma_dp {sigma:.4g}" in capsys.readouterr().out


def test_tv_is_half_the_l1_distance_between_the_corrected_and_plain_softmax(script):
    """Recomputed by hand for one block: scores q·k/√d over the causal, non-padding keys, the correction subtracted."""
    from clbench.models.seqrec import SeqRec
    from clbench.privacy.reattention import ErrorPrior

    torch.manual_seed(0)
    model = SeqRec(n_items=12, max_len=6, dim=8, depth=1, heads=2, attention="reattention").eval()
    model.set_error_prior(ErrorPrior(2.0, 4.0, torch.rand(13)))
    x = torch.tensor([[0, 0, 3, 5, 7, 2], [1, 4, 4, 9, 11, 12]])
    (tv,) = script.correction_tv(model, x)
    inputs = []
    hook = model.blocks[0].attn.register_forward_pre_hook(lambda _m, args: inputs.append(args))
    with torch.no_grad():
        model.hidden(x)
    hook.remove()
    a, pad, a_var, param_var = inputs[0][:4]
    attn = model.blocks[0].attn
    expected = []
    with torch.no_grad():
        q = attn._split(attn.q(a)) / attn.head_dim ** 0.5
        k = attn._split(attn.k(a))
        correction = torch.broadcast_to(attn.correction(q, a, a_var, param_var), (2, 2, 6, 6))
        for b in range(2):
            for i in range(6):
                if x[b, i] == 0:
                    continue
                for h in range(2):
                    keys = [j for j in range(i + 1) if x[b, j] != 0]
                    s = torch.stack([q[b, h, i] @ k[b, h, j] for j in keys])
                    c = correction[b, h, i, keys]
                    expected.append(0.5 * float((s.softmax(0) - (s - c).softmax(0)).abs().sum()))
    assert sorted(tv.tolist()) == pytest.approx(sorted(expected), abs=1e-6)
    assert max(expected) > 0


def test_a_vanilla_run_is_refused(script, tmp_path):
    from tests.test_strategies_seqrec import cycles

    folder, _ = private_run(tmp_path, "vanilla")
    with pytest.raises(SystemExit, match="not a private Re-Attention run"):
        script.runs_tv([str(folder)], cycles(), ("test_seqrec_cycles", {}), users=10)
