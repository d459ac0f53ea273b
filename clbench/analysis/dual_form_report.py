"""The dual-form report of a run recorded with the ``dual_form`` callback (``run_bench.py analyze dual-form``,
:mod:`clbench.commands.analyze`, loads the run and calls :func:`write_report`).

Test queries (the first ``queries`` test samples of every test experience) are passed through the model saved
after the last experience; the input of each recorded layer is the query of that layer. Written to ``out``::

    accuracy.csv                 test accuracy on every test experience after every training experience
    interference.csv             per query experience and outcome: mean attention mass Σ_t α_t on every training
                                 experience and the share on the other experiences (the paper's quantity), then the
                                 mean contribution of every training experience to the predicted logit and the
                                 contribution shares (signed and positive-part; attribution.py)
    attention_by_class.csv       per query experience, true label and outcome: mean attention mass and mean
                                 contribution to the predicted logit, per training experience and label
    misclassified_attention.csv  misclassified queries of the first experience, per true label: the predicted label,
                                 the later experiences' class with the largest attention mass (mean over the
                                 queries) and its share of the later experiences' mass; beside it the class
                                 contributing most to the predicted logit and its share of the positive
                                 class-level contributions
    top_patterns.csv             the most attended training patterns of example queries (``examples``)
    attention_over_time.csv      cumulative attention mass of first-experience queries, per layer and training
                                 experience, by step (mean query)
    per_class_attention.png      attention mass (left) and contribution (right) per training class for the example
                                 queries
    attention_over_time.png      the cumulative attention mass curves
    summary.json                 the headline numbers

Attention and contributions are sums over the kept patterns: with a kept fraction f < 1 (see the store's manifest,
``kept_fraction`` in every CSV) sums are about f times the full ones, ratios (shares) are estimates of the full ones.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import torch
from torch import nn

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from clbench.analysis.attribution import Attribution, attention_over_steps, attribute  # noqa: E402
from clbench.analysis.store import PatternStore  # noqa: E402
from clbench.errors import ConfigError  # noqa: E402
from clbench.specs import RunSpec  # noqa: E402

FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# names of the shared labels per training experience, for reports (scenario name, args "mode") -> per experience
CLASS_NAMES = {("mnist_fmnist", "domain"): (tuple(str(d) for d in range(10)), FASHION)}


@dataclass
class Attributed:
    """The queries of every test experience with the attribution of their predicted logit."""

    queries: list[dict]                             # per test experience: inputs, logits, labels, logit_layers
    results: list[tuple[Attribution, np.ndarray]]   # per test experience: (attribution, predicted labels)
    names: list[list[str]]                          # per training experience: label -> class name
    n_exp: int
    n_lab: int
    fraction: float                                 # the store's kept fraction f


def _names(spec: RunSpec, n_exp: int, n_lab: int) -> list[list[str]]:
    known = CLASS_NAMES.get((spec.scenario.name, spec.scenario.args.get("mode")))
    return [list(known[e]) if known and e < len(known) else [str(c) for c in range(n_lab)] for e in range(n_exp)]


def _layer(root: nn.Module, name: str) -> nn.Module:
    head, _, rest = name.partition(".")
    for path in (rest, name):
        try:
            return root.get_submodule(path)
        except AttributeError:
            continue
    raise ConfigError(f"recorded layer {name!r} is not in the saved model.")


def _queries(model: nn.Module, layers: list[str], scenario, per_experience: int):
    """Per test experience: the recorded layers' inputs, logits, labels (first ``per_experience`` samples)."""
    modules = {name: _layer(model, name) for name in layers}
    out = []
    model.eval()
    for experience in scenario.test_stream:
        dataset = experience.dataset.eval()
        n = min(per_experience, len(dataset))
        x = torch.stack([dataset[i][0] for i in range(n)])
        y = np.array([int(dataset[i][1]) for i in range(n)])
        seen: dict[str, torch.Tensor] = {}
        hooks = [m.register_forward_hook(lambda mod, i, o, name=name, seen=seen: seen.update({name: i[0],
                                                                                              name + ">": o}))
                 for name, m in modules.items()]
        with torch.no_grad():
            logits = model(x)
        for h in hooks:
            h.remove()
        inputs = {name: seen[name].reshape(n, -1).double().numpy() for name in layers}
        logit_layers = [name for name in layers if torch.equal(seen[name + ">"], logits)]
        out.append({"inputs": inputs, "logits": logits.numpy(), "labels": y, "logit_layers": logit_layers})
    return out


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def write_report(record: dict, spec: RunSpec, scenario, model: nn.Module, store: PatternStore, out: Path,
                 queries: int, examples: int, top_k: int, source: str) -> dict:
    """Write the files of the module docstring for the run ``record`` (``spec``, its rebuilt ``scenario``, its
    ``model`` after the last experience, its pattern ``store``) into ``out``; returns the summary. ``queries`` test
    samples per experience, ``examples`` misclassified queries plotted, ``top_k`` patterns per query; ``source``
    names the run in errors."""
    n_exp = len(scenario.train_stream)
    layers = list(store.layers)
    found = _queries(model, layers, scenario, queries)
    logit_layer = found[0]["logit_layers"][-1] if found[0]["logit_layers"] else None
    if logit_layer is None:
        raise ConfigError(f"{source}: none of the recorded layers {layers} produces the model's logits; record the "
                          f"output layer to attribute predictions.")
    f = store.fraction
    summary: dict = {"run_id": record["run_id"], "kept_fraction": f, "complete": store.manifest["complete"],
                     "patterns_per_layer": {n: store.layers[n]["patterns"] for n in layers},
                     "samples_seen": store.manifest["samples_seen"], "logit_layer": logit_layer}
    summary["accuracy_percent"] = _accuracy(record.get("accuracy_matrix") or [], n_exp, out)
    results = []
    for q in found:
        pred = q["logits"].argmax(1)
        results.append((attribute(store, logit_layer, q["inputs"][logit_layer], pred, top_k=top_k), pred))
    n_lab = results[0][0].contribution.shape[2] - 1
    attributed = Attributed(found, results, _names(spec, n_exp, n_lab), n_exp, n_lab, f)
    summary["interference"] = _interference(attributed, out)
    summary["misclassified_first_experience"] = _misclassified(attributed, out)
    _examples(attributed, examples, logit_layer, out)
    _attention_over_time(store, layers, found[0], f, n_exp, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    return summary


def _accuracy(matrix: list[list[float]], n_exp: int, out: Path) -> list[list[float]]:
    """accuracy.csv: the record's accuracy after each phase, in percent."""
    _write_csv(out / "accuracy.csv", ["after_experience", *[f"test_experience_{j}" for j in range(n_exp)]],
               [[i, *[round(100 * v, 2) for v in row]] for i, row in enumerate(matrix)])
    return [[round(100 * v, 2) for v in row] for row in matrix]


def _interference(a: Attributed, out: Path) -> list[dict]:
    """interference.csv and attention_by_class.csv: attention mass and contributions per query experience and
    outcome, then per true label and training class."""
    n_exp, n_lab, f = a.n_exp, a.n_lab, a.fraction
    rows, class_rows = [], []
    for j, ((result, pred), q) in enumerate(zip(a.results, a.queries)):
        own = np.full(len(pred), j)
        share, positive, mass_share = (result.interference(own), result.positive_interference(own),
                                       result.attention_share(own))
        per_exp, mass = result.by_experience(), result.by_experience("attention")
        for outcome, mask in (("correct", pred == q["labels"]), ("misclassified", pred != q["labels"]),
                              ("all", np.ones(len(pred), bool))):
            if not mask.any():
                continue
            rows.append([j, outcome, int(mask.sum()), *np.round(mass[mask].mean(0), 4),
                         round(float(mass_share[mask].mean()), 4), *np.round(per_exp[mask].mean(0), 6),
                         round(float(np.median(share[mask])), 4), round(float(share[mask].mean()), 4),
                         round(float(positive[mask].mean()), 4), f])
        for label in range(n_lab):
            for outcome, mask in (("correct", pred == q["labels"]), ("misclassified", pred != q["labels"])):
                mask = mask & (q["labels"] == label)
                if not mask.any():
                    continue
                for e in range(n_exp):
                    for c in range(n_lab):
                        class_rows.append([j, label, outcome, int(mask.sum()), e, c, a.names[e][c],
                                           round(float(result.attention[mask, e, c].mean()), 4),
                                           round(float(result.contribution[mask, e, c].mean()), 6), f])
    _write_csv(out / "interference.csv", ["query_experience", "outcome", "n",
                                          *[f"attention_from_exp{e}" for e in range(n_exp)],
                                          "mean_attention_share_other_experiences",
                                          *[f"contribution_from_exp{e}" for e in range(n_exp)],
                                          "median_interference_share", "mean_interference_share",
                                          "mean_positive_interference_share", "kept_fraction"],
               rows)
    _write_csv(out / "attention_by_class.csv", ["query_experience", "true_label", "outcome", "n", "train_experience",
                                                "train_label", "train_class", "mean_attention", "mean_contribution",
                                                "kept_fraction"], class_rows)
    return [dict(zip(["query_experience", "outcome", "n"], r[:3])) | {
        "attention_by_experience": r[3:3 + n_exp], "attention_share_other_experiences": r[3 + n_exp],
        "contribution_median_share": r[-4], "contribution_mean_share": r[-3],
        "contribution_mean_positive_share": r[-2]} for r in rows]


def _misclassified(a: Attributed, out: Path) -> list[dict]:
    """misclassified_attention.csv: which classes of later experiences pull the misclassified queries of the first
    experience."""
    n_exp, n_lab, names = a.n_exp, a.n_lab, a.names
    result, pred = a.results[0]
    labels = a.queries[0]["labels"]
    wrong = pred != labels
    mis_rows = []
    if n_exp > 1:
        for label in range(n_lab):
            mask = wrong & (labels == label)
            if not mask.any():
                continue
            att = result.attention[mask, :, :n_lab].mean(0)                   # (E, C) mean over the queries
            later_att = att[1:]
            ea, ca = np.unravel_index(later_att.argmax(), later_att.shape)
            cells = result.contribution[mask, :, :n_lab].mean(0)
            later = cells[1:]
            e, c = np.unravel_index(later.argmax(), later.shape)
            predicted = np.bincount(pred[mask], minlength=n_lab)
            mis_rows.append([label, int(mask.sum()), int(predicted.argmax()),
                             names[1][int(predicted.argmax())] if n_exp > 1 else "",
                             int(ea) + 1, int(ca), names[int(ea) + 1][int(ca)], round(float(later_att[ea, ca]), 4),
                             round(float(later_att[ea, ca] / later_att.sum()), 4),
                             round(float(later_att.sum() / att.sum()), 4),
                             names[int(e) + 1][int(c)], round(float(later[e, c]), 4),
                             round(float(later[e, c] / np.maximum(cells, 0).sum()), 4), a.fraction])
    _write_csv(out / "misclassified_attention.csv",
               ["true_label", "n_misclassified", "most_predicted_label", "most_predicted_as_exp1_class",
                "top_experience", "top_class_label", "top_class_by_attention_mass", "top_class_mean_attention",
                "top_class_share_of_later_attention", "later_experiences_share_of_attention",
                "top_class_by_contribution", "top_class_mean_contribution",
                "top_class_share_of_positive_class_contributions", "kept_fraction"], mis_rows)
    return [dict(zip(
        ["true_label", "n", "predicted", "predicted_as", "pulled_by_experience", "pulled_by_label",
         "pulled_by_class_attention_mass", "attention_mass", "share_of_later_attention",
         "later_share_of_attention", "pulled_by_class_contribution", "contribution", "share_of_positive_contribution"],
        r[:13])) for r in mis_rows]


def _examples(a: Attributed, count: int, logit_layer: str, out: Path) -> None:
    """top_patterns.csv and per_class_attention.png for the first ``count`` misclassified first-experience
    queries."""
    n_exp, n_lab, names, f = a.n_exp, a.n_lab, a.names, a.fraction
    result, pred = a.results[0]
    labels = a.queries[0]["labels"]
    examples = np.flatnonzero(pred != labels)[:count]
    top_rows = [[int(q), rank, round(float(result.top_alpha[q, rank]), 4), *[int(v) for v in result.top_meta[q, rank]]]
                for q in examples for rank in range(result.top_alpha.shape[1])]
    _write_csv(out / "top_patterns.csv", ["query", "rank", "alpha", "step", "experience", "sample", "label", "token"],
               top_rows)
    if not len(examples):
        return
    fig, axes = plt.subplots(len(examples), 2, figsize=(16, 2.4 * len(examples)), squeeze=False)
    ticks = [f"{names[e][c]}" for e in range(n_exp) for c in range(n_lab)]
    colors = [f"C{e}" for e in range(n_exp) for _ in range(n_lab)]
    for row, q in zip(axes, examples):
        for ax, kind, ylabel in ((row[0], "attention", "attention mass Σ α"),
                                 (row[1], "contribution", "contribution to the logit")):
            values = getattr(result, kind)[q, :, :n_lab].reshape(-1)
            ax.bar(range(len(values)), values, color=colors)
            ax.set_xticks(range(len(values)), ticks, rotation=60, fontsize=7)
            ax.axhline(0, color="k", lw=0.5)
            ax.set_ylabel(ylabel, fontsize=8)
        row[0].set_title(f"test experience 0, query {q}: true {names[0][labels[q]]}, predicted label {pred[q]} "
                         f"(= {names[0][pred[q]]} / {names[1][pred[q]] if n_exp > 1 else ''}); colour = "
                         f"training experience", fontsize=8)
    fig.suptitle(f"Attention mass of each training class's patterns (left) and their contribution to the "
                 f"predicted logit (right) ({logit_layer}; kept fraction {f:g})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "per_class_attention.png", dpi=110)
    plt.close(fig)


def _attention_over_time(store: PatternStore, layers: list[str], first: dict, f: float, n_exp: int,
                         out: Path) -> None:
    """attention_over_time.csv/.png: the cumulative attention mass of the first experience's queries over training
    time, every layer."""
    steps = store.steps()
    boundaries = np.flatnonzero(np.diff(steps["experience"])) + 1
    time_rows = []
    fig, axes = plt.subplots(1, len(layers), figsize=(4.2 * len(layers), 3.4), squeeze=False)
    for ax, name in zip(axes[0], layers):
        mass = np.cumsum(attention_over_steps(store, name, first["inputs"][name]), axis=0)
        for e in range(mass.shape[1]):
            ax.plot(steps["step"], mass[:, e], label=f"patterns of experience {e}", color=f"C{e}")
        for b in boundaries:
            ax.axvline(b, color="grey", ls="--", lw=0.8)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("cumulative Σ α (mean query)")
        stride = max(1, len(steps) // 200)
        time_rows += [[name, int(s), *np.round(mass[s], 4), f] for s in range(0, len(steps), stride)]
        time_rows.append([name, len(steps) - 1, *np.round(mass[-1], 4), f])
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Attention mass of {len(first['labels'])} test queries of experience 0 on the training "
                 f"patterns, by experience (kept fraction {f:g})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "attention_over_time.png", dpi=110)
    plt.close(fig)
    _write_csv(out / "attention_over_time.csv", ["layer", "step", *[f"cumulative_attention_exp{e}"
                                                                    for e in range(n_exp)], "kept_fraction"],
               time_rows)


__all__ = ["CLASS_NAMES", "write_report"]
