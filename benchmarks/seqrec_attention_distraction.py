"""Attention distraction on Amazon Games (Ding et al., Figure 10): how much attention the scored query (each test
user's last position) puts on rare items, for seqrec models trained with and without privacy.

Each spec trains one model (the product's strategy and ``dp`` callback, seed 0, vanilla attention) and then reads its
attention rows on ``--users`` test windows: for block ``b`` and the last position ``i = L - 1``,
``α_ij = softmax_j(⟨q̃_i, k_j⟩)`` over the keys ``j`` it may see (recomputed from the block's ``q``/``k`` layers on
the block's input, as ``clbench.privacy.reattention.CausalSelfAttention`` computes it). Keys are grouped by their
item's training frequency ``c_j`` (number of training windows containing the item: buckets ``1-5``, ``6-20``,
``21-100``, ``> 100``); the script prints per block the mean attention mass per bucket, the buckets' share of the
keys (what uniform attention would give) and the mean entropy ``-Σ_j α_ij log α_ij`` of the rows. The paper's
claim: DP noise makes rare items' keys noisy and attention drifts to them ("distraction"), which Re-Attention undoes.

    CLBENCH_DATA=<root> python benchmarks/seqrec_attention_distraction.py \\
        "nonprivate,epochs=3,warmup=0.2,batch_size=2048,lr=0.008,loss_positions=1" \\
        "eps8,epochs=3,warmup=0.2,batch_size=2048,lr=0.008,loss_positions=1,dp_epsilon=8,dp_clipping=automatic"

(the specs' syntax is benchmarks/seqrec_games_curve.py's). With ``--runs`` it trains nothing and reads the models a
suite trained, from the final weights its ``model_snapshot`` callback kept (clbench/snapshots.py), each rebuilt with
its record's hyperparameters; the label printed is the run id::

    CLBENCH_DATA=<root> python benchmarks/seqrec_attention_distraction.py --runs \\
        results/reference/dp_seqrec_games_every/artifacts/games__dp_eps8_vanilla__s0 ...

For a Re-Attention model the rows are the plain softmax of its scores, before the correction divides each by
``exp(C σ_i² / 2)``: the distraction the correction is there to take back.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from clbench import records
from clbench.callbacks import CallbackContext, CallbackSpec
from clbench.cl.data import experience_tensors
from clbench.runner import record_path
from clbench.scenarios.recommendation import games_seqrec
from clbench.snapshots import load_snapshot
from clbench.specs import RunSpec
from clbench.strategies.seqrec import SeqRecConfig, SequentialRecommender, item_counts

sys.path.insert(0, str(Path(__file__).parent))
from seqrec_games_curve import parse  # noqa: E402  (the curve script's spec syntax)

BUCKETS = ((1, 5), (6, 20), (21, 100), (101, 10**9))
SCENARIO = ("games_seqrec", {"max_len": 50, "windows": "last"})
"""The scenario (name, arguments) the models are read on: Games, each user's latest 50 items."""
USERS = 4000


def attention_rows(model, x: torch.Tensor) -> list[torch.Tensor]:
    """Per block, ``(B, H, L)``: the last position's attention over the keys (0 where it may not look)."""
    inputs: list[tuple[torch.Tensor, torch.Tensor]] = []       # every block's attention input (x, pad)
    hooks = [block.attn.register_forward_pre_hook(lambda _m, args: inputs.append((args[0], args[1])))
             for block in model.blocks]
    with torch.no_grad():
        model.hidden(x)
    for h in hooks:
        h.remove()
    rows = []
    for block, (a, pad) in zip(model.blocks, inputs):
        attn = block.attn
        q = attn._split(attn.q(a))[:, :, -1:] / math.sqrt(attn.head_dim)           # (B, H, 1, d_h)
        k = attn._split(attn.k(a))                                                 # (B, H, L, d_h)
        scores = (q @ k.transpose(-1, -2)).squeeze(2)                              # (B, H, L)
        allowed = ~pad[:, None, :]
        allowed[..., -1] = True                                                   # a query always sees itself
        rows.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1))
    return rows


