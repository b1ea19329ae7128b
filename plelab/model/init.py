"""Meta-device construction and the one place where parameters get their values.

Every parameter is drawn from its own ``torch.Generator`` seeded by ``(run seed,
parameter name)``. The trunk's initial weights are therefore bit-identical across dP
values and gate variants for the same seed: the sweeps compare runs in pairs, and the
diagnostics measure change since initialisation. A tensor of more than ``INIT_BLOCK`` elements
(256 MB in fp32; only models far above CPU scale have one, e.g. ``seed-3b``'s embedding and table) is
drawn in row blocks, each from the generator of ``(seed, "{name}/rows{b}")``, so any range of its
rows can be drawn without the rest: a rank of a sharded (FSDP2) model draws exactly its own rows
(:func:`init_weights` on ``DTensor`` parameters), bit-identical to the same rows of the full tensor.

Init convention (HF ``PreTrainedModel._init_weights``): Linear and Embedding weights
normal(0, ``initializer_range``), RMSNorm weights 1. The per-layer table uses
``ple.table_init_std`` when set (zeros, frozen, for ``ple.table=zero``; ``frozen`` keeps the
random init and takes it out of the optimizer). Learned scalar/vector gates start at ``ple.gate_init``
(and stay there with ``ple.gate_learn=false``). The table family's other kinds (``aux.kind``) are set by their
module's own ``reset_parameters`` (``aux.init``), drawn on CPU from the generator of ``(seed, module name)``.
Unlike HF Gemma, no table row is a padding row: every row is trainable.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from plelab.config.aux_schema import AuxConfig
from plelab.config.schema import ModelConfig, PLEConfig
from plelab.model.layers import RMSNorm
from plelab.model.modulation import TokenModulation
from plelab.model.ngram import HashedNgramEmbedding
from plelab.model.ple import PLEModules
from plelab.model.transformer import AUX_ATTRIBUTES, AUX_CLASSES, PLECausalLM, build_aux
from plelab.model.value_embed import ValueEmbeddings
from plelab.runtime import seeded_generator

#: tensors with more elements are drawn in row blocks of at most this many elements
INIT_BLOCK = 1 << 26


def table_init_std(mc: ModelConfig, pc: PLEConfig) -> float:
    """The std of a per-layer table's normal init: ``ple.table_init_std``, or ``model.initializer_range``."""
    return pc.table_init_std if pc.table_init_std is not None else mc.initializer_range


def init_spec(model: PLECausalLM) -> dict[str, tuple[str, float]]:
    """Map every parameter name to ``(kind, value)``: ``("normal", std)``, ``("ones", 1)``, ``("const", v)`` or
    ``("module", 0)`` (an aux module's, set by :func:`init_aux`)."""
    mc, pc = model.mc, model.pc
    table_std = table_init_std(mc, pc)
    spec: dict[str, tuple[str, float]] = {}
    for name, module in aux_modules(model).items():
        spec.update({f"{name}.{p_name}": ("module", 0.0) for p_name, _ in module.named_parameters()})
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if full in spec:
                continue
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


AUX_MODULES = tuple(AUX_CLASSES.values())
# aux.init=native: each source's own init under its module's name for it
NATIVE = {ValueEmbeddings: "nanochat", HashedNgramEmbedding: "modded", TokenModulation: "normal"}


def aux_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The table family's modules other than PLE in ``model``, by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, AUX_MODULES)}


def init_aux(name: str, module: nn.Module, seed: int, mc: ModelConfig, ac: AuxConfig) -> None:
    """Set one aux module's values (``aux.init``) from the CPU generator of ``(seed, name)``: the same values on
    every device. nanochat's value tables use std ``H^-½`` (its ``n_embd^-½``), the others ``initializer_range``."""
    device = next(module.parameters()).device
    if device.type != "cpu":
        module.to("cpu")
    std = mc.hidden_size ** -0.5 if isinstance(module, ValueEmbeddings) else mc.initializer_range
    init = NATIVE[type(module)] if ac.init == "native" else "function-preserving"
    module.reset_parameters(generator=seeded_generator(seed, name), std=std, init=init)
    if device.type != "cpu":
        module.to(device)


def build_aux_alone(mc: ModelConfig, ac: AuxConfig, seed: int) -> nn.Module:
    """The run's aux module on its own, on CPU, with the values the whole model's :func:`init_weights` gives it
    (seeded by the same name): what the diagnostics regenerate W_0 from."""
    module = build_aux(mc, ac)
    if module is None:
        raise ValueError(f"aux.kind={ac.kind} has no aux module")
    init_aux(f"model.{AUX_ATTRIBUTES[ac.kind]}", module, seed, mc, ac)
    return module


