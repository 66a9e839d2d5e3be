"""A node's own files: tensors (safetensors) and JSON, written atomically so a crash never leaves half a file.

Reading them back never raises on a damaged file (docs/protocol.md, "Files a node keeps"): the
``load_*`` functions return None — for a file that is absent, silently; for one that exists but is
damaged (truncated, not safetensors/JSON, nested absurdly deep), with a warning naming the file and
why.  The caller decides what None means: the miner starts with an empty error-feedback buffer, the
validator skips that saved folder.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from dso.util.atomic import atomic_write

log = logging.getLogger("dso.files")


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    atomic_write(Path(path), safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()}, metadata))


def _damaged(path: Path, what: str, error: BaseException) -> None:
    log.warning("%s %s is damaged and is not used: %s: %s", what, path, type(error).__name__, str(error)[:200])


def load_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    """The node's own file (never another party's); None when absent or damaged (logged)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        _damaged(Path(path), "tensor file", e)
        return None
    try:
        return safetensors.torch.load(data)
    except (safetensors.SafetensorError, ValueError, RuntimeError, OverflowError) as e:
        _damaged(Path(path), "tensor file", e)
        return None


def save_json(path: Path, obj: dict[str, Any]) -> None:
    atomic_write(Path(path), json.dumps(obj, indent=1, sort_keys=True).encode())


def load_json(path: Path) -> dict[str, Any] | None:
    """A JSON object the node wrote; None when absent or damaged (logged)."""
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        _damaged(Path(path), "JSON file", e)
        return None
    if not isinstance(obj, dict):
        _damaged(Path(path), "JSON file", ValueError("top level is not an object"))
        return None
    return obj
