"""Checkpoints on local disk (safetensors or torch ``state_dict`` files); nothing is fetched from a hub."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)


def save_weights(model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Write ``model.state_dict()`` to ``path`` (``.safetensors`` or anything else for ``torch.save``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file
        save_file(state, str(tmp), metadata=metadata)
    else:
        torch.save({"state_dict": state, "metadata": metadata or {}}, tmp)
    tmp.replace(path)
    return path


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist. Create one with `python run_bench.py pretrain` "
                                f"or pass the path of a local .safetensors/.pt file.")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    blob = torch.load(path, map_location="cpu", weights_only=True)
    return blob.get("state_dict", blob) if isinstance(blob, dict) else blob


def load_weights(model: nn.Module, path: str | Path, strict_backbone: bool = True) -> list[str]:
    """Load matching tensors from ``path`` into ``model``; returns the names skipped because their shapes differ,
    which may only be the classification head's (``head.*``: a head of another width). With ``strict_backbone``, a
    backbone tensor that is missing or of another shape (a checkpoint of another width or depth) raises, naming the
    file: skipping it would train that tensor from scratch while the run says ``init``."""
    state = read_state_dict(path)
    own = model.state_dict()
    skipped = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    usable = {k: v for k, v in state.items() if k in own and k not in skipped}
    missing = [k for k in own if k not in usable and k not in skipped]
    other_shape = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in skipped if not k.startswith("head")]
    if strict_backbone and other_shape:
        raise ValueError(f"checkpoint {path} does not fit this model: {len(other_shape)} backbone tensor(s) of another "
                         f"shape, e.g. {other_shape[0]} (checkpoint vs model). Was it saved from a model of the same "
                         f"width and depth?")
    if strict_backbone and [k for k in missing if not k.startswith("head")]:
        raise ValueError(f"checkpoint {path} does not fit this model: missing {missing[:5]}... "
                         f"Was it saved from a model of the same architecture?")
    model.load_state_dict(usable, strict=False)
    if skipped:
        log.info("checkpoint %s: skipped %s (shape differs)", path, skipped)
    return skipped
