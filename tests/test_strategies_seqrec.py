"""The seqrec model (causality, the shared embedding, the loss) and the ``seqrec`` strategy through the runner, the
ranking evaluator and the record; private training with the ``dp`` callback feeding Re-Attention's σ_dp."""

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from clbench.callbacks import CallbackContext, CallbackSpec
from clbench.executors import LocalExecutor
from clbench.models.seqrec import SeqRec, TargetScores, next_item_loss, target_loss
from clbench.protocol import NEXT_ITEM, ScenarioInfo
from clbench.registry import MODELS, SCENARIOS, STRATEGIES
from clbench.scenarios.movielens import sequences_scenario
from clbench.strategies.seqrec import item_counts, item_frequency
from clbench.suite_file import parse_suite

N_ITEMS = 12


@SCENARIOS.register("test_seqrec_cycles")
def cycles(*, seed: int = 0, n_experiences: int = 1, users: int = 40, length: int = 12):
    """Each user walks the items in a cycle (next = item % 12 + 1) from its own start: next-item is learnable."""
    rows = [(u, (u + t) % N_ITEMS + 1, 1, 1000 * t + u) for u in range(users) for t in range(length)]
    return sequences_scenario(np.array(rows), n_experiences, max_len=6, n_items=N_ITEMS)


cycles.kind = NEXT_ITEM


NORMS_AND_EMBEDDINGS = [(n, e) for n in ("pre", "post") for e in ("tied", "untied")]


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("attention", ["vanilla", "reattention"])
def test_outputs_at_t_do_not_depend_on_later_items(attention, norm):
    torch.manual_seed(0)
    model = SeqRec(30, 8, dim=16, attention=attention, norm=norm).eval()
    if attention == "reattention":
        from clbench.privacy.reattention import ErrorPrior
        model.set_error_prior(ErrorPrior(1.0, 16, torch.rand(31)))
    items = torch.randint(1, 31, (3, 8))
    items[0, :2] = 0                                                      # left padding
    changed = items.clone()
    changed[:, 5:] = torch.randint(1, 31, (3, 3))
    a, b = model(items), model(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=0)        # positions 0..4: exactly unchanged
    assert not torch.allclose(a[:, 5:], b[:, 5:])
    assert torch.isfinite(a).all()                                        # padding rows attend to themselves


def test_input_and_output_embeddings_are_one_parameter():
    torch.manual_seed(1)
    model = SeqRec(20, 5, dim=8, dropout=0.0)
    assert model.output.weight is model.item_emb.weight
    assert sum(p is model.item_emb.weight for p in model.parameters()) == 1
    items, targets = torch.randint(1, 21, (4, 5)), torch.randint(0, 21, (4, 5))
    next_item_loss(model(items), targets).backward()
    shared = model.item_emb.weight.grad.clone()
    # the shared gradient is the sum of the two uses: input lookup + output projection (computed separately)
    e = model.item_emb.weight.detach().clone().requires_grad_(True)
    o = model.item_emb.weight.detach().clone().requires_grad_(True)
    h = model.dropout(F.embedding(items, e, padding_idx=0) + model.pos_emb(torch.arange(5).expand(4, 5)))
    pad = items == 0
    for block in model.blocks:
        h, _ = block(h, pad, None, 0.0)
    next_item_loss(F.linear(model.norm(h), o), targets).backward()
    torch.testing.assert_close(shared, e.grad + o.grad)
    assert e.grad.abs().sum() > 0 and o.grad.abs().sum() > 0


def test_loss_is_the_batch_mean_of_per_sample_sums():
    torch.manual_seed(2)
    scores = torch.randn(3, 4, 11)
    targets = torch.tensor([[0, 3, 10, 1], [0, 0, 0, 5], [2, 2, 2, 2]])
    per_sample = [sum(float(F.cross_entropy(scores[i, t, 1:], torch.tensor(targets[i, t] - 1)))
                      for t in range(4) if targets[i, t] > 0) for i in range(3)]
    torch.testing.assert_close(next_item_loss(scores, targets, "sample"), torch.tensor(per_sample))
    assert float(next_item_loss(scores, targets)) == pytest.approx(sum(per_sample) / 3)
    with pytest.raises(ValueError, match="reduction must be"):
        next_item_loss(scores, targets, "token")


def test_item_frequency_counts_windows_containing_each_item():
    x = torch.tensor([[0, 1, 1], [2, 1, 3], [0, 0, 3]])
    torch.testing.assert_close(item_frequency(x, 4), torch.tensor([0.0, 2 / 3, 1 / 3, 2 / 3, 0.0]))


