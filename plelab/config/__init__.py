"""One config system: dataclasses (``schema``), named presets, typed overrides, config files, and the one
function that resolves a run's config from them (``resolve_run_config``)."""

from plelab.config.aux_schema import AUX_KINDS, AuxConfig
from plelab.config.files import read_config_file
from plelab.config.lists import parse_numbers
from plelab.config.overrides import all_keys, apply_overrides, as_override, get_value, load_dict, set_value
from plelab.config.overrides import keys_tagged as _keys_tagged
from plelab.config.presets import PRESETS, get_preset
from plelab.config.resolve import config_file_overrides, resolve_config, resolve_run_config
from plelab.config.schema import (
    GATE_KINDS,
    QUANTIZER_IDS,
    VISUAL_IDS,
    DataConfig,
    ModelConfig,
    PLEConfig,
    RunConfig,
    TrainConfig,
    VisualConfig,
)

config_from_dict = RunConfig.from_dict


def keys_tagged(tag: str) -> tuple[str, ...]:
    """The :class:`RunConfig` keys tagged ``tag`` (``resume``, ``advise``, ``sweep_data``, ``visual_ids``,
    ``quantizer_ids``; see :mod:`plelab.config.schema`): ``"model"`` for a whole section, else ``"train.seq_len"``."""
    found = _keys_tagged(RunConfig, tag)
    if not found:
        raise ValueError(f"no config field is tagged {tag!r}")
    return found


__all__ = [
    "AUX_KINDS", "AuxConfig", "GATE_KINDS", "PRESETS", "QUANTIZER_IDS", "VISUAL_IDS", "DataConfig", "ModelConfig", "PLEConfig", "RunConfig",
    "TrainConfig", "VisualConfig", "all_keys", "apply_overrides", "as_override", "config_file_overrides",
    "config_from_dict", "get_preset", "get_value", "keys_tagged", "load_dict", "parse_numbers", "read_config_file",
    "resolve_config", "resolve_run_config", "set_value",
]
