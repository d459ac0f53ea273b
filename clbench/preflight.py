"""The pre-flight of a suite: what every run would otherwise fail on, in each run, checked once before the first.

:func:`preflight` (``clbench run`` calls it once the output folder is known) checks

- the file size limit (``ulimit -f``): at least :data:`MIN_FILE_SIZE`;
- the run ids as file names: each makes ``runs/<run_id>.json`` (through a temporary ``.<run_id>.json.<pid>.tmp``),
  ``artifacts/<run_id>/`` and ``state/<run_id>/``, which must fit the output folder's file name limit;
- what the suite's callbacks need outside Python (:data:`NEEDS`, by callback name): ``dp`` a working opacus (an
  installed opacus that fails at import is caught here, not in each private run), ``tensorboard`` and ``wandb``
  their packages importable (:mod:`clbench.optional` keeps a missing or broken one from breaking other runs), and
  ``wandb`` with ``mode: online`` a W&B login (``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE`` or the netrc entry
  that ``wandb login`` writes).

Each problem is a :class:`~clbench.errors.ConfigError`: one line, exit code 2, nothing trained.
"""

from __future__ import annotations

import netrc
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from clbench import optional
from clbench.errors import ConfigError
from clbench.names import check_file_names

TEMPORARY_SUFFIX = len(".") + len(".json") + len(".4194304.tmp")
"""Bytes a record's temporary file adds to its run id (the largest Linux pid: 4194304)."""


def _dp(args: list[dict]) -> None:
    try:
        import opacus.accountants.utils  # noqa: F401 - the accountant private runs calibrate their noise with
    except Exception as exc:  # noqa: BLE001 - installed but broken is as fatal as missing, for every private run
        cause = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ConfigError(f"callback dp needs opacus (its accountant calibrates the noise), which cannot be imported "
                          f"({cause}); reinstall it (pip install --force-reinstall 'opacus>=1.5') or remove the dp "
                          f"entries.") from None


def _package(module: str, callback: str) -> Callable[[list[dict]], None]:
    def check(args: list[dict]) -> None:
        cause = optional.failure(module)
        if cause is not None:
            raise ConfigError(f"callback {callback} needs {module}, which cannot be imported ({cause}); pip install "
                              f"'clbench[{callback}]' or remove the {callback} entries.")
    return check


def _wandb(args: list[dict]) -> None:
    _package("wandb", "wandb")(args)
    if any(a.get("mode") == "online" for a in args) and not wandb_login():
        raise ConfigError("callback wandb with mode: online needs a W&B login, and none is set up (no WANDB_API_KEY, "
                          "no WANDB_IDENTITY_TOKEN_FILE, no netrc entry for the W&B host); run `wandb login`, or use "
                          "mode: offline (the default) and `wandb sync` later.")


def wandb_login() -> bool:
    """Whether W&B finds credentials without asking: its environment variables or the netrc entry of its host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


NEEDS: dict[str, Callable[[list[dict]], None]] = {
    "dp": _dp,
    "tensorboard": _package("torch.utils.tensorboard", "tensorboard"),
    "wandb": _wandb,
}
"""Callback name -> ``check(args of each entry that uses it)``, raising :class:`ConfigError` when it cannot work."""


MIN_FILE_SIZE = 1 << 20
"""The smallest file size limit (``ulimit -f``) a suite runs under: its largest files besides saved states are the
plots (330 KB for the quick suite's accuracy plot in results/reference/quick/plots)."""


def check_file_size_limit() -> None:
    """Refuse a file size limit (``RLIMIT_FSIZE``) under :data:`MIN_FILE_SIZE`: every run would train and then fail
    to write its plots or records (``OSError`` 27, "File too large") after the suite's work is done."""
    try:
        import resource
    except ImportError:         # not on this platform: no such limit
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY and soft < MIN_FILE_SIZE:
        raise ConfigError(f"the file size limit of this shell is {soft:,} bytes (ulimit -f), under the "
                          f"{MIN_FILE_SIZE:,} bytes that clbench's plots and records need (saved states need more): "
                          f"raise it (ulimit -f unlimited) and run again.")


GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")
"""The device files a Linux machine has when torch can see a GPU (NVIDIA, ROCm, WSL): without any of them, ``--device
cuda`` is refused before torch is imported."""


def check_gpu_present(device: str) -> None:
    """Refuse ``--device cuda[:N]`` on a Linux machine without any of :data:`GPU_DEVICE_FILES` (torch would see no
    CUDA device), before torch is imported; elsewhere, and with a GPU, ``resolve_device`` decides after the import."""
    import glob

    if device.split(":")[0] == "cuda" and sys.platform.startswith("linux") and \
            not any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES):
        files = ", ".join(GPU_DEVICE_FILES)
        raise ConfigError(f"--device {device} was asked for but this machine has no GPU (no {files}), so torch "
                          f"sees no CUDA device; use --device cpu or auto.")