def test_model_registered_and_config_refuses_unknown_attention():
    info = ScenarioInfo("r", 1, (7,), extra={"n_items": 9})
    model = MODELS.get("seqrec")(info, dim=8)
    assert model.max_len == 7 and model.output.out_features == 10
    with pytest.raises(ValueError, match="attention: unknown attention 'sparse'. Choose one of: reattention, vanilla"):
        STRATEGIES.get("seqrec").Config(attention="sparse")


def test_seqrec_learns_and_ndcg_hit_reach_the_record(tmp_path):
    suite = parse_suite({"suite": "s", "seeds": [0], "scenarios": [{"name": "test_seqrec_cycles"}],
                         "strategies": [{"name": "seqrec", "args": {"dim": 16, "epochs": 40, "batch_size": 16,
                                                                     "lr": 0.01, "dropout": 0.0}}]})
    (record,) = LocalExecutor().run_all(suite.run_specs("cpu"), tmp_path)
    assert record.status == "finished", record.reason
    assert set(record.matrices) == {"ndcg@10", "hit@10"}
    assert [s["name"] for s in record.metric_specs if s["primary"]] == ["ndcg@10"]
    assert record.matrices["hit@10"][0][0] == 1.0 and record.matrices["ndcg@10"][0][0] > 0.9
    assert record.metrics["ndcg@10_last"] == pytest.approx(record.matrices["ndcg@10"][0][0])    # a fraction


def test_private_training_feeds_reattention_the_calibrated_sigma():
    privacy = pytest.importorskip("clbench.privacy")
    scenario = cycles(users=24)
    config = STRATEGIES.get("seqrec").Config(dim=8, epochs=2, batch_size=8, attention="reattention")
    strategy = STRATEGIES.get("seqrec")(scenario.info, "cpu", config)
    strategy.callbacks.attach([CallbackSpec("dp", {"epsilon": 8.0, "clip": 0.5})],
                              CallbackContext(run_id="t", modules=strategy.modules,
                                              n_train=len(scenario.train_stream[0].dataset)))
    strategy.train(scenario.train_stream[0])
    (dp,) = strategy.callbacks.callbacks
    assert isinstance(dp, privacy.PrivateTraining) and dp.call.steps_taken > 0
    prior = strategy.model.error_prior
    assert prior.sigma_dp == dp.call.sigma > 0 and prior.active and prior.clip == 0.5
    assert prior.batch_size == pytest.approx(dp.call.sample_rate * dp.call.n)
    assert strategy.extra_metrics()["reattention_sigma_dp"] == dp.call.sigma


def test_private_reattention_releases_a_noised_frequency_prior_and_counts_it_in_epsilon():
    """Under dp the prior is the presence counts plus N(0, σ_f² L) (L = 6, the window length; σ_f = prior_noise =
    2, drawn from the global generator right before training), over M windows, clipped to [0, 1], padding 0; the
    release is part of the call and of the run's ε; catches an unnoised prior, a wrong sensitivity or a release
    left out of ε."""
    privacy = pytest.importorskip("clbench.privacy")
    scenario = cycles(users=24)
    x = scenario.train_stream[0].dataset.x
    config = STRATEGIES.get("seqrec").Config(dim=8, epochs=1, batch_size=8, attention="reattention", prior_noise=2.0)
    strategy = STRATEGIES.get("seqrec")(scenario.info, "cpu", config)
    strategy.callbacks.attach([CallbackSpec("dp", {"epsilon": 8.0})],
                              CallbackContext(run_id="prior", modules=strategy.modules, n_train=len(x)))
    torch.manual_seed(5)
    noise = torch.randn(N_ITEMS + 1) * 2.0 * math.sqrt(6)
    expected = ((item_counts(x, N_ITEMS) + noise) / len(x)).clamp(0, 1)
    expected[0] = 0.0
    torch.manual_seed(5)
    strategy.train(scenario.train_stream[0])
    (dp,) = strategy.callbacks.callbacks
    assert isinstance(dp, privacy.PrivateTraining) and x.shape[1] == 6
    torch.testing.assert_close(strategy.model.error_prior.token_frequency, expected)
    assert not torch.equal(expected, item_frequency(x, N_ITEMS))
    assert dp.call.releases == [(2.0, 1.0, 1)]
    spent = dp.extra_metrics()["epsilon"]
    assert spent == privacy.accountant.epsilon(dp.call.history(), dp.delta) and 7.9 < spent <= 8.0


