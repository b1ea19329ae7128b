"""HF weights into a model by name, under either of HF's naming schemes, with a report of what was loaded.

Gemma's text-only classes (``Gemma4ForCausalLM``, ``Gemma3nForCausalLM``) name tensors ``model.layers.3.…``; the
multimodal ones (``…ForConditionalGeneration``) put the text model under ``model.language_model.…`` (older Gemma 3n
files: ``language_model.model.…``) and the head under ``lm_head`` or ``language_model.lm_head``. A plain
``load_state_dict(strict=False)`` with the multimodal names loads nothing and says nothing; :func:`load_hf_weights`
maps both schemes onto the target's names and reports the tensors it loaded, the target's tensors it left at their
init, and the source's tensors it did not use (vision / audio towers, for instance).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from plelab.errors import PlelabError
from plelab.model.loading import check_tensors

# (source prefix, target prefix), tried in order; the first that applies to a key renames it.
PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."), ("model.text_model.", "model."))


def hf_target_name(key: str) -> str:
    """``key`` under the text-model scheme (``model.language_model.layers.0.x`` -> ``model.layers.0.x``)."""
    for source, target in PREFIXES:
        if key.startswith(source):
            return target + key[len(source):]
    return key


@dataclass
class LoadReport:
    """What :func:`load_hf_weights` did: target names loaded, target names left at init, source keys not used."""

    loaded: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"loaded {len(self.loaded)} tensors; left {len(self.left)} at their init"
                + (f" ({', '.join(self.left[:3])}{', …' if len(self.left) > 3 else ''})" if self.left else "")
                + f"; {len(self.unused)} source tensors not used")


def read_safetensors(path: str | Path, keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors (all, or those named in ``keys``) of a safetensors file, or of every ``*.safetensors`` file of a
    folder (sharded checkpoints); one-line errors for a missing or unreadable file."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise PlelabError(f"{path} holds no .safetensors file; give an HF model folder or a .safetensors file")
    out: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys() if keys is None or k in keys})
        except (SafetensorError, OSError) as err:
            raise PlelabError(f"{file} is not a readable safetensors file ({str(err).splitlines()[0]})") from None
    return out


@torch.no_grad()
def load_hf_weights(model: nn.Module, source: Mapping[str, torch.Tensor] | str | Path) -> LoadReport:
    """Copy the tensors of ``source`` (a state dict, a safetensors file or an HF folder) into ``model`` by name, under
    either naming scheme (see the module doc); float dtypes are converted to the target's. Refuses, in one line, a
    shape or dtype-kind mismatch (:func:`~plelab.model.loading.check_tensors`) and a source none of whose names
    match."""
    tensors = read_safetensors(source) if isinstance(source, (str, Path)) else dict(source)
    own = model.state_dict(keep_vars=True)
    # a float weight stored as integers (a relabelled header) is refused; bf16 into float32 is converted
    check_tensors(str(source) if isinstance(source, (str, Path)) else "the weights given",
                  {hf_target_name(k): v for k, v in tensors.items()}, own,
                  "the checkpoint is for another configuration (or was altered)", exact_dtype=False, complete=False,
                  extra=True)
    report = LoadReport()
    for key, value in tensors.items():
        name = hf_target_name(key)
        if name not in own:
            report.unused.append(key)
            continue
        own[name].copy_(value.to(own[name].dtype))
        report.loaded.append(name)
    if not report.loaded:
        raise PlelabError(f"none of the {len(tensors)} source tensors match the model's names (e.g. "
                          f"{next(iter(tensors), '—')}); is it a checkpoint of this kind of model?")
    done = {id(own[n]) for n in report.loaded}  # a tied weight counts as loaded through its twin
    report.left = [n for n, t in own.items() if id(t) not in done]
    return report
