"""One view of a run's token-indexed table, whatever its kind: what the row counts, the table's step-0 values and the
diagnostics read.

Every kind of the family keeps its rows in one tensor whose columns are ``layers`` blocks of ``dim``:

    kind        state-dict key                          rows   layers        dim           rows keyed by
    ple         model.embed_tokens_per_layer.weight     Vp     L             dP            token ids (Gemma's rule)
    value       model.value_embeddings.embed.weight     V      |aux.layers|  n_kv·head_dim token ids
    ngram       model.ngram_embedding.embed.weight      R      1             d             hash buckets [B,T,S]
    modulation  model.token_modulation.embed.weight     V      |aux.layers|  H             token ids

so the per-layer structure, the cross-seed agreement and the row-permutation use test run on each as they run on
PLE's table, with bucket counts in place of token counts for the n-gram table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plelab.config.aux_schema import AuxConfig
from plelab.config.schema import ModelConfig, PLEConfig
from plelab.model.init import aux_modules, build_aux_alone
from plelab.model.modulation import selected_layers
from plelab.model.ngram import HashedNgramEmbedding, ngram_ids, resolve_sizes
from plelab.model.ple import TABLE_KEY, PLEModules
from plelab.model.transformer import AUX_ATTRIBUTES
from plelab.model.value_embed import value_embed_layers


@dataclass(frozen=True)
class TableView:
    """A run's table: its kind, state-dict ``key`` and shape ``[rows, layers·dim]``; ``keyed_by`` token ids or
    hash buckets."""

    kind: str
    key: str
    rows: int
    layers: int
    dim: int
    keyed_by: str = "token"


def table_view(mc: ModelConfig, pc: PLEConfig, ac: AuxConfig | None = None) -> TableView | None:
    """The table of a run of ``mc``, ``pc``, ``ac`` (``None``: a dP=0 trunk, no table)."""
    ac = ac if ac is not None else AuxConfig()
    L, H, V = mc.num_hidden_layers, mc.hidden_size, mc.vocab_size
    if ac.kind == "ple":
        return TableView("ple", TABLE_KEY, pc.resolved_vocab_size(mc), L, pc.dim) if pc.enabled else None
    key = aux_table_key(ac.kind)
    if ac.kind == "value":
        layers = ac.layers or value_embed_layers(L)
        return TableView("value", key, V, len(layers), mc.num_key_value_heads * mc.resolved_head_dim)
    if ac.kind == "ngram":
        _, rows, dim = resolve_sizes(V, H, ac.orders, ac.heads, ac.rows, ac.dim, ac.rows_multiple)
        return TableView("ngram", key, rows, 1, dim, "bucket")
    return TableView("modulation", key, V, len(selected_layers(L, ac.layers)), H)


def aux_table_key(kind: str) -> str:
    """The state-dict key of an aux kind's table (``model.value_embeddings.embed.weight``, …)."""
    return f"model.{AUX_ATTRIBUTES[kind]}.embed.weight"


def model_table(model: nn.Module) -> tuple[nn.Parameter, int, int]:
    """``(weight [rows, layers·dim], layers, dim)`` of the table ``model`` holds: an aux module's, or its PLE's."""
    found = list(aux_modules(model).values())
    if len(found) > 1:
        raise LookupError(f"the model holds {len(found)} tables of the family; plelab reads one per model")
    if not found:
        ple = PLEModules(model)
        return ple.table, ple.num_layers, ple.dim
    module = found[0]
    weight = module.embed.weight
    layers = 1 if isinstance(module, HashedNgramEmbedding) else len(module.layers)  # value, modulation: selected
    return weight, layers, weight.shape[1] // layers


def aux_row_ids(ac: AuxConfig, mc: ModelConfig, input_ids: torch.Tensor) -> torch.Tensor:
    """The rows of the run's aux table that ``input_ids [B,T]`` look up: the ids themselves, or the n-gram buckets
    ``[B,T,S]``."""
    if ac.kind != "ngram":
        return input_ids
    _, rows, _ = resolve_sizes(mc.vocab_size, mc.hidden_size, ac.orders, ac.heads, ac.rows, ac.dim, ac.rows_multiple)
    return ngram_ids(input_ids, rows=rows, orders=ac.orders, heads=ac.heads, seed=ac.hash_seed)


def initial_aux_table(mc: ModelConfig, ac: AuxConfig, seed: int) -> torch.Tensor:
    """The aux table's values at step 0, regenerated from the run's seed exactly as the run drew them."""
    return build_aux_alone(mc, ac, seed).embed.weight.detach()
