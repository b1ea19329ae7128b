"""How good are the visual IDs, as numbers (``visual_tokenizers_and_diagnostics.md`` §4.4):

- utilisation = |{k : c_k > 0}| / K over M assigned patches, against the uniform baseline
  1 − (1 − 1/K)^M (what M uniform draws would touch);
- perplexity = exp(−Σ p_k ln p_k), against K (uniform) — reported with M/K, since a small M biases
  it down;
- ID stability: the flip rate between two lookups of the same patches, against chance
  (:func:`plelab.visual.flips.flip_stats`);
- ID semantics = normalised mutual information between IDs and the ground-truth patch labels,
  NMI = I(ID; label) / mean(H(ID), H(label)) (arithmetic normalisation, scikit-learn's default):
  0 for IDs independent of the labels, 1 when either determines the other exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def _flat(x) -> np.ndarray:
    return (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).reshape(-1).astype(np.int64)


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def utilisation(ids, k: int) -> dict:
    flat = _flat(ids)
    m = len(flat)
    counts = np.bincount(flat, minlength=k)
    return {"utilisation": float((counts > 0).mean()), "uniform_baseline": 1 - (1 - 1 / k) ** m,
            "m_over_k": m / k}


def perplexity(ids, k: int) -> dict:
    counts = np.bincount(_flat(ids), minlength=k)
    h = _entropy(counts)
    return {"perplexity": math.exp(h), "uniform": float(k), "normalised_entropy": h / math.log(k)}


def nmi(ids, labels) -> float:
    """Normalised mutual information (arithmetic mean of the two entropies)."""
    a, b = _flat(ids), _flat(labels)
    if len(a) != len(b):
        raise ValueError(f"{len(a)} ids but {len(b)} labels")
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    joint = np.bincount(ai * (bi.max() + 1) + bi, minlength=(ai.max() + 1) * (bi.max() + 1))
    joint = joint.reshape(ai.max() + 1, bi.max() + 1).astype(np.float64)
    ha, hb = _entropy(joint.sum(1)), _entropy(joint.sum(0))
    if ha == 0 or hb == 0:
        return 1.0 if ha == hb else 0.0
    mi = ha + hb - _entropy(joint.reshape(-1))
    return float(max(0.0, mi) / ((ha + hb) / 2))


def id_report(ids, k: int, labels=None) -> dict:
    """Utilisation, perplexity and (with labels) NMI of one method's IDs."""
    out = {**utilisation(ids, k), **perplexity(ids, k)}
    if labels is not None:
        out["nmi"] = nmi(ids, labels)
    return out
