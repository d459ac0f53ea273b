"""PETL strategies (strategies/petl.py): the pre-trained backbone is loaded and stays bitwise unchanged while
the PETL modules and heads train; per-task module sets are chosen by the task label or the nearest frozen-feature
class prototype; merging averages the sets; replay uses the shared memory; callbacks fire; trainable % is the
closed form over the backbone."""

import pytest
import torch

from clbench.callbacks import Callback, CallbackContext
from clbench.config import build_config
from clbench.errors import ConfigError
from clbench.models.checkpoint import save_weights
from clbench.petl import METHODS, build_method
from clbench.registry import MODELS, SCENARIOS, STRATEGIES
from clbench.runner import seed_everything
from clbench.strategies.petl import OUTSIDE
from clbench.suite_file import parse_suite

VIT = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 2}
SMALL = {"model_args": VIT, "epochs": 2, "batch_size": 16}


@pytest.fixture(scope="module")
def scenario():
    return SCENARIOS.get("synthetic")(seed=0, n_classes=4, n_experiences=2, train_per_class=24, test_per_class=8,
                                      separation=6.0)


@pytest.fixture(scope="module")
def checkpoint(scenario, tmp_path_factory):
    torch.manual_seed(5)
    vit = MODELS.get("vit")(scenario.info, **VIT)
    return str(save_weights(vit, tmp_path_factory.mktemp("ckpt") / "vit.pt"))


def _strategy(name, scenario, checkpoint, **args):
    seed_everything(0)
    method = STRATEGIES.get(name).method
    sizes = {"size": 2} if "size" in METHODS.get(method).reads else {}        # the controls have no size
    mam = {"prefix_length": 2} if method == "mam" else {}
    config = build_config(name, "cpu", {**SMALL, **sizes, **mam, "init": checkpoint, **args})
    return STRATEGIES.get(name)(scenario.info, "cpu", config)


def test_every_method_has_three_registered_variants():
    for method in METHODS.names():
        for suffix in ("", "_per_task", "_merge"):
            assert method + suffix in STRATEGIES


@pytest.mark.parametrize("name", ["lora", "mam_per_task", "adapter_seq_merge", "mh_par_adapter"])
def test_backbone_is_the_checkpoint_and_stays_bitwise_unchanged(name, scenario, checkpoint):
    strategy = _strategy(name, scenario, checkpoint)
    vit = strategy.backbone.vit
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    own = {k.replace(".base.", "."): v for k, v in vit.state_dict().items()}   # hooks wrap the timm modules
    assert all(torch.equal(own[k], v) for k, v in saved.items() if not k.startswith("head"))
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    petl_before = [p.detach().clone() for p in strategy.new_set().parameters()]
    for experience in scenario.train_stream:
        strategy.train(experience)
    assert all(torch.equal(v, before[k]) for k, v in vit.state_dict().items())
    trained = strategy.sets[0] if hasattr(strategy, "sets") else strategy.model.petl
    assert any(not torch.equal(p, q) for p, q in zip(trained.parameters(), petl_before))


def test_init_checkpoint_is_the_frozen_backbone(scenario, checkpoint, tmp_path):
    """The backbone starts from the file ``init`` names (``{scenario}`` in it is replaced by the runner, for every
    strategy: tests/test_runner.py); a missing file is an error that says how to make one."""
    strategy = _strategy("lora", scenario, checkpoint)
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert torch.equal(strategy.backbone.vit.pos_embed, saved["pos_embed"])
    with pytest.raises(FileNotFoundError, match="run_bench.py pretrain"):
        _strategy("lora", scenario, str(tmp_path / "missing.pt"))


def test_trainable_pct_is_the_closed_form_over_the_backbone(scenario, checkpoint):
    strategy = _strategy("lora", scenario, checkpoint)
    vit_params = sum(p.numel() for n, p in MODELS.get("vit")(scenario.info, **VIT).named_parameters()
                     if not n.startswith("head"))
    lora = 2 * 2 * (2 * 16 + 16 * 2) * 1                                       # L · 2 targets · (r d + d r)
    assert strategy.extra_metrics()["trainable_pct"] == pytest.approx(100 * lora / vit_params)


