"""K-means in torch: k-means++ seeding, Lloyd iterations in chunks, empty clusters re-seeded.

Why not a library: faiss is the right tool for millions of vectors and thousands of centroids,
but the study's sizes (≤ 10⁶ patches, K ≤ 1024) fit a few dozen lines of torch, which run on the
same device as the model, are deterministic from a seed on CPU, and add no dependency (faiss has
no wheel for every platform; scikit-learn's k-means would be a dependency for one function).

``spherical=True`` clusters directions: rows and centroids are L2-normalised (cosine k-means), the
recommendation for encoder features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _sqdist(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Squared distances ``[N, K]`` (clamped at 0 against rounding)."""
    return (x.pow(2).sum(1, keepdim=True) - 2 * x @ c.T + c.pow(2).sum(1)).clamp_min(0)


def nearest(x: torch.Tensor, centroids: torch.Tensor, chunk: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of the nearest centroid and the squared distance to it, for ``x [N, D]`` in chunks."""
    ids, dist = [], []
    for i in range(0, len(x), chunk):
        d = _sqdist(x[i:i + chunk], centroids)
        m = d.min(dim=1)
        ids.append(m.indices)
        dist.append(m.values)
    if not ids:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0)
    return torch.cat(ids), torch.cat(dist)


@torch.no_grad()
def kmeans(x: torch.Tensor, k: int, iters: int = 50, seed: int = 0, spherical: bool = False,
           max_points: int | None = None, tol: float = 1e-6) -> tuple[torch.Tensor, float]:
    """Fit ``k`` centroids to ``x [N, D]``; returns ``(centroids [k, D], inertia per point)``.

    ``max_points`` subsamples the fit (faiss's default is 256 points per centroid).
    """
    if k < 1 or len(x) < k:
        raise ValueError(f"k-means needs at least k={k} points, got {len(x)}")
    gen = torch.Generator().manual_seed(seed)
    x = x.detach().float()
    if spherical:
        x = F.normalize(x, dim=1)
    if max_points is not None and len(x) > max_points:
        x = x[torch.randperm(len(x), generator=gen)[:max_points].to(x.device)]
    n = len(x)
    # k-means++ (Arthur & Vassilvitskii 2007): each new centre drawn with probability ∝ D(x)²
    chosen = [int(torch.randint(n, (1,), generator=gen))]
    d2 = _sqdist(x, x[chosen]).squeeze(1)
    for _ in range(1, k):
        total = float(d2.sum())
        probs = (d2 / total).cpu() if total > 0 else torch.full((n,), 1.0 / n)
        chosen.append(int(torch.multinomial(probs, 1, generator=gen)))
        d2 = torch.minimum(d2, _sqdist(x, x[chosen[-1:]]).squeeze(1))
    c = x[chosen].clone()
    for _ in range(iters):
        assign, dist = nearest(x, c)
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k)
        new = sums / counts.clamp_min(1).unsqueeze(1).to(x.dtype)
        empty = (counts == 0).nonzero().flatten()
        if len(empty):  # re-seed with the points farthest from their centroid
            far = dist.topk(len(empty)).indices
            new[empty] = x[far]
        if spherical:
            new = F.normalize(new, dim=1)
        shift = float((new - c).pow(2).sum())
        c = new
        if shift <= tol * float(c.pow(2).sum().clamp_min(1e-12)):
            break
    _, dist = nearest(x, c)
    return c, float(dist.mean())
