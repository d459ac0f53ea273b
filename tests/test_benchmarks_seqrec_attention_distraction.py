"""benchmarks/seqrec_attention_distraction.py reads attention rows off a seqrec model by recomputing them from each
block's q/k layers: checked against the attention module's own output (``proj(Σ_j α_ij v_j)`` at the last position)
and the frequency-bucket bookkeeping against a hand count."""

from __future__ import annotations

import pytest
import torch

from clbench.models.seqrec import SeqRec
from tests._scripts import benchmark_script


@pytest.fixture(scope="module")
def script():
    yield from benchmark_script("seqrec_attention_distraction")


def test_recomputed_rows_reproduce_the_attention_modules_output(script):
    torch.manual_seed(0)
    model = SeqRec(n_items=12, max_len=6, dim=8, depth=2, heads=2).eval()
    x = torch.tensor([[0, 0, 3, 5, 7, 2], [1, 4, 4, 9, 11, 12], [0, 0, 0, 0, 0, 6]])
    outputs = []
    hooks = [b.attn.register_forward_hook(lambda _m, _a, out: outputs.append(out[0][:, -1])) for b in model.blocks]
    rows = script.attention_rows(model, x)
    inputs = []
    for h in hooks:
        h.remove()
    hooks = [b.attn.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])) for b in model.blocks]
    with torch.no_grad():
        model.hidden(x)
    for h in hooks:
        h.remove()
    for block, alpha, a, out in zip(model.blocks, rows, inputs, outputs):
        v = block.attn._split(block.attn.v(a))                                   # (B, H, L, d_h)
        mixed = (alpha[:, :, None, :] @ v).squeeze(2).reshape(len(x), -1)        # Σ_j α_j v_j, heads concatenated
        assert torch.allclose(block.attn.proj(mixed), out, atol=1e-6)
        assert torch.allclose(alpha.sum(-1), torch.ones_like(alpha.sum(-1)))
    assert torch.all(rows[0][2, :, :5] == 0)                                       # padding keys get nothing


def test_bucket_masses_and_key_shares_by_hand(script, monkeypatch):
    x = torch.tensor([[0, 1, 2], [3, 3, 1]])
    counts = torch.tensor([0.0, 3.0, 50.0, 200.0])                                 # items 1, 2, 3
    alpha = torch.tensor([[0.0, 0.25, 0.75], [0.5, 0.25, 0.25]])[:, None, :]      # one head
    monkeypatch.setattr(script, "attention_rows", lambda model, items: [alpha])
    (row,) = script.profile(None, x, counts)
    # row 0: keys 1 (count 3, bucket 1-5) and 2 (count 50, bucket 21-100); row 1: 3, 3 (>100) and 1 (1-5)
    assert row["mass_1-5"] == pytest.approx((0.25 + 0.25) / 2)
    assert row["mass_21-100"] == pytest.approx(0.75 / 2)
    assert row["mass_101-1000000000"] == pytest.approx(0.75 / 2)
    assert row["keys_1-5"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert row["entropy"] == pytest.approx(float(-(alpha * alpha.clamp_min(1e-30).log()).sum(-1).mean()))


def test_runs_mode_rebuilds_the_suites_model_from_its_record_and_snapshot(script, tmp_path):
    from clbench.executors import LocalExecutor
    from clbench.suite_file import parse_suite
    from tests.test_strategies_seqrec import cycles

    entry = {"name": "seqrec", "args": {"dim": 16, "epochs": 3, "batch_size": 16, "heads": 2},
             "callbacks": ["model_snapshot"]}
    suite = parse_suite({"suite": "s", "seeds": [0], "scenarios": [{"name": "test_seqrec_cycles"}],
                         "strategies": [entry]})
    (record,) = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert record.status == "finished", record.reason
    folder = tmp_path / "artifacts" / record.run_id
    scenario = cycles()
    ((label, model, _),) = script.recorded([str(folder)], scenario, ("test_seqrec_cycles", {}))
    assert label == record.run_id
    saved = torch.load(folder / "model.pt", weights_only=True)["model"]
    assert model.state_dict().keys() == saved.keys()
    assert all(torch.equal(value, saved[key]) for key, value in model.state_dict().items())
    fresh = script.SequentialRecommender(scenario.info, torch.device("cpu"), suite.run_specs("cpu")[0].config())
    assert not all(torch.equal(value, saved[key]) for key, value in fresh.model.state_dict().items())
    with pytest.raises(SystemExit, match="this script reads games_seqrec"):
        list(script.recorded([str(folder)], scenario))


@pytest.mark.parametrize("argv", [[], ["a,epochs=1", "--runs", "x"], ["a,no_such_field=1"]])
def test_arguments_are_refused_before_the_data_loads(script, monkeypatch, argv):
    """Neither specs nor --runs, both, or a spec naming no config field: refused before Amazon Games is read."""
    monkeypatch.setattr(script, "games_seqrec", lambda **_: pytest.fail("the data loaded"))
    with pytest.raises(SystemExit):
        script.main(argv)