def test_per_task_uses_the_task_label_in_task_incremental_scenarios(checkpoint):
    scenario = SCENARIOS.get("synthetic")(seed=0, n_classes=4, n_experiences=2, train_per_class=24,
                                          test_per_class=8, task_aware=True)
    strategy = _strategy("adapter_par_per_task", scenario, checkpoint)
    for experience in scenario.train_stream:
        strategy.train(experience)
    x = torch.stack([scenario.test_stream[0].dataset.eval()[i][0] for i in range(6)])
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    logits = strategy.predict(x, labels)
    for row, t in zip(logits, labels.tolist()):
        own = scenario.info.class_range(t)
        assert (row[own.start: own.stop] != OUTSIDE).all()
        assert (torch.cat((row[: own.start], row[own.stop:])) == OUTSIDE).all()
    assert "route_acc" not in strategy.extra_metrics()


def test_per_task_routes_by_the_nearest_frozen_feature_prototype(scenario, checkpoint):
    strategy = _strategy("lora_per_task", scenario, checkpoint)
    for experience in scenario.train_stream:
        strategy.train(experience)
    assert strategy.prototypes.shape == (4, 16) and strategy.owner.tolist() == [0, 0, 1, 1]
    x = torch.stack([scenario.test_stream[1].dataset.eval()[i][0] for i in range(8)])
    features = strategy.base_features(x)
    distances = ((features[:, None, :] - strategy.prototypes[None]) ** 2).sum(-1)
    expected = strategy.owner[distances.argmin(1)]
    assert torch.equal(strategy.route(features), expected)
    logits = strategy.predict(x, None)
    for row, t in zip(logits, expected.tolist()):
        own = scenario.info.class_range(t)
        assert (row[own.start: own.stop] != OUTSIDE).all()
    extra = strategy.extra_metrics()
    held = [(f, t) for t, f in enumerate(strategy.held)]
    assert [len(f) for f, _ in held] == [9, 9]                     # min(route_holdout, n // 5) of 48 samples each
    hits = [int(strategy.owner[((f[i] - strategy.prototypes) ** 2).sum(-1).argmin()] == t)
            for f, t in held for i in range(len(f))]
    assert extra["module_sets"] == 2 and extra["route_acc"] == pytest.approx(100 * sum(hits) / len(hits))


def test_merge_deploys_the_average_of_sets_trained_from_one_initial_state(scenario, checkpoint):
    strategy = _strategy("adapter_par_merge", scenario, checkpoint)
    for experience in scenario.train_stream:
        strategy.train(experience)
    first, second = (dict(s.named_parameters()) for s in strategy.sets)
    for name, value in strategy.merged.named_parameters():
        assert torch.allclose(value, (first[name] + second[name]) / 2, rtol=0, atol=1e-7)
    init = dict(strategy.init_set.named_parameters())
    assert torch.equal(init["blocks.0.ffn.down.weight"], strategy.initial_set().blocks[0]["ffn"].down.weight)
    assert not torch.equal(first["blocks.0.ffn.up.weight"], second["blocks.0.ffn.up.weight"])


def test_replay_memory_holds_at_most_its_budget_and_per_task_refuses_one(scenario, checkpoint):
    strategy = _strategy("scaled_par_adapter", scenario, checkpoint, mem_size=10)
    for experience in scenario.train_stream:
        strategy.train(experience)
    assert len(strategy.memory) == 10 and set(strategy.memory.counts()) == {0, 1, 2, 3}
    with pytest.raises(ConfigError, match="mem_size"):                # per-experience sets have no memory
        _strategy("lora_per_task", scenario, checkpoint, mem_size=10)


class _Count(Callback):
    def __init__(self):
        self.steps = 0

    def after_step(self, optimizer):
        self.steps += 1
        self.params = sum(p.numel() for g in optimizer.param_groups for p in g["params"])


@pytest.mark.parametrize("name", ["prefix", "prefix_per_task"])
def test_callbacks_fire_and_the_optimizer_holds_only_petl_and_head(name, scenario, checkpoint):
    strategy = _strategy(name, scenario, checkpoint, epochs=1, prefix_reparam=0)     # free prefix vectors
    counter = _Count()
    counter.setup(CallbackContext())
    strategy.callbacks.callbacks.append(counter)
    strategy.train(scenario.train_stream[0])
    assert counter.steps == 3                                   # 48 samples, batch 16, 1 epoch
    assert counter.params == 2 * 2 * 2 * 16 + (16 * 2 + 2)      # prefix 2Lld + head over 2 classes


# ------------------------------------------------------------------------ the controls: head only, full fine-tuning
def _test_data(scenario, t):
    data = scenario.test_stream[t].dataset.eval()
    return torch.stack([data[i][0] for i in range(len(data))]), torch.tensor([data[i][1] for i in range(len(data))])


