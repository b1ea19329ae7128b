"""Meta-device construction and the one place where parameters get their values.

Every parameter is drawn from its own ``torch.Generator`` seeded by ``(run seed,
parameter name)``. The trunk's initial weights are therefore bit-identical across dP
values and gate variants for the same seed: the sweeps compare runs in pairs, and the
diagnostics measure change since initialisation.

Init convention (HF ``PreTrainedModel._init_weights``): Linear and Embedding weights
normal(0, ``initializer_range``), RMSNorm weights 1. The per-layer table uses
``ple.table_init_std`` when set (zeros, frozen, for ``ple.table=zero``; ``frozen`` keeps the
random init and takes it out of the optimizer). Learned scalar/vector gates start at ``ple.gate_init``.
Unlike HF Gemma, no table row is a padding row: every row is trainable.
"""

from __future__ import annotations

import torch
from torch import nn

from plelab.config.schema import ModelConfig, PLEConfig
from plelab.model.layers import RMSNorm
from plelab.model.transformer import PLECausalLM
from plelab.runtime import seeded_generator


def table_init_std(mc: ModelConfig, pc: PLEConfig) -> float:
    """The std of a per-layer table's normal init: ``ple.table_init_std``, or ``model.initializer_range``."""
    return pc.table_init_std if pc.table_init_std is not None else mc.initializer_range


def init_spec(model: PLECausalLM) -> dict[str, tuple[str, float]]:
    """Map every parameter name to ``(kind, value)``: ``("normal", std)``, ``("ones", 1)`` or ``("const", v)``."""
    mc, pc = model.mc, model.pc
    table_std = table_init_std(mc, pc)
    spec: dict[str, tuple[str, float]] = {}
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if isinstance(module, RMSNorm):
                spec[full] = ("ones", 1.0)
            elif p_name == "per_layer_gate":
                spec[full] = ("const", pc.gate_init)
            elif mod_name.endswith("embed_tokens_per_layer"):
                spec[full] = ("const", 0.0) if pc.table == "zero" else ("normal", table_std)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                spec[full] = ("normal", mc.initializer_range)
            else:
                raise AssertionError(f"no init rule for parameter {full}")
    return spec


def initial_normal(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    """The initial value of a normal-initialised parameter, regenerated exactly (CPU, fp32).

    The diagnostics use it to recover W_0 of a table from the run's seed alone.
    """
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=seeded_generator(seed, name))


@torch.no_grad()
def init_weights(model: PLECausalLM, seed: int) -> PLECausalLM:
    """Fill every parameter in place from its own seeded generator (values drawn on CPU in fp32)."""
    spec = init_spec(model)
    for name, param in model.named_parameters():
        kind, value = spec[name]
        if kind == "normal":
            param.copy_(initial_normal(name, tuple(param.shape), seed, value))
        else:
            param.fill_(value)
    return model


def materialise(model: PLECausalLM, device: str | torch.device, table_device: str | torch.device | None) -> None:
    """``to_empty`` for a meta-device model, the per-layer table on ``table_device`` (None: skip it, left on
    the meta device for the caller to fill; default placement when equal to ``device``)."""
    table = getattr(model.model, "embed_tokens_per_layer", None)
    for module in model.modules():
        if module is not table:
            module.to_empty(device=device, recurse=False)
    if table is not None and table_device is not None:
        table.to_empty(device=table_device)


def build_model(mc: ModelConfig, pc: PLEConfig, seed: int = 0, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, table_device: str | torch.device | None = None,
                table_sparse: bool = False) -> PLECausalLM:
    """Construct on the meta device (instant at any size), then materialise on ``device`` and init.

    ``device="meta"`` returns the uninitialised skeleton, for parameter accounting. ``table_device``
    materialises the per-layer table there instead (e.g. host memory under a GPU trunk); the table
    is never allocated on ``device``. ``table_sparse`` gives the table sparse row gradients (the row-sparse
    optimizer's table). Values depend on neither.
    """
    with torch.device("meta"):
        model = PLECausalLM(mc, pc, table_sparse=table_sparse)
    if str(device) == "meta":
        return model
    materialise(model, device, table_device if table_device is not None else device)
    model.to(dtype)
    init_weights(model, seed)
    if pc.enabled and pc.table != "learned":  # the frozen / zero controls: the optimizer never sees it
        model.model.embed_tokens_per_layer.weight.requires_grad_(False)
    return model
