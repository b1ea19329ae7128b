"""Cross-seed agreement of two tables' rows (linear CKA) against a permutation null.

- :func:`cka_against_null`: with row counts. Frequency is taken out twice: each column is regressed on a smooth
  function of log-frequency (:func:`comparable`), and the null shuffles rows only among rows of similar frequency.
  Only agreement specific to each id's own row beats it. The counts are a run's training counts (plelab runs,
  Monitor folders) or, for a checkpoint plelab did not train, the token counts of the data given to diagnose.
- :func:`cka_with_null`: without row counts. The null shuffles rows among all rows, so agreement that frequency
  alone explains (frequent ids' rows move more in both runs) is credited as well; the reports say so.
"""

from __future__ import annotations

import numpy as np
import torch

from plelab.diagnostics.structure import linear_cka, residual_after, unit_rows
from plelab.diagnostics.usage import within_bin_permutation

NULL_DRAWS = 20
FREQ_DEGREE = 4


def comparable(delta: torch.Tensor, counts: np.ndarray) -> torch.Tensor:
    """``delta [N, d]`` with what a smooth function of frequency explains removed (each column regressed on a
    degree-4 polynomial in standardised log-frequency), then unit-normalised (for cross-seed CKA)."""
    logf = np.log1p(counts)
    z = (logf - logf.mean()) / (logf.std() + 1e-12)
    basis = torch.from_numpy(np.stack([z ** k for k in range(1, FREQ_DEGREE + 1)], 1)).double()
    return unit_rows(residual_after(delta.double(), basis))


def cka_against_null(a: torch.Tensor, b: torch.Tensor, counts: np.ndarray, seed: int = 0) -> dict:
    """Cross-seed CKA of ``a [N, d_a]`` and ``b [N, d_b]`` (rows: the same ids) and its permutation null: ``b``'s rows
    shuffled among rows of similar frequency (``counts [N]``), 20 draws. What frequency alone explains — in any
    functional form — survives the shuffle; what an id's own row learned does not. A table that never moved (Δ ≡ 0:
    frozen, or its gate held at 0) has nothing to agree on: CKA, null mean and sd are 0 (z = 0), with a ``note``."""
    if not bool(a.any()) or not bool(b.any()):
        return {"cka": 0.0, "null_mean": 0.0, "null_sd": 0.0, "null": "rows permuted within frequency bins",
                "note": "Δ = 0: a table that never moved agrees with nothing (z = 0)"}
    ca, cb = comparable(a, counts), comparable(b, counts)
    value, nulls = _cka_and_null(ca, cb, [within_bin_permutation(counts, seed + k) for k in range(NULL_DRAWS)])
    return {"cka": value, "null_mean": float(np.mean(nulls)), "null_sd": float(np.std(nulls, ddof=1)),
            "null": "rows permuted within frequency bins"}


def _cka_and_null(x: torch.Tensor, y: torch.Tensor, perms: list[torch.Tensor]) -> tuple[float, list[float]]:
    """:func:`linear_cka` of ``x`` and ``y``, and of ``x`` and each row permutation of ``y``. A permutation leaves
    ``y``'s column means and ``‖YᵀY‖`` unchanged, so both are computed once and each draw costs one ``XᵀY[perm]``."""
    x = x.to(torch.float64) - x.to(torch.float64).mean(0)
    y = y.to(torch.float64) - y.to(torch.float64).mean(0)
    den = float((x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt())
    if den == 0:
        return float("nan"), [float("nan")] * len(perms)
    return float((x.T @ y).pow(2).sum()) / den, [float((x.T @ y[p]).pow(2).sum()) / den for p in perms]


def cka_with_null(a: torch.Tensor, b: torch.Tensor, seed: int = 0) -> dict:
    """Linear CKA of unit rows of ``a`` and ``b`` (``[N, d_a]``, ``[N, d_b]``) against ``b``'s rows shuffled among
    all rows (no row counts: frequency not matched)."""
    ua, ub = unit_rows(a.double()), unit_rows(b.double())
    g = torch.Generator().manual_seed(seed)
    nulls = [linear_cka(ua, ub[torch.randperm(len(ub), generator=g)]) for _ in range(NULL_DRAWS)]
    return {"cka": linear_cka(ua, ub), "null_mean": float(np.mean(nulls)), "null_sd": float(np.std(nulls, ddof=1)),
            "null": "rows permuted among all rows (no row counts: frequency not matched)"}
