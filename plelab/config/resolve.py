"""The one path from what a user gives to the config a run uses, validated once after every override.

Order (each step overrides the one before):

1. the base: a resumed run's own ``config.json`` (``saved``), else a preset — ``preset``, else the
   ``preset`` the config file names, else the verb's default;
2. the config file (``config``: JSON or TOML, any subset of a ``config.json``'s keys);
3. ``overrides``: ``section.key=value`` texts (``--set``), in order;
4. ``settings``: config key -> typed value from the flags that are shortcuts (``--dp`` is ``ple.dim``,
   ``--data`` is ``data.path``, ...); ``None`` means not given;
5. the path-like keys made absolute against the current directory (:mod:`plelab.config.paths`: a run's
   ``config.json`` then works from any directory);
6. on an HF trunk (``model.hf_config``), the trunk fields read from its config.json (:mod:`plelab.config.hf_trunk`;
   one set by the user to another value is refused);
7. :meth:`RunConfig.validate`, once.

A config file and ``--preset`` must agree when the file names a preset (the file's preset is its
base: anything else could not be honoured); when resuming, both must name the run's own preset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from plelab.config.files import read_config_file
from plelab.config.hf_trunk import sync_hf_trunk
from plelab.config.overrides import all_keys, apply_overrides, as_override, get_value, load_dict, set_value
from plelab.config.paths import portable
from plelab.config.presets import get_preset
from plelab.config.schema import RunConfig
from plelab.errors import ConfigError, PlelabError

ConfigSource = str | os.PathLike | Mapping | None
# The flag shortcuts of resolve_config, by keyword.
SHORTCUTS = {"dp": "ple.dim", "gate": "ple.gate", "seed": "seed", "steps": "train.steps"}


def _file(config: ConfigSource) -> tuple[Mapping | None, str]:
    if config is None:
        return None, ""
    if isinstance(config, Mapping):
        return config, "the config given"
    return read_config_file(config), f"config file {config}"


def _read_saved(saved: str | os.PathLike) -> RunConfig:
    try:
        return RunConfig.from_dict(json.loads(Path(saved).read_text()))
    except (OSError, ValueError, RecursionError) as err:
        raise ConfigError(f"cannot read {saved} ({str(err).split(';')[0]}); fix it or start a new --out") from None
    except PlelabError as err:
        raise ConfigError(f"{saved}: {err}; fix it or start a new --out") from None


def _base(preset: str | None, file: Mapping | None, source: str, default_preset: str,
          saved: str | os.PathLike | None = None) -> RunConfig:
    """Steps 1 and 2: the base config with the file's keys set on it (not validated)."""
    named = file.get("preset") if file is not None else None
    if saved is not None:
        cfg = _read_saved(saved)
        if preset is not None and preset != cfg.preset:
            raise ConfigError(f"--preset {preset} differs from the run's preset {cfg.preset}; drop --preset when "
                              "resuming")
        if named is not None and named != cfg.preset:
            raise ConfigError(f"{source} names preset {named!r}, but the run was made from {cfg.preset!r}; resume "
                              "with a file of the run's own preset (its config.json is one)")
    elif preset is not None and named is not None and preset != named:
        raise ConfigError(f"--preset {preset} disagrees with {source}, which names preset {named!r} as its base; "
                          "drop --preset or change the file's preset")
    else:
        try:
            cfg = get_preset(named if named is not None else preset or default_preset)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}" if named is not None else str(err)) from None
    if file is not None:
        try:
            load_dict(cfg, file)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
    return cfg


def resolve_run_config(preset: str | None = None, *, saved: str | os.PathLike | None = None,
                       config: ConfigSource = None, overrides: Iterable[str] = (),
                       settings: Mapping[str, Any] | None = None, default_preset: str = "cpu-tiny") -> RunConfig:
    """The config of a run, fresh (``saved=None``) or resumed (``saved``: the run's ``config.json``); see the
    module docstring for the order. Every error is a one-line :class:`ConfigError`."""
    file, source = _file(config)
    cfg = _base(preset, file, source, default_preset, saved)
    overrides = list(overrides)
    apply_overrides(cfg, overrides)
    for key, value in (settings or {}).items():
        if value is not None:
            set_value(cfg, key, value)
    cfg = portable(cfg)
    sync_hf_trunk(cfg, _explicit_keys(file, overrides, settings))
    return cfg.validate()


def _explicit_keys(file: Mapping | None, overrides: Iterable[str], settings: Mapping[str, Any] | None) -> set[str]:
    """The config keys a user set: the file's (``section.key``), the overrides' and the given flags'."""
    keys = {text.partition("=")[0].strip() for text in overrides}
    keys |= {key for key, value in (settings or {}).items() if value is not None}
    for section, values in (file or {}).items():
        if isinstance(values, Mapping):
            keys |= {f"{section}.{key}" for key in values}
    return keys


def resolve_config(preset: str | None = "cpu-tiny", overrides: Iterable[str] | None = None, *,
                   config: ConfigSource = None, **shortcuts) -> RunConfig:
    """Preset (or ``config`` file) -> ``section.key=value`` overrides -> shortcuts (``dp=64`` for ``ple.dim``,
    ``gate``, ``seed``, ``steps``; they win) -> validate. :func:`resolve_run_config` with keyword shortcuts."""
    unknown = sorted(set(shortcuts) - set(SHORTCUTS))
    if unknown:
        raise TypeError(f"resolve_config() got unknown shortcuts {unknown}; known: {', '.join(SHORTCUTS)}")
    return resolve_run_config(preset, config=config, overrides=overrides or (),
                              settings={SHORTCUTS[name]: value for name, value in shortcuts.items()})


def config_file_overrides(config: ConfigSource, preset: str | None = None,
                          default_preset: str = "cpu-tiny") -> tuple[str, list[str]]:
    """A config file as ``(preset, overrides)``: its base preset and a ``key=value`` for every key where the
    file differs from that preset. How a sweep (which stores a preset and override texts in ``sweep.json``)
    takes a config file as its base; resolving them gives the file's config back exactly."""
    file, source = _file(config)
    if file is None:
        return preset or default_preset, []
    cfg = _base(preset, file, source, default_preset)
    base = get_preset(cfg.preset)
    return cfg.preset, [as_override(cfg, key) for key in all_keys(cfg)
                        if key != "preset" and get_value(cfg, key) != get_value(base, key)]
