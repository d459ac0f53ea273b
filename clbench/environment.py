"""Where a run happened: package versions, git commit, device, and a peak-memory probe."""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import os
import platform
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("torch", "torchvision", "avalanche-lib", "continuum", "timm", "numpy", "opacus", "clbench")


def git_commit(cwd: str | Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``. Anything but ``cpu``, ``cuda[:N]`` with that GPU present
    or ``mps`` where available raises :class:`~clbench.errors.ConfigError` (the CLI checks it before any run)."""
    from clbench.errors import ConfigError

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {device!r} is not a device: use auto, cpu, cuda or cuda:N.")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device} was asked for but torch sees no CUDA device; use --device cpu or auto.")
    if resolved.type == "cuda" and (resolved.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s), numbered from 0.")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available here; use --device cpu or auto.")
    return resolved


def describe_machine(device: torch.device) -> str:
    """A one-line machine description for leaderboards, e.g. ``cpu: 2 cores (AMD EPYC ...)``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {os.cpu_count()} cores ({cpu_model()}), {torch.get_num_threads()} torch threads"


@functools.cache
def _software() -> dict:
    """Package versions, platform and git commit: fixed for the life of the process, so read once."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions,
            "git_commit": git_commit()}


def cpu_capability() -> str:
    """The instruction set torch's CPU kernels dispatch to (``torch.backends.cpu.get_cpu_capability()``: ``AVX512``,
    ``AVX2``, ``DEFAULT``, ...): one reason the same run gives other numbers on another host."""
    return torch.backends.cpu.get_cpu_capability()


def environment(device: torch.device) -> dict:
    """A record's ``env``: package versions, python, platform, git commit, the device, a one-line machine
    description, and the CPU (``cpu_model``, ``cpu_capability``: the kernels torch picks on it) whatever the device."""
    return {**_software(), "packages": dict(_software()["packages"]), "device": str(device),
            "machine": describe_machine(device), "cpu_model": cpu_model(), "cpu_capability": cpu_capability()}


def _statm_rss_bytes() -> int | None:
    """The resident set size now, from Linux's ``/proc/self/statm`` (None where there is none)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024
"""``ru_maxrss`` is in bytes on macOS, in kB elsewhere."""


def _reset_high_water_mark() -> bool:
    """Reset the kernel's peak RSS of this process (``VmHWM``) to its current RSS; False where Linux's
    ``/proc/self/clear_refs`` is not there or not writable."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_bytes(*keys: str) -> tuple[int, ...]:
    """``/proc/self/status`` fields (``VmHWM``, ``VmRSS``: kB) in bytes, read at one instant."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[k].split()[0]) * 1024 for k in keys)


_frozen = False


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``), so that the resident set
    size at the start of a run does not include what earlier runs in this process freed but malloc kept.

    The first call moves every object alive then (the imported libraries, before any run's data exists) to the
    collector's permanent generation (``gc.freeze``), so that later full collections scan only what runs created:
    0.35 s per run on the 2-core machine without it."""
    global _frozen
    gc.collect()
    if not _frozen:
        gc.freeze()
        atexit.register(gc.unfreeze)     # let interpreter shutdown collect them as usual
        _frozen = True
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory of one run in MB, the same whichever runs its process did before.

    ``peak_mb = max RSS during the run − RSS after it``: the most memory the run held at once above what stays in
    the process once the run's objects are freed (the interpreter, imported libraries, one-time initialisation of
    torch and the data loaders: a worker's first run pays for those, its later runs find them done, so a baseline
    taken at the start would charge them to whichever run comes first). Enter before the run builds anything; exit
    after its objects are gone (the runner exits in ``execute``, after ``_execute`` returned): the exit collects
    garbage and returns freed heap pages (:func:`release_freed_memory`) before reading the RSS. One-time costs a
    first run pays after its peak still lower its figure (they raise the RSS after it, not the peak): measured on
    the 2-core VM, split digits naive / replay read 3.5 / 2.8 MB as a process's first run and 3.4 / 3.7 MB as its
    second; a synthetic run whose peak is its data generation, overlapping the first imports, 10 MB first and 18 MB
    later (the baseline at the start read 17 MB first and 0.1-0.2 MB later on split digits).

    ``method`` says how the max RSS was found:

    - ``"vmhwm"`` (Linux): the kernel's high-water mark (``VmHWM`` of /proc/self/status), reset on entry by writing
      ``5`` to /proc/self/clear_refs: exact.
    - ``"sampled"`` (a Linux whose clear_refs is not writable): the RSS of /proc/self/statm sampled every
      ``interval`` seconds by a background thread; a peak shorter than the interval can be missed.
    - ``"process_peak"`` (no /proc: macOS, Windows): ``ru_maxrss``, the process's peak RSS since it started, which
      cannot be reset: an upper bound that includes the interpreter and earlier runs, not the run's own.
    - ``"cuda"``: ``torch.cuda.max_memory_allocated`` (reset on entry): device memory of tensors, which the caching
      allocator counts per allocation, so no baseline is needed.
    """

    def __init__(self, device: torch.device, interval: float = 0.02) -> None:
        self.device, self.interval = device, interval
        self.peak_mb = 0.0
        self.method = "cuda" if device.type == "cuda" else ""
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        release_freed_memory()
        if _reset_high_water_mark():
            self.method = "vmhwm"
        elif (rss := _statm_rss_bytes()) is not None:
            self.method, self._peak = "sampled", rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        else:
            self.method = "process_peak"
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, _statm_rss_bytes())

    def __exit__(self, *exc) -> None:
        if self.method == "cuda":
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        if self.method == "sampled":
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, _statm_rss_bytes())
        release_freed_memory()
        if self.method == "vmhwm":
            peak, after = _status_bytes("VmHWM", "VmRSS")
        elif self.method == "sampled":
            peak, after = self._peak, _statm_rss_bytes()
        else:
            import resource
            peak, after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_UNIT, 0
        self.peak_mb = (peak - after) / 2**20
