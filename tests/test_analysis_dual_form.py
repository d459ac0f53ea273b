"""The dual form W_T x = W_0 x + Σ_t e_t (x_tᵀ x) (Irie et al., 2022), checked against the trained weights in float64:
plain SGD, momentum (with dampening, nesterov, an lr change and a reset optimizer state), a timm ViT's head, a real
strategy run with the callback from a suite entry; refusals (Adam, weight decay, frozen layer, a changed gradient,
budgets); aggregations summing to totals; bytes on disk within the budget; float16 error within its bound."""

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from clbench.analysis.attribution import attention_over_steps, attribute
from clbench.analysis.dual_form import DualFormError, PatternRecorder, coefficients, reconstruct, values
from clbench.analysis.store import FLOAT16_UNIT, PatternStore, StoreBudgetError, step_dtype
from clbench.api import run as api_run
from clbench.cli import main
from clbench.models.vit import vit
from clbench.protocol import ClassificationInfo

LAYERS = ["0", "2", "4"]


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(inplace=True), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def _train(model, optimizer, recorder, steps=12, batch=5, experiences=1, reset_state_at=None, lr_change_at=None,
           seed=1):
    g = torch.Generator().manual_seed(seed)
    with recorder:
        for step in range(steps):
            if step == lr_change_at:
                for group in optimizer.param_groups:
                    group["lr"] *= 0.5
            if step == reset_state_at:          # what Avalanche does between experiences
                optimizer.state.clear()
            recorder.on_experience_start(step * experiences // steps)
            x = torch.randn(batch, 6, generator=g, dtype=torch.float64)
            y = torch.randint(0, 3, (batch,), generator=g)
            recorder.on_batch_start(x, y)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    return recorder


OPTIMIZERS = {
    "sgd": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "dampening": dict(lr=0.05, momentum=0.8, dampening=0.3),
    "nesterov": dict(lr=0.05, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_dual_form_equals_trained_mlp_in_float64(tmp_path, name):
    model = _mlp()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), **OPTIMIZERS[name])
    rec = _train(model, optimizer, PatternRecorder(model, optimizer, LAYERS, tmp_path, dtype="float64"),
                 experiences=2, reset_state_at=6, lr_change_at=4)
    store = PatternStore(tmp_path / "patterns")
    assert store.full and store.manifest["layers"]["0"]["patterns"] == 12 * 5
    query = torch.randn(7, 6, dtype=torch.float64)
    inputs = {}
    hooks = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: inputs.__setitem__(n, i[0]))
             for n in LAYERS]
    with torch.no_grad():
        model(query)
    for h in hooks:
        h.remove()
    for layer in LAYERS:
        module = model.get_submodule(layer)
        w0, b0 = initial[f"{layer}.weight"], initial[f"{layer}.bias"]
        assert not torch.allclose(module.weight, w0)
        q = inputs[layer].numpy()
        # W_T q = W_0 q + Σ_t e_t (x_tᵀ q), and b_T = b_0 + Σ_t e_t, from the stored patterns
        attention_sum = sum(e_w.T @ (x @ q.T) for x, e_w, _, _ in values(store, store.steps(), layer))
        bias_sum = sum(e_b.sum(0) for _, _, e_b, _ in values(store, store.steps(), layer))
        np.testing.assert_allclose(module.weight.detach().numpy() @ q.T, w0.numpy() @ q.T + attention_sum,
                                   rtol=0, atol=1e-9)
        np.testing.assert_allclose(module.bias.detach().numpy(), b0.numpy() + bias_sum, rtol=0, atol=1e-9)
        w, b = rec.reconstruct(layer)
        np.testing.assert_allclose(w, module.weight.detach().numpy(), rtol=0, atol=1e-9)
        np.testing.assert_allclose(b, module.bias.detach().numpy(), rtol=0, atol=1e-9)


