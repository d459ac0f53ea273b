"""GPU-hour estimates of the *_full suites (clbench/estimates.py), by hand from the stated formula."""

import importlib.resources

from clbench import estimates


def test_cifar100_full_by_hand():
    """96 runs x (70 x 5,000 + 9 x 70 x (5,000 + 2,000)) images at min(0.25 x 989e12 / 0.414e9, 15,000) / s."""
    passes = 70 * 5000 + 9 * 70 * 7000
    assert estimates.gpu_hours("cifar100_full") == 96 * passes / 15_000 / 3600


def test_every_shipped_full_suite_has_an_estimate_and_only_those_print_on_cpu():
    shipped = {p.name.removesuffix(".yaml") for p in importlib.resources.files("clbench").joinpath("suites").iterdir()
               if p.name.endswith("_full.yaml")}
    assert shipped == set(estimates.SUITES)
    assert "GPU hours" in estimates.notice("dytox_full", "cpu")
    assert estimates.notice("dytox_full", "cuda") is None and estimates.notice("quick", "cpu") is None


def _train_gflops(model, x, targets) -> float:
    """Forward + backward GFLOPs per item of one cross-entropy training step, counted."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode
    model.train()
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        F.cross_entropy(getattr(out, "logits", out), targets).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(x) / 1e9


def test_the_throughput_figures_are_the_counted_training_flops_of_the_real_networks():
    """ResNet-32 and DER's ResNet-18 per step ((t + 2) F: t backbone forwards, the new one's backward) recounted."""
    import torch

    from clbench.config import build_config
    from clbench.protocol import ClassificationInfo
    from clbench.registry import STRATEGIES

    info = ClassificationInfo(name="c", n_classes=30, classes_per_experience=(10,) * 3, input_shape=(3, 32, 32))
    x, y = torch.randn(2, 3, 32, 32), torch.zeros(2, dtype=torch.long)
    naive = STRATEGIES.get("naive")(info, "cpu", build_config("naive", "full", {"model": "resnet32"}))
    assert abs(_train_gflops(naive.model, x, y) - estimates.THROUGHPUT["resnet32"].train_gflops) < 0.005
    der = STRATEGIES.get("der")(info, "cpu", build_config("der", "full", {"model": "resnet18"})).model
    for t in (1, 2, 3):
        der.add_task(10)
        assert abs(_train_gflops(der, x, y) - (t + 2) * estimates.RESNET18_W64_FORWARD) < 0.01 * t