def init_block_rows(shape: tuple[int, ...]) -> int:
    """Rows per init block of a tensor of ``shape``: all of them up to ``INIT_BLOCK`` elements."""
    rows = shape[0] if shape else 1
    row = max(1, math.prod(shape[1:]))
    return rows if rows * row <= INIT_BLOCK else max(1, INIT_BLOCK // row)


def initial_normal(name: str, shape: tuple[int, ...], seed: int, std: float,
                   rows: tuple[int, int] | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The initial value of a normal-initialised parameter, regenerated exactly (CPU, fp32): the whole
    tensor, or only its rows ``[start, stop)`` (shape ``[stop - start, *shape[1:]]``) with ``rows``;
    written into ``out`` (that shape, any dtype or device) when given, one row block at a time.

    The diagnostics use it to recover W_0 of a table from the run's seed alone; a sharded model uses
    ``rows`` and ``out`` to fill each rank's shard holding no more than one block besides it.
    """
    block = init_block_rows(shape)
    n = shape[0] if shape else 1
    start, stop = rows if rows is not None else (0, n)
    if not 0 <= start <= stop <= n:
        raise ValueError(f"rows {start}:{stop} outside a tensor of {n} rows")
    if block >= n:  # one draw for the whole tensor (every model at CPU scale)
        full = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=seeded_generator(seed, name))
        part = full if rows is None else full[start:stop]
        if out is not None:
            return out.copy_(part)
        return part if rows is None else part.clone()
    if out is None:
        out = torch.empty((stop - start, *shape[1:]), dtype=torch.float32)
    for b in range(start // block, -(-stop // block)):
        lo, hi = b * block, min(n, (b + 1) * block)
        drawn = torch.empty((hi - lo, *shape[1:]), dtype=torch.float32)
        drawn.normal_(0.0, std, generator=seeded_generator(seed, f"{name}/rows{b}"))
        a, z = max(start, lo), min(stop, hi)
        out[a - start:z - start].copy_(drawn[a - lo:z - lo])
    return out


def shard_rows(param: DTensor) -> tuple[int, int]:
    """The rows ``[start, stop)`` of the full tensor that this rank holds of an FSDP2 parameter (``Shard(0)`` on
    a 1-D mesh; ``torch.chunk``'s rule: ``ceil(n / world)`` rows per rank, the last ranks short or empty)."""
    if len(param.placements) != 1 or param.placements[0] != Shard(0):
        raise NotImplementedError(f"sharded init supports Shard(0) on a 1-D mesh, not {param.placements}")
    n = param.shape[0]
    world, rank = param.device_mesh.size(), param.device_mesh.get_local_rank()
    per = -(-n // world)
    start, stop = min(n, rank * per), min(n, (rank + 1) * per)
    local = param.to_local().shape
    if local[0] != stop - start:  # another sharding rule would draw the wrong rows: fail, never guess
        raise NotImplementedError(f"local shard of {tuple(param.shape)} has {local[0]} rows, expected "
                                  f"{stop - start} (rows {start}:{stop})")
    return start, stop


@torch.no_grad()
def init_weights(model: PLECausalLM, seed: int) -> PLECausalLM:
    """Fill every parameter in place from its own seeded generator (values drawn on CPU in fp32).

    A ``DTensor`` parameter (FSDP2, sharded before materialisation) gets only its own rows of the full
    tensor's values; no rank draws or holds the other rows of a blocked tensor.
    """
    spec = init_spec(model)
    for name, module in aux_modules(model).items():
        init_aux(name, module, seed, model.mc, model.ac)
    for name, param in model.named_parameters():
        kind, value = spec[name]
        target = param.to_local() if isinstance(param, DTensor) else param
        if kind == "module":
            continue
        if kind == "normal":
            rows = shard_rows(param) if isinstance(param, DTensor) else None
            initial_normal(name, tuple(param.shape), seed, value, rows=rows, out=target)
        else:
            target.fill_(value)
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
                table_sparse: bool = False, shard: Callable[[nn.Module], None] | None = None,
                activation_checkpointing: bool = False, token_rows: torch.Tensor | None = None,
                ac: AuxConfig | None = None) -> PLECausalLM:
    """Construct on the meta device (instant at any size), then materialise on ``device`` and init.

    ``device="meta"`` returns the uninitialised skeleton, for parameter accounting. ``table_device``
    materialises the per-layer table there instead (e.g. host memory under a GPU trunk); the table
    is never allocated on ``device``. ``table_sparse`` gives the table sparse row gradients (the row-sparse
    optimizer's table). Values depend on neither. ``shard`` (e.g. FSDP2's ``fully_shard`` per unit) is applied on
    the meta device, before anything is allocated: each rank then materialises and draws only its own shard, with
    the values the unsharded model has (:func:`init_weights`). ``activation_checkpointing``: see
    :class:`~plelab.model.transformer.PLETextModel`. ``token_rows [V]``: the id -> row map of
    ``ple.vocab_remap=frequency`` (:func:`~plelab.model.ple.frequency_rows`); without it the map is unfilled
    until a checkpoint is loaded, and reading it raises. ``ac``: the run's ``aux`` section (None: PLE only).
    """
    if token_rows is not None and not (pc.enabled and pc.vocab_remap == "frequency"):
        raise ValueError("token_rows is the id -> row map of ple.vocab_remap=frequency; this config has no remap")
    if token_rows is not None and (tuple(token_rows.shape) != (mc.vocab_size,) or int(token_rows.min()) < 0
                                   or int(token_rows.max()) >= pc.resolved_vocab_size(mc)):
        raise ValueError(f"token_rows must map each of the {mc.vocab_size} ids to a row in [0, "
                         f"{pc.resolved_vocab_size(mc)}), got shape {tuple(token_rows.shape)}")
    with torch.device("meta"):
        model = PLECausalLM(mc, pc, table_sparse=table_sparse, activation_checkpointing=activation_checkpointing,
                            ac=ac)
    if str(device) == "meta":
        return model
    if shard is not None:
        shard(model)
    materialise(model, device, table_device if table_device is not None else device)
    model.to(dtype)
    init_weights(model, seed)
    rows = getattr(model.model, "per_layer_token_rows", None)  # to_empty left it uninitialised
    if rows is not None:
        with torch.no_grad():
            rows.copy_(token_rows) if token_rows is not None else rows.fill_(-1)
    if pc.enabled and pc.table != "learned":  # the frozen / zero controls: the optimizer never sees it
        PLEModules(model).table.requires_grad_(False)
    if pc.enabled and not pc.gate_learn:  # a gate held at ple.gate_init
        for name, p in model.named_parameters():
            if name.endswith("per_layer_gate"):
                p.requires_grad_(False)
    return model
