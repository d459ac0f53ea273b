"""Errors whose messages tell the user what to do."""

from __future__ import annotations


class NonFiniteLossError(RuntimeError):
    """A training loss or prediction became NaN/inf; the run is marked failed and the suite continues."""

    def __init__(self, where: str, value: float) -> None:
        super().__init__(f"non-finite value ({value}) in {where}. Lower the learning rate, enable gradient "
                         f"clipping, or check the inputs; the run was marked failed and the suite went on.")
