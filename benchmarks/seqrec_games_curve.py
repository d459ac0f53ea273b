"""NDCG@10 / HIT@10 on Amazon Games after every epoch of seqrec runs (non-private or private) and most_popular's, to
size the games presets (docs/seqrec.md). One torch thread; one JSON line per event (seconds per epoch included).

    CLBENCH_DATA=<root> python benchmarks/seqrec_games_curve.py [--holdout valid|test] \
        "LABEL,field=value,...,dp_epsilon=8" ...

``--holdout valid`` (the default): each user's second-to-last item is scored and the last is never read, so a budget
chosen on this curve is chosen on a validation split (issue 33: the test data is read once, at the end); ``test``
scores the last item (what the curves in docs/seqrec.md before 2026-11-27 used).

``field=value``: :class:`SeqRecConfig` fields (epochs, batch_size, lr, warmup, loss_positions, ...); ``dp_<arg>``:
the ``dp`` callback's arguments (epsilon, clip, clipping). A mid-run epoch is evaluated with the model as it is then:
under a warm-up/decay schedule that is not the model a shorter run would end with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
import typing

import torch

from clbench.callbacks import Callback, CallbackContext, CallbackSpec
from clbench.scenarios.recommendation import games_seqrec
from clbench.strategies.popularity import MostPopular, MostPopularConfig
from clbench.strategies.seqrec import SeqRecConfig, SequentialRecommender

DEVICE = torch.device("cpu")


def log(**fields) -> None:
    print(json.dumps({**fields, "time": time.strftime("%H:%M:%S")}), flush=True)


def evaluate(scenario, strategy) -> tuple[float, float, float]:
    start = time.time()
    scores = scenario.evaluator(strategy, scenario, 0, DEVICE)
    return scores.rows["ndcg@10"][0], scores.rows["hit@10"][0], time.time() - start


class EpochEval(Callback):
    """Evaluates the strategy after every ``steps_per_epoch`` optimizer steps."""

    def __init__(self, scenario, strategy, steps_per_epoch: int, label: str) -> None:
        self.scenario, self.strategy, self.per_epoch, self.label = scenario, strategy, steps_per_epoch, label
        self.steps, self.start = 0, time.time()

    def after_step(self, optimizer) -> None:
        self.steps += 1
        if self.steps % self.per_epoch:
            return
        train_s = time.time() - self.start
        self.strategy.model.eval()
        ndcg, hit, eval_s = evaluate(self.scenario, self.strategy)
        self.strategy.model.train()
        log(event="epoch", run=self.label, epoch=self.steps // self.per_epoch, ndcg=round(ndcg, 5), hit=round(hit, 5),
            train_s=round(train_s, 1), eval_s=round(eval_s, 1), lr=optimizer.param_groups[0]["lr"])
        self.start = time.time()


def parse(spec: str) -> tuple[str, dict, dict]:
    """``"LABEL,k=v,..."`` -> label, SeqRecConfig overrides (typed by the dataclass), dp arguments."""
    label, *pairs = spec.split(",")
    hints = typing.get_type_hints(SeqRecConfig)
    kinds = {f.name: next(t for t in (int, float, str) if t in (hints[f.name], *typing.get_args(hints[f.name])))
             for f in dataclasses.fields(SeqRecConfig)}
    config, dp = {}, {}
    for key, value in (pair.split("=", 1) for pair in pairs):
        if key.startswith("dp_"):
            dp[key[3:]] = value if key == "dp_clipping" else float(value)
        elif key in kinds:
            config[key] = kinds[key](value)
        else:
            raise SystemExit(f"{spec}: {key!r} is not a SeqRecConfig field ({', '.join(sorted(kinds))}) "
                             f"nor a dp_<argument>.")
    return label, config, dp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holdout", choices=("valid", "test"), default="valid")
    parser.add_argument("runs", nargs="+", help='"LABEL,field=value,...,dp_epsilon=8"')
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    scenario = games_seqrec(max_len=50, windows="last", holdout=args.holdout)
    train = scenario.train_stream[0]
    log(event="data", holdout=args.holdout, seconds=round(time.time() - start, 1), n_train=len(train.dataset),
        n_test=len(scenario.test_stream[0].dataset))
    popular = MostPopular(scenario.info, DEVICE, MostPopularConfig())
    popular.train(train)
    ndcg, hit, _ = evaluate(scenario, popular)
    log(event="most_popular", ndcg=round(ndcg, 5), hit=round(hit, 5))
    for spec in args.runs:
        label, config, dp = parse(spec)
        torch.manual_seed(0)
        strategy = SequentialRecommender(scenario.info, DEVICE, SeqRecConfig(**config))
        context = CallbackContext(run_id=label, modules=strategy.modules, n_train=len(train.dataset))
        strategy.callbacks.attach([CallbackSpec("dp", dp)] if dp else [], context)
        per_epoch = math.ceil(len(train.dataset) / strategy.config.batch_size)
        strategy.callbacks.callbacks.append(EpochEval(scenario, strategy, per_epoch, label))
        log(event="start", run=label, config=dataclasses.asdict(strategy.config), dp=dp)
        start = time.time()
        strategy.train(train)
        log(event="done", run=label, seconds=round(time.time() - start, 1),
            **(strategy.callbacks.extra_metrics() if dp else {}))


if __name__ == "__main__":
    main()
