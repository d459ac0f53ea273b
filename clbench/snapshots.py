"""Model snapshots as a callback: the weights of a run's modules when its training ends, for analyses that read a
trained model (attention profiles, probes) without training it again.

``model_snapshot`` writes ``{module name: state_dict}`` of the strategy's ``modules()`` (tensors on the CPU) to
``<artifacts>/model.pt`` after the last training step (:meth:`ModelSnapshot.close`, in the run's own process; a
shard member's job writes nothing). Attach it like a logger: ``callbacks: [{name: model_snapshot}]`` in a suite
entry, or ``clbench.api.run(..., callbacks=["model_snapshot"], out=...)``; :func:`load_snapshot`
reads it back, checked to be the one the run of its record wrote (a run redone without the callback leaves none:
:mod:`clbench.replaced` moved the earlier artifacts aside).

It only watches (``observer``): adding it to a suite resumes the runs that already finished, without a snapshot,
and :func:`load_snapshot` says so for them. A strategy that keeps state beyond its modules' weights (a replay
memory, routing keys) saves it through ``save_state`` instead (:mod:`clbench.protocol`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from clbench import records
from clbench.callbacks import Callback, CallbackContext
from clbench.files import write_atomic
from clbench.registry import CALLBACKS

SNAPSHOT_FILE = "model.pt"


@CALLBACKS.register("model_snapshot")
class ModelSnapshot(Callback):
    """Saves ``{module name: state_dict}`` of the run's modules to ``<artifacts>/model.pt`` when training ends; an
    earlier attempt's file is removed when the run starts, so a file that is there belongs to the attempt that
    finished."""

    observer = True

    def setup(self, context: CallbackContext) -> None:
        super().setup(context)
        if context.artifacts is None:
            raise ValueError("model_snapshot: this run has no output folder; give the run one (out=...) or drop "
                             "the callback.")
        if not context.member:
            (context.artifacts / SNAPSHOT_FILE).unlink(missing_ok=True)

    def close(self) -> None:
        if self.context.member:
            return
        state = {name: {key: value.detach().cpu() for key, value in module.state_dict().items()}
                 for name, module in self.context.modules().items()}
        write_atomic(self.context.artifacts / SNAPSHOT_FILE, lambda tmp: torch.save(state, tmp))


def load_snapshot(artifacts: str | Path) -> dict[str, dict[str, Tensor]]:
    """``{module name: state_dict}`` saved by :class:`ModelSnapshot` in the run's artifacts folder
    ``<out>/artifacts/<run_id>``, checked to be the one the run of the record ``<out>/runs/<run_id>.json`` wrote
    (:func:`clbench.records.artifact`: the record is read and checked, the folder's owner file names it and holds the
    file's sha256; a snapshot an earlier run left, or one copied in since, raises
    :class:`~clbench.records.ForeignState`). A run without one raises :class:`FileNotFoundError` saying how to get it;
    so does a snapshot without its record."""
    folder = Path(artifacts)
    path = folder / SNAPSHOT_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no model snapshot. Attach the callback to the run (callbacks: [{{name: "
                                f"model_snapshot}}]) and run it again (a run that finished before the callback was "
                                f"added is resumed, not rerun: delete its record under runs/ first).")
    record = folder.resolve().parent.parent / "runs" / f"{folder.resolve().name}.json"
    if not record.exists():
        raise FileNotFoundError(f"{path}: no record {record} of the run that wrote it; a snapshot is read with its "
                                f"run's record (keep <out>/runs/ and <out>/artifacts/ together).")
    return torch.load(records.artifact(record, records.read(record), SNAPSHOT_FILE), weights_only=True)
