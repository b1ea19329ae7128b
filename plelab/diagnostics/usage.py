"""Use metrics: does the model rely on its per-layer table? Interventions at evaluation time.

On the same validation windows (paired), the loss is measured with the trained table and
with the table (or one layer's slice of it) changed:

- ``reset``: rows set back to their initial values W_0 (what training added is removed);
- ``permute``: rows shuffled among rows of similar training frequency (what each id's row
  says is scrambled, while the distribution of rows the model sees is kept).

:func:`ablation_losses` is a third intervention, which no verdict reads: every row replaced by the mean of its
frequency bin (what distinguishes a row from rows of similar frequency removed by averaging, not by exchange).
The calibration benchmark scores the USE call with it, on other seeds and other windows
(:mod:`plelab.calibration.truth`), so that a call is never scored by its own statistic.

The reported change is the mean over windows of ``loss_intervened − loss_trained`` with its
standard error across windows. A table that carries nothing the model uses gives ≈ 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from plelab.model.losses import window_losses
from plelab.model.ple import IIDTableIds, PLEModules


@dataclass
class Intervention:
    kind: str  # "reset" | "permute"
    layer: int | None  # None = every layer at once
    delta: float  # mean paired loss change (nats); > 0: the intervention hurts
    se: float  # standard error of the mean over windows
    windows: int

    def to_dict(self) -> dict:
        return asdict(self)


def frequency_bins(counts: np.ndarray, bin_size: int = 16) -> list[np.ndarray]:
    """Rows grouped by training frequency: never-seen rows form one bin; seen rows, sorted by count,
    are cut into bins of ``bin_size`` (the last bin takes the remainder)."""
    order = np.argsort(counts, kind="stable")
    unseen = order[counts[order] == 0]
    seen = order[counts[order] > 0]
    bins = [seen[i:i + bin_size] for i in range(0, len(seen), bin_size)]
    if len(bins) > 1 and len(bins[-1]) < bin_size:
        short = bins.pop()  # popped first: ``bins[-2] = f(bins.pop())`` would assign to the wrong bin
        bins[-1] = np.concatenate([bins[-1], short])
    return ([unseen] if len(unseen) else []) + bins


def within_bin_permutation(counts: np.ndarray, seed: int = 0, bin_size: int = 16) -> torch.Tensor:
    """A row permutation that only swaps rows of similar frequency: ``new[i] = old[perm[i]]``."""
    rng = np.random.default_rng(seed)
    perm = np.arange(len(counts))
    for b in frequency_bins(counts, bin_size):
        perm[b] = rng.permutation(b)
    return torch.from_numpy(perm)


@contextlib.contextmanager
def weight_swapped(weight: torch.nn.Parameter, values: torch.Tensor):
    """Temporarily replace a parameter's values (restored on exit, also after an error)."""
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.copy_(values.to(weight.device, weight.dtype))
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def use_metrics(model: nn.Module, windows: torch.Tensor, w0: torch.Tensor | None, counts: np.ndarray, batch: int,
                device: torch.device, per_layer: bool = True, seed: int = 0, iid: IIDTableIds | None = None,
                table: tuple[nn.Parameter, int, int] | None = None,
                logits_of: Callable | None = None) -> tuple[float, list[Intervention]]:
    """Base validation loss and the reset (when ``w0`` is known) and permute interventions (whole table, then each
    layer); ``iid``, ``logits_of``: see :func:`window_losses`. ``table``: ``(weight [Vp, L·dP], L, dP)`` of a model
    whose PLE modules plelab did not build (an HF Gemma); default: found with :class:`PLEModules`."""
    if table is None:
        ple = PLEModules(model)
        table = (ple.table, ple.num_layers, ple.dim)
    weight, L, dP = table
    base = window_losses(model, windows, batch, device, iid, logits_of)
    wt = weight.detach().float().cpu()
    perm = within_bin_permutation(counts, seed)
    variants = {"reset": w0.reshape(wt.shape)} if w0 is not None else {}
    variants["permute"] = wt[perm]
    results = []
    for layer in [None, *(range(L) if per_layer else [])]:
        cols = slice(None) if layer is None else slice(layer * dP, (layer + 1) * dP)
        for kind, changed in variants.items():
            new = wt.clone()
            new[:, cols] = changed[:, cols]
            with weight_swapped(weight, new):
                diff = window_losses(model, windows, batch, device, iid, logits_of) - base
            se = float(diff.std(unbiased=True) / len(diff) ** 0.5) if len(diff) > 1 else float("nan")
            results.append(Intervention(kind, layer, float(diff.mean()), se, len(diff)))
    return float(base.mean()), results


def bin_mean_rows(weight: torch.Tensor, counts: np.ndarray, bin_size: int = 16) -> torch.Tensor:
    """``weight [Vp, ·]`` with every row replaced by the mean of its frequency bin (:func:`frequency_bins`)."""
    out = weight.detach().float().cpu().clone()
    for b in frequency_bins(counts, bin_size):
        idx = torch.from_numpy(np.asarray(b, dtype=np.int64))
        out[idx] = out[idx].mean(0, keepdim=True)
    return out


def ablation_losses(model: nn.Module, windows: torch.Tensor, counts: np.ndarray, batch: int, device: torch.device,
                    iid: IIDTableIds | None = None, table: tuple[nn.Parameter, int, int] | None = None,
                    logits_of: Callable | None = None) -> torch.Tensor:
    """Per-window paired loss change ``[N]`` (nats; > 0: the model needed what the rows said) when every row of the
    table is replaced by the mean of its frequency bin (:func:`bin_mean_rows`); arguments as :func:`use_metrics`."""
    weight = PLEModules(model).table if table is None else table[0]
    base = window_losses(model, windows, batch, device, iid, logits_of)
    with weight_swapped(weight, bin_mean_rows(weight, counts)):
        return window_losses(model, windows, batch, device, iid, logits_of) - base
