"""On-disk store of training patterns for the dual-form analysis: ``.npy`` chunks (memory-mapped to read), a budget.

Layout of a store folder (everything in it counts against ``budget_bytes``; the store refuses to allocate past it)::

    manifest.json                 layers, dtype, policy, chunk list, counts, ``complete`` (False if a run stopped)
    steps_000.npy ...             one structured row per optimizer step (:data:`STEP_FIELDS`, one column per param)
    <layer>/w0.npy, b0.npy        W_0 and b_0 (parameter dtype), taken before the first recorded step
    <layer>/x_000.npy ...         keys x_t: (rows, d_in), ``dtype``, each row divided by its scale
    <layer>/g_000.npy ...         raw output gradients ∂L/∂y_t: (rows, d_out), ``dtype``, each row divided by its scale
    <layer>/meta_000.npy ...      int32 (rows, 5): step, experience, sample, label, token
    <layer>/scale_000.npy ...     float32 (rows, 2): scales of x_t and g_t (powers of two; 1 for float32/float64)

float16 rows are scaled by a power of two ``2^⌈log2 max|row|⌉`` before rounding, so values lie in [-1, 1] and the
error of every stored element is at most ``2^-12 · scale`` (no underflow of the 1/B-sized gradients). Chunks are
preallocated at ``chunk_rows`` rows (less when the budget is short) and the last one of each layer is cut to its
used rows on :meth:`PatternWriter.close`.

Subsampling policy (chosen before training, :func:`choose_fraction`): a fraction ``f`` of every minibatch's samples
is kept, drawn from a seeded generator; the number kept so far is always ``⌊f · samples seen⌋`` (error diffusion, so
the count is exact and the byte need is known from the planned number of samples). ``f = 1`` keeps everything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
META_COLUMNS = ("step", "experience", "sample", "label", "token")
MANIFEST_RESERVE = 64 * 1024          # bytes kept free for manifest.json
NPY_HEADER = 128                      # bytes of a .npy header (numpy pads it to 64-byte multiples; 128 here)
STEP_CHUNK = 512                      # rows per steps_*.npy chunk
FLOAT16_UNIT = 2.0 ** -12             # max |error| of a float16 element in units of its row scale


class StoreBudgetError(RuntimeError):
    """The pattern store cannot stay within its byte budget (raised before writing past it)."""


def step_dtype(n_params: int) -> np.dtype:
    """One step: its index, experience, patterns kept, and per recorded parameter the SGD hyperparameters used and
    whether the parameter was updated (``active``) and whether its momentum buffer was (re)created (``fresh``)."""
    return np.dtype([("step", "i4"), ("experience", "i4"), ("kept", "i4"), ("lr", "f8", (n_params,)),
                     ("momentum", "f8", (n_params,)), ("dampening", "f8", (n_params,)),
                     ("nesterov", "?", (n_params,)), ("active", "?", (n_params,)), ("fresh", "?", (n_params,))])


@dataclass(frozen=True)
class LayerShape:
    d_in: int
    d_out: int
    bias: bool

    def row_bytes(self, itemsize: int) -> int:
        """Bytes one stored pattern of this layer takes: x, g, metadata and scales."""
        return (self.d_in + self.d_out) * itemsize + 4 * len(META_COLUMNS) + 4 * 2


def pattern_bytes(shapes: dict[str, LayerShape], dtype: str) -> int:
    """Bytes per kept sample over all layers (one pattern per layer per sample)."""
    return sum(s.row_bytes(np.dtype(DTYPES[dtype]).itemsize) for s in shapes.values())


def fixed_bytes(shapes: dict[str, LayerShape], param_itemsize: int, steps: int) -> int:
    """Bytes of W_0/b_0, the step table for ``steps`` steps (in whole chunks) and the manifest reserve."""
    n_params = sum(1 + s.bias for s in shapes.values())
    w0 = sum(NPY_HEADER + s.d_in * s.d_out * param_itemsize + (NPY_HEADER + s.d_out * param_itemsize) * s.bias
             for s in shapes.values())
    chunks = max(1, math.ceil(steps / STEP_CHUNK))
    return w0 + chunks * (NPY_HEADER + STEP_CHUNK * step_dtype(n_params).itemsize) + MANIFEST_RESERVE


def choose_fraction(shapes: dict[str, LayerShape], dtype: str, budget_bytes: int, planned_samples: int,
                    planned_steps: int, param_itemsize: int, chunk_rows: int, fraction: float | str) -> float:
    """The kept fraction of samples: ``fraction`` if a number (checked against the plan), or for ``"auto"`` the
    largest one (rounded down to 1e-4) whose patterns fit the budget. Raises :class:`StoreBudgetError` with the
    numbers when the plan does not fit (one pattern per layer per sample; chunk slack of one chunk per layer)."""
    per_sample = pattern_bytes(shapes, dtype) + len(shapes) * 4 * NPY_HEADER / chunk_rows   # + chunk headers
    slack = sum(min(chunk_rows, planned_samples) * s.row_bytes(np.dtype(DTYPES[dtype]).itemsize) + 4 * NPY_HEADER
                for s in shapes.values())
    room = budget_bytes - fixed_bytes(shapes, param_itemsize, planned_steps) - slack
    fits = max(0.0, math.floor(1e4 * room / (per_sample * planned_samples)) / 1e4) if room > 0 else 0.0
    if fraction == "auto":
        if fits <= 0:
            raise StoreBudgetError(
                f"dual_form: budget_bytes={budget_bytes} cannot hold even the fixed part of the store (W_0, step "
                f"table, one chunk per layer: {budget_bytes - room} bytes); raise budget_bytes or lower chunk_rows.")
        return min(1.0, fits)
    if float(fraction) > fits:
        need = fixed_bytes(shapes, param_itemsize, planned_steps) + slack + per_sample * planned_samples * fraction
        raise StoreBudgetError(
            f"dual_form: keeping fraction={fraction} of {planned_samples} planned samples needs about {int(need)} "
            f"bytes ({per_sample} per sample over the recorded layers) but budget_bytes={budget_bytes}; set "
            f"fraction <= {fits} (or 'auto') or raise budget_bytes.")
    return float(fraction)


class Allocator:
    """Counts the bytes of every file the store creates; refuses a file that would pass the budget."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.used = MANIFEST_RESERVE

    def take(self, nbytes: int, what: str) -> None:
        if self.used + nbytes > self.budget:
            raise StoreBudgetError(
                f"dual_form: the pattern store reached budget_bytes={self.budget} ({self.used} bytes used) when "
                f"allocating {what}; nothing past this point was recorded. Give planned_samples so that the kept "
                f"fraction is chosen before training, or raise budget_bytes.")
        self.used += nbytes

    def give_back(self, nbytes: int) -> None:
        self.used -= nbytes