def _counted(strategy, experience):
    """Trains ``experience`` with a :class:`_Count` attached; returns it (optimizer steps, parameters held)."""
    counter = _Count()
    counter.setup(CallbackContext())
    strategy.callbacks.callbacks.append(counter)
    strategy.train(experience)
    strategy.callbacks.callbacks.remove(counter)
    return counter


@pytest.mark.parametrize("name", ["head_only", "head_only_per_task", "head_only_merge"])
def test_head_only_trains_the_classifier_alone(name, scenario, checkpoint):
    """Every backbone weight stays bitwise the checkpoint's, the module sets hold no parameter, the optimizer holds
    exactly the head (16 · c + c for its c classes), the head changes and trainable_pct is exactly 0."""
    strategy = _strategy(name, scenario, checkpoint)
    vit = strategy.backbone.vit
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    for t, experience in enumerate(scenario.train_stream):
        counter = _counted(strategy, experience)
        head = strategy.model.head if hasattr(strategy, "model") else strategy.heads[t]
        classes = scenario.info.n_seen(t) if hasattr(strategy, "model") else 2      # incremental / own classes
        assert counter.params == sum(p.numel() for p in head.parameters()) == 16 * classes + classes
    assert all(torch.equal(v, before[k]) for k, v in vit.state_dict().items())
    sets = strategy.sets if hasattr(strategy, "sets") else [strategy.model.petl]
    assert all(sum(p.numel() for p in s.parameters()) == 0 for s in [*sets, strategy.new_set()])
    fresh = _strategy(name, scenario, checkpoint)
    if hasattr(fresh, "model"):                 # the shared head exists before training: it changed
        assert not torch.equal(head.classifier.weight[:2], fresh.model.head.classifier.weight)
    assert strategy.extra_metrics()["trainable_pct"] == 0.0


@pytest.mark.parametrize("name", ["full_finetune", "full_finetune_per_task", "full_finetune_merge"])
def test_full_finetuning_trains_every_backbone_weight(name, scenario, checkpoint):
    """The optimizer holds every backbone weight and the head; every tensor of the trained backbone moves away from
    the checkpoint; the pre-trained backbone (φ_0: routing, replay features) stays bitwise the checkpoint's;
    trainable_pct is exactly 100; _merge deploys the mean of the per-experience backbones, all started from the
    checkpoint, and counts no frozen backbone beside it."""
    strategy = _strategy(name, scenario, checkpoint)
    vit = strategy.backbone.vit
    saved = {k: v.clone() for k, v in vit.state_dict().items()}
    for t, experience in enumerate(scenario.train_stream):
        classes = scenario.info.n_seen(t) if hasattr(strategy, "model") else 2      # incremental / own classes
        assert _counted(strategy, experience).params == strategy.backbone_params + 16 * classes + classes
    assert all(torch.equal(v, saved[k]) for k, v in vit.state_dict().items())
    trained = strategy.sets if hasattr(strategy, "sets") else [strategy.model.petl]
    for petl in trained:
        assert all(not torch.equal(p, saved[n]) for n, p in petl.backbone.named_parameters())
    assert strategy.extra_metrics()["trainable_pct"] == 100.0
    if name.endswith("_merge"):
        first, second = (dict(s.backbone.named_parameters()) for s in strategy.sets)
        for n, p in strategy.merged.backbone.named_parameters():
            torch.testing.assert_close(p, (first[n] + second[n]) / 2, rtol=0, atol=1e-7)
        assert all(torch.equal(p, saved[n]) for n, p in strategy.init_set.backbone.named_parameters())
        assert strategy.num_parameters().total == strategy.backbone_params + 2 * (16 * 2 + 2)   # no frozen copy


def test_private_full_finetuning_clips_every_backbone_weight_per_sample(scenario, checkpoint):
    """What the dp callback hooks (``modules()``) holds the trainable backbone, and the per-sample gradient norms
    from clbench.privacy's rules equal vmap(grad)'s over all trainable parameters (float64, 1e-6 relative), with the
    head and with the backbone alone (non-zero): no backbone weight is skipped by per-sample clipping. (After one
    experience: before it, the incremental head masks every class and all gradients are 0.)"""
    from clbench.privacy import per_sample_grad_norms
    from tests.test_privacy_rules import RTOL, ce, vmap_norms

    strategy = _strategy("full_finetune", scenario, checkpoint, epochs=1)
    strategy.train(scenario.train_stream[0])
    model = strategy.modules()["model"].double().train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {f"petl.backbone.{n}" for n, _ in strategy.backbone.vit.named_parameters()} < trainable
    x, y = _test_data(scenario, 0)
    x, y = x[:6].double(), y[:6]
    with_head = per_sample_grad_norms(model, ce, x, y)
    torch.testing.assert_close(with_head, vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)
    model.head.requires_grad_(False)
    backbone = per_sample_grad_norms(model, ce, x, y)
    torch.testing.assert_close(backbone, vmap_norms(model, ce, x, y), rtol=RTOL, atol=0)
    assert (backbone > 0).all() and (backbone < with_head).all()


