"""The HF and factory trunks of :mod:`plelab.training.hosts`, and their exact parameter accounting.

- ``hf``: ``AutoModelForCausalLM.from_config`` of the run's ``model.hf_config`` (transformers' own init, under
  ``torch.manual_seed(seed)``), then, when ``ple.dim > 0``, :func:`plelab.attach` with the run's dP, gate, Vp and
  seed and ``init="gemma"`` — the init plelab's own decoder uses, so an arm means the same on either trunk — with the
  learned gates at ``ple.gate_init`` and the lookup scaled by ``ple.embed_scale``.
- ``factory``: ``FUNCTION(cfg)`` from ``model.factory = "MODULE:FUNCTION"`` (the protocol is in
  :mod:`plelab.training.hosts`); the module is imported from ``sys.path``, then from the current directory.

Both end in :func:`~plelab.training.hosts.finish_host_model` (W_0, controls, checks). :func:`host_accounting`
counts a host model built on the meta device: ``base`` = every parameter not in the PLE modules, the PLE groups
as plelab's accounting names them — the numbers ``plelab report`` and ``plelab advise`` read.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import torch
from torch import nn

from plelab.config.hf_trunk import TRUNK_KEYS, hf_config_file, read_hf_config, trunk_values
from plelab.config.schema import RunConfig
from plelab.errors import ConfigError, PlelabError
from plelab.integrations.hf import attach
from plelab.integrations.pretrained import loader_errors, loader_reason
from plelab.model.ple import PLEModules
from plelab.training.checkpoint import load_model_weights, read_state
from plelab.training.hosts import Host, finish_host_model, register_host
from plelab.training.loading import checkpoint_of


def _seeded(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def build_hf(cfg: RunConfig, device: torch.device | str = "cpu") -> nn.Module:
    """The HF trunk of ``cfg`` with PLE attached when ``ple.dim > 0`` (module doc)."""
    import transformers  # optional dependency (the hf extra): an HF trunk needs it

    file = hf_config_file(cfg.model.hf_config)
    values = read_hf_config(file)
    kind = values.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(kind, **values)
    except loader_errors() as err:  # a field of the wrong type is huggingface_hub's StrictDataclassError
        raise ConfigError(f"model.hf_config {file}: transformers cannot build a {kind!r} config from it "
                          f"({loader_reason(err)})") from None
    stale = {k: v for k, v in trunk_values({"model_type": kind, **values}).items()
             if k in TRUNK_KEYS and getattr(cfg.model, k) != v}
    if stale:
        key = next(iter(stale))
        raise ConfigError(f"model.hf_config {file} says {key} = {stale[key]!r}, but the run was made with "
                          f"{getattr(cfg.model, key)!r}: the file changed since — restore it, or start a new run")
    model = _seeded(cfg.seed, lambda: transformers.AutoModelForCausalLM.from_config(config))
    pc = cfg.ple
    if pc.enabled:
        attach(model, pc.dim, gate=pc.gate, vocab_size=pc.resolved_vocab_size(cfg.model), init="gemma",
               seed=cfg.seed)
        ple = PLEModules(model)
        ple.embedding.embed_scale = pc.embed_scale
        for inj in ple.injections:
            inj.gate_init = pc.gate_init
            if pc.gate in ("scalar", "vector"):
                with torch.no_grad():
                    inj.owner.per_layer_gate.fill_(pc.gate_init)
    return finish_host_model(model, cfg, f"the HF trunk {file}").to(device)


def _import(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module.split(".")[0] or os.getcwd() in sys.path:
            raise
    sys.path.insert(0, os.getcwd())  # the console script does not put the working directory on sys.path
    return importlib.import_module(module)


def build_factory(cfg: RunConfig, device: torch.device | str = "cpu") -> nn.Module:
    """``FUNCTION(cfg)`` of ``model.factory``, checked and finished (module doc)."""
    name, _, function = cfg.model.factory.partition(":")
    try:
        module = _import(name)
    except ImportError as err:
        raise ConfigError(f"model.factory={cfg.model.factory}: cannot import {name} ({err}); put the folder holding "
                          "it on PYTHONPATH (or run from it)") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ConfigError(f"model.factory={cfg.model.factory}: {name} has no function {function!r}")
    model = _seeded(cfg.seed, lambda: factory(cfg))
    if not isinstance(model, nn.Module):
        raise PlelabError(f"model.factory={cfg.model.factory} returned {type(model).__name__}, not a torch "
                          "nn.Module")
    return finish_host_model(model, cfg, f"the model of {cfg.model.factory}").to(device)


BUILDERS = {"hf": build_hf, "factory": build_factory}
register_host(Host("hf", build_hf, passes_table_ids=True))
register_host(Host("factory", build_factory))


def host_accounting(cfg: RunConfig) -> dict:
    """Exact parameter counts of ``cfg``'s host model (built on the meta device), in the keys of
    :meth:`plelab.model.accounting.Accounting.to_dict` that need no closed form: ``base`` (every parameter outside
    the PLE modules, shared ones once), ``added`` (the PLE modules'), ``total``, ``added_pct_of_base`` and the
    PLE groups ``ple_table`` / ``ple_model_projection`` / ``ple_per_layer``."""
    with torch.device("meta"):
        model = BUILDERS[cfg.model.host](cfg, "meta") if cfg.model.host in BUILDERS else None
    if model is None:
        raise PlelabError(f"host_accounting takes a model.hf_config or model.factory config, not {cfg.model.host!r}")
    groups = {"ple_table": 0, "ple_model_projection": 0, "ple_per_layer": 0}
    ple_ids: set[int] = set()
    if cfg.ple.enabled:
        ple = PLEModules(model)
        owner = ple.embedding.owner
        groups["ple_table"] = ple.table.numel()
        groups["ple_model_projection"] = sum(p.numel() for n in ("per_layer_model_projection",
                                                                  "per_layer_projection_norm")
                                             for p in getattr(owner, n).parameters())
        ple_ids = {id(p) for p in ple.parameters()}
        groups["ple_per_layer"] = sum(p.numel() for p in ple.parameters()) - groups["ple_table"] \
            - groups["ple_model_projection"]
    unique = {id(p): p for p in model.parameters()}
    base = sum(p.numel() for i, p in unique.items() if i not in ple_ids)
    added = sum(groups.values())
    return {"dP": cfg.ple.dim, "total": base + added, "base": base, "added": added,
            "added_pct_of_base": round(100.0 * added / base, 4), **groups,
            "seq_len": cfg.train.seq_len, "host": cfg.model.host, "groups": {"base": base, **groups}}


def load_host_run(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, RunConfig]:
    """A run trained on an HF or factory trunk, ``(model, config)`` in eval mode: the trunk rebuilt from the run's
    config, then the checkpoint's ``model.safetensors`` (every tensor's name, dtype and shape checked). ``path``: a run
    folder (its latest checkpoint) or a ``checkpoints/step-N`` folder. Runs of plelab's own decoder:
    :func:`plelab.training.loading.load_for_eval`."""
    ckpt = checkpoint_of(path)
    cfg = RunConfig.from_dict(read_state(ckpt, for_resume=False)["config"])
    if cfg.model.host not in BUILDERS:
        raise PlelabError(f"{ckpt} is a run of plelab's own decoder: load it with plelab.load_for_eval (or plelab "
                          "export it to an HF folder)")
    model = BUILDERS[cfg.model.host](cfg, "cpu")
    load_model_weights(model, ckpt)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.to(device).eval(), cfg
