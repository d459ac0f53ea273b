"""Plots of a suite's records: accuracy-matrix heatmaps, accuracy-vs-step curves, parameters-vs-step.

Files go to ``<out_dir>/plots/``: ``<scenario>__<strategy>__matrix.png`` (seed-mean ``R``),
``<scenario>__accuracy.png`` (``A_i`` per strategy, mean over seeds) and ``<scenario>__params.png``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from clbench.metrics import seen_accuracy  # noqa: E402


def _group(records: list[dict]) -> dict[str, dict[str, list[dict]]]:
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["status"] != "finished":
            continue
        spec = r["spec"]
        groups[spec["scenario"].get("label") or spec["scenario"]["name"]][
            spec["strategy"].get("label") or spec["strategy"]["name"]].append(r)
    return groups


def plot(records: list[dict], out_dir: str | Path) -> list[Path]:
    """Write the plots for every finished record; returns the paths written."""
    folder = Path(out_dir) / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for scenario, by_strategy in _group(records).items():
        fig_acc, ax_acc = plt.subplots(figsize=(6, 4))
        fig_par, ax_par = plt.subplots(figsize=(6, 4))
        for strategy, runs in sorted(by_strategy.items()):
            R = np.mean([np.asarray(r["accuracy_matrix"]) for r in runs], axis=0)
            sizes = runs[0]["test_sizes"]
            if R.shape[0] == R.shape[1]:
                steps = np.arange(1, R.shape[0] + 1)
                ax_acc.plot(steps, [100 * seen_accuracy(R, sizes, i) for i in range(R.shape[0])], marker="o",
                            label=strategy)
                ax_par.plot(steps, [np.mean([r["params_per_step"][i]["total"] for r in runs]) / 1e6
                                    for i in range(R.shape[0])], marker="o", label=strategy)
            fig, ax = plt.subplots(figsize=(1 + 0.5 * R.shape[1], 1 + 0.5 * R.shape[0]))
            image = ax.imshow(100 * R, vmin=0, vmax=100, cmap="viridis")
            ax.set_xlabel("test experience j")
            ax.set_ylabel("after training step i")
            ax.set_title(f"{strategy}: R[i, j] (%)", fontsize=9)
            fig.colorbar(image, ax=ax)
            fig.tight_layout()
            written.append(folder / f"{scenario}__{strategy}__matrix.png")
            fig.savefig(written[-1], dpi=100)
            plt.close(fig)
        for fig, ax, name, ylabel in ((fig_acc, ax_acc, "accuracy", "accuracy on seen classes (%)"),
                                      (fig_par, ax_par, "params", "parameters (M)")):
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.set_title(scenario)
            ax.legend(fontsize=7)
            fig.tight_layout()
            written.append(folder / f"{scenario}__{name}.png")
            fig.savefig(written[-1], dpi=100)
            plt.close(fig)
    return written