@torch.no_grad()
def profile(model, x: torch.Tensor, counts: torch.Tensor) -> list[dict]:
    """Per block: attention mass and key share per frequency bucket, mean row entropy (nats)."""
    key_counts = counts[x]                                          # (B, L); padding: count 0
    out = []
    for b, rows in enumerate(attention_rows(model, x)):
        present = x > 0
        row = {"block": b, "entropy": float(-(rows * rows.clamp_min(1e-30).log()).sum(-1).mean())}
        for low, high in BUCKETS:
            in_bucket = present & (key_counts >= low) & (key_counts <= high)
            row[f"mass_{low}-{high}"] = float((rows * in_bucket[:, None, :]).sum(-1).mean())
            row[f"keys_{low}-{high}"] = float((in_bucket.sum(-1) / present.sum(-1).clamp_min(1)).mean())
        out.append(row)
    return out


def trained(specs: list[tuple[str, dict, dict]], scenario, train):
    """``(label, model, train_s)`` for each parsed spec ``(label, config, dp)``, trained here (seed 0)."""
    for label, config, dp in specs:
        torch.manual_seed(0)
        strategy = SequentialRecommender(scenario.info, torch.device("cpu"), SeqRecConfig(**config))
        context = CallbackContext(run_id=label, modules=strategy.modules, n_train=len(train.dataset))
        strategy.callbacks.attach([CallbackSpec("dp", dp)] if dp else [], context)
        start = time.time()
        strategy.train(train)
        yield label, strategy.model, round(time.time() - start, 1)


def recorded(folders: list[str], scenario, expected: tuple[str, dict] = SCENARIO):
    """``(run id, model, None)`` for each run's artifacts folder ``<out>/artifacts/<run_id>``: the model rebuilt
    from its record ``<out>/runs/<run_id>.json`` and loaded with its snapshot; a run of another scenario than
    ``expected`` (name, arguments) is refused."""
    for folder in map(Path, folders):
        spec = RunSpec.from_dict(records.read(record_path(folder.parents[1], folder.name))["spec"])
        if (spec.scenario.name, spec.scenario.args) != expected:
            raise SystemExit(f"{folder.name}: scenario {spec.scenario.name} {spec.scenario.args}; this script reads "
                             f"{expected[0]} {expected[1]}.")
        strategy = SequentialRecommender(scenario.info, torch.device("cpu"), spec.config())
        state = load_snapshot(folder)
        for name, module in strategy.modules().items():
            module.load_state_dict(state[name])
        yield folder.name, strategy.model, None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", help='train these, seed 0: "LABEL,field=value,...,dp_epsilon=8"')
    parser.add_argument("--runs", nargs="+", default=[], metavar="ARTIFACTS",
                        help="read these suite runs instead: <out>/artifacts/<run_id> folders with a model snapshot")
    args = parser.parse_args(argv)
    if bool(args.specs) == bool(args.runs):
        parser.error("give specs to train or --runs to read (one of the two)")
    specs = [parse(spec) for spec in args.specs]                  # a malformed spec fails before the data loads
    torch.set_num_threads(1)
    scenario = games_seqrec(**SCENARIO[1])
    train = scenario.train_stream[0]
    x_train, _ = experience_tensors(train)
    counts = item_counts(x_train, scenario.info.extra["n_items"])
    x_test, _ = experience_tensors(scenario.test_stream[0])
    x_test = x_test[:USERS]
    models = recorded(args.runs, scenario) if args.runs else trained(specs, scenario, train)
    for label, model, train_s in models:
        model.eval()
        for row in profile(model, x_test, counts):
            print(json.dumps({"run": label, "train_s": train_s,
                              **{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}}), flush=True)


if __name__ == "__main__":
    main()