def check_output_links(out: Path) -> None:
    """Refuse an output folder whose ``runs/``, ``artifacts/``, ``state/`` or ``replaced/`` is a symbolic link
    (:func:`clbench.replaced.refuse_links`, the same line as the executor's), before torch is imported: a run (and
    ``--force``'s moving aside) would write wherever the link points. Checked before the folder's write test, which
    would otherwise write through the link."""
    from clbench.replaced import refuse_links

    refuse_links(out)


def refuse_missing_checkpoints(missing: dict[str, list[str]]) -> None:
    """One :class:`ConfigError` line naming each checkpoint file of ``missing`` (path -> who reads it, in order)
    and the first of its readers, when there is any."""
    if missing:
        listed = "; ".join(f"{path}, read by {users[0]}" + (f" and {len(users) - 1} more" if len(users) > 1 else "")
                           for path, users in missing.items())
        raise ConfigError(f"checkpoint file(s) not found: {listed}. Create them with `python run_bench.py pretrain` "
                          f"(the commands are in docs/petl.md and docs/tangent.md) or set init / --init to a local "
                          f"file.")


def check_suite_checkpoints(suite: str, scenarios: list[str] | None, strategies: list[str] | None,
                            init: str | None) -> None:
    """The checkpoint files that the entries of the suite file ``suite`` (as ``--scenario``/``--strategy`` select
    them) name in their args (``init``, ``model_args.init``, with ``{scenario}`` replaced by each scenario's name),
    refused when missing, before the suite's modules are imported (:func:`refuse_missing_checkpoints`). An ``init``
    that ``--init`` replaces is not read. A file this reading cannot make sense of is left to the loader, which
    refuses it with its own line; a preset's checkpoints are checked after the imports (``check_checkpoints``)."""
    from clbench.config import checkpoint_paths

    spec = _selected(suite, scenarios, strategies)
    if spec is None:
        return
    missing: dict[str, list[str]] = {}
    for strategy in spec.strategies:
        args = {k: v for k, v in strategy.args.items() if not (init and k == "init")}
        for scenario in spec.scenarios:
            for field, path in checkpoint_paths(args, scenario.name).items():
                if not Path(path).is_file():
                    missing.setdefault(path, []).append(f"{strategy.key} ({field}) on {scenario.key}")
    refuse_missing_checkpoints(missing)


def _selected(suite: str, scenarios: list[str] | None, strategies: list[str] | None, seeds: list[int] | None = None,
              strict: bool = False):
    """The entries of the suite file ``suite`` as ``--scenario``/``--strategy`` select them (a SuiteSpec, its args
    unchecked), read without importing their modules; None for a file this reading cannot make sense of (the loader
    refuses it with its own line), and for a selection :meth:`~clbench.specs.SuiteSpec.select` refuses unless
    ``strict`` (then its :class:`ConfigError` is raised)."""
    from clbench.specs import ScenarioEntry, StrategyEntry, SuiteSpec
    from clbench.suite_file import read_yaml, resolve_suite_path

    try:
        data = read_yaml(resolve_suite_path(suite))
        entries = [[{"name": e} if isinstance(e, str) else e for e in data[kind]] for kind in ("scenarios",
                                                                                              "strategies")]
        spec = SuiteSpec(str(data["suite"]), tuple(ScenarioEntry(e["name"], dict(e.get("args") or {}),
                                                                 e.get("label", "")) for e in entries[0]),
                         tuple(StrategyEntry(e["name"], dict(e.get("args") or {}), e.get("label", ""))
                               for e in entries[1]))
    except (ConfigError, TypeError, KeyError, AttributeError, ValueError):
        return None
    try:
        return spec.select(scenarios, strategies, seeds)
    except ConfigError:
        if strict:
            raise
        return None


