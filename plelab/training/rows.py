"""Exact counts of the table rows a run looked up (saved with every checkpoint; the diagnostics' "used rows")."""

from __future__ import annotations

import torch

from plelab.distributed import sum_across_ranks


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
