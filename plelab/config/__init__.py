"""One config system: dataclasses (``schema``), named presets, typed CLI overrides."""

from plelab.config.overrides import all_keys, apply_overrides, config_from_dict, set_value
from plelab.config.presets import PRESETS, get_preset
from plelab.config.schema import GATE_KINDS, DataConfig, ModelConfig, PLEConfig, RunConfig, TrainConfig


def resolve_config(preset: str = "cpu-tiny", overrides: list[str] | None = None, **shortcuts) -> RunConfig:
    """Preset -> ``section.key=value`` overrides -> shortcuts (``dp=64`` for ``ple.dim``; they win) -> validate."""
    cfg = get_preset(preset)
    apply_overrides(cfg, overrides or [])
    keys = {"dp": "ple.dim", "gate": "ple.gate", "seed": "seed", "steps": "train.steps"}
    for name, value in shortcuts.items():
        if value is not None:
            set_value(cfg, keys[name], value, from_text=isinstance(value, str))
    return cfg.validate()


__all__ = [
    "GATE_KINDS", "PRESETS", "DataConfig", "ModelConfig", "PLEConfig", "RunConfig", "TrainConfig",
    "all_keys", "apply_overrides", "config_from_dict", "get_preset", "resolve_config", "set_value",
]
