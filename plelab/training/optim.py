"""AdamW with explicit parameter groups (by what each parameter is), and the LR schedule.

Groups (they partition the model's parameters; asserted):

- ``decay``: matmul weights (attention, MLP, untied LM head, PLE projections and gates);
  weight decay ``train.weight_decay``.
- ``no_decay``: RMSNorm weights, learned scalar/vector gates, and the main token embedding
  (an embedding table: no decay, as for the PLE table).
- ``ple_table``: ``embed_tokens_per_layer`` alone, with ``train.table_lr`` (× ``train.table_lr_mult``) and
  ``train.table_weight_decay`` (default 0). Absent when the table is frozen (``ple.table``).
  With ``train.table_optimizer=row-sparse`` the group is marked ``row_sparse`` and stepped row by row
  (:mod:`plelab.training.sparse`); every other group is plain AdamW either way.
- ``aux_table``: the tables of the family's other kinds (``aux.kind``: value, n-gram, modulation tables), with the
  table's learning rate and weight decay, so each kind's table trains as PLE's does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from plelab.config.schema import TrainConfig
from plelab.errors import PlelabError
from plelab.model.init import aux_modules
from plelab.model.ple import PLEModules, find_ple_modules
from plelab.training.sparse import RowSparseAdamW


def param_groups(model: nn.Module, *, lr: float, table_lr: float | None = None, weight_decay: float = 0.0,
                 table_weight_decay: float = 0.0) -> list[dict]:
    """plelab's AdamW groups for any model holding PLE modules: plelab's, an HF model after ``attach``, or your own
    decoder holding a :class:`~plelab.PerLayerEmbedding` under any attribute name (found by type:
    :class:`~plelab.PLEModules`).

    ``decay``: matrices (``weight_decay``); ``no_decay``: vectors and scalars (norm weights, learned gates,
    biases) and input-embedding tables; ``ple_table``: the per-layer table (``table_lr``, default ``lr``;
    ``table_weight_decay``), marked ``row_sparse`` when its gradients are (``sparse_table=True``) so that
    :func:`adamw` steps it row by row. Frozen parameters are left out. The groups cover every trainable
    parameter (asserted). For a model without PLE there is no ``ple_table`` group, and ``table_lr`` /
    ``table_weight_decay`` — which could not be honoured — are refused (PlelabError), as for a frozen table and
    for PLE modules that are not one embedding and one injection per layer.
    """
    try:
        lookup = PLEModules(model).embedding.owner.embed_tokens_per_layer
    except LookupError as err:
        if any(find_ple_modules(model)):
            raise PlelabError(f"plelab.param_groups: {err}") from None
        lookup = None
    table = None if lookup is None else lookup.weight
    aux_tables = {id(m.weight) for module in aux_modules(model).values() for m in module.modules()
                  if isinstance(m, nn.Embedding) and m.weight.requires_grad}
    if (table is None or not table.requires_grad) and not aux_tables and (table_lr is not None or table_weight_decay):
        where = "has no per-layer table" if table is None else "has its per-layer table frozen"
        raise PlelabError(f"plelab.param_groups: table_lr / table_weight_decay given but the model {where}; "
                          "leave them out (or add PLE with plelab.PerLayerEmbedding / plelab.attach)")
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    groups: dict[str, list] = {"decay": [], "no_decay": [], "ple_table": [], "aux_table": []}
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        if p is table:
            groups["ple_table"].append(p)
        elif id(p) in aux_tables:
            groups["aux_table"].append(p)
        elif p.ndim < 2 or id(p) in embeddings:
            groups["no_decay"].append(p)
        else:
            groups["decay"].append(p)
    assert sum(len(v) for v in groups.values()) == len(trainable), "optimizer groups do not cover the model"
    spec = {"decay": (lr, weight_decay), "no_decay": (lr, 0.0),
            "ple_table": (lr if table_lr is None else table_lr, table_weight_decay),
            "aux_table": (lr if table_lr is None else table_lr, table_weight_decay)}
    sparse = lookup is not None and table.requires_grad and lookup.sparse
    return [adamw_group(k, v, *spec[k], **({"row_sparse": True} if sparse and k == "ple_table" else {}))
            for k, v in groups.items() if v]


def optimizer_groups(model: nn.Module, tc: TrainConfig) -> list[dict]:
    """:func:`param_groups` with ``train.*``'s learning rates and weight decays (the table's where the model has a
    trainable table)."""
    try:
        trainable_table = PLEModules(model).table.requires_grad
    except LookupError:
        trainable_table = bool(aux_modules(model))
    groups = param_groups(model, lr=tc.lr, weight_decay=tc.weight_decay,
                          **({"table_lr": table_lr(tc), "table_weight_decay": tc.table_weight_decay}
                             if trainable_table else {}))
    for g in groups:
        if g["name"] == "ple_table" and tc.table_optimizer == "row-sparse":
            g["row_sparse"] = True
    return groups


def table_lr(tc: TrainConfig) -> float:
    """The per-layer table group's learning rate: ``train.table_lr`` (or ``train.lr``) × ``train.table_lr_mult``."""
    return (tc.lr if tc.table_lr is None else tc.table_lr) * tc.table_lr_mult


def adamw_group(name: str, params: list, lr: float, weight_decay: float, **extra) -> dict:
    """One named parameter group (``base_lr`` is what the schedule multiplies)."""
    return {"name": name, "params": params, "lr": lr, "base_lr": lr, "weight_decay": weight_decay, **extra}


def adamw(groups: list[dict]) -> torch.optim.AdamW:
    """plelab's AdamW (β = 0.9, 0.95; ε = 1e-8). foreach=False keeps CPU results bit-identical across runs
    and group layouts. Groups marked ``row_sparse`` make it a :class:`RowSparseAdamW`."""
    cls = RowSparseAdamW if any(g.get("row_sparse") for g in groups) else torch.optim.AdamW
    return cls(groups, betas=(0.9, 0.95), eps=1e-8, foreach=False)


def build_optimizer(model: nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    return adamw(optimizer_groups(model, tc))


def lr_multiplier(step: int, tc: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` at ``steps``."""
    if tc.warmup_steps and step < tc.warmup_steps:
        return (step + 1) / tc.warmup_steps
    progress = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return tc.min_lr_ratio + (1 - tc.min_lr_ratio) * cos


def set_lr(opt: torch.optim.Optimizer, mult: float) -> None:
    for g in opt.param_groups:
        g["lr"] = g["base_lr"] * mult
