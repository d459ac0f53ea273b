"""``*_full`` rows at their own full settings, checked on CPU at reduced data (3 x 32 x 32 Gaussian-cluster images):
the row's model, optimizer, learning rate, batch size and method settings kept, a few epochs."""

import importlib.resources

import pytest
import yaml

from clbench import api

IMAGES = {"n_classes": 4, "n_experiences": 2, "train_per_class": 32, "test_per_class": 4, "image_size": 32,
          "channels": 3, "separation": 6.0}


def _row(suite: str, name: str) -> dict:
    text = importlib.resources.files("clbench").joinpath(f"suites/{suite}.yaml").read_text()
    return next(e for e in yaml.safe_load(text)["strategies"] if e["name"] == name)


@pytest.mark.parametrize("name", ["der_dark"])
def test_a_cifar100_full_row_trains_two_steps_without_diverging(name):
    """Finished (a non-finite loss fails the run), the loss falls within each step, and the second step does not
    start far above the first (DER++ at the shared SGD 0.1 / momentum 0.9 started step 2 at 24 against 1.9)."""
    entry = _row("cifar100_full", name)
    args = {**entry.get("args", {}), "epochs": 3}
    if "mem_size" in args:
        args["mem_size"] = 16
    record = api.run("synthetic", name, preset=entry["preset"], args=args, scenario_args=IMAGES, seed=0, device="cpu")
    assert record.status == "finished", record.reason
    first, second = record.adequacy
    assert first["loss_last"] < first["loss_first"] and second["loss_last"] < second["loss_first"]
    assert second["loss_first"] < 2 * first["loss_first"], (first, second)
