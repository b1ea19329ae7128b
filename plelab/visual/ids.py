"""Visual IDs: one interface for every tokenizer — ``fit(scenes, seed)``, ``assign(scenes)``,
``state()`` — with the same K for every method, so that the per-layer table is [K, L·dP] for all.

Offline methods (IDs never change once fitted, ID-flip rate exactly 0):

- :class:`DCTKMeans`: per patch, RGB → YCbCr, orthonormal 2-D DCT-II per channel
  (``scipy.fft.dctn``), zigzag scan, the first ``luma`` luma and ``chroma`` chroma coefficients,
  each standardised with the fit set's mean/std (without it K-means is dominated by DC), then
  K-means (``visual_tokenizers_and_diagnostics.md`` §3.1);
- :class:`FeatureKMeans`: spherical K-means on the L2-normalised patch features of a frozen encoder
  (SigLIP-style; §3.3), given as a function ``images [N,S,S,3] uint8 -> [N, P, D]``.

Controls: :class:`RandomIDs` draws every occurrence i.i.d. from a fitted method's ID frequencies (a
null that carries no information), :class:`OracleIDs` keys patches by the generator's labels
(colour × shape × size, 0 for background — exactly the caption-relevant facts).

A fitted tokenizer saves to safetensors (tensors + JSON metadata, no pickle).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from plelab.errors import PlelabError
from plelab.io import atomic_write
from plelab.visual.kmeans import kmeans, nearest
from plelab.visual.scenes import COLOURS, SHAPES, SIZES, SceneSet

# RGB -> YCbCr (ITU-R BT.601, full range), offsets dropped: standardisation removes them anyway
_YCBCR = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])


def _dctn(x, **kwargs):
    """``scipy.fft.dctn``, imported on first use."""
    from scipy.fft import dctn  # heavy (about 0.4 s with what it pulls in): every CLI start would pay it

    return dctn(x, **kwargs)


def zigzag(n: int) -> np.ndarray:
    """Flat indices of an n×n block in JPEG zigzag order (low to high frequency)."""
    order = sorted(((i, j) for i in range(n) for j in range(n)),
                   key=lambda ij: (ij[0] + ij[1], ij[0] if (ij[0] + ij[1]) % 2 else ij[1]))
    return np.array([i * n + j for i, j in order])


def patches(images: np.ndarray, patch: int) -> np.ndarray:
    """``[N,S,S,C]`` -> ``[N, P, patch, patch, C]`` in raster order."""
    n, s, _, c = images.shape
    g = s // patch
    return images.reshape(n, g, patch, g, patch, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, g * g, patch, patch, c)


class VisualTokenizer(ABC):
    """Base: ``K`` IDs, ``fit`` then ``assign``. ``name`` identifies the method in reports."""

    name = "base"

    def __init__(self, k: int) -> None:
        if k < 2:
            raise PlelabError(f"the number of visual IDs K must be >= 2, got {k}")
        self.k = k
        self.fitted = False

    @abstractmethod
    def fit(self, scenes: SceneSet, seed: int = 0) -> VisualTokenizer:
        """Learn whatever the method needs from ``scenes`` (deterministic in ``seed``)."""

    @abstractmethod
    def assign(self, scenes: SceneSet, seed: int = 0) -> torch.Tensor:
        """IDs ``[N, P]`` int64 in ``[0, K)`` (``seed`` only matters for random IDs)."""

    def state(self) -> dict[str, torch.Tensor]:
        return {}

    def meta(self) -> dict:
        return {"method": self.name, "k": self.k}

    def save(self, path: str | Path) -> Path:
        self._need_fit()
        tensors = {k: v.contiguous() for k, v in self.state().items()}
        return atomic_write(path, lambda p: save_file(tensors, str(p), metadata={"plelab": json.dumps(self.meta())}))

    def _enough(self, n: int) -> None:
        if n < self.k:
            raise PlelabError(f"{self.name}: K={self.k} visual IDs but only {n} patches to fit on; lower K or use "
                              "more images")

    def _need_fit(self) -> None:
        if not self.fitted:
            raise PlelabError(f"the {self.name} tokenizer is not fitted yet; call fit first")


class DCTKMeans(VisualTokenizer):
    name = "dct-kmeans"

    def __init__(self, k: int, luma: int = 16, chroma: int = 4, iters: int = 50) -> None:
        super().__init__(k)
        self.luma, self.chroma, self.iters = luma, chroma, iters
        self.mean = self.std = self.centroids = None
        self.inertia = float("nan")

    def features(self, scenes: SceneSet) -> torch.Tensor:
        """Standardisable DCT features ``[N·P, luma + 2·chroma]`` (before standardisation)."""
        p = scenes.patch
        if self.luma > p * p or self.chroma > p * p:
            raise PlelabError(f"dct-kmeans keeps {self.luma} luma coefficients, a {p}×{p} patch has {p * p}")
        ycc = patches(scenes.images.astype(np.float64), p) @ _YCBCR.T  # [N, P, p, p, 3]
        coef = _dctn(ycc, type=2, norm="ortho", axes=(2, 3)).reshape(*ycc.shape[:2], p * p, 3)[:, :, zigzag(p)]
        feats = np.concatenate([coef[..., :self.luma, 0], coef[..., :self.chroma, 1], coef[..., :self.chroma, 2]], -1)
        return torch.from_numpy(feats.reshape(-1, feats.shape[-1])).float()

    def fit(self, scenes: SceneSet, seed: int = 0) -> DCTKMeans:
        x = self.features(scenes)
        self._enough(len(x))
        self.mean, self.std = x.mean(0), x.std(0).clamp_min(1e-6)
        self.centroids, self.inertia = kmeans((x - self.mean) / self.std, self.k, self.iters, seed,
                                              max_points=256 * self.k)
        self.fitted = True
        return self

    def assign(self, scenes: SceneSet, seed: int = 0) -> torch.Tensor:
        self._need_fit()
        ids, _ = nearest((self.features(scenes) - self.mean) / self.std, self.centroids)
        return ids.view(len(scenes), scenes.num_patches)

    def state(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean, "std": self.std, "centroids": self.centroids}

    def meta(self) -> dict:
        return {**super().meta(), "luma": self.luma, "chroma": self.chroma, "inertia": self.inertia}


class FeatureKMeans(VisualTokenizer):
    """Spherical K-means on a frozen encoder's patch features (``encode: images -> [N, P, D]``)."""

    name = "feature-kmeans"

    def __init__(self, k: int, encode: Callable[[np.ndarray], torch.Tensor], iters: int = 50,
                 encoder_name: str = "siglip") -> None:
        super().__init__(k)
        self.encode, self.iters, self.encoder_name = encode, iters, encoder_name
        self.name = f"{encoder_name}-kmeans"
        self.centroids = None
        self.inertia = float("nan")

    def _features(self, scenes: SceneSet) -> torch.Tensor:
        f = self.encode(scenes.images)
        if f.ndim != 3 or f.shape[1] != scenes.num_patches:
            raise PlelabError(f"the encoder gave features of shape {tuple(f.shape)}, expected [N, "
                              f"{scenes.num_patches}, D] (one per patch)")
        return f.reshape(-1, f.shape[-1]).float()

    def fit(self, scenes: SceneSet, seed: int = 0) -> FeatureKMeans:
        x = self._features(scenes)
        self._enough(len(x))
        self.centroids, self.inertia = kmeans(x, self.k, self.iters, seed, spherical=True, max_points=256 * self.k)
        self.fitted = True
        return self

    def assign(self, scenes: SceneSet, seed: int = 0) -> torch.Tensor:
        self._need_fit()
        x = torch.nn.functional.normalize(self._features(scenes), dim=1)
        ids, _ = nearest(x, self.centroids.to(x.device))
        return ids.view(len(scenes), scenes.num_patches).cpu()

    def state(self) -> dict[str, torch.Tensor]:
        return {"centroids": self.centroids}

    def meta(self) -> dict:
        return {**super().meta(), "encoder": self.encoder_name, "inertia": self.inertia}