class _Chunked:
    """Append-only rows in preallocated ``<prefix>_NNN.npy`` files of one dtype and row shape. Rows are written
    through the file (``write`` at the next offset: one copy, no page fault per 4 KiB as with a writable memmap);
    readers memory-map the files."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, row_shape: tuple[int, ...], chunk_rows: int,
                 allocator: Allocator) -> None:
        self.folder, self.prefix, self.dtype, self.row_shape = folder, prefix, np.dtype(dtype), row_shape
        self.chunk_rows, self.allocator = chunk_rows, allocator
        self.files: list[dict] = []          # {"file", "rows"}
        self.handle = None                   # the open last chunk
        self.capacity = 0

    def _row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.row_shape)

    def _new_chunk(self, rows_wanted: int) -> None:
        self._close_handle()
        rows = max(self.chunk_rows, rows_wanted)
        room = (self.allocator.budget - self.allocator.used - NPY_HEADER) // self._row_bytes()
        rows = min(rows, max(room, rows_wanted))       # a short budget gives a short chunk; too short raises below
        path = self.folder / f"{self.prefix}_{len(self.files):03d}.npy"
        self.allocator.take(NPY_HEADER + rows * self._row_bytes(), str(path.name))
        array = np.lib.format.open_memmap(path, mode="w+", dtype=self.dtype, shape=(rows, *self.row_shape))
        offset = array.offset
        del array
        self.handle = open(path, "r+b")  # noqa: SIM115 - kept open across appends, closed by close()
        self.handle.seek(offset)
        self.capacity = rows
        self.files.append({"file": path.name, "rows": 0})

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        start = 0
        while start < len(values):
            if self.handle is None or self.files[-1]["rows"] == self.capacity:
                self._new_chunk(len(values) - start)
            used = self.files[-1]["rows"]
            n = min(len(values) - start, self.capacity - used)
            self.handle.write(values[start: start + n].data)
            self.files[-1]["rows"] = used + n
            start += n

    def flush(self) -> None:
        if self.handle is not None:
            self.handle.flush()

    def _close_handle(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def close(self) -> None:
        """Close, and cut the last chunk to its used rows (giving the freed bytes back to the budget)."""
        if self.handle is None:
            return
        self._close_handle()
        used = self.files[-1]["rows"]
        if used < self.capacity:
            path = self.folder / self.files[-1]["file"]
            part = np.array(np.load(path, mmap_mode="r")[:used])
            np.save(path, part)
            self.allocator.give_back((self.capacity - used) * self._row_bytes())


class PatternWriter:
    """Writes a store (see the module docstring); the recorder is its only user."""

    def __init__(self, folder: Path, shapes: dict[str, LayerShape], params: list[str], dtype: str,
                 budget_bytes: int, chunk_rows: int, policy: dict) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dual_form: dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
        self.folder, self.shapes, self.params, self.dtype, self.policy = folder, shapes, params, dtype, policy
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            raise FileExistsError(f"dual_form: storage folder {folder} is not empty; give an empty or new folder.")
        self.allocator = Allocator(budget_bytes)
        self.np_dtype = np.dtype(DTYPES[dtype])
        self.steps = _Chunked(folder, "steps", step_dtype(len(params)), (), STEP_CHUNK, self.allocator)
        self.columns: dict[str, dict[str, _Chunked]] = {}
        for name, s in shapes.items():
            (folder / name).mkdir()
            self.columns[name] = {
                "x": _Chunked(folder / name, "x", self.np_dtype, (s.d_in,), chunk_rows, self.allocator),
                "g": _Chunked(folder / name, "g", self.np_dtype, (s.d_out,), chunk_rows, self.allocator),
                "meta": _Chunked(folder / name, "meta", np.int32, (len(META_COLUMNS),), chunk_rows, self.allocator),
                "scale": _Chunked(folder / name, "scale", np.float32, (2,), chunk_rows, self.allocator)}
        self.counts = {name: 0 for name in shapes}
        self.samples_seen = 0
        self.complete = False

    def save_initial(self, name: str, weight: np.ndarray, bias: np.ndarray | None) -> None:
        for array, file in ((weight, "w0.npy"), (bias, "b0.npy")):
            if array is not None:
                self.allocator.take(NPY_HEADER + array.nbytes, f"{name}/{file}")
                np.save(self.folder / name / file, array)

    def _scaled(self, rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Rows in the storage dtype and their scales (powers of two for float16, ones otherwise); done in torch,
        whose float16 conversion is vectorized (numpy's is several times slower)."""
        if self.dtype != "float16":
            return rows.to(TORCH_DTYPES[self.dtype]).cpu().numpy(), np.ones(len(rows), np.float32)
        rows = rows.float()
        peak = rows.abs().amax(dim=1)
        scale = torch.exp2(torch.ceil(torch.log2(torch.where(peak > 0, peak, torch.ones_like(peak)))))
        return (rows / scale[:, None]).half().cpu().numpy(), scale.cpu().numpy()

    def append(self, name: str, x: torch.Tensor, g: torch.Tensor, meta: np.ndarray) -> None:
        """Patterns of one layer: ``x (n, d_in)``, ``g (n, d_out)`` (tensors), ``meta (n, 5)`` int."""
        x_stored, x_scale = self._scaled(x)
        g_stored, g_scale = self._scaled(g)
        cols = self.columns[name]
        cols["x"].append(x_stored)
        cols["g"].append(g_stored)
        cols["meta"].append(meta.astype(np.int32))
        cols["scale"].append(np.stack([x_scale, g_scale], axis=1))
        self.counts[name] += len(x)

    def append_step(self, row: np.ndarray) -> None:
        self.steps.append(row)

    def manifest(self) -> dict:
        return {"dtype": self.dtype, "budget_bytes": self.allocator.budget, "policy": self.policy,
                "params": self.params, "complete": self.complete, "samples_seen": self.samples_seen,
                "steps": sum(f["rows"] for f in self.steps.files), "step_chunks": self.steps.files,
                "layers": {name: {"d_in": s.d_in, "d_out": s.d_out, "bias": s.bias, "patterns": self.counts[name],
                                  "chunks": self._chunk_list(name)} for name, s in self.shapes.items()}}

    def _chunk_list(self, name: str) -> list[dict]:
        cols = self.columns[name]
        whole = min(len(c.files) for c in cols.values())      # a failed allocation can leave one column ahead
        return [{"rows": min(c.files[i]["rows"] for c in cols.values()),
                 **{col: c.files[i]["file"] for col, c in cols.items()}} for i in range(whole)]

    def write_manifest(self) -> None:
        text = json.dumps(self.manifest(), indent=1)
        if len(text) > MANIFEST_RESERVE:
            raise StoreBudgetError("dual_form: manifest larger than its reserve; use fewer, larger chunks.")
        tmp = self.folder / ".manifest.json.tmp"
        tmp.write_text(text)
        tmp.replace(self.folder / "manifest.json")

    def flush(self) -> None:
        """Write the manifest of what is on disk so far (chunks stay open)."""
        for cols in self.columns.values():
            for column in cols.values():
                column.flush()
        self.steps.flush()
        self.write_manifest()

    def close(self, complete: bool) -> None:
        self.complete = complete
        for cols in self.columns.values():
            for column in cols.values():
                column.close()
        self.steps.close()
        self.write_manifest()