def test_momentum_coefficients_match_a_hand_computation():
    # μ = 0.5, τ = 0.2, lrs 1, 2, 3; fresh buffer at step 0 only:
    # buf0 = g0, buf1 = .5 g0 + .8 g1, buf2 = .25 g0 + .4 g1 + .8 g2; W3 − W0 = −(1 buf0 + 2 buf1 + 3 buf2)
    steps = np.zeros(3, step_dtype(1))
    steps["lr"][:, 0], steps["momentum"][:, 0], steps["dampening"][:, 0] = [1, 2, 3], 0.5, 0.2
    steps["active"][:, 0], steps["fresh"][:, 0] = True, [True, False, False]
    np.testing.assert_allclose(coefficients(steps, 0), [-(1 + 1 + 0.75), -(1.6 + 1.2), -2.4])
    np.testing.assert_allclose(coefficients(steps, 0, upto=2), [-(1 + 1), -1.6])
    steps["nesterov"][:, 0] = True      # update_s = lr_s (g_s + μ buf_s)
    np.testing.assert_allclose(coefficients(steps, 0), [-(1 + 0.5 * (1 + 1 + 0.75)), -(2 + 0.5 * 2.8), -(3 + 1.2)])
    steps["active"][1, 0] = False       # no gradient at step 1: no update, the buffer carries over untouched
    steps["nesterov"][:, 0] = False
    np.testing.assert_allclose(coefficients(steps, 0), [-(1 + 1.5), 0, -2.4])


def test_dual_form_on_the_head_of_a_timm_vit(tmp_path):
    info = ClassificationInfo(name="t", n_classes=3, classes_per_experience=(3,), input_shape=(3, 8, 8))
    torch.manual_seed(0)
    model = vit(info, embed_dim=16, depth=1, num_heads=2, patch_size=4).double()
    w0 = model.head.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rec = PatternRecorder(model, optimizer, ["head"], tmp_path, dtype="float64")
    g = torch.Generator().manual_seed(0)
    with rec:
        for _ in range(6):
            x, y = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (4,), generator=g)
            rec.on_batch_start(x, y)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    features = model.forward_head(model.forward_features(torch.randn(5, 3, 8, 8, dtype=torch.float64)),
                                  pre_logits=True).detach().numpy()
    store = PatternStore(tmp_path / "patterns")
    out = w0.numpy() @ features.T + sum(e.T @ (x @ features.T) for x, e, _, _ in values(store, store.steps(), "head"))
    np.testing.assert_allclose(model.head.weight.detach().numpy() @ features.T, out, rtol=0, atol=1e-9)
    assert not np.allclose(w0.numpy(), model.head.weight.detach().numpy())


@pytest.fixture(scope="module")
def naive_run(tmp_path_factory):
    """naive (an Avalanche template) with SGD + momentum and the dual_form callback as a suite entry gives it."""
    out = tmp_path_factory.mktemp("naive_dual_form")
    args = {"epochs": 1, "batch_size": 8, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "head": "fixed",
            "model_args": {"hidden": [8]}}
    callbacks = [{"name": "dual_form", "args": {"layers": ["model.feature_extractor.1", "model.classifier"]}}]
    record = api_run("synthetic", "naive", scenario_args={"n_classes": 4, "n_experiences": 2, "train_per_class": 12,
                                                          "test_per_class": 4}, args=args, callbacks=callbacks,
                     out=out)
    assert record.status == "finished", record.reason
    return out, record


def test_callback_in_a_real_strategy_run_reconstructs_the_trained_weights(naive_run):
    """float32 model, so the check is at float32 precision."""
    out, record = naive_run
    folder = out / "artifacts" / record.run_id / "dual_form" / "run"
    store = PatternStore(folder / "patterns")
    steps = store.steps()
    assert store.full and set(steps["experience"]) == {0, 1} and steps["fresh"][0, 0]
    model = torch.load(folder / "models" / "after_exp1.pt", weights_only=False)
    for layer, module in (("model.feature_extractor.1", model.feature_extractor[1]),
                          ("model.classifier", model.classifier)):
        w, b = reconstruct(store, layer)
        np.testing.assert_allclose(w, module.weight.detach().numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(b, module.bias.detach().numpy(), rtol=0, atol=1e-6)
    phase1 = torch.load(folder / "models" / "after_exp0.pt", weights_only=False)
    w, _ = reconstruct(store, "model.classifier", upto=int((steps["experience"] == 0).sum()))
    np.testing.assert_allclose(w, phase1.classifier.weight.detach().numpy(), rtol=0, atol=1e-6)
    meta = np.concatenate([m for _, _, m, _ in store.chunks("model.classifier")])
    assert sorted(set(meta[:, 3])) == [0, 1, 2, 3] and meta[-1, 2] == 4 * 12 - 1


@pytest.mark.parametrize("make, why", [
    (lambda p: torch.optim.Adam(p, lr=0.01), "only torch.optim.SGD"),
    (lambda p: torch.optim.AdamW(p, lr=0.01), "only torch.optim.SGD"),
    (lambda p: torch.optim.SGD(p, lr=0.01, weight_decay=1e-4), "weight_decay=0.0001"),
    (lambda p: torch.optim.SGD(p, lr=0.01, maximize=True), "maximize=True"),
])
def test_optimizers_without_a_dual_form_are_refused(tmp_path, make, why):
    model = _mlp()
    optimizer = make(model.parameters())
    with pytest.raises(DualFormError, match=why):
        _train(model, optimizer, PatternRecorder(model, optimizer, LAYERS, tmp_path), steps=1)


def test_frozen_layer_changed_gradient_and_late_attachment_are_refused(tmp_path):
    model = _mlp()
    model[0].weight.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(DualFormError, match="frozen"):
        PatternRecorder(model, optimizer, ["0"], tmp_path / "a").__enter__()
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = PatternRecorder(model, optimizer, ["4"], tmp_path / "b")
    with pytest.raises(DualFormError, match="gradient clipping"), rec:
        x, y = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
        nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        optimizer.step()
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer, PatternRecorder(model, optimizer, ["4"], tmp_path / "c"), steps=1)
    with pytest.raises(DualFormError, match="attached after the optimizer's first step"):
        _train(model, optimizer, PatternRecorder(model, optimizer, ["4"], tmp_path / "d"), steps=1)
    with pytest.raises(ValueError, match="only nn.Linear"):
        PatternRecorder(model, optimizer, ["1"], tmp_path / "e").__enter__()


