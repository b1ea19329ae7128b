"""PLE and its diagnostics in other people's models and training loops.

- :func:`~plelab.integrations.hf.attach` / :func:`~plelab.integrations.hf.load_attached`: Gemma-style PLE added
  to an HF decoder-only causal LM, and the round trip through ``save_pretrained``;
- :class:`~plelab.integrations.hf_callback.HFTrainerCallback` and
  :class:`~plelab.integrations.lightning_callback.LightningCallback`: a :class:`plelab.Monitor` driven by HF
  ``Trainer`` or Lightning.

Names load on first use: transformers and lightning are optional dependencies.
"""

from __future__ import annotations

import importlib

from plelab.errors import PlelabError

_EXPORTS = {"attach": "plelab.integrations.hf", "load_attached": "plelab.integrations.hf",
            "HFTrainerCallback": "plelab.integrations.hf_callback",
            "LightningCallback": "plelab.integrations.lightning_callback"}
_NEEDS = {"plelab.integrations.hf_callback": "transformers", "plelab.integrations.lightning_callback": "lightning"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'plelab.integrations' has no attribute {name!r}")
    module = _EXPORTS[name]
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] == _NEEDS.get(module):
            need = _NEEDS[module]
            raise PlelabError(f"plelab.integrations.{name} needs {need}: pip install {need}") from None
        raise
