"""Reading a :class:`dso.config.schema.Config`: dataclass defaults < a profile (``--profile NAME``:
``configs/NAME.toml``)
< a JSON/TOML file (``--config``) < dotted CLI flags (``--hparams.topk 16``); a file or flag's value is checked
against the field's declared type, and an unknown key or a wrong type is a :class:`~dso.config.schema.ConfigError`
naming the key.

What a config holds and how it validates is :mod:`dso.config.schema`; this module only fills one in.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dso.config.schema import Config, ConfigError, HParams, ModelConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The protocol's named variants, one TOML file each (``configs/default.toml`` is the default).
PROFILES = Path(__file__).resolve().parents[2] / "configs"
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check (and for CLI strings, convert) one leaf value against its declared type."""
    origin = typing.get_origin(typ)
    if origin is Literal:
        choices = typing.get_args(typ)
        if value not in choices:
            raise ConfigError(f"{key}: must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out = float(value)
        elif isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        else:
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if out != out or out in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}: must be finite, got {value!r}")
        return out
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {typ}")  # pragma: no cover


def _leaf_types(cls: DataclassInstance | type[DataclassInstance], prefix: str = "") -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        typ = hints[f.name]
        if dataclasses.is_dataclass(typ):
            out.update(_leaf_types(typ, key + "."))
        else:
            out[key] = (typ, f)
    return out


def _apply(obj: Any, data: dict[str, Any], prefix: str = "") -> None:
    """Merge a nested dict into a dataclass instance, rejecting unknown keys."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a table/object")
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for name, value in sorted(data.items(), key=lambda kv: kv[0] != "preset"):  # a preset first
        key = f"{prefix}{name}"
        if name not in names:
            raise ConfigError(f"{key}: unknown key")
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            _apply(getattr(obj, name), value, key + ".")
        else:
            setattr(obj, name, _coerce(key, value, typ))
            if name == "preset" and isinstance(obj, ModelConfig):
                obj.apply_preset()


def set_key(cfg: Config | HParams, key: str, value: Any) -> None:
    """Set one dotted key, e.g. ``set_key(cfg, 'hparams.topk', 16)`` (or ``set_key(hp, 'topk', 16)``)."""
    parts = key.split(".")
    nested: dict[str, Any] = {}
    cur = nested
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    _apply(cfg, nested)


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.toml"))


def profile_data(name: str) -> dict[str, Any]:
    """A profile's values: only ``[hparams]`` (a profile is a protocol variant, not one node's settings)."""
    if not PROFILE_NAME.fullmatch(name) or not (PROFILES / f"{name}.toml").is_file():
        raise ConfigError(f"profile {name!r}: no such profile; one of {', '.join(profile_names())}")
    data: dict[str, Any] = load_file(PROFILES / f"{name}.toml")
    others = sorted(set(data) - {"hparams"})
    if others:
        raise ConfigError(f"profile {name!r}: only [hparams] belongs in a profile, not {others}")
    return data


def profile_settings(name: str) -> dict[str, Any]:
    """A profile's hyper-parameters as dotted keys (``{"outer.rule": "signed", ...}``)."""
    def flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in d.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out
    return flat(profile_data(name).get("hparams", {}))


def use_profile(hp: HParams, name: str) -> HParams:
    """``hp`` with a profile's values, checked as a config file's are; returns it."""
    _apply(hp, profile_data(name).get("hparams", {}), "hparams.")
    return hp


def set_hparams(cfg: Config, items: list[str]) -> None:
    """Apply command-line ``hparams.KEY=VALUE`` items (``--set``) in order; a malformed item is a ConfigError."""
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("hparams."):
            raise ConfigError(f"--set {item!r}: expected hparams.KEY=VALUE")
        set_key(cfg, key, value)


def load_file(path: str | Path) -> Any:
    """The file's JSON or TOML value (JSON need not be an object: :func:`from_dict` / ``_apply`` check)."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read ({e.strerror})") from None
    try:
        if path.suffix == ".toml":
            return tomllib.loads(text.decode())
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path}: not valid {path.suffix.lstrip('.') or 'JSON'} ({e})") from None


def from_dict(data: dict[str, Any]) -> Config:
    cfg = Config()
    _apply(cfg, data)
    return cfg.validate()


def build_parser(description: str = "") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--profile", default="default", metavar="NAME",
                        help=f"the protocol variant, configs/NAME.toml: one of {', '.join(profile_names())}; "
                             "--config and the flags below override it")
    parser.add_argument("--config", metavar="FILE", help="JSON or TOML file with any of the keys below")
    parser.add_argument("--print-config", action="store_true", help="print the effective config and exit")
    defaults = Config()
    for key, (typ, f) in _leaf_types(Config).items():
        cur: Any = defaults
        for p in key.split("."):
            cur = getattr(cur, p)
        choices = typing.get_args(typ) if typing.get_origin(typ) is Literal else None
        parser.add_argument(f"--{key}", dest=f"cfg:{key}", default=None, metavar=typ.__name__.upper()
                            if isinstance(typ, type) else "CHOICE",
                            help=f"{f.metadata.get('doc', '')} (default: {cur!r})"
                            + (f"; one of {', '.join(map(str, choices))}" if choices else ""))
    return parser


def parse_args(argv: list[str] | None = None, description: str = "",
               parser: argparse.ArgumentParser | None = None) -> tuple[Config, argparse.Namespace]:
    """Parse CLI flags into a validated Config; exits with a message on any error."""
    parser = parser or build_parser(description)
    ns = parser.parse_args(argv)
    try:
        cfg = Config()
        use_profile(cfg.hparams, ns.profile)
        if ns.config:
            _apply(cfg, load_file(ns.config))
        for dest, value in vars(ns).items():
            if dest.startswith("cfg:") and value is not None:
                set_key(cfg, dest[4:], value)
        cfg.validate()
    except ConfigError as e:
        parser.exit(2, f"{parser.prog}: config error: {e}\n")
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        parser.exit(0)
    return cfg, ns