def test_aggregations_sum_back_to_totals_and_to_the_output(tmp_path):
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer, PatternRecorder(model, optimizer, LAYERS, tmp_path, dtype="float64"), steps=10,
           experiences=2)
    store = PatternStore(tmp_path / "patterns")
    queries = torch.randn(6, 4, dtype=torch.float64)
    logits = model[4](queries).detach().numpy()
    units = logits.argmax(1)
    result = attribute(store, "4", queries.numpy(), units, top_k=3)
    np.testing.assert_allclose(result.initial + result.total, logits[np.arange(6), units], atol=1e-9)
    np.testing.assert_allclose(result.by_class().sum(1), result.total, atol=1e-12)
    np.testing.assert_allclose(result.by_experience().sum(1), result.total, atol=1e-12)
    assert result.by_class().shape == (6, 4) and np.allclose(result.by_class()[:, 3], 0)   # no unknown labels
    interference = result.interference(np.zeros(6, int))
    np.testing.assert_allclose(interference, result.by_experience()[:, 1] / result.total)
    positive = result.positive_interference(np.zeros(6, int))
    assert ((0 <= positive) & (positive <= 1)).all() and (result.positive >= result.contribution - 1e-12).all()
    # the positive parts, brute force over all patterns
    c = np.concatenate([(queries.numpy() @ x.T) * e_w[:, units].T + e_b[:, units].T
                        for x, e_w, e_b, _ in values(store, store.steps(), "4")], axis=1)
    np.testing.assert_allclose(result.positive.sum((1, 2)), np.maximum(c, 0).sum(1), atol=1e-12)
    np.testing.assert_allclose(c.sum(1), result.total, atol=1e-12)
    # top-k: the largest α_t over all patterns, brute force
    x = np.concatenate([c[0] for c in store.chunks("4")]).astype(np.float64)
    alpha = queries.numpy() @ x.T
    np.testing.assert_allclose(result.top_alpha, -np.sort(-alpha, axis=1)[:, :3])
    mass = attention_over_steps(store, "4", queries.numpy())
    assert mass.shape == (10, 2)
    np.testing.assert_allclose(mass.sum(), result.attention.sum() / 6)
    np.testing.assert_allclose(mass[:5, 1], 0) and np.testing.assert_allclose(mass[5:, 0], 0)


