"""Folders ``save_pretrained`` writes after :func:`plelab.attach` travel: plain transformers loads them *with* PLE
or refuses them — never silently drops the table, as the host's own class would (it reports the PLE tensors as
"unexpected" in a log line and loads the host alone).

:func:`plelab.attach` makes the model's ``save_pretrained`` write ``"model_type": "plelab_attached"`` into the
folder's ``config.json`` (the host's type kept in its ``plelab_ple`` entry as ``host_model_type``;
:func:`plelab.integrations.hf.mark_attached`). With plelab imported, this module's :func:`register` (run when
transformers is imported) maps that type onto :func:`~plelab.integrations.hf.load_attached`, so
``AutoModelForCausalLM.from_pretrained(folder)`` returns the host with PLE attached and every PLE tensor loaded.
In a process that never imported plelab, transformers refuses the unknown model type.
"""

from __future__ import annotations

import functools

from plelab.errors import PlelabError
from plelab.integrations import hf_aux  # noqa: F401  (registers attach_table's folders with load_attached)
from plelab.integrations.hf import ATTACHED_TYPE, load_attached


@functools.cache
def classes() -> tuple[type, type]:
    """``(PlelabAttachedConfig, PlelabAttachedForCausalLM)``, made on first use (they need transformers)."""
    import transformers  # optional dependency (the hf extra): registered only when transformers is imported

    class PlelabAttachedConfig(transformers.PretrainedConfig):
        """The config.json of a folder saved after plelab.attach, read as plain keys (the host's config is
        rebuilt from them by :func:`~plelab.integrations.hf.load_attached`)."""

        model_type = ATTACHED_TYPE

    class PlelabAttachedForCausalLM:
        """Not a model: the Auto classes' entry for ``plelab_attached``; ``from_pretrained`` is
        :func:`~plelab.integrations.hf.load_attached`."""

        config_class = PlelabAttachedConfig

        @classmethod
        def from_pretrained(cls, path, *args, config=None, **kwargs):
            if args:
                raise PlelabError(f"from_pretrained({path!r}, ...): a folder saved after plelab.attach takes keyword "
                                  "arguments only (e.g. dtype=, device_map=)")
            # the Auto classes' own bookkeeping (names with a leading underscore) is not for the host's loader
            return load_attached(path, **{k: v for k, v in kwargs.items() if not k.startswith("_")})

    return PlelabAttachedConfig, PlelabAttachedForCausalLM


def register() -> None:
    """Register the ``plelab_attached`` type with ``AutoConfig`` / ``AutoModelForCausalLM`` (idempotent)."""
    import transformers  # optional dependency (the hf extra)

    config_class, model_class = classes()
    transformers.AutoConfig.register(ATTACHED_TYPE, config_class, exist_ok=True)
    transformers.AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)
