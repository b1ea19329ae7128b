"""Diagnostics during training: cheap signal metrics every ``train.diag_every`` steps, the full
structure + use set at every checkpoint (``checkpoints/step-N/diagnostics.json``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from plelab.config.schema import RunConfig
from plelab.diagnostics.signal import SignalProbe, gradient_norms
from plelab.diagnostics.structure import matrix_stats
from plelab.diagnostics.usage import use_metrics
from plelab.diagnostics.verdict import use_verdict
from plelab.model.init import initial_normal, table_init_std
from plelab.model.ple import TABLE_KEY, IIDTableIds
from plelab.model.tables import initial_aux_table, model_table
from plelab.training.task import Observer


class LiveDiagnostics(Observer):
    """The trainer's diagnostics observer for a run with a per-layer table.

    Every ``train.diag_every`` steps (off under ``torch.compile``: hooks would recompile the graph) it hooks
    the first micro-batch's forward (:class:`~plelab.diagnostics.signal.SignalProbe`) and, after the backward,
    adds ``diag`` to the step's metrics row: the probe's signal metrics, per-layer gradient norms, the share of
    table rows looked up so far and the task's own live metrics. At every checkpoint it returns the structure
    and use diagnostics of the table (:func:`checkpoint_diagnostics`), saved as ``diagnostics.json``.
    """

    def __init__(self, task) -> None:
        self.task, self.cfg = task, task.cfg
        tc = self.cfg.train
        # the live probe reads PLE's per-layer signals: another kind of table gets its checkpoint diagnostics only
        self.every = 0 if tc.compile or self.cfg.aux.extra else tc.diag_every
        self.probe: SignalProbe | None = None

    def bind(self, model, env) -> None:
        self.model, self.lm, self.env = model, self.task.language_model(model), env
        self.cfg = self.task.cfg  # the run's config, as the trainer resolved it

    def _due(self, step: int) -> bool:
        return bool(self.every) and (step + 1) % self.every == 0

    def forward_context(self, step: int, micro: int):
        if micro == 0 and self._due(step):
            self.probe = SignalProbe(self.lm)
            return self.probe
        return contextlib.nullcontext()

    def after_backward(self, step: int, rows: dict) -> dict:
        if not self._due(step) or self.probe is None:
            return {}
        diag = {**self.probe.summary(), **gradient_norms(self.lm),
                "rows_touched": rows["text"].fraction_touched(self.env.dist), **self.task.live_metrics(self.model)}
        self.probe = None
        return {"diag": diag}

    def on_checkpoint(self, step: int, counts: dict, table_alpha: float) -> dict | None:
        if self.env.dist.enabled and self.cfg.train.parallel == "fsdp":
            return None  # the table is sharded: no rank holds it whole
        return checkpoint_diagnostics(self.lm, self.cfg, counts["text"].numpy(), table_alpha,
                                      self.task.diag_windows(), self.env.device, self.task.iid,
                                      fraction=step / self.cfg.train.steps,
                                      logits_of=getattr(self.task, "logits_of", None))


def initial_table(cfg: RunConfig) -> torch.Tensor:
    """The run's table at step 0 (PLE's, or another kind's: :func:`~plelab.model.tables.initial_aux_table`),
    regenerated from its seed."""
    if cfg.aux.extra:
        return initial_aux_table(cfg.model, cfg.aux, cfg.seed)
    vp = cfg.ple.resolved_vocab_size(cfg.model)
    if cfg.ple.table == "zero":
        return torch.zeros(vp, cfg.model.num_hidden_layers * cfg.ple.dim)
    return initial_normal(TABLE_KEY, (vp, cfg.model.num_hidden_layers * cfg.ple.dim), cfg.seed,
                          table_init_std(cfg.model, cfg.ple))


@torch.no_grad()
def checkpoint_diagnostics(model: nn.Module, cfg: RunConfig, counts: np.ndarray, alpha: float,
                           windows: torch.Tensor | None, device: torch.device, iid: IIDTableIds | None = None,
                           fraction: float | None = None, logits_of: Callable | None = None) -> dict:
    """:func:`table_diagnostics` of a plelab run (W_0 regenerated from its seed; ``iid``: the null control's id
    frequencies, for its evaluations; ``logits_of``: a host trunk's, :func:`table_diagnostics`).

    A frozen table has Δ = 0 (structure skipped, the use test still asks whether the model relies on
    its random rows); a zeroed table has neither.
    """
    if cfg.ple.table == "zero" and not cfg.aux.extra:
        return {"rows_used": int((counts > 0).sum()), "layers": [], "skipped": "ple.table=zero: no table signal"}
    return table_diagnostics(model, initial_table(cfg), counts, alpha, windows, device, seed=cfg.seed, iid=iid,
                             structure=cfg.aux.extra or cfg.ple.table == "learned", fraction=fraction,
                             logits_of=logits_of)


@torch.no_grad()
def table_diagnostics(model: nn.Module, w0: torch.Tensor, counts: np.ndarray, alpha: float = 1.0,
                      windows: torch.Tensor | None = None, device: torch.device | str = "cpu", *, seed: int = 0,
                      iid: IIDTableIds | None = None, structure: bool = True, fraction: float | None = None,
                      logits_of: Callable | None = None) -> dict:
    """Structure of W_t and Δ = W_t − αW_0 on the used rows of each layer, and the table-level use test, for
    any model holding PLE modules or another kind's table (:func:`~plelab.model.tables.model_table`).

    ``w0 [Vp, L·dP]``: the table at step 0; ``counts [Vp]``: how often each row was looked up in training;
    ``alpha``: Π(1 − lr·wd) of the table's group (1 without weight decay); ``windows [N, T+1]``: validation token
    windows for the use test (None: no use test); ``structure``: False skips the per-layer structure (a frozen table);
    ``fraction``: how far through its run the checkpoint is (the use verdict's calibrated decision point);
    ``logits_of``: the logits in the model's forward output (:func:`~plelab.model.losses.window_losses`).
    """
    table = model_table(model)
    weight, L, dP = table
    wt = weight.detach().float().cpu()
    used = counts > 0
    out: dict = {"rows_used": int(used.sum()), "layers": []}
    if structure:
        delta = wt - alpha * w0.float().view(wt.shape)
        for i in range(L):
            cols = slice(i * dP, (i + 1) * dP)
            out["layers"].append({"layer": i, "wt_used": matrix_stats(wt[used][:, cols]).to_dict(),
                                  "delta_used": matrix_stats(delta[used][:, cols]).to_dict()})
    if windows is not None and len(windows):
        base, results = use_metrics(model, windows, w0, counts, batch=16, device=device, per_layer=False, seed=seed,
                                    iid=iid, table=table, logits_of=logits_of)
        out["val_loss"] = base
        out["use"] = {r.kind: r.to_dict() for r in results}
        perm = out["use"]["permute"]
        out["use_verdict"] = use_verdict(perm["delta"], perm["se"], fraction=fraction)[0]
    return out