class PatternStore:
    """Reads a store written by :class:`PatternWriter` (memory-mapped; nothing loaded until asked)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        path = self.folder / "manifest.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no dual-form pattern store here (a recorder writes manifest.json).")
        self.manifest = json.loads(path.read_text())
        self.params: list[str] = self.manifest["params"]
        self.layers: dict[str, dict] = self.manifest["layers"]

    @property
    def fraction(self) -> float:
        return float(self.manifest["policy"]["fraction"])

    @property
    def full(self) -> bool:
        """True when every pattern of every step was kept and the recording completed."""
        return self.fraction == 1.0 and bool(self.manifest["complete"])

    def steps(self) -> np.ndarray:
        parts = [np.load(self.folder / f["file"], mmap_mode="r")[: f["rows"]] for f in self.manifest["step_chunks"]]
        return np.concatenate(parts) if parts else np.zeros(0, step_dtype(len(self.params)))

    def initial(self, layer: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``(W_0, b_0)`` (b_0 None without bias)."""
        self._check(layer)
        b0 = self.folder / layer / "b0.npy"
        return np.load(self.folder / layer / "w0.npy"), (np.load(b0) if b0.exists() else None)

    def chunks(self, layer: str):
        """Yields ``(x, g, meta, scale)`` per chunk: ``x (n, d_in)`` and ``g (n, d_out)`` as stored (divided by
        their row scales), ``meta (n, 5)`` int32 (:data:`META_COLUMNS`), ``scale (n, 2)`` float32."""
        self._check(layer)
        for c in self.layers[layer]["chunks"]:
            rows = c["rows"]
            yield tuple(np.load(self.folder / layer / c[k], mmap_mode="r")[:rows] for k in ("x", "g", "meta", "scale"))

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())

    def _check(self, layer: str) -> None:
        if layer not in self.layers:
            raise KeyError(f"layer {layer!r} was not recorded; recorded layers: {', '.join(self.layers)}.")


__all__ = ["DTYPES", "FLOAT16_UNIT", "META_COLUMNS", "LayerShape", "PatternStore", "PatternWriter",
           "StoreBudgetError", "choose_fraction", "pattern_bytes"]