class RandomIDs(VisualTokenizer):
    """IDs drawn i.i.d. for every occurrence from a fitted method's ID frequencies."""

    name = "random"

    def __init__(self, source: VisualTokenizer) -> None:
        super().__init__(source.k)
        self.source = source
        self.probs = None

    def fit(self, scenes: SceneSet, seed: int = 0) -> RandomIDs:
        if not self.source.fitted:
            self.source.fit(scenes, seed)
        counts = torch.bincount(self.source.assign(scenes).flatten(), minlength=self.k).double()
        self.probs = (counts / counts.sum()).float()
        self.fitted = True
        return self

    def assign(self, scenes: SceneSet, seed: int = 0) -> torch.Tensor:
        self._need_fit()
        gen = torch.Generator().manual_seed(seed)
        n = len(scenes) * scenes.num_patches
        return torch.multinomial(self.probs, n, replacement=True, generator=gen).view(len(scenes), -1)

    def state(self) -> dict[str, torch.Tensor]:
        return {"probs": self.probs}

    def meta(self) -> dict:
        return {**super().meta(), "source": self.source.name}


class OracleIDs(VisualTokenizer):
    """The generator's patch labels: 0 background, else 1 + colour × shape × size."""

    name = "oracle"
    NEEDED = 1 + len(COLOURS) * len(SHAPES) * len(SIZES)

    def __init__(self, k: int) -> None:
        super().__init__(k)
        if k < self.NEEDED:
            raise PlelabError(f"the oracle control needs K >= {self.NEEDED} (background + colour × shape × size)")

    def fit(self, scenes: SceneSet, seed: int = 0) -> OracleIDs:
        self.fitted = True
        return self

    def assign(self, scenes: SceneSet, seed: int = 0) -> torch.Tensor:
        if not scenes.has_labels:
            raise PlelabError("the oracle control needs patch labels: only the embedded scenes have them")
        return torch.from_numpy(scenes.semantic_labels()).long()
