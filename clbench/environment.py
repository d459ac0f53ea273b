"""Where a run happened: package versions, git commit, device, and a peak-memory probe."""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import os
import platform
import subprocess
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


def _rss_bytes() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
    """Peak memory used by the code inside the ``with`` block, in MB.

    On CUDA: ``torch.cuda.max_memory_allocated`` (reset on entry). On CPU: the peak resident set size sampled
    every ``interval`` seconds by a background thread, minus the resident size on entry (call
    :func:`release_freed_memory` before, so that memory freed earlier is not reused unseen).
    """

    def __init__(self, device: torch.device, interval: float = 0.02) -> None:
        self.device, self.interval = device, interval
        self.peak_mb = 0.0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._base = self._peak = _rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, _rss_bytes())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, _rss_bytes())
        self.peak_mb = (self._peak - self._base) / 2**20
