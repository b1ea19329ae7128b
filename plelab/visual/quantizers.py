"""The three online quantizers of the second seed — VQ-VAE, LFQ, BSQ — over the frozen encoder's patch
features (``visual_tokenizers_and_diagnostics.md`` §1; written here, not taken from
vector-quantize-pytorch, because the study needs hooks for flips and restarts and fixed semantics).

Every quantizer maps features ``f [N, D]`` through a linear ``encoder`` to ``z [N, d]``, quantizes
``z`` to an ID in ``[0, K)`` and a code ``q``, and decodes ``z + sg[q − z]`` (straight-through) with a
small MLP to the patch's pixels. The table lookup downstream is not differentiable, so the
straight-through path exists only through this reconstruction. Losses (``losses`` dict, ``total``
is what to backpropagate):

- VQ-VAE (§1.1): ``k* = argmin_k ‖z − e_k‖²``; commitment ``β·‖z − sg[e_k*]‖²`` (β = 0.25); the
  codebook by EMA (γ = 0.99, Laplace ε = 1e-5; no codebook loss) or by the codebook loss
  ``‖sg[z] − e_k*‖²``; dead codes (EMA count < ``restart_threshold``) restarted from batch vectors,
  every event logged in ``restarts``; the codebook is initialised from the first training batch. IDs are
  computed with the codebook *before* the step's update.
- LFQ (§1.2): d = log2 K bits, ``q_i = +1 if z_i > 0 else −1``, index big-endian
  ``Σ_i 2^{d−1−i}·1[z_i > 0]``; entropy ``w·(H_sample − γ·H_codebook)`` over soft assignments to all
  2^d corners with logits ``2·z·c / τ`` (τ = 0.01, w = 0.1, γ = 1); commitment 0.25.
- BSQ (§1.3): ``u = z/‖z‖``, ``q = sign(u)/√d`` (STE on the ±1 vector, then scaled); factorised
  per-bit entropy (group size 1, the analytical per-sample form) with ``p_i = σ(4·u_i/(τ√d))``,
  penalty ``H_sample − H_codebook`` scaled by ζ·τ = 1 (inv_temperature 1), weight 0.1; β = 0.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from plelab.errors import PlelabError

QUANTIZERS = ("vq", "lfq", "bsq")


@contextlib.contextmanager
def single_thread():
    """Quantizer math on one thread: the same bits whatever the run's thread count (a worker of a sweep with
    ``--jobs 2`` uses 1 thread, an in-process run 2), so online and frozen arms end identical."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _entropy(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return -(p * p.clamp_min(1e-12).log()).sum(dim)


def _binary_entropy(p: torch.Tensor) -> torch.Tensor:
    return _entropy(torch.stack([p, 1 - p], -1))


def bits_to_ids(bits: torch.Tensor) -> torch.Tensor:
    """``[..., d]`` bools (True = positive) -> big-endian integer IDs (coordinate 0 is the top bit)."""
    d = bits.shape[-1]
    weights = 2 ** torch.arange(d - 1, -1, -1, device=bits.device)
    return (bits.long() * weights).sum(-1)


