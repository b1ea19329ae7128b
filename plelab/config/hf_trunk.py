"""A run on an HF trunk (``model.hf_config``): the trunk fields of ``model`` read from the HF ``config.json``.

The HF config says what the trunk is; plelab's ``model`` fields say the same numbers to everything that sizes a run
without building it — the tokenizer (``vocab_size``), the per-layer table ``[Vp, L·dP]`` and its regenerated W_0,
the memory budget, the parameter accounting's PLE groups. So they are copied from the file when the config is
resolved, and a flag or file that sets one of them to another value is refused (it could not be honoured: the
trunk is the file's). Only JSON is read here; transformers builds the model later (:mod:`plelab.integrations.hosts`).
"""

from __future__ import annotations

import json
from pathlib import Path

from plelab.config.overrides import set_value
from plelab.errors import ConfigError

# ModelConfig fields an HF decoder config holds under the same name (HF's names are plelab's).
TRUNK_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
              "initializer_range")


def hf_config_file(path: str | Path) -> Path:
    """The ``config.json`` that ``model.hf_config`` names (the file, or the folder holding it)."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def read_hf_config(path: str | Path) -> dict:
    """The HF config as a dict (it must name its ``model_type``); every problem is one :class:`ConfigError` line."""
    file = hf_config_file(path)
    try:
        values = json.loads(file.read_text())
    except OSError as err:
        raise ConfigError(f"model.hf_config: cannot read {file} ({err.strerror or err}); give the path of an HF "
                          "config.json or of the folder holding it") from None
    except ValueError as err:
        raise ConfigError(f"model.hf_config: {file} is not JSON ({err}); give an HF config.json") from None
    if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
        raise ConfigError(f"model.hf_config: {file} names no model_type; give the config.json transformers wrote "
                          "(e.g. LlamaConfig(...).save_pretrained(folder))")
    return values


def trunk_values(values: dict) -> dict:
    """The ``model.*`` values an HF config gives (GQA-less configs: as many key/value heads as heads)."""
    out = {key: values[key] for key in TRUNK_KEYS if values.get(key) is not None}
    rope = values.get("rope_parameters")  # transformers 5 keeps rope_theta there
    if "rope_theta" not in out and isinstance(rope, dict) and rope.get("rope_theta") is not None:
        out["rope_theta"] = rope["rope_theta"]
    out.setdefault("num_key_value_heads", out.get("num_attention_heads"))
    out["scale_embeddings"] = values["model_type"].startswith("gemma")  # Gemma multiplies by sqrt(H); others do not
    return {k: v for k, v in out.items() if v is not None}


def sync_hf_trunk(cfg, explicit: set[str]) -> None:
    """Copy the trunk fields of ``cfg.model.hf_config`` into ``cfg.model`` (in place); ``explicit``: the config keys
    the user set (file, ``--set``, flags) — one of them at another value than the HF config's is refused."""
    if not cfg.model.hf_config:
        return
    file = hf_config_file(cfg.model.hf_config)
    for key, value in trunk_values(read_hf_config(file)).items():
        full = f"model.{key}"
        if full in explicit and getattr(cfg.model, key) != value:
            raise ConfigError(f"{full}={getattr(cfg.model, key)!r} but the HF trunk's {file} says {value!r}: the "
                              "trunk is the HF config's — drop the setting, or edit that config.json")
        try:
            set_value(cfg, full, value)
        except ConfigError as err:
            raise ConfigError(f"model.hf_config {file}: {key} = {value!r} ({err})") from None
