"""Text runs on a trunk that is not plelab's decoder: an HF model (``model.hf_config``) or your own
(``model.factory``) — the dP study on your architecture, through the same trainer, sweep, report and advise.

A :class:`Host` builds the run's model, PLE included when ``ple.dim > 0``; everything else is the text run's
(:class:`~plelab.training.text_task.TextTask`: data, batches, the loss on the model's logits, evaluation, the
diagnostics, which find the PLE modules by type). Hosts are registered by name (:func:`register_host`); the HF and
factory hosts live in :mod:`plelab.integrations.hosts`, which the CLI, :mod:`plelab.runs` and ``import plelab``'s
verbs import.

The protocol of a factory model (``model.factory = "MODULE:FUNCTION"``): ``FUNCTION(cfg)`` gets the resolved
:class:`~plelab.config.RunConfig` and returns an ``nn.Module`` sized by ``cfg.model`` (``vocab_size``,
``hidden_size``, ``num_hidden_layers``, ...) holding, when ``cfg.ple.dim > 0``, one :class:`~plelab.PerLayerEmbedding`
``(Vp, H, L, dP, embed_scale=cfg.ple.embed_scale)`` and one :class:`~plelab.PerLayerInjection` ``(H, dP,
cfg.ple.gate, gate_init=cfg.ple.gate_init)`` per layer (anywhere, found by type), and none when ``ple.dim = 0``.
``model(input_ids [B,T])`` returns the logits ``[B,T,V]`` of every position: the tensor, an object with ``.logits``,
or a tuple whose first element they are (nanoGPT's ``(logits, loss)``). The function is called under
``torch.manual_seed(cfg.seed)``. What :func:`finish_host_model` does after it: the table is set to plelab's W_0
(regenerated from the seed by the diagnostics), held at zero or frozen as ``ple.table`` says, and the learned gates
frozen under ``ple.gate_learn=false``; a model whose PLE modules disagree with ``cfg`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from plelab.config.overrides import get_value
from plelab.config.schema import RunConfig
from plelab.errors import ConfigError, PlelabError
from plelab.model.init import initial_normal, table_init_std
from plelab.model.losses import output_logits
from plelab.model.ple import TABLE_KEY, PLEModules, find_ple_modules


@dataclass(frozen=True)
class Host:
    """A kind of trunk. ``build(cfg, device)``: the run's model, initialised from ``cfg.seed``, on ``device``;
    ``passes_table_ids``: its forward takes ``table_ids=`` (the i.i.d. null control needs it)."""

    name: str
    build: Callable[[RunConfig, torch.device], nn.Module]
    passes_table_ids: bool = False


_HOSTS: dict[str, Host] = {}


def register_host(host: Host) -> None:
    _HOSTS[host.name] = host


def get_host(cfg: RunConfig) -> Host | None:
    """The host of ``cfg``'s trunk, or None for plelab's own decoder."""
    name = cfg.model.host
    if name == "plelab":
        return None
    if name not in _HOSTS:
        raise PlelabError(f"no '{name}' trunk is registered; import plelab.integrations.hosts (or use the plelab "
                          "command, which registers it) before running this config")
    return _HOSTS[name]


def host_logits(out) -> torch.Tensor:
    """The logits ``[B,T,V]`` in a host model's forward output: the tensor, ``.logits``, or a tuple's first element."""
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return output_logits(out)


# what a host trunk cannot honour: config key -> (the value it needs, why)
_REFUSED = {
    "ple.vocab_remap": ("none", "the frequency remap is plelab's decoder's buffer"),
    "train.table_optimizer": ("adamw", "row-sparse table gradients are plelab's decoder's"),
    "train.table_device": ("auto", "a host-side table is plelab's decoder's"),
    "train.parallel": ("ddp", "FSDP2's sharded init is plelab's decoder's"),
    "train.activation_checkpointing": (False, "checkpointing is the trunk's own (turn it on in your model)"),
    "train.compile": (False, "compile your model in its factory instead"),
    "kind": ("text", "a kind of run other than text uses plelab's own model"),
}


def check_host_options(cfg: RunConfig) -> None:
    """Refuse, in one line, a setting a run on ``cfg.model.host`` could not honour."""
    host = cfg.model.host
    if host == "plelab":
        return
    for key, (needed, why) in _REFUSED.items():
        value = get_value(cfg, key)
        if value != needed:
            raise ConfigError(f"{key}={value!r} cannot be honoured on a model.{_field(host)} trunk ({why}): "
                              f"set {key}={needed!r} (lowercase for booleans), or train plelab's own decoder")
    if host == "factory" and cfg.ple.enabled and cfg.ple.ids == "iid":
        raise ConfigError("ple.ids=iid needs the model's forward to take table_ids=, which a model.factory model does "
                          "not: use the HF trunk (model.hf_config) or plelab's decoder for the i.i.d. control")


def _field(host: str) -> str:
    return "hf_config" if host == "hf" else "factory"


@torch.no_grad()
def finish_host_model(model: nn.Module, cfg: RunConfig, where: str) -> nn.Module:
    """Check ``model``'s PLE modules against ``cfg`` (``where`` names the trunk in messages), then set the table to
    W_0 (zeros for ``ple.table=zero``), freeze what ``ple.table`` / ``ple.gate_learn`` hold fixed; returns it."""
    mc, pc = cfg.model, cfg.ple
    if not pc.enabled:
        if any(find_ple_modules(model)):
            raise PlelabError(f"{where} holds PLE modules but ple.dim=0: build none when cfg.ple.dim is 0 (the "
                              "study's baseline is the trunk alone)")
        return model
    try:
        ple = PLEModules(model)
    except LookupError as err:
        raise PlelabError(f"{where}: {err} (ple.dim={pc.dim}; build plelab.PerLayerEmbedding and one "
                          "plelab.PerLayerInjection per layer when cfg.ple.dim > 0)") from None
    vp = pc.resolved_vocab_size(mc)
    found = {"ple.dim": ple.dim, "model.num_hidden_layers": ple.num_layers, "ple.vocab_size": ple.table.shape[0],
             "ple.gate": ple.injections[0].gate, "ple.embed_scale": ple.embedding.embed_scale}
    wanted = {"ple.dim": pc.dim, "model.num_hidden_layers": mc.num_hidden_layers, "ple.vocab_size": vp,
              "ple.gate": pc.gate, "ple.embed_scale": pc.embed_scale}
    gates = sorted({inj.gate for inj in ple.injections})
    found["ple.gate"] = gates[0] if len(gates) == 1 else "/".join(gates)
    for key, value in found.items():
        want = wanted[key]
        same = abs(value - want) <= 1e-9 * abs(want) if isinstance(value, float) else value == want
        if not same:
            raise PlelabError(f"{where}: its PLE modules have {key} = {value!r} but the config says {want!r}; build "
                              "them from cfg (plelab.training.hosts documents the protocol)")
    if pc.gate in ("scalar", "vector"):
        for inj in ple.injections:
            gate = inj.owner.per_layer_gate
            if not gate.is_meta and not torch.allclose(gate.detach().float(), torch.full_like(gate.detach().float(),
                                                                                             pc.gate_init)):
                raise PlelabError(f"{where}: a learned gate starts at {float(gate.flatten()[0]):g}, not "
                                  f"ple.gate_init={pc.gate_init:g}; build the injections with "
                                  "gate_init=cfg.ple.gate_init")
            gate.requires_grad_(pc.gate_learn)
    table = ple.table
    table.requires_grad_(pc.table == "learned")
    if table.is_meta:  # a model built only to be counted
        return model
    shape = (vp, mc.num_hidden_layers * pc.dim)
    w0 = (torch.zeros(shape) if pc.table == "zero"
          else initial_normal(TABLE_KEY, shape, cfg.seed, table_init_std(mc, pc)))
    table.copy_(w0.to(dtype=table.dtype, device=table.device))
    return model