def check_selection(suite: str, scenarios: list[str] | None, strategies: list[str] | None,
                    seeds: list[int] | None) -> None:
    """``--scenario``, ``--strategy`` and ``--seeds`` refused as :meth:`clbench.specs.SuiteSpec.select` refuses them
    (a word no entry of the suite is keyed or named by, a seed out of range), before the suite's imports (``--strategy
    naiv`` on a suite that the index cannot check whole, e.g. ``quick``, was refused after them). Call it once the file
    has passed :func:`clbench.suite_file.check_without_imports`."""
    _selected(suite, scenarios, strategies, seeds, strict=True)


def check_suite_datasets(suite: str, scenarios: list[str] | None) -> None:
    """The dataset files that the selected scenario entries of the suite file ``suite`` read (the datasets the
    registries' index records for each scenario: :func:`clbench.recorded.dataset_record`), looked for under the
    data roots (the entry's ``data_root``, ``--data-root``, ``$CLBENCH_DATA``, the system roots) before the suite's
    modules are imported: a dataset found under none is one :class:`ConfigError` line naming it, the roots searched
    and the fix; with ``--download`` a downloadable one is left to the run, which fetches it. A scenario the index
    does not record (a plugin's, or after its module changed) is left to its run."""
    from clbench.plugins import record
    from clbench.suite_file import check_without_imports

    check_without_imports(suite)        # a wrong file or value first: the loader's line, as without the data
    spec = _selected(suite, scenarios, None)
    for entry in spec.scenarios if spec is not None else ():
        found = record("scenario", entry.name)
        if found is not None and "data_check" in found:
            _data_check(entry, found)
        for dataset in (found or {}).get("datasets", ()):
            from clbench.data.roots import ENV_VAR, download_enabled, download_root, search_roots

            data_root = entry.args.get("data_root")
            if not isinstance(data_root, (str, type(None))) or dataset["download"] and download_enabled():
                continue
            roots = search_roots(data_root)
            if any(all((root / layout["folder"] / name).exists() or layout["gzip_ok"] and
                       (root / layout["folder"] / f"{name}.gz").exists() for name in layout["files"])
                   for root in roots for layout in dataset["layouts"]):
                continue
            expected = " or ".join(f"{layout['folder']}/{{{', '.join(layout['files'])}}}"
                                   for layout in dataset["layouts"])
            fetch = (f", or rerun with --download (fetches it into {download_root(data_root)})"
                     if dataset["download"] else f" (no automatic download: {dataset['how_to_get']})")
            raise ConfigError(f"dataset {dataset['name']!r} of scenario {entry.key} not found under the data roots "
                              f"{', '.join(map(str, roots))} (expected {expected}); set {ENV_VAR}=<a root holding "
                              f"it> or pass --data-root <root>{fetch}.")


def _data_check(entry: Any, found: dict) -> None:
    """The scenario's recorded ``data_check`` (``"module:function"``, a torch-free function of its arguments:
    :func:`clbench.recorded.scenario_record`) called with the entry's arguments over the recorded defaults; what it
    refuses (a missing dataset, a ``ValueError`` with the fix) is one :class:`ConfigError` line naming the entry."""
    import importlib

    from clbench.data.errors import DatasetNotFound

    module, _, function = found["data_check"].partition(":")
    defaults = {p["name"]: p["default"] for p in found["signature"]["params"] if "default" in p}
    try:
        getattr(importlib.import_module(module), function)(**{**defaults, **entry.args})
    except (DatasetNotFound, ValueError, OSError) as exc:
        raise ConfigError(f"scenario {entry.key}: {exc}") from None


def preflight(specs: Iterable, out: Path) -> None:
    """Check, once, what each of ``specs`` (RunSpecs) would fail on in each run (module docstring)."""
    specs = list(specs)
    check_file_size_limit()
    check_file_names(out / "runs", [s.run_id for s in specs], "run id", TEMPORARY_SUFFIX)
    uses: dict[str, list[dict]] = {}
    for spec in specs:
        for callback in spec.strategy.callbacks:
            uses.setdefault(callback["name"], []).append(dict(callback.get("args") or {}))
    for name, args in sorted(uses.items()):
        if name in NEEDS:
            NEEDS[name](args)


__all__ = ["GPU_DEVICE_FILES", "NEEDS", "check_file_size_limit", "check_gpu_present", "check_output_links",
           "check_selection", "check_suite_checkpoints", "check_suite_datasets", "preflight",
           "refuse_missing_checkpoints", "wandb_login"]
