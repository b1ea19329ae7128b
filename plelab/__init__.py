"""plelab: a lab for Per-Layer Embeddings (PLE) in transformer language models.

The documented surface (``docs/python-api.md``): configs and presets, the model and its PLE modules,
and one function per CLI verb. Names are imported on first use, so ``import plelab`` stays light.

Importing plelab also registers its model with transformers (``model_type="plelab"``, so
``AutoModelForCausalLM`` loads folders ``plelab export`` wrote): at once if transformers is imported already,
otherwise right after transformers finishes importing (a post-import hook: plelab never imports it itself).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # configs and presets
    "RunConfig": "plelab.config", "ModelConfig": "plelab.config", "PLEConfig": "plelab.config",
    "TrainConfig": "plelab.config", "DataConfig": "plelab.config", "PRESETS": "plelab.config",
    "AuxConfig": "plelab.config",
    "get_preset": "plelab.config", "resolve_config": "plelab.config",
    # the model and the PLE mechanism
    "build_model": "plelab.model", "PLECausalLM": "plelab.model", "CausalLMOutput": "plelab.model",
    "PerLayerEmbedding": "plelab.model.ple", "PerLayerInjection": "plelab.model.ple",
    "IIDTableIds": "plelab.model.ple", "token_table_ids": "plelab.model.ple", "frequency_rows": "plelab.model.ple",
    # the table family's other kinds (aux.kind) and the exact accounting of any of them
    "ValueEmbeddings": "plelab.model.value_embed", "HashedNgramEmbedding": "plelab.model.ngram",
    "TokenModulation": "plelab.model.modulation", "ngram_ids": "plelab.model.ngram",
    "account": "plelab.model.accounting", "Accounting": "plelab.model.accounting",
    # what the CLI verbs do
    "train": "plelab.runs", "evaluate": "plelab.training.evaluate", "diagnose": "plelab.integrations.checkpoints",
    "sweep": "plelab.sweeps.commands", "pack": "plelab.sweeps.commands", "report": "plelab.reports.study",
    "plan": "plelab.stats.planning", "lr_search": "plelab.sweeps.commands", "advise": "plelab.stats.advise",
    "Advice": "plelab.stats.advise",
    "preregister_sweep": "plelab.sweeps.commands",
    "ingest": "plelab.data.pipeline", "prepare_data": "plelab.runs", "ladder": "plelab.scaling.ladder",
    "fit_runs": "plelab.scaling.scaling_runs", "fit_study": "plelab.scaling.laws",
    "calibrate": "plelab.calibration.commands", "verdict_reliability": "plelab.diagnostics.verdict",
    "range_status": "plelab.diagnostics.verdict", "preregister_validation": "plelab.calibration.validation",
    "run_validation": "plelab.calibration.validation", "validation_result": "plelab.calibration.validation_report",
    "ValidationDesign": "plelab.calibration.validation",
    # the trainer's seams, for your own kinds of run and observers
    "Trainer": "plelab.training.trainer", "TrainResult": "plelab.training.trainer", "Task": "plelab.training.task",
    "Observer": "plelab.training.task", "TextTask": "plelab.training.text_task",
    # PLE and its diagnostics in your own model and loop
    "attach": "plelab.integrations.hf", "load_attached": "plelab.integrations.hf",
    "attach_table": "plelab.integrations.hf_aux", "load_attached_table": "plelab.integrations.hf_aux",
    "load_host_run": "plelab.integrations.hosts",
    "param_groups": "plelab.training.optim", "adamw": "plelab.training.optim", "Monitor": "plelab.diagnostics.monitor",
    "PLEModules": "plelab.model.ple", "load_hf_weights": "plelab.model.hf_weights", "PlelabError": "plelab.errors",
    # out of plelab: HF folders and text
    "export": "plelab.integrations.export", "generate_text": "plelab.runs.generation",
    "generate": "plelab.model.generate", "KVCache": "plelab.model.generate",
    "consolidate_checkpoint": "plelab.training.checkpoint",
}
# packages that register trunks (hosts) and attached-folder loaders (hf_aux) when imported: loaded before any verb is
# returned (kinds of run load themselves when a
# config or a study names them: plelab.config.schema.KIND_MODULES)
_PLUGINS = ("plelab.integrations.hosts", "plelab.integrations.hf_aux")
# plelab's model for transformers' Auto classes: registered when transformers is imported (see the module doc)
_HF_REGISTRATION = ("plelab.integrations.hf_model", "plelab.integrations.hf_attached")

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


def _register_with_transformers() -> None:
    try:
        for module in _HF_REGISTRATION:
            importlib.import_module(module).register()
    except Exception as err:  # never break the user's import of transformers: warn and go on without plelab's class
        warnings.warn(f"plelab could not register its model with transformers ({err}); AutoModelForCausalLM will "
                      "not load plelab exports", stacklevel=2)


class _AfterTransformersImport(importlib.abc.MetaPathFinder):
    """Runs :func:`_register_with_transformers` once ``import transformers`` has finished executing.

    It stays on ``sys.meta_path`` until then: a bare ``importlib.util.find_spec("transformers")`` (libraries such as
    datasets call it to test for transformers) also reaches it, and must not use it up.
    """

    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformers" or self.busy:
            return None
        self.busy = True  # the lookup below passes through this finder again: let it through to the real ones
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, finder = loader.exec_module, self

        def exec_then_register(module):
            exec_module(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            _register_with_transformers()
        loader.exec_module = exec_then_register
        return spec


if "transformers" in sys.modules:
    _register_with_transformers()
elif not any(isinstance(f, _AfterTransformersImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTransformersImport())