def test_attention_mass_per_class_and_task_equals_a_hand_computed_matrix(tmp_path):
    """Σ_t α_t per (task, class), α_t = x_tᵀ q, for three patterns written by hand (batch 1, plain SGD, one layer):
    task 0: x = (1, 0) label 0, x = (0, 2) label 1; task 1: x = (1, 1) label 0. Query q = (1, 3):
    α = 1, 6, 4 -> attention[task 0] = (1, 6), attention[task 1] = (4, 0); task 1's share of the mass 4 / 11."""
    layer = nn.Sequential(nn.Linear(2, 2)).double()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    rec = PatternRecorder(layer, optimizer, ["0"], tmp_path, dtype="float64")
    patterns = [(0, [1.0, 0.0], 0), (0, [0.0, 2.0], 1), (1, [1.0, 1.0], 0)]
    with rec:
        for task, x, y in patterns:
            rec.on_experience_start(task)
            x, y = torch.tensor([x], dtype=torch.float64), torch.tensor([y])
            rec.on_batch_start(x, y)
            optimizer.zero_grad()
            nn.functional.cross_entropy(layer(x), y).backward()
            optimizer.step()
    store = PatternStore(tmp_path / "patterns")
    result = attribute(store, "0", np.array([[1.0, 3.0]]), np.array([0]))
    expected = np.array([[[1.0, 6.0, 0.0], [4.0, 0.0, 0.0]]])          # (query, task, class + unknown)
    np.testing.assert_allclose(result.attention, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.by_class("attention"), [[5.0, 6.0, 0.0]], atol=1e-12)
    np.testing.assert_allclose(result.by_experience("attention"), [[7.0, 4.0]], atol=1e-12)
    np.testing.assert_allclose(result.attention_share(np.array([0])), [4 / 11], atol=1e-12)
    np.testing.assert_allclose(result.attention_share(np.array([1])), [7 / 11], atol=1e-12)


def test_storage_respects_its_budget_and_refuses_a_plan_that_does_not_fit(tmp_path):
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    budget = 300_000
    with pytest.raises(StoreBudgetError, match="set fraction <="):
        PatternRecorder(model, optimizer, LAYERS, tmp_path / "a", budget_bytes=budget, planned_samples=10**6,
                        chunk_rows=64).__enter__()
    assert not (tmp_path / "a" / "patterns").exists()          # refused before anything was written
    with pytest.raises(StoreBudgetError, match="below the store's minimum"):
        PatternRecorder(model, optimizer, LAYERS, tmp_path / "b", budget_bytes=1000).__enter__()
    rec = PatternRecorder(model, optimizer, LAYERS, tmp_path / "c", budget_bytes=budget, fraction="auto",
                          planned_samples=400 * 5, planned_steps=400, chunk_rows=64)
    _train(model, optimizer, rec, steps=400)
    store = PatternStore(tmp_path / "c" / "patterns")
    assert 0 < store.fraction < 1 and store.manifest["complete"]
    assert store.bytes_on_disk() <= budget
    assert store.manifest["layers"]["0"]["patterns"] == int(np.floor(store.fraction * 2000 + 1e-9))
    with pytest.raises(DualFormError, match="kept a fraction"):
        reconstruct(store, "0")
    rec = PatternRecorder(model, optimizer, LAYERS, tmp_path / "d", budget_bytes=budget, chunk_rows=64)
    with pytest.raises(StoreBudgetError, match="reached budget_bytes"):
        _train(model, optimizer, rec, steps=400)
    assert PatternStore(tmp_path / "d" / "patterns").bytes_on_disk() <= budget


def test_float16_storage_error_is_within_its_bound(tmp_path):
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    exact = PatternRecorder(model, optimizer, ["2"], tmp_path / "64", dtype="float64")
    half = PatternRecorder(model, optimizer, ["2"], tmp_path / "16", dtype="float16")
    with half:
        _train(model, optimizer, exact, steps=20, batch=64)
    w_exact, _ = reconstruct(PatternStore(tmp_path / "64" / "patterns"), "2")
    store = PatternStore(tmp_path / "16" / "patterns")
    w_half, _ = reconstruct(store, "2")
    # |ê x̂ᵀ − e xᵀ| <= |c| (δg |x| + |g| δx + δg δx) elementwise, δ = 2^-12 · row scale
    coef = coefficients(store.steps(), 0)
    bound = np.zeros_like(w_exact)
    for x, g, meta, scale in store.chunks("2"):
        c = np.abs(coef[meta[:, 0]])[:, None]
        dx, dg = FLOAT16_UNIT * scale[:, :1], FLOAT16_UNIT * scale[:, 1:]
        xa, ga = np.abs(x.astype(np.float64)) * scale[:, :1] + dx, np.abs(g.astype(np.float64)) * scale[:, 1:] + dg
        bound += (c * dg).T @ xa + (c * ga).T @ dx
    error = np.abs(w_half - w_exact)
    assert (error <= bound + 1e-12).all() and error.max() > 0
    assert error.max() < 1e-3 * np.abs(w_exact - PatternStore(tmp_path / "64" / "patterns").initial("2")[0]).max()


