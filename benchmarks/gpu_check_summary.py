"""Per-epoch timings and accuracies of the runs benchmarks/gpu_check.sh made, as one Markdown table per folder.

``python benchmarks/gpu_check_summary.py FOLDER... [--reference results/reference/quick]``: for each record under
``FOLDER/runs``: the device, steps, epochs per step, seconds of training per epoch (mean over steps of
``step_train_s[t] / epochs``; the first step apart, since it holds CUDA's start-up), and ``avg_inc_acc`` /
``last_acc``. With ``--reference``, the same seed's record there (same file name) is put beside each row, so a GPU
run's accuracy can be read against the CPU reference's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def epochs_per_step(config: dict) -> float:
    """Epochs of one step: ``epochs`` (DyTox's balanced fine-tuning epochs are not counted)."""
    return float(config.get("epochs", 1))


def pair(metrics: dict) -> str:
    """``avg_inc_acc / last_acc`` with two decimals; ``-`` where a metric is undefined (joint has one step)."""
    return " / ".join("-" if metrics.get(k) is None else f"{metrics[k]:.2f}" for k in ("avg_inc_acc", "last_acc"))


def rows(folder: Path, reference: Path | None) -> list[str]:
    out = []
    for path in sorted((folder / "runs").glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("status") != "finished":
            reason = (record.get("reason") or "").splitlines()[0] if record.get("reason") else ""
            out.append(f"| {path.stem} | {record.get('status')} | {reason} | | | | |")
            continue
        steps = record["step_train_s"]
        epochs = epochs_per_step(record["strategy_config"])
        first = steps[0] / epochs
        rest = sum(steps[1:]) / epochs / len(steps[1:]) if len(steps) > 1 else float("nan")
        metrics = record["metrics"]
        ref = ""
        if reference is not None and (reference / "runs" / path.name).is_file():
            ref = pair(json.loads((reference / "runs" / path.name).read_text())["metrics"])
        out.append(f"| {path.stem} | {record['env']['device']} | {len(steps)} x {epochs:g} | {first:.2f} | "
                   f"{rest:.3f} | {pair(metrics)} | {ref} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--reference", type=Path, help="a reference folder whose runs have the same file names")
    args = parser.parse_args()
    for folder in args.folders:
        print(f"\n### {folder}\n")
        print("| run | device | steps x epochs | s/epoch, step 1 | s/epoch, later steps (mean) | avg_inc / last "
              "| reference avg_inc / last |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(rows(folder, args.reference)))


if __name__ == "__main__":
    main()
