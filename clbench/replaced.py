"""A run's earlier outputs kept aside before the run writes its own, and no write through a link in a results folder.

A run writes three things into its results folder ``<out>``: its record ``runs/<run_id>.json``, its callbacks'
``artifacts/<run_id>/`` and its saved state ``state/<run_id>/``. When any of them is already there (a rerun with
another configuration, by other code, after a failure, with ``--force``, or the leftovers of an interrupted attempt),
:func:`set_aside` moves all of them, as they are, to ``<out>/replaced/<stamp>__<run_id>/`` under the same relative
paths: that folder is itself a results folder (``clbench leaderboard <out>/replaced/<stamp>__<run_id>`` reads it; a
saved state still belongs to its record), nothing is lost, and the new run starts from empty folders (an old
``model.pt`` cannot pass for the new run's). The readers of ``<out>`` (leaderboard, report, resume, analyses) read
``runs/*.json`` only, never ``replaced/``.

A results folder whose ``runs/``, ``artifacts/``, ``state/`` or ``replaced/`` is a symbolic link would have a run
write (or move the earlier outputs) wherever the link points, outside the folder: :func:`refuse_links` refuses it in
one line naming the link, before the run. A link in a run's own place (``artifacts/<run_id>`` pointing elsewhere) is
moved aside as the link itself (``os.rename`` never follows it): nothing is written through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from clbench.errors import OutputError
from clbench.files import writing

REPLACED = "replaced"
"""The folder of ``<out>`` that holds the outputs set aside, one ``<stamp>__<run_id>`` folder per run replaced."""
FOLDERS = ("runs", "artifacts", "state", REPLACED)
"""The folders of ``<out>`` a run writes into (or moves into): none may be a link."""


PARTS = {"record": "runs/{run_id}.json", "artifacts": "artifacts/{run_id}", "state": "state/{run_id}"}
"""What a run writes, named as the console says it: the path relative to the results folder."""


@dataclass(frozen=True)
class SetAside:
    """What :func:`set_aside` moved for the run ``run_id`` (names of :data:`PARTS`) and the folder it went to."""

    run_id: str
    moved: tuple[str, ...]
    folder: Path

    def line(self) -> str:
        """One console line saying what was replaced and where it is kept."""
        return f"replacing {self.run_id}: its earlier {', '.join(self.moved)} kept in {self.folder}"


def refuse_links(out_dir: str | Path) -> None:
    """Refuse (:class:`~clbench.errors.OutputError`, one line naming the link and its target) a results folder one of
    whose :data:`FOLDERS` is a symbolic link."""
    for name in FOLDERS:
        link = Path(out_dir) / name
        if link.is_symlink():
            raise OutputError(f"{link} is a symbolic link (to {os.readlink(link)}): a run writes only inside its "
                              f"results folder {out_dir}; replace the link by a folder, or pass another --out.")


def set_aside(out_dir: str | Path, run_id: str) -> SetAside | None:
    """Move what the run ``run_id`` wrote before (the :data:`PARTS` that exist, links included: moved, not followed)
    to a new ``<out_dir>/replaced/<stamp>__<run_id>/`` (stamp: UTC time to the second; ``-2``, ``-3``... after it when
    taken), under the same relative paths; ``None`` when there was nothing. Refuses links first
    (:func:`refuse_links`)."""
    out = Path(out_dir)
    refuse_links(out)
    found = {name: part.format(run_id=run_id) for name, part in PARTS.items()
             if os.path.lexists(out / part.format(run_id=run_id))}
    if not found:
        return None
    base = out / REPLACED / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}__{run_id}"
    with writing(base):
        base.parent.mkdir(parents=True, exist_ok=True)
        folder, n = base, 1
        while os.path.lexists(folder):
            n += 1
            folder = base.with_name(f"{base.name}-{n}")
        for path in found.values():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            os.rename(out / path, folder / path)
    return SetAside(run_id, tuple(found), folder)


__all__ = ["FOLDERS", "PARTS", "REPLACED", "SetAside", "refuse_links", "set_aside"]
