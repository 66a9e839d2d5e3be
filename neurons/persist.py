"""A node's own files: tensors (safetensors) and JSON, written atomically so a crash never leaves half a file."""
from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch

from dso.atomic import atomic_write


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    atomic_write(Path(path), safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()}, metadata))


def load_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    """The node's own file (never another party's); None when absent or unreadable."""
    try:
        return safetensors.torch.load(Path(path).read_bytes())
    except (OSError, ValueError, RuntimeError):
        return None


def save_json(path: Path, obj: dict) -> None:
    atomic_write(Path(path), json.dumps(obj, indent=1, sort_keys=True).encode())


def load_json(path: Path) -> dict | None:
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None
