"""The seed's contrast, measured: a visual run's two per-layer tables side by side.

``text`` is the LM's ``embed_tokens_per_layer`` (keyed by caption words), ``visual`` is
``visual_embed_tokens_per_layer`` (keyed by patch IDs). At the end of every run — the same step
for every arm — :func:`end_of_run` measures for each table (``visual_tokenizers_and_diagnostics.md``
§4, the verdict axes of :mod:`plelab.diagnostics.verdict`):

- structure of ``W_t`` on its used rows, per layer: mean cosine, centred effective rank and PC1
  share, next to a same-shape i.i.d. Gaussian sample (the seed's metrics and their random
  baseline), and the same metrics of ``Δ = W_t − αW_0``;
- use (the USE axis): the paired change of the validation caption loss — and of the content-word
  loss — when the table's rows are permuted among rows of similar frequency, or reset to ``W_0``;
  standard errors across captions.

:func:`cross_seed` reads two seeds' final checkpoints and gives the CKA of their ``Δ`` against the
within-frequency-bin permutation null (the STRUCTURE axis). Tokenizers are fitted with
``visual.data_seed``, not the run seed, so row k is the same cluster in every seed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from plelab.config.schema import RunConfig
from plelab.diagnostics.agreement import cka_against_null
from plelab.diagnostics.diagnose import weight_decay_shrink
from plelab.diagnostics.live import initial_table
from plelab.diagnostics.structure import gaussian_null, matrix_stats
from plelab.diagnostics.usage import weight_swapped, within_bin_permutation
from plelab.diagnostics.verdict import use_verdict
from plelab.model.init import initial_normal, table_init_std
from plelab.model.ple import PLEModules
from plelab.training.checkpoint import read_state
from plelab.visual.model import VISUAL_TABLE
from plelab.visual.text import PAD

TABLES = {"text": "lm.model.embed_tokens_per_layer.weight", "visual": VISUAL_TABLE}
COUNT_KEYS = {"text": "diag.row_counts", "visual": "diag.visual_row_counts"}
SUMMARY_KEYS = ("mean_cos", "mean_abs_cos", "erank_centred", "pc1")


def initial_tables(cfg: RunConfig, k: int) -> dict[str, torch.Tensor]:
    """``W_0`` of each table a run has (regenerated from the name-seeded initialisation)."""
    out = {"text": initial_table(cfg)}
    if k:
        pc, mc = cfg.ple, cfg.model
        out["visual"] = initial_normal(VISUAL_TABLE, (k, mc.num_hidden_layers * pc.dim), cfg.seed,
                                       table_init_std(mc, pc))
    return out


def structure_stats(wt: torch.Tensor, delta: torch.Tensor, counts: np.ndarray, num_layers: int, dim: int) -> dict:
    """Per-layer structure of ``W_t`` and ``Δ`` on the used rows (``[rows, L·dP]`` each), with the null."""
    used = torch.from_numpy(counts > 0)
    n = int(used.sum())
    out: dict = {"rows": len(counts), "rows_used": n, "dim": dim, "layers": []}
    if n < 2:
        return out
    null = gaussian_null(n, dim, seed=1).to_dict()
    for i in range(num_layers):
        cols = slice(i * dim, (i + 1) * dim)
        out["layers"].append({"layer": i, "wt_used": matrix_stats(wt[used][:, cols]).to_dict(),
                              "delta_used": matrix_stats(delta[used][:, cols]).to_dict()})
    out["null"] = null
    out["wt_mean"] = {k: float(np.mean([ly["wt_used"][k] for ly in out["layers"]])) for k in SUMMARY_KEYS}
    out["delta_mean"] = {k: float(np.mean([ly["delta_used"][k] for ly in out["layers"]])) for k in SUMMARY_KEYS}
    return out


def paired_change(base: torch.Tensor, new: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean over captions of (new − base) per-token loss averaged on ``mask``; SE across captions."""
    n_tok = mask.sum(1)
    keep = n_tok > 0
    diff = ((new - base) * mask).sum(1)[keep] / n_tok[keep]
    n = len(diff)
    se = float(diff.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.nan
    return {"delta": float(diff.mean()) if n else math.nan, "se": se, "captions": n}


def table_weights(model, learned_only: bool = False) -> dict[str, torch.nn.Parameter]:
    """The run's per-layer tables by name (``learned_only``: leave out a frozen or zeroed text table)."""
    text = PLEModules(model.lm).table
    out = {} if learned_only and model.lm.pc.table != "learned" else {"text": text}
    if model.num_ids:
        out["visual"] = model.visual_embed_tokens_per_layer.weight
    return out


@torch.no_grad()
def end_of_run(task, model, step: int, counts: dict[str, np.ndarray]) -> dict:
    """Structure and use of each table of a finished visual run (:class:`~plelab.visual.task.VisualTask`,
    its model after ``step`` steps, the row counts per table)."""
    cfg, data = task.cfg, task.data
    L, dP = cfg.model.num_hidden_layers, cfg.ple.dim
    caps = data.val_caps
    real = (caps != PAD).float()
    masks = {"caption": real, "content": real * data.val_content.float()}
    base = task.val_per_token(model)
    w0s = initial_tables(cfg, model.num_ids)
    out = {}
    alpha = weight_decay_shrink(cfg, step)  # both tables' groups share the table lr and decay
    for name, weight in table_weights(model, learned_only=True).items():
        wt = weight.detach().float().cpu()
        c = counts[name]
        report = structure_stats(wt, wt - alpha * w0s[name], c, L, dP)
        perm = within_bin_permutation(c, seed=cfg.seed)
        report["use"] = {}
        for kind, values in (("permute", wt[perm]), ("reset", w0s[name])):
            with weight_swapped(weight, values):
                new = task.val_per_token(model)
            report["use"][kind] = {m: paired_change(base, new, mask) for m, mask in masks.items()}
        p = report["use"]["permute"]["caption"]
        report["use_verdict"] = use_verdict(p["delta"], p["se"])[0]
        out[name] = report
    return out


def gradient_per_row(weight: torch.nn.Parameter, num_layers: int, dim: int) -> list[float | None]:
    """Per layer: mean L2 norm of the gradient over the rows that received one (a diag step)."""
    g = weight.grad
    if g is None:
        return [None] * num_layers
    norms = g.detach().float().view(g.shape[0], num_layers, dim).norm(dim=2)  # [rows, L]
    hit = norms.sum(1) > 0
    if not hit.any():
        return [0.0] * num_layers
    return norms[hit].mean(0).tolist()


def load_run_tables(ckpt: Path) -> dict[str, tuple[torch.Tensor, np.ndarray]]:
    """``{table: (Δ [rows, L·dP], row counts)}`` from a visual run's checkpoint."""
    state = read_state(ckpt, for_resume=False)
    cfg = RunConfig.from_dict(state["config"])
    alpha = weight_decay_shrink(cfg, state["step"])
    learned = {"text"} if cfg.ple.table == "learned" else set()
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        weights = {name: f.get_tensor(key).float() for name, key in TABLES.items()
                   if key in f.keys() and (name in learned or name == "visual")}
    with safe_open(str(ckpt / "optimizer.safetensors"), framework="pt") as f:
        counts = {name: f.get_tensor(key).numpy().astype(np.float64) for name, key in COUNT_KEYS.items()
                  if key in f.keys()}
    if "text" in counts:
        counts["text"][PAD] = 0  # <pad> is looked up at every padded position but gets no gradient
    k = len(weights["visual"]) if "visual" in weights else 0
    w0s = initial_tables(cfg, k)
    return {name: (w - alpha * w0s[name], counts[name]) for name, w in weights.items() if name in counts}


def cross_seed(checkpoints: dict[int, Path]) -> dict[int, dict[str, dict]]:
    """Per seed and table: CKA of this seed's Δ with the next seed's (cyclic) against the permutation null;
    ``independent`` marks the disjoint pairs (seeds 0–1, 2–3, … in sorted order), the only ones a count may add up:
    the cyclic pairs share runs."""
    if len(checkpoints) < 2 or not all(p.exists() for p in checkpoints.values()):
        return {}
    tables = {seed: load_run_tables(p) for seed, p in checkpoints.items()}
    seeds, out = sorted(tables), {}
    for i, s in enumerate(seeds):
        nxt = tables[seeds[(i + 1) % len(seeds)]]
        out[s] = {}
        for name, (delta, counts) in tables[s].items():
            if name not in nxt:
                continue
            both = (counts > 0) & (nxt[name][1] > 0)
            if both.sum() < 8:  # too few shared rows for a CKA and its null
                continue
            res = cka_against_null(delta[both], nxt[name][0][both], counts[both], seed=s)
            out[s][name] = {**{k: res[k] for k in ("cka", "null_mean", "null_sd")},
                            "independent": i % 2 == 0 and i + 1 < len(seeds)}
    return out
