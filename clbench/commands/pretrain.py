"""``run_bench.py pretrain``: :func:`clbench.pretraining.pretrain` from the command line, the checkpoint saved for
``--init`` / ``init:``.

::

    # a ViT trained on CIFAR-100 classes 50-99 (experience 1 of a fixed-order 2-step split), for --init
    python run_bench.py pretrain --scenario split_cifar100 \\
        --scenario-args '{"n_experiences": 2, "class_order": "fixed"}' --experiences 1 \\
        --model-args '{"embed_dim": 128, "depth": 4, "num_heads": 4}' --epochs 4 --out checkpoints/vit128_c100_upper.pt

``--callbacks '[{"name": "hook_trace"}]'`` attaches callbacks as a suite entry does; their files go to
``<out>.artifacts/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clbench.callbacks import CallbackSpec
from clbench.commands import Command
from clbench.models.checkpoint import save_weights
from clbench.pretraining import Pretraining, pretrain
from clbench.registry import COMMANDS
from clbench.suite_file import parse_callbacks


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, help="a SCENARIOS name providing the source data")
    p.add_argument("--scenario-args", default="{}", help="JSON keyword arguments of the scenario")
    p.add_argument("--experiences", nargs="+", type=int, required=True,
                   help="training experiences used as the source (choose ones disjoint from your target)")
    p.add_argument("--model-args", default="{}", help="JSON keyword arguments of the 'vit' model")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--callbacks", default="[]", help="JSON list of callbacks ({name, args}) attached to training")
    p.add_argument("--out", required=True, help="checkpoint path (.pt or .safetensors)")


def run(args: argparse.Namespace) -> int:
    """Train a ``vit`` with cross-entropy (AdamW, one-cycle lr, scenario's train augmentation) on the chosen
    experiences and save it to ``--out`` with the arguments as metadata."""
    callbacks = [CallbackSpec(c["name"], c.get("args", {}))
                 for c in parse_callbacks("--callbacks", json.loads(args.callbacks))]
    setup = Pretraining(args.scenario, tuple(args.experiences), json.loads(args.scenario_args),
                        json.loads(args.model_args), args.epochs, args.batch_size, args.lr, args.weight_decay,
                        args.seed)
    out = Path(args.out)
    model, _ = pretrain(setup, callbacks, out.with_name(out.name + ".artifacts"),
                        report=lambda line: print(line, file=sys.stderr))
    meta = {"scenario": args.scenario, "scenario_args": args.scenario_args, "experiences": str(args.experiences),
            "model_args": args.model_args, "epochs": str(args.epochs)}
    print(save_weights(model, out, metadata=meta))
    return 0


COMMANDS.register("pretrain")(Command("train a ViT on a source dataset and save the checkpoint used by --init",
                                      _add_arguments, run))