def test_automatic_clipping_of_the_tied_model_equals_a_vmap_per_sample_normalization():
    """Ding et al.'s gradient normalization (automatic clipping, Bu et al. 2023: ``C_i = R / (‖g_i‖ + γ)``, R = 1) on
    the seqrec model with its shared embedding, σ = 0, training on the last 2 positions (``loss_positions``): the
    book-kept gradient equals ``Σ_i C_i g_i / B̄`` with ``g_i`` from ``torch.func.vmap`` over per-sample losses
    (float64); catches a wrong norm of the tied matrix, flat clipping in its place or a lost cross term."""
    privacy = pytest.importorskip("clbench.privacy")
    torch.manual_seed(3)
    model = SeqRec(15, 6, dim=8, dropout=0.0).double()
    items = torch.randint(0, 16, (5, 6))
    items[:, -1] = torch.randint(1, 16, (5,))
    targets = torch.randint(0, 16, (5, 2))
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss_one(p, x, y):
        scores = torch.func.functional_call(model, p, (x[None],), {"last": 2})
        return next_item_loss(scores, y[None])

    grads = torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(params, items, targets)
    norms = torch.cat([g.flatten(1) for g in grads.values()], 1).norm(dim=1)
    factors = 1.0 / (norms + 0.01)
    assert (norms > 1.5).all()                                      # far from flat clipping's factor 1 / ‖g‖
    expected = {n: (factors.view(-1, *[1] * (g.ndim - 1)) * g).sum(0) / 8 for n, g in grads.items()}

    dp = privacy.PrivateTraining(noise_multiplier=1.0, delta=1e-5, clip=1.0, clipping="automatic")
    dp.setup(CallbackContext(run_id="auto", modules=lambda: {"model": model}, n_train=80))
    dp.batch_sampler(80, 8, 1)
    dp.call.sigma = 0.0
    dp.on_batch_start(items, targets)
    next_item_loss(model(items, last=2), targets).backward()
    ours = dp.privatize(list(model.parameters()))
    torch.testing.assert_close(ours, norms, rtol=1e-9, atol=1e-12)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-9, atol=1e-12)


def test_warmup_then_linear_decay_by_hand_and_in_the_loop():
    """T = 2 epochs · ⌈10/4⌉ = 6 steps, warm-up 0.2 -> W = ⌈1.2⌉ = 2: lr·(1/2, 2/2, 4/4, 3/4, 2/4, 1/4)."""
    from clbench.training import FitSettings, Schedule, fit
    settings = FitSettings(2, 4, Schedule(0.8, per="step", warmup=0.2, decay="linear"), optimizer="sgd")
    assert [settings.schedule.lr_at(s, 6) for s in range(6)] == pytest.approx([0.4, 0.8, 0.8, 0.6, 0.4, 0.2])
    seen = []
    from clbench.callbacks import Callback, CallbackList

    class Rates(Callback):
        def after_step(self, optimizer):
            seen.append(optimizer.param_groups[0]["lr"])

    callbacks = CallbackList()
    callbacks.callbacks.append(Rates())
    model = torch.nn.Linear(2, 1)
    fit(model, model, model.parameters(), torch.randn(10, 2), torch.randn(10, 1),
        lambda out, y: (out - y).pow(2).mean(), settings, 0, callbacks)
    assert seen == pytest.approx([0.4, 0.8, 0.8, 0.6, 0.4, 0.2])
    with pytest.raises(ValueError, match="milestones are for decay 'step'"):
        Schedule(0.8, per="step", warmup=0.2, decay="linear", milestones=(1,))
    with pytest.raises(ValueError, match=r"warmup must be in \[0, 1\)"):
        STRATEGIES.get("seqrec").Config(warmup=1.0)


def test_loss_positions_trains_on_the_last_positions_only():
    """``loss_positions = K``: the model scores the last K positions and the loss is the full loss with every
    earlier target removed."""
    torch.manual_seed(4)
    model = SeqRec(20, 5, dim=8, dropout=0.0)
    items, targets = torch.randint(1, 21, (3, 5)), torch.randint(1, 21, (3, 5))
    kept = targets.clone()
    kept[:, :3] = 0
    torch.testing.assert_close(next_item_loss(model(items, last=2), targets[:, -2:]),
                               next_item_loss(model(items), kept))
    with pytest.raises(ValueError, match="loss_positions must be >= 1"):
        STRATEGIES.get("seqrec").Config(loss_positions=0)