def test_analyze_command_writes_consistent_csvs_and_plots(naive_run, tmp_path):
    out, record = naive_run
    code = main(["analyze", "dual-form", "--run", str(out / "runs" / f"{record.run_id}.json"), "--out",
                 str(tmp_path), "--queries", "6", "--examples", "2", "--top-k", "3"])
    assert code == 0
    for name in ("accuracy.csv", "interference.csv", "attention_by_class.csv", "misclassified_attention.csv",
                 "top_patterns.csv", "attention_over_time.csv", "attention_over_time.png", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    by_class = pd.read_csv(tmp_path / "attention_by_class.csv")
    interference = pd.read_csv(tmp_path / "interference.csv")
    # per-(true label, outcome) means over training classes, weighted by n, give the per-experience means
    for (j, outcome), rows in interference[interference.outcome != "all"].groupby(["query_experience", "outcome"]):
        part = by_class[(by_class.query_experience == j) & (by_class.outcome == outcome)]
        for e in (0, 1):
            mine = part[part.train_experience == e]
            total = (mine.mean_contribution * mine.n).sum() / part.groupby("true_label").n.first().sum()
            assert total == pytest.approx(rows[f"contribution_from_exp{e}"].item(), abs=1e-4)
    # the attribution leads with attention mass: the per-label class picked has the largest mean Σα
    for _, row in pd.read_csv(tmp_path / "misclassified_attention.csv").iterrows():
        part = by_class[(by_class.query_experience == 0) & (by_class.true_label == row.true_label)
                        & (by_class.outcome == "misclassified") & (by_class.train_experience >= 1)]
        best = part.loc[part.mean_attention.idxmax()]
        assert (best.train_experience, best.train_label) == (row.top_experience, row.top_class_label)
        assert row.top_class_share_of_later_attention == pytest.approx(
            best.mean_attention / part.mean_attention.sum(), abs=2e-3)
    for (j, outcome), rows in interference[interference.outcome != "all"].groupby(["query_experience", "outcome"]):
        part = by_class[(by_class.query_experience == j) & (by_class.outcome == outcome)]
        for e in (0, 1):
            mine = part[part.train_experience == e]
            total = (mine.mean_attention * mine.n).sum() / part.groupby("true_label").n.first().sum()
            assert total == pytest.approx(rows[f"attention_from_exp{e}"].item(), rel=1e-3, abs=1e-3)
    accuracy = pd.read_csv(tmp_path / "accuracy.csv")
    assert np.allclose(accuracy.iloc[:, 1:].to_numpy() / 100, np.array(record.accuracy_matrix), atol=1e-4)
    assert (len(pd.read_csv(tmp_path / "top_patterns.csv")) ==
            3 * min(2, int(interference.query("query_experience == 0 and outcome == 'misclassified'").n.sum())))


class _TwiceOnTokens(nn.Module):
    """One Linear used twice per step on token inputs (B, T, d): y = L(tanh(L(x))), pooled over tokens."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        return self.out(self.shared(torch.tanh(self.shared(x))).mean(1))


def test_token_inputs_through_a_layer_used_twice_per_step_reconstruct_exactly(tmp_path):
    model = _TwiceOnTokens().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rec = PatternRecorder(model, optimizer, ["shared", "out"], tmp_path, dtype="float64")
    g = torch.Generator().manual_seed(0)
    batch, tokens, steps = 3, 6, 4
    with rec:
        for _ in range(steps):
            x = torch.randn(batch, tokens, 4, generator=g, dtype=torch.float64)
            y = torch.randint(0, 3, (batch,), generator=g)
            rec.on_batch_start(x, y)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    w, b = rec.reconstruct("shared")
    np.testing.assert_allclose(w, model.shared.weight.detach().numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(b, model.shared.bias.detach().numpy(), rtol=0, atol=1e-10)
    store = PatternStore(tmp_path / "patterns")
    meta = np.concatenate([m for _, _, m, _ in store.chunks("shared")])
    assert len(meta) == steps * 2 * batch * tokens          # two calls per step, one pattern per token
    first = meta[(meta[:, 2] >= 0)]                         # the batch's own call: sample index and label
    second = meta[(meta[:, 2] < 0)]                         # the reuse: unknown sample and label, per token
    assert len(first) == len(second) == steps * batch * tokens
    assert (second[:, 3] == -1).all() and (first[:, 3] >= 0).all()
    np.testing.assert_array_equal(np.bincount(second[:, 4]), np.full(tokens, steps * batch))
    np.testing.assert_array_equal(np.sort(np.unique(first[:, 2])), np.arange(steps * batch))