# ------------------------------------------------------------------ settings refused at load (issue 26's probes)
def _load(name, args, model_args=None):
    """The suite loader on one entry (the ViT of the shipped suites: d = 64, 3 blocks, 4 heads)."""
    entry = {"name": name, "args": {"model_args": model_args or {"embed_dim": 64, "depth": 3, "num_heads": 4,
                                                                  "patch_size": 4}, **args}}
    return parse_suite({"suite": "probe", "scenarios": [{"name": "synthetic"}], "strategies": [entry]})


@pytest.mark.parametrize("name, args, key", [
    ("lora", {"size": 0}, "size"),                          # trained as r = 8 (`a.size or 8`)
    ("prefix", {"size": 0}, "size"),                        # trained as l = 30
    ("mam", {"size": 8, "prefix_length": -3}, "prefix_length"),
    ("lora", {"size": 100000}, "size 100000"),              # 76.8 M parameters on a width-64 ViT
    ("adapter_par", {"size": 65}, "size 65"),               # r > d
    ("prefix", {"size": 5000}, "share"),                    # more PETL parameters than the blocks
    ("mh_par_adapter", {"placement": "ffn"}, "placement"),  # a per-head adapter has one place
    ("prefix", {"placement": "ffn"}, "placement"),
    ("mam", {"placement": "attn"}, "placement"),
    ("lora", {"prefix_length": 4}, "prefix_length"),        # read by MAM only
    ("adapter_par", {"scale": 2.0}, "scale"),               # plain add: no s
    ("adapter_par_merge", {"lora_alpha": 8.0}, "lora_alpha"),
    ("head_only", {"size": 3}, "no size setting"),       # the controls have no module to size
    ("full_finetune_merge", {"placement": "ffn"}, "placement"),
    ("adapter_par", {"size": 3, "model_args": {"embed_dim": 64, "depth": 3, "num_heads": 4, "patch_size": 4,
                                               "drop_path_rate": 0.1}}, "drop_path_rate 0.1"),  # eval-mode backbone
    ("full_finetune", {"model_args": {"drop_path_rate": 0.2}}, "drop_path_rate 0.2"),
])
def test_settings_that_would_not_train_as_written_are_refused_at_load(name, args, key):
    with pytest.raises(ConfigError) as error:
        _load(name, args)
    message = str(error.value)
    assert key in message and "\n" not in message.strip()


@pytest.mark.parametrize("method", METHODS.names())
def test_placement_is_honoured_by_every_method_that_reads_it(method):
    """``placement: ffn`` puts every module at the FFN for the methods that read it (LoRA on W_1, W_2); the others
    refuse it (above)."""
    if "placement" not in METHODS.get(method).reads:
        with pytest.raises(ConfigError, match="placement"):
            _load(method, {"placement": "ffn"})
        return
    spec = _load(method, {"placement": "ffn", "size": 4})
    config = build_config(method, None, spec.strategies[0].args)
    reps = {m.representation for m in build_method(method, config).modifications}
    assert reps == {"ffn"}
    default = build_config(method, None, {"size": 4})
    assert {m.representation for m in build_method(method, default).modifications} != {"ffn"} or method in (
        "adapter_par", "scaled_par_adapter")                # their default is the FFN already


def test_lora_placement_ffn_trains_the_ffn_not_the_attention(scenario, checkpoint):
    strategy = _strategy("lora", scenario, checkpoint, placement="ffn", epochs=1)
    block = strategy.model.petl.blocks[0]
    assert set(block.keys()) == {"fc1", "fc2"}


def test_alpha_over_r_is_what_lora_scales_by():
    for r, alpha in ((1, 2.0), (10, 20.0)):
        (m,) = build_method("lora", build_config("lora", None, {"size": r, "lora_alpha": alpha})).modifications
        assert m.scale == 2.0
