"""Portable configs: the path-like keys of a run's config made absolute, so that a saved ``config.json`` (and a
sweep's ``sweep.json``, its report's "Reproduce" line) means the same files from any working directory.

The path-like keys are the fields tagged ``path`` in :mod:`plelab.config.schema` (``data.path``, ``data.mix``,
``data.tokenizer``, ``data.ood``, ``visual.data``); a list value holds ``PATH:WEIGHT`` entries (a mixture), whose
paths are made absolute and weights kept as typed. A path is taken relative to the current directory, as plelab
reads it, with ``~`` expanded; symbolic links are kept (:func:`os.path.abspath`, not ``resolve``). Absolute paths,
``none``, empty values and the names of built-in sets (:data:`BUILT_IN`) are left as they are.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence

from plelab.config.overrides import NONE_WORDS, get_value, keys_tagged, set_value
from plelab.config.schema import OTHER_LIBRARIES, RunConfig

PATH_TAG = "path"
BUILT_IN = (OTHER_LIBRARIES,)  # values of a path-like key that name a set plelab builds (data.ood): kept as given


def path_keys() -> tuple[str, ...]:
    """The config keys that hold file-system paths (``data.mix``: PATH:WEIGHT entries)."""
    return keys_tagged(RunConfig, PATH_TAG)


def absolute(path: str) -> str:
    """``path`` made absolute against the current directory (``~`` expanded, links kept); "" and the names of
    :data:`BUILT_IN` sets stay as they are."""
    return os.path.abspath(os.path.expanduser(path)) if path and path not in BUILT_IN else path


def absolute_entry(entry: str) -> str:
    """A ``PATH:WEIGHT`` mixture entry with its path made absolute (an entry without a weight is left for the
    mixture's own check to refuse)."""
    path, sep, weight = str(entry).rpartition(":")
    return f"{absolute(path)}:{weight}" if sep and path else entry


def _portable_value(value):
    if isinstance(value, str):
        return absolute(value)
    if isinstance(value, list):
        return [absolute_entry(v) for v in value]
    return value


def portable(cfg: RunConfig) -> RunConfig:
    """A copy of ``cfg`` with every path-like key made absolute (what a run records in ``config.json``)."""
    out = copy.deepcopy(cfg)
    for key in path_keys():
        set_value(out, key, _portable_value(get_value(cfg, key)))
    return out


def portable_override(text: str) -> str:
    """A ``section.key=value`` override with its value made absolute when the key is path-like (a list key's
    comma-separated ``PATH:WEIGHT`` entries each); any other override, ``none`` or an empty value unchanged."""
    key, sep, raw = str(text).partition("=")
    value = raw.strip()
    if not sep or key.strip() not in path_keys() or not value or value.lower() in NONE_WORDS:
        return text
    if isinstance(get_value(RunConfig(), key.strip()), list):
        value = ",".join(absolute_entry(v.strip()) for v in value.split(",") if v.strip())
    else:
        value = absolute(value)
    return f"{key.strip()}={value}"


def portable_mapping(config: Mapping) -> dict:
    """A config file's contents (the shape of ``config.json``, any subset) with its path-like keys made absolute;
    values of the wrong type are left for the schema's check to refuse."""
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in config.items()}
    for key in path_keys():
        section, _, name = key.partition(".")
        part = out.get(section)
        if isinstance(part, dict) and name in part:
            value = part[name]
            if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                part[name] = _portable_value(value)
    return out


def portable_overrides(overrides: Sequence[str]) -> list[str]:
    """:func:`portable_override` of each."""
    return [portable_override(o) for o in overrides]