def _windows(seed: int, batch: int = 5, length: int = 6, items: int = 15) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows with left padding and targets only at some positions (0 elsewhere, as the scenario's)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, items + 1, (batch, length), generator=g)
    y = torch.randint(1, items + 1, (batch, length), generator=g)
    for i in range(batch):
        x[i, :i] = 0
        y[i, :i] = 0
    y[torch.rand(batch, length, generator=g) < 0.4] = 0
    y[0, -1] = 3
    return x, y


@pytest.mark.parametrize("norm,embeddings", NORMS_AND_EMBEDDINGS)
def test_scores_at_target_positions_give_the_every_position_loss_to_the_last_digit(float64, norm, embeddings):
    """``forward(items, targets=y)`` scores only the positions with a target (packed rows); its loss equals the
    every-position loss exactly (float64, bitwise, for the default pre-LN tied model), and so do the gradients to
    rounding; for post-LN blocks and untied embeddings to rounding too (post-LN's last operation, ``LN_2``, runs on the
    packed rows: the hidden states of the item positions differ from the dense ones in the last bit, as pre-LN's
    do before its final LayerNorm)."""
    torch.manual_seed(6)
    model = SeqRec(15, 6, dim=8, heads=2, dropout=0.0, norm=norm, embeddings=embeddings)
    x, y = _windows(1)
    packed = model(x, targets=y)
    assert isinstance(packed, TargetScores) and packed.scores.shape == (int((y > 0).sum()), 15)
    for reduction in ("mean", "sum", "sample"):
        ours, dense = target_loss(packed, reduction), next_item_loss(model(x), y, reduction)
        if (norm, embeddings) == ("pre", "tied"):
            assert torch.equal(ours, dense)
        torch.testing.assert_close(ours, dense, rtol=1e-14, atol=0)
    dense = torch.autograd.grad(next_item_loss(model(x), y), list(model.parameters()))
    rows = torch.autograd.grad(target_loss(model(x, targets=y)), list(model.parameters()))
    for a, b in zip(dense, rows):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("norm,embeddings", NORMS_AND_EMBEDDINGS)
def test_per_sample_norms_on_packed_target_rows_equal_vmap_of_the_every_position_loss(float64, norm, embeddings):
    """The private side of packing: per-sample norms of the model whose output layer runs on the packed target
    rows (Linear rule within each sample's rows; tied: the tie's cross term on rows; untied: the output layer's own
    rows apart from the embedding's lookups) equal torch.func's per-sample gradients of the same loss written over
    every position, for pre- and post-LN blocks (post-LN: ``LN_2`` on the packed rows); the first-step invariant
    holds."""
    privacy = pytest.importorskip("clbench.privacy")
    torch.manual_seed(7)
    model = SeqRec(15, 6, dim=8, dropout=0.0, norm=norm, embeddings=embeddings)
    x, y = _windows(2)

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pairs):
            return self.model(pairs[:, 0], targets=pairs[:, 1])

    ours = privacy.per_sample_grad_norms(Packed(), lambda out, _: target_loss(out, "sample"), torch.stack([x, y], 1),
                                         y)
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss_one(p, xi, yi):
        return next_item_loss(torch.func.functional_call(model, p, (xi[None],)), yi[None])

    grads = torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    torch.testing.assert_close(ours, torch.cat([g.flatten(1) for g in grads.values()], 1).norm(dim=1),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("norm,embeddings", NORMS_AND_EMBEDDINGS)
def test_seqrec_trains_privately_on_packed_rows(norm, embeddings):
    """The strategy trains on the packed layout with dp: every step's output layer runs on the target rows only,
    the first step's invariant passes, and the steps are taken (pre/post-LN, tied/untied)."""
    privacy = pytest.importorskip("clbench.privacy")
    scenario = cycles(users=24)
    config = STRATEGIES.get("seqrec").Config(dim=8, epochs=2, batch_size=8, norm=norm, embeddings=embeddings)
    strategy = STRATEGIES.get("seqrec")(scenario.info, "cpu", config)
    strategy.callbacks.attach([CallbackSpec("dp", {"epsilon": 8.0, "clip": 1.0})],
                              CallbackContext(run_id="packed", modules=strategy.modules,
                                              n_train=len(scenario.train_stream[0].dataset)))
    outputs = []
    strategy.model.register_forward_hook(lambda m, args, out: outputs.append(type(out)))
    strategy.train(scenario.train_stream[0])
    (dp,) = strategy.callbacks.callbacks
    assert isinstance(dp, privacy.PrivateTraining) and dp.call.steps_taken > 0 and not dp.unchecked
    assert outputs and set(outputs) == {TargetScores}           # scores at the target rows, never (B, L, V + 1)


def test_post_norm_blocks_compute_vaswanis_encoder_block():
    """``norm="post"``: ``h ← LN_1(h + Attn(h))``, ``h ← LN_2(h + W_2 relu(W_1 h))`` and no final LayerNorm, written
    out here from the block's layers; the default pre-LN model is another function of the same parameters."""
    torch.manual_seed(8)
    post = SeqRec(15, 6, dim=8, depth=2, dropout=0.0, norm="post").eval()
    pre = SeqRec(15, 6, dim=8, depth=2, dropout=0.0).eval()
    assert isinstance(post.norm, torch.nn.Identity) and isinstance(pre.norm, torch.nn.LayerNorm)
    pre.norm = torch.nn.Identity()
    pre.load_state_dict(post.state_dict())                                  # the same parameters, pre-LN placement
    x, _ = _windows(3)
    pad = x == 0
    h = post.item_emb(x) + post.pos_emb(torch.arange(6).expand_as(x))
    for block in post.blocks:
        out, _ = block.attn(h, pad)
        h = block.norm1(h + out)
        h = block.norm2(h + block.fc2(F.relu(block.fc1(h))))
    torch.testing.assert_close(post.hidden(x), h, rtol=0, atol=0)
    assert not torch.allclose(pre.hidden(x), h)


def test_untied_embeddings_are_two_parameters_of_the_same_shape():
    """``embeddings="untied"``: the output layer has its own Parameter (row 0, padding, zero), the input embedding
    gets its gradient from the lookups only, and the model has ``(V + 1)·d`` more parameters than the tied one."""
    torch.manual_seed(9)
    tied = SeqRec(20, 5, dim=8, dropout=0.0)
    untied = SeqRec(20, 5, dim=8, dropout=0.0, embeddings="untied")
    assert untied.output.weight is not untied.item_emb.weight and untied.output.weight.shape == (21, 8)
    assert torch.equal(untied.output.weight[0], torch.zeros(8))
    count = [sum(p.numel() for p in m.parameters()) for m in (tied, untied)]
    assert count[1] - count[0] == 21 * 8
    untied.load_state_dict({**tied.state_dict(), "output.weight": tied.item_emb.weight.detach().clone()})
    items, targets = torch.randint(1, 21, (4, 5)), torch.randint(0, 21, (4, 5))
    torch.testing.assert_close(untied(items), tied(items))                # same values as tied, two Parameters...
    next_item_loss(tied(items), targets).backward()
    next_item_loss(untied(items), targets).backward()
    torch.testing.assert_close(untied.item_emb.weight.grad + untied.output.weight.grad, tied.item_emb.weight.grad)
    assert untied.item_emb.weight.grad.abs().sum() > 0 and untied.output.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("field,value", [("norm", "post"), ("embeddings", "untied")])
def test_norm_and_embeddings_change_what_is_trained_and_the_run_identity(field, value):
    """Each option changes the trained model's scores (same seed, same data) and the run's identity; an unknown
    value is refused naming the choices."""
    from clbench.specs import RunSpec, ScenarioEntry, StrategyEntry
    scenario = cycles(users=16)
    scores = []
    for args in ({}, {field: value}):
        torch.manual_seed(0)
        config = STRATEGIES.get("seqrec").Config(dim=8, epochs=1, batch_size=8, **args)
        strategy = STRATEGIES.get("seqrec")(scenario.info, "cpu", config)
        strategy.train(scenario.train_stream[0])
        scores.append(strategy.predict(scenario.test_stream[0].dataset.x, None))
    assert not torch.allclose(scores[0], scores[1])
    identities = [RunSpec("s", ScenarioEntry("test_seqrec_cycles"), StrategyEntry("seqrec", args=args), 0).identity()
                  for args in ({}, {field: value})]
    assert identities[0]["strategy"]["resolved"][field] != identities[1]["strategy"]["resolved"][field]
    with pytest.raises(ValueError, match=f"{field}: unknown {field} 'sideways'"):
        STRATEGIES.get("seqrec").Config(**{field: "sideways"})
