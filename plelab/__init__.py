"""plelab: a lab for Per-Layer Embeddings (PLE) in transformer language models.

The documented surface (``README.md``, "In Python"): configs and presets, the model and its PLE modules,
and one function per CLI verb. Names are imported on first use, so ``import plelab`` stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # configs and presets
    "RunConfig": "plelab.config", "ModelConfig": "plelab.config", "PLEConfig": "plelab.config",
    "TrainConfig": "plelab.config", "DataConfig": "plelab.config", "PRESETS": "plelab.config",
    "get_preset": "plelab.config", "resolve_config": "plelab.config",
    # the model and the PLE mechanism
    "build_model": "plelab.model", "PLECausalLM": "plelab.model", "CausalLMOutput": "plelab.model",
    "PerLayerEmbedding": "plelab.model.ple", "PerLayerInjection": "plelab.model.ple",
    "IIDTableIds": "plelab.model.ple", "token_table_ids": "plelab.model.ple",
    # what the CLI verbs do
    "train": "plelab.runs", "evaluate": "plelab.training.evaluate", "diagnose": "plelab.diagnostics.diagnose",
    "sweep": "plelab.sweeps.commands", "report": "plelab.reports",
    # the trainer's seams, for your own kinds of run and observers
    "Trainer": "plelab.training.trainer", "TrainResult": "plelab.training.trainer", "Task": "plelab.training.task",
    "Observer": "plelab.training.task", "TextTask": "plelab.training.text_task",
    # PLE and its diagnostics in your own model and loop
    "attach": "plelab.integrations.hf", "load_attached": "plelab.integrations.hf",
    "param_groups": "plelab.training.optim", "adamw": "plelab.training.optim", "Monitor": "plelab.diagnostics.monitor",
    "PLEModules": "plelab.model.ple", "load_hf_weights": "plelab.model.hf_weights", "PlelabError": "plelab.errors",
}
# packages that register kinds of run (and their studies) when imported: loaded before any verb is returned
_PLUGINS = ("plelab.visual",)

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'plelab' has no attribute {name!r}")
    for plugin in _PLUGINS:
        importlib.import_module(plugin)
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