def ids_to_bits(ids: torch.Tensor, d: int) -> torch.Tensor:
    weights = 2 ** torch.arange(d - 1, -1, -1, device=ids.device)
    return (ids.unsqueeze(-1) // weights) % 2 == 1


class OnlineQuantizer(nn.Module):
    """Base: ``encoder`` (D→d), ``quantize`` (subclass), ``decoder`` (d→patch pixels)."""

    kind = "base"

    def __init__(self, feature_dim: int, k: int, code_dim: int, pixel_dim: int, hidden: int = 128) -> None:
        super().__init__()
        self.k, self.code_dim = k, code_dim
        self.encoder = nn.Linear(feature_dim, code_dim)
        self.decoder = nn.Sequential(nn.Linear(code_dim, hidden), nn.GELU(), nn.Linear(hidden, pixel_dim))
        self.steps = 0

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``z [N, d]`` -> (code with a straight-through gradient to ``z`` ``[N, d]``, IDs ``[N]``, aux losses)."""
        raise NotImplementedError

    def forward(self, features: torch.Tensor, pixels: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """``features [N, D]`` (and the patches' ``pixels [N, pixel_dim]``) -> (IDs ``[N]``, losses)."""
        z = self.encoder(features)
        q, ids, losses = self.quantize(z)
        if pixels is not None:
            recon = self.decoder(q)  # q carries the straight-through path: the decoder's gradient reaches z
            losses["reconstruction"] = F.mse_loss(recon, pixels)
        losses["total"] = sum(losses.values())
        if self.training:
            self.steps += 1
        return ids, losses

    @torch.no_grad()
    def assign(self, features: torch.Tensor) -> torch.Tensor:
        """IDs without any update (eval mode; codebooks untouched; one thread, see :func:`single_thread`)."""
        was = self.training
        self.eval()
        try:
            with single_thread():
                return self.quantize(self.encoder(features))[1]
        finally:
            self.train(was)

    @torch.no_grad()
    def margins(self, features: torch.Tensor) -> torch.Tensor:
        """Per-bit distance to the sign boundary ``|z_i|`` (binary quantizers): bits near 0 flip first."""
        return self.encoder(features).abs()


class VQQuantizer(OnlineQuantizer):
    kind = "vq"

    def __init__(self, feature_dim: int, k: int, pixel_dim: int, code_dim: int = 16, beta: float = 0.25,
                 ema: bool = True, decay: float = 0.99, eps: float = 1e-5, restart_threshold: float = 1.0,
                 seed: int = 0) -> None:
        super().__init__(feature_dim, k, code_dim, pixel_dim)
        self.beta, self.ema, self.decay, self.eps, self.restart_threshold = beta, ema, decay, eps, restart_threshold
        gen = torch.Generator().manual_seed(seed)
        init = torch.randn(k, code_dim, generator=gen)
        if ema:
            self.register_buffer("codebook", init.clone())
            self.register_buffer("cluster_size", torch.ones(k))
            self.register_buffer("embed_sum", init.clone())
        else:
            self.codebook = nn.Parameter(init)
        self.register_buffer("initialised", torch.tensor(False))
        self.restart_gen = torch.Generator().manual_seed(seed + 1)
        self.restarts: list[tuple[int, list[int]]] = []  # (step, restarted code IDs)

    @torch.no_grad()
    def _init_from(self, z: torch.Tensor) -> None:
        """First training batch: codes = K distinct batch vectors, counts = the batch's mean cluster size
        (a Gaussian codebook far from the encoder's outputs would leave most codes dead, and restart
        them all on the first step)."""
        pick = torch.randperm(len(z), generator=self.restart_gen)[:self.k]
        pick = pick.repeat(math.ceil(self.k / len(pick)))[:self.k]
        self.codebook.data.copy_(z[pick])
        if self.ema:
            self.cluster_size.fill_(len(z) / self.k)
            self.embed_sum.copy_(z[pick] * len(z) / self.k)
        self.initialised.fill_(True)

    def quantize(self, z):
        if self.training and not bool(self.initialised):
            self._init_from(z.detach())
        codebook = self.codebook
        dist = (z.detach().pow(2).sum(1, keepdim=True) - 2 * z.detach() @ codebook.detach().T
                + codebook.detach().pow(2).sum(1))
        ids = dist.argmin(1)
        q = codebook[ids]
        losses = {"commitment": self.beta * F.mse_loss(z, q.detach())}
        if not self.ema:
            losses["codebook"] = F.mse_loss(q, z.detach())
        elif self.training:
            self._ema_update(z.detach(), ids)
        return z + (q - z).detach(), ids, losses

    @torch.no_grad()
    def _ema_update(self, z: torch.Tensor, ids: torch.Tensor) -> None:
        onehot = F.one_hot(ids, self.k).type_as(z)
        self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
        self.embed_sum.mul_(self.decay).add_(onehot.T @ z, alpha=1 - self.decay)
        n = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.eps) / (n + self.k * self.eps) * n
        self.codebook.copy_(self.embed_sum / smoothed.unsqueeze(1))
        dead = (self.cluster_size < self.restart_threshold).nonzero().flatten()
        if len(dead):
            pick = torch.randint(len(z), (len(dead),), generator=self.restart_gen)
            self.codebook[dead] = z[pick]
            self.embed_sum[dead] = z[pick] * self.restart_threshold
            self.cluster_size[dead] = self.restart_threshold
            self.restarts.append((self.steps + 1, dead.tolist()))


class LFQQuantizer(OnlineQuantizer):
    kind = "lfq"

    def __init__(self, feature_dim: int, k: int, pixel_dim: int, entropy_weight: float = 0.1,
                 diversity_gamma: float = 1.0, temperature: float = 0.01, commitment: float = 0.25) -> None:
        bits = int(round(math.log2(k)))
        if 2 ** bits != k:
            raise PlelabError(f"LFQ and BSQ need K to be a power of two (K = 2^bits), got K={k}")
        super().__init__(feature_dim, k, bits, pixel_dim)
        self.entropy_weight, self.diversity_gamma = entropy_weight, diversity_gamma
        self.temperature, self.commitment = temperature, commitment
        self.register_buffer("corners", ids_to_bits(torch.arange(k), bits).float() * 2 - 1)  # [K, d] in ±1

    def entropies(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample entropy ``mean_i H(p_i)`` and codebook entropy ``H(mean_i p_i)`` over the 2^d corners."""
        p = (2 * z @ self.corners.T / self.temperature).softmax(-1)
        return _entropy(p).mean(), _entropy(p.mean(0))

    def quantize(self, z):
        bits = z > 0
        q = bits.float() * 2 - 1
        h_sample, h_codebook = self.entropies(z)
        losses = {"entropy": self.entropy_weight * (h_sample - self.diversity_gamma * h_codebook),
                  "commitment": self.commitment * F.mse_loss(z, q)}
        return z + (q - z).detach(), bits_to_ids(bits), losses


class BSQQuantizer(OnlineQuantizer):
    kind = "bsq"

    def __init__(self, feature_dim: int, k: int, pixel_dim: int, weight: float = 0.1, inv_temperature: float = 1.0,
                 gamma0: float = 1.0, gamma: float = 1.0, zeta: float = 1.0, beta: float = 0.0) -> None:
        bits = int(round(math.log2(k)))
        if 2 ** bits != k:
            raise PlelabError(f"LFQ and BSQ need K to be a power of two (K = 2^bits), got K={k}")
        super().__init__(feature_dim, k, bits, pixel_dim)
        self.weight, self.inv_temperature = weight, inv_temperature
        self.gamma0, self.gamma, self.zeta, self.beta = gamma0, gamma, zeta, beta

    def entropies(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Factorised per bit: per-sample ``mean_n Σ_i H_b(p_ni)``, codebook ``Σ_i H_b(mean_n p_ni)``."""
        p = torch.sigmoid(4 * self.inv_temperature * u / math.sqrt(self.code_dim))
        return _binary_entropy(p).sum(-1).mean(), _binary_entropy(p.mean(0)).sum()

    def quantize(self, z):
        u = F.normalize(z, dim=-1)
        bits = u > 0
        sign = bits.float() * 2 - 1
        q_sign = u + (sign - u).detach()  # STE on the ±1 vector, then scaled: gradients scaled by 1/√d too
        q = q_sign / math.sqrt(self.code_dim)
        h_sample, h_codebook = self.entropies(u)
        penalty = self.gamma0 * h_sample - self.gamma * h_codebook
        losses = {"entropy": self.weight * self.zeta * penalty / self.inv_temperature,
                  "commitment": self.beta * (q.detach() - u).pow(2).sum(-1).mean()}
        return q, bits_to_ids(bits), losses


def build_quantizer(kind: str, feature_dim: int, k: int, pixel_dim: int, seed: int = 0) -> OnlineQuantizer:
    """One of :data:`QUANTIZERS`, with its parameters drawn from ``seed``."""
    if kind not in QUANTIZERS:
        raise PlelabError(f"unknown quantizer {kind!r}; choose one of {', '.join(QUANTIZERS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "vq":
            return VQQuantizer(feature_dim, k, pixel_dim, seed=seed)
        return (LFQQuantizer if kind == "lfq" else BSQQuantizer)(feature_dim, k, pixel_dim)
