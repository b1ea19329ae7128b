"""Which table row each token id looks up under a run's rule, and exact counts of the rows a run looked up (saved
with every checkpoint; the diagnostics' "used rows")."""

from __future__ import annotations

import numpy as np
import torch

from plelab.config.schema import RunConfig
from plelab.data.tokens import TokenData
from plelab.distributed import sum_across_ranks
from plelab.model.ple import frequency_rows


class RowCounter:
    """How often each row of one table was looked up so far, on this rank."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.counts = torch.zeros(rows, dtype=torch.int64, device=device)

    def update(self, table_ids: torch.Tensor | None) -> None:
        if table_ids is not None:
            self.counts += torch.bincount(table_ids.reshape(-1).to(self.counts.device), minlength=len(self.counts))

    def fraction_touched(self, dist=None) -> float:
        """Fraction of rows looked up so far, over all ranks (collective under torchrun)."""
        counts = sum_across_ranks(self.counts, dist) if dist is not None else self.counts
        return float((counts > 0).float().mean())


def token_rows(cfg: RunConfig, data: TokenData, counts: np.ndarray | None = None) -> torch.Tensor | None:
    """The id -> row map ``[V]`` of ``ple.vocab_remap=frequency``, from the training split's counts (``counts``
    when the caller has them; :func:`~plelab.model.ple.frequency_rows`); ``None`` under Gemma's rule (ids >= Vp ->
    row 0)."""
    if not (cfg.ple.enabled and cfg.ple.vocab_remap == "frequency"):
        return None
    V = cfg.model.vocab_size
    counts = data.train_counts(V) if counts is None else counts[:V]
    return frequency_rows(torch.from_numpy(counts), cfg.ple.resolved_vocab_size(cfg.model))


def rows_of(token_counts: np.ndarray, rows: torch.Tensor | None, table_rows: int) -> np.ndarray:
    """Per-row counts ``[Vp]`` from per-id counts ``[V]`` under the map ``rows`` (None: ids >= Vp -> row 0)."""
    if rows is None:
        out = token_counts[:table_rows].copy()
        out[0] += token_counts[table_rows:].sum()
        return out
    return np.bincount(rows.numpy(), weights=token_counts[:len(rows)], minlength=table_rows).round().astype(np.int64)


def row_counts(cfg: RunConfig, data: TokenData) -> np.ndarray:
    """How often each table row is looked up by the training split's ids, under the run's id -> row rule."""
    V, vp = cfg.model.vocab_size, cfg.ple.resolved_vocab_size(cfg.model)
    counts = data.train_counts(max(V, vp))  # one pass over the training split for both the map and the counts
    return rows_of(counts, token_rows(cfg, data, counts), vp)
