"""Config files: a run's ``config.json`` (or any subset of its keys) as JSON or TOML.

The file has the shape of ``RUN/config.json``: top-level ``preset`` and ``seed``, and one object
(a TOML table) per section, ``model``, ``ple``, ``train``, ``data``, ``visual``. Every problem is a
one-line :class:`~plelab.errors.ConfigError` naming the file.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from plelab.errors import ConfigError
from plelab.io import os_reason

SUFFIXES = (".json", ".toml")


def read_config_file(path: str | os.PathLike) -> dict:
    """The file's contents as a dict (JSON by ``.json``, TOML by ``.toml``); not yet checked against the schema."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"config file {path} is neither .json nor .toml; give a JSON or TOML file, e.g. a run's "
                          "config.json")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; give a .json or .toml file, e.g. a run's config.json")
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; give a .json or .toml file")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {os_reason(err)}; check its permissions") from None
    try:
        data = _parse(path, raw, suffix)
    except RecursionError:
        raise ConfigError(f"config file {path} nests deeper than any config (a run's config.json is two levels "
                          "deep); give a run's config.json or a subset of its keys") from None
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        raise ConfigError(f"config file {path} holds a value plelab cannot read ({str(err).split(';')[0]}); fix "
                          "it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} holds a {type(data).__name__}, not an object with the sections of a "
                          "run's config.json")
    return data


class DuplicateKey(ValueError):
    """A JSON object that names a key twice (``json`` would keep the last silently)."""


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise DuplicateKey(repr(key))
    return dict(pairs)


def _parse(path: Path, raw: bytes, suffix: str):
    """The file's contents (JSON or TOML by ``suffix``); a format error is one :class:`ConfigError` line."""
    if suffix == ".toml":
        try:
            data = tomllib.loads(raw.decode("utf-8-sig"))  # a byte-order mark is read past, as for JSON
        except UnicodeDecodeError as err:
            raise ConfigError(f"config file {path} is not UTF-8 (invalid byte at offset {err.start}); save it as "
                              "UTF-8") from None
        except tomllib.TOMLDecodeError as err:  # its message ends with "(at line N, column M)"
            raise ConfigError(f"config file {path} is not valid TOML: {err}") from None
    else:
        try:
            data = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
        except UnicodeDecodeError as err:
            raise ConfigError(f"config file {path} is not UTF-8 (invalid byte at offset {err.start}); save it as "
                              "UTF-8") from None
        except DuplicateKey as err:
            raise ConfigError(f"config file {path} sets {err} twice; keep one") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"config file {path} is not valid JSON: {err.msg} (at line {err.lineno}, column "
                              f"{err.colno})") from None
    return data
