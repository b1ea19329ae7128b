"""Diagnostics during training: cheap signal metrics every ``train.diag_every`` steps, the full
structure + use set at every checkpoint (``checkpoints/step-N/diagnostics.json``).
"""

from __future__ import annotations

import numpy as np
import torch

from plelab.config.schema import RunConfig
from plelab.diagnostics.signal import SignalProbe, gradient_norms
from plelab.diagnostics.structure import matrix_stats
from plelab.diagnostics.usage import use_metrics
from plelab.diagnostics.verdict import use_verdict
from plelab.model.init import initial_normal
from plelab.model.transformer import PLECausalLM

TABLE = "model.embed_tokens_per_layer.weight"


class RowCounter:
    """Exact count of how often each table row was looked up so far (saved with checkpoints)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.counts = torch.zeros(rows, dtype=torch.int64, device=device)

    def update(self, table_ids: torch.Tensor | None) -> None:
        if table_ids is not None:
            self.counts += torch.bincount(table_ids.reshape(-1), minlength=len(self.counts))

    def fraction_touched(self, dist=None) -> float:
        """Fraction of rows looked up so far, over all ranks (collective under torchrun)."""
        from plelab.train.distributed import sum_across_ranks

        counts = sum_across_ranks(self.counts, dist) if dist is not None else self.counts
        return float((counts > 0).float().mean())


def probe_context(model: PLECausalLM, enabled: bool):
    """A SignalProbe on ``model`` when ``enabled`` (a diag step), else a no-op context."""
    import contextlib

    return SignalProbe(model) if enabled and model.pc.enabled else contextlib.nullcontext()


def live_row(probe, model: PLECausalLM, counter: RowCounter, dist=None) -> dict:
    """The cheap per-layer metrics of one step (call after backward, before the optimizer step)."""
    return {"diag": {**probe.summary(), **gradient_norms(model), "rows_touched": counter.fraction_touched(dist)}}


def initial_table(cfg: RunConfig) -> torch.Tensor:
    vp = cfg.ple.resolved_vocab_size(cfg.model)
    if cfg.ple.table == "zero":
        return torch.zeros(vp, cfg.model.num_hidden_layers * cfg.ple.dim)
    std = cfg.ple.table_init_std if cfg.ple.table_init_std is not None else cfg.model.initializer_range
    return initial_normal(TABLE, (vp, cfg.model.num_hidden_layers * cfg.ple.dim), cfg.seed, std)


@torch.no_grad()
def checkpoint_diagnostics(model: PLECausalLM, cfg: RunConfig, counts: np.ndarray, alpha: float,
                           windows: torch.Tensor | None, device: torch.device) -> dict:
    """Structure of W_t and Δ = W_t − αW_0 on used rows per layer, and the table-level use test.

    A frozen table has Δ = 0 (structure skipped, the use test still asks whether the model relies on
    its random rows); a zeroed table has neither.
    """
    L, dP = cfg.model.num_hidden_layers, cfg.ple.dim
    if cfg.ple.table == "zero":
        return {"rows_used": int((counts > 0).sum()), "layers": [], "skipped": "ple.table=zero: no table signal"}
    wt = model.model.embed_tokens_per_layer.weight.detach().float().cpu()
    delta = wt - alpha * initial_table(cfg)
    used = counts > 0
    out: dict = {"rows_used": int(used.sum()), "layers": []}
    for i in range(L if cfg.ple.table == "learned" else 0):
        cols = slice(i * dP, (i + 1) * dP)
        out["layers"].append({"layer": i, "wt_used": matrix_stats(wt[used][:, cols]).to_dict(),
                              "delta_used": matrix_stats(delta[used][:, cols]).to_dict()})
    if windows is not None and len(windows):
        base, results = use_metrics(model, windows, initial_table(cfg), counts, batch=16, device=device,
                                    per_layer=False, seed=cfg.seed)
        out["val_loss"] = base
        out["use"] = {r.kind: r.to_dict() for r in results}
        perm = out["use"]["permute"]
        out["use_verdict"] = use_verdict(perm["delta"], perm["se"])[0]
    return out
