"""Structure metrics of an embedding matrix, streamed over row chunks, and their random nulls.

For ``E ∈ R^{N×d}`` (one layer slice of a per-layer table, or its change since init), one
pass over row chunks accumulates the d×d Gram matrix ``G = EᵀE``, the column sum and the sum
of unit-normalised rows. From these (``visual_tokenizers_and_diagnostics.md`` §4):

- mean off-diagonal cosine ``(‖Σ u_i‖² − N) / (N(N−1))`` — O(N·d), no N×N matrix;
- mean |cos| over the pairs of a fixed, evenly spaced sample of ≤ 2,048 rows;
- effective rank (Roy & Vetterli 2007) ``exp(H(σ/Σσ))`` from the eigenvalues of ``G`` (raw,
  uncentred) and of the covariance ``G − N μμᵀ`` (centred);
- PC1 explained variance ``λ₁ / Σλ`` of the covariance (centred).

Nulls: the same metrics of a same-shape i.i.d. Gaussian sample (fixed seed), and the
Marchenko–Pastur limits for erank/min(N, d) and PC1 ``(√N + √d)² / (N·d)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch

SAMPLE_ROWS = 2048


@dataclass
class MatrixStats:
    n: int
    d: int
    mean_cos: float
    mean_abs_cos: float
    erank_raw: float
    erank_centred: float
    pc1: float
    mean_row_norm: float

    def to_dict(self) -> dict:
        return asdict(self)


def effective_rank(eigenvalues: torch.Tensor) -> float:
    """Roy & Vetterli erank ``exp(H(σ/Σσ))`` from eigenvalues ``σ²`` of a Gram matrix."""
    sigma = eigenvalues.clamp_min(0).sqrt()
    total = sigma.sum()
    if total <= 0:
        return 0.0
    p = sigma / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


class StreamingMoments:
    """Accumulates what the metrics need from row chunks of an ``[N, d]`` matrix (float64)."""

    def __init__(self, n: int, d: int) -> None:
        self.n_expected, self.d = n, d
        self.gram = torch.zeros(d, d, dtype=torch.float64)
        self.col_sum = torch.zeros(d, dtype=torch.float64)
        self.unit_sum = torch.zeros(d, dtype=torch.float64)
        self.norm_sum = 0.0
        self.count = 0
        self.nonzero = 0  # rows with norm > 0 (a zero row has no direction: left out of the cosines)
        k = min(n, SAMPLE_ROWS)
        self.sample_idx = np.unique(np.linspace(0, n - 1, num=k).round().astype(np.int64)) if n else np.zeros(0, int)
        # Preallocated: appending small tensors chunk by chunk fragments the heap (measured: +3 MB per chunk).
        self.sample = torch.zeros(len(self.sample_idx), d, dtype=torch.float64)
        self.sampled = 0

    def update(self, rows: torch.Tensor) -> None:
        x = rows.detach().to(torch.float64).reshape(-1, self.d)
        start = self.count
        self.gram += x.T @ x
        self.col_sum += x.sum(0)
        norms = x.norm(dim=1)
        self.norm_sum += float(norms.sum())
        self.nonzero += int((norms > 0).sum())
        self.unit_sum += (x / norms.clamp_min(1e-30).unsqueeze(1)).sum(0)
        lo, hi = np.searchsorted(self.sample_idx, [start, start + len(x)])
        if hi > lo:
            self.sample[lo:hi] = x[torch.from_numpy(self.sample_idx[lo:hi] - start)]
            self.sampled = hi
        self.count += len(x)

    def finalize(self) -> MatrixStats:
        n, d = self.count, self.d
        mean = self.col_sum / max(n, 1)
        cov = self.gram - n * torch.outer(mean, mean)
        eig_cov = torch.linalg.eigvalsh(cov)
        m = self.nonzero
        mean_cos = float((self.unit_sum.dot(self.unit_sum) - m) / (m * (m - 1))) if m > 1 else float("nan")
        abs_cos = float("nan")
        if self.sampled:
            s = self.sample[:self.sampled]
            u = s / s.norm(dim=1, keepdim=True).clamp_min(1e-30)
            c = (u @ u.T).abs()
            k = len(u)
            abs_cos = float((c.sum() - c.diagonal().sum()) / (k * (k - 1))) if k > 1 else float("nan")
        trace = float(eig_cov.clamp_min(0).sum())
        return MatrixStats(n=n, d=d, mean_cos=mean_cos, mean_abs_cos=abs_cos,
                           erank_raw=effective_rank(torch.linalg.eigvalsh(self.gram)),
                           erank_centred=effective_rank(eig_cov),
                           pc1=float(eig_cov.max()) / trace if trace > 0 else float("nan"),
                           mean_row_norm=self.norm_sum / max(n, 1))


def matrix_stats(matrix: torch.Tensor | Iterable[torch.Tensor], n: int | None = None, d: int | None = None,
                 chunk_rows: int = 16384) -> MatrixStats:
    """Metrics of a matrix, or of an iterable of row chunks (then give ``n`` and ``d``)."""
    if isinstance(matrix, torch.Tensor):
        n, d = matrix.shape
        chunks: Iterable[torch.Tensor] = (matrix[i:i + chunk_rows] for i in range(0, n, chunk_rows))
    else:
        chunks = matrix
    acc = StreamingMoments(n, d)
    for chunk in chunks:
        acc.update(chunk)
    return acc.finalize()


def gaussian_null(n: int, d: int, seed: int = 0, chunk_rows: int = 16384) -> MatrixStats:
    """The same metrics of an i.i.d. N(0, 1) matrix of the same shape (drawn in chunks, fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    chunks = (torch.randn(min(chunk_rows, n - i), d, generator=gen) for i in range(0, n, chunk_rows))
    return matrix_stats(chunks, n=n, d=d)


def mp_erank_ratio(n: int, d: int, grid: int = 20001) -> float:
    """Marchenko–Pastur limit of erank / min(N, d) for an i.i.d. Gaussian N×d matrix.

    With γ = min/max and σ = √λ under the MP law, erank/Q → m·exp(−E[σ ln σ]/m), m = E[σ].
    """
    gamma = min(n, d) / max(n, d)
    a, b = (1 - math.sqrt(gamma)) ** 2, (1 + math.sqrt(gamma)) ** 2
    # λ = a + (b−a)(1−cos t)/2 removes the square-root (and, at γ=1, the 1/√λ) endpoint singularities.
    t = np.linspace(0.0, math.pi, grid)
    lam = a + (b - a) * (1 - np.cos(t)) / 2
    jac = (b - a) / 2 * np.sin(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        density = np.where(lam > 0, np.sqrt(np.clip((b - lam) * (lam - a), 0, None)) / (2 * math.pi * gamma * lam), 0)
    w = density * jac
    w = w / np.trapezoid(w, t)
    sigma = np.sqrt(lam)
    m = np.trapezoid(w * sigma, t)
    slns = np.where(sigma > 0, sigma * np.log(np.where(sigma > 0, sigma, 1.0)), 0.0)
    return float(m * math.exp(-np.trapezoid(w * slns, t) / m))


def mp_pc1(n: int, d: int) -> float:
    """Marchenko–Pastur top-edge estimate of the PC1 share of an N×d Gaussian: (√N + √d)² / (N·d)."""
    return (math.sqrt(n) + math.sqrt(d)) ** 2 / (n * d)


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA (Kornblith et al. 2019) between two ``[N, d]`` matrices with rows aligned.

    ``‖XᵀY‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F)`` on column-centred X, Y. Invariant to rotations and isotropic
    scaling of either matrix, so two seeds' tables can agree although their bases differ.
    """
    x = x.to(torch.float64) - x.to(torch.float64).mean(0)
    y = y.to(torch.float64) - y.to(torch.float64).mean(0)
    num = (x.T @ y).pow(2).sum()
    den = (x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt()
    return float(num / den) if den > 0 else float("nan")


def residual_after(x: torch.Tensor, covariates: torch.Tensor) -> torch.Tensor:
    """``x`` minus its least-squares fit on ``[1, covariates]`` (rows aligned).

    Used to remove what a row's frequency alone explains before comparing two tables.
    """
    cov = covariates.to(torch.float64).reshape(len(x), -1)
    design = torch.cat([torch.ones(len(x), 1, dtype=torch.float64), cov], 1)
    coef = torch.linalg.lstsq(design, x.to(torch.float64)).solution
    return x.to(torch.float64) - design @ coef


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-30)
