"""``clbench config NAME [--preset P]``: a strategy's resolved hyperparameters (defaults + preset)."""

from __future__ import annotations

import argparse
import dataclasses

from clbench.commands import Command
from clbench.config import build_config
from clbench.registry import COMMANDS


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a strategy name (`clbench list`)")
    p.add_argument("--preset", help="one of its presets (default: none, the Config's defaults)")


def run(args: argparse.Namespace) -> int:
    """Print ``field = value`` for every field of the strategy's Config."""
    config = build_config(args.name, args.preset)
    for field in dataclasses.fields(config):
        print(f"{field.name} = {getattr(config, field.name)!r}")
    return 0


COMMANDS.register("config")(Command("show a strategy's hyperparameters", _add_arguments, run))
