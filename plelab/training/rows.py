"""Which table row each token id looks up under a run's rule, and exact counts of the rows a run looked up (saved
with every checkpoint; the diagnostics' "used rows")."""

from __future__ import annotations

import numpy as np
import torch

from plelab.config.schema import RunConfig
from plelab.data.tokens import TokenData
from plelab.distributed import sum_across_ranks
from plelab.model.ple import IIDTableIds, frequency_rows
from plelab.model.tables import aux_row_ids, table_view


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
    """How often each table row is looked up by the training split's ids, under the run's id -> row rule (for
    another kind of table: its token ids, or its n-gram buckets over the split cut into training-length windows)."""
    if cfg.aux.extra:
        return _aux_row_counts(cfg, data)
    V, vp = cfg.model.vocab_size, cfg.ple.resolved_vocab_size(cfg.model)
    counts = data.train_counts(max(V, vp))  # one pass over the training split for both the map and the counts
    return rows_of(counts, token_rows(cfg, data, counts), vp)


def _aux_row_counts(cfg: RunConfig, data: TokenData, chunk: int = 1 << 20) -> np.ndarray:
    view = table_view(cfg.model, cfg.ple, cfg.aux)
    if view.keyed_by == "token":
        return data.train_counts(view.rows)
    T = cfg.train.seq_len  # the buckets as training windows hash them: each window stands alone
    stream = torch.from_numpy(np.asarray(data.train[: len(data.train) // T * T], dtype=np.int64)).view(-1, T)
    counts = torch.zeros(view.rows, dtype=torch.int64)
    for start in range(0, len(stream), max(1, chunk // T)):
        ids = aux_row_ids(cfg.aux, cfg.model, stream[start:start + max(1, chunk // T)])
        counts += torch.bincount(ids.reshape(-1), minlength=view.rows)
    return counts.numpy()


def iid_slots(cfg: RunConfig) -> int | None:
    """Rows each position looks up under the null control (``ple.ids=iid`` / ``aux.ids=iid``): the n-gram table's
    orders × heads, else 1; None for a run keyed by its real ids."""
    aux = cfg.aux.extra
    if not (cfg.aux.ids == "iid" if aux else cfg.ple.enabled and cfg.ple.ids == "iid"):
        return None
    return len(cfg.aux.orders) * cfg.aux.heads if aux and cfg.aux.kind == "ngram" else 1


def null_ids(cfg: RunConfig, data: TokenData, device: torch.device | str = "cpu") -> IIDTableIds | None:
    """The null control's draws (``ple.ids=iid`` / ``aux.ids=iid``) from the real rows' frequencies on the training
    split; None for a run keyed by its real ids."""
    slots = iid_slots(cfg)
    if slots is None:
        return None
    return IIDTableIds(torch.from_numpy(row_counts(cfg, data)).to(device), slots)
