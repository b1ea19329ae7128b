"""Typed ``section.key=value`` overrides and dict loading for :class:`RunConfig`.

Types come from the dataclass annotations, so a new config field is overridable from
the CLI (``--set model.hidden_size=128``) and loadable from JSON with no extra code.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, get_args, get_origin

from plelab.config.schema import SECTIONS, RunConfig
from plelab.errors import ConfigError

_NONE_WORDS = {"none", "null"}
_TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE_WORDS = {"false", "0", "no", "off"}


def _hints(obj: Any) -> dict[str, Any]:
    return typing.get_type_hints(type(obj))


def all_keys(cfg: RunConfig) -> list[str]:
    """Every overridable key, e.g. ``['seed', 'model.vocab_size', ...]``."""
    keys: list[str] = []
    for f in dataclasses.fields(cfg):
        if f.name in SECTIONS:
            keys += [f"{f.name}.{sf.name}" for sf in dataclasses.fields(getattr(cfg, f.name))]
        else:
            keys.append(f.name)
    return keys


def _resolve(cfg: RunConfig, key: str) -> tuple[Any, str, Any]:
    """Return (owner object, attribute name, annotated type) for a dotted key."""
    parts = key.split(".")
    if len(parts) == 1 and parts[0] not in SECTIONS and parts[0] in _hints(cfg):
        return cfg, parts[0], _hints(cfg)[parts[0]]
    if len(parts) == 2 and parts[0] in SECTIONS:
        owner = getattr(cfg, parts[0])
        hints = _hints(owner)
        if parts[1] in hints:
            return owner, parts[1], hints[parts[1]]
        allowed = ", ".join(f"{parts[0]}.{k}" for k in hints)
        raise ConfigError(f"unknown config key {key!r}: allowed keys in {parts[0]} are {allowed}")
    raise ConfigError(f"unknown config key {key!r}: keys look like 'model.hidden_size'; sections are "
                      + ", ".join(SECTIONS) + ", plus 'seed' and 'preset'")


def _type_name(typ: Any) -> str:
    if get_origin(typ) is Literal:
        return " | ".join(str(a) for a in get_args(typ))
    args = [a for a in get_args(typ) if a is not type(None)]
    if args and len(get_args(typ)) > len(args):
        return f"{_type_name(args[0])} or none"
    return getattr(typ, "__name__", str(typ))


def _coerce(key: str, typ: Any, value: Any, from_text: bool) -> Any:
    """Convert/check ``value`` against ``typ``; raise a one-line ConfigError if it does not fit."""
    origin = get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = get_args(typ)
        if type(None) in args and (value is None or (from_text and str(value).lower() in _NONE_WORDS)):
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, inner[0], value, from_text)
    bad = ConfigError(f"invalid config value {key}={value!r}: allowed {_type_name(typ)}")
    if origin is Literal:
        if value not in get_args(typ):
            raise bad
        return value
    if typ is bool:
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in _TRUE_WORDS | _FALSE_WORDS:
            return str(value).lower() in _TRUE_WORDS
        raise bad
    if typ is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if from_text:
            try:
                return int(str(value).replace("_", ""))
            except ValueError:
                raise bad from None
        raise bad
    if typ is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            number = float(value)
        elif from_text:
            try:
                number = float(value)
            except ValueError:
                raise bad from None
        else:
            raise bad
        if not math.isfinite(number):  # nan / inf pass "> 0"-style checks and then wreck a run
            raise ConfigError(f"invalid config value {key}={value!r}: allowed a finite number")
        return number
    if typ is str:
        if isinstance(value, str):
            return value
        raise bad
    raise ConfigError(f"config key {key!r} has unsupported type {typ!r}")


def set_value(cfg: RunConfig, key: str, value: Any, from_text: bool = False) -> None:
    owner, attr, typ = _resolve(cfg, key)
    setattr(owner, attr, _coerce(key, typ, value, from_text))


def apply_overrides(cfg: RunConfig, assignments: list[str]) -> RunConfig:
    """Apply CLI assignments like ``['model.hidden_size=128', 'ple.gate=scalar']`` in order."""
    for item in assignments:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.key=value (e.g. model.hidden_size=128)")
        key, raw = item.split("=", 1)
        set_value(cfg, key.strip(), raw.strip(), from_text=True)
    return cfg


def config_from_dict(d: Any) -> RunConfig:
    """Rebuild a RunConfig from ``to_dict()`` output, checking every key and type."""
    if not isinstance(d, dict):
        raise ConfigError("a config must be a JSON object with sections " + ", ".join(SECTIONS))
    cfg = RunConfig()
    for top, value in d.items():
        if top in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"config section {top!r} must be an object, got {type(value).__name__}")
            for k, v in value.items():
                set_value(cfg, f"{top}.{k}", v)
        else:
            set_value(cfg, top, value)
    return cfg
