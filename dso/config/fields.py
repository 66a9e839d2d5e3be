"""What every configuration section shares: the error, the documented field and the common checks."""
from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the key."""


def doc(text: str, **kw: Any) -> Any:
    """A dataclass field with its help text (``--help`` shows it)."""
    return field(metadata={"doc": text}, **kw)


def positive(obj: Any, prefix: str, *names: str) -> None:
    """Raise :class:`ConfigError` naming the first of ``names`` whose value on ``obj`` is not > 0."""
    for name in names:
        if not getattr(obj, name) > 0:
            key = f"{prefix}.{name}" if prefix else name
            raise ConfigError(f"{key}: must be > 0, got {getattr(obj, name)!r}")


def expand(path: str) -> Path:
    return Path(path).expanduser()
