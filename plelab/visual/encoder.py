"""The frozen patch encoder: a tiny ViT pretrained on the embedded scenes with the SigLIP loss, or a
real SigLIP vision tower loaded from a local folder with transformers.

SigLIP (Zhai et al. 2023, arXiv 2303.15343; ``visual_tokenizers_and_diagnostics.md`` §3.3): image
and text embeddings are L2-normalised, ``logits_ij = t·x_i·y_j + b`` with ``t = exp(t')``,
``t' = log 10`` and ``b = −10`` at init, and ``L = −(1/B) Σ_i Σ_j log σ(z_ij · logits_ij)`` with
``z_ij = +1`` on the diagonal and −1 elsewhere.

Shapes: images ``[N, S, S, 3]`` uint8 → pixels in [−1, 1] → patch features ``[N, P, D]`` in raster
order (the order of :func:`plelab.visual.ids.patches`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from plelab.errors import PlelabError
from plelab.integrations.pretrained import from_pretrained
from plelab.io import atomic_write, cache_dir
from plelab.visual.scenes import fingerprint


@dataclass
class EncoderConfig:
    image_size: int = 48
    patch: int = 8
    dim: int = 64
    layers: int = 2
    heads: int = 4
    embed_dim: int = 64  # the shared image–text embedding space of the SigLIP loss


def to_pixels(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 ``[N,S,S,3]`` -> float ``[N,3,S,S]`` in [−1, 1] (SigLIP's preprocessing: x/255, mean = std = 0.5)."""
    x = torch.as_tensor(np.asarray(images)).float().permute(0, 3, 1, 2)
    return x / 127.5 - 1.0


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """Patch embedding (a linear map of each patch's pixels), learned positions, pre-norm blocks."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n = (cfg.image_size // cfg.patch) ** 2
        self.patch_embed = nn.Linear(3 * cfg.patch * cfg.patch, cfg.dim)
        self.pos = nn.Parameter(torch.randn(n, cfg.dim) * 0.02)
        self.blocks = nn.ModuleList(_Block(cfg.dim, cfg.heads) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[N, 3, S, S]`` -> ``[N, P, dim]``."""
        p = self.cfg.patch
        x = pixels.unfold(2, p, p).unfold(3, p, p)  # [N, 3, g, g, p, p]
        x = x.permute(0, 2, 3, 1, 4, 5).reshape(pixels.shape[0], -1, 3 * p * p)
        x = self.patch_embed(x) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)


class SigLIPPair(nn.Module):
    """The two towers for pretraining: the ViT (mean-pooled, projected) and a bag-of-words text tower."""

    def __init__(self, cfg: EncoderConfig, vocab: int) -> None:
        super().__init__()
        self.vit = TinyViT(cfg)
        self.img_proj = nn.Linear(cfg.dim, cfg.embed_dim)
        self.txt = nn.EmbeddingBag(vocab, cfg.embed_dim, mode="mean")
        self.txt_proj = nn.Sequential(nn.GELU(approximate="tanh"), nn.Linear(cfg.embed_dim, cfg.embed_dim))
        self.t_prime = nn.Parameter(torch.tensor(math.log(10.0)))
        self.bias = nn.Parameter(torch.tensor(-10.0))

    def forward(self, pixels: torch.Tensor, words: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        x = F.normalize(self.img_proj(self.vit(pixels).mean(1)), dim=-1)
        y = F.normalize(self.txt_proj(self.txt(words, offsets)), dim=-1)
        return siglip_loss(x, y, self.t_prime, self.bias)


def siglip_loss(x: torch.Tensor, y: torch.Tensor, t_prime: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``−(1/B) Σ_i Σ_j log σ(z_ij (exp(t')·x_i·y_j + b))`` for normalised ``x, y [B, E]``."""
    logits = torch.exp(t_prime) * x @ y.T + bias
    z = 2 * torch.eye(len(x), device=x.device) - 1
    return -F.logsigmoid(z * logits).sum() / len(x)


def _bag_of_words(captions: list[str]) -> tuple[dict[str, int], list[list[int]]]:
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(w, len(vocab)) for w in c.split()] for c in captions]
    return vocab, ids


def pretrain_encoder(scenes, cfg: EncoderConfig, steps: int = 300, batch: int = 64, lr: float = 2e-3,
                     seed: int = 0, log=None) -> tuple[TinyViT, list[float]]:
    """SigLIP-pretrain a :class:`TinyViT` on ``scenes`` (images + captions); returns it frozen and the losses."""
    torch.manual_seed(seed)
    vocab, words = _bag_of_words(scenes.captions)
    model = SigLIPPair(cfg, len(vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    pixels = to_pixels(scenes.images)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        idx = torch.randperm(len(scenes), generator=gen)[:batch]
        flat = [words[i] for i in idx.tolist()]
        offsets = torch.tensor([0, *np.cumsum([len(w) for w in flat])[:-1]])
        loss = model(pixels[idx], torch.tensor([w for ws in flat for w in ws]), offsets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if log is not None and (step + 1) % 100 == 0:
            log(f"  SigLIP pretraining step {step + 1}/{steps}: loss {loss:.3f}")
    vit = model.vit.eval().requires_grad_(False)
    return vit, losses


@torch.no_grad()
def encode_with(vit: nn.Module, images: np.ndarray, batch: int = 256) -> torch.Tensor:
    """Patch features ``[N, P, D]`` of a frozen encoder, in batches."""
    out = [vit(to_pixels(images[i:i + batch])) for i in range(0, len(images), batch)]
    return torch.cat(out) if out else torch.zeros(0)


def get_encoder(scenes, cfg: EncoderConfig | None = None, steps: int = 300, seed: int = 0, log=None) -> TinyViT:
    """The SigLIP-pretrained encoder for ``scenes``, from the cache (``$PLELAB_CACHE/encoders``) when it
    was trained before with the same data and settings."""
    cfg = cfg or EncoderConfig(image_size=scenes.image_size, patch=scenes.patch)
    key = hashlib.sha256(json.dumps([asdict(cfg), steps, seed, fingerprint(scenes)]).encode()).hexdigest()[:16]
    path = cache_dir("encoders") / f"tinyvit-{key}.safetensors"
    if path.exists():
        return load_encoder(path)
    vit, _ = pretrain_encoder(scenes, cfg, steps=steps, seed=seed, log=log)
    save_encoder(vit, path)
    return vit


def save_encoder(vit: TinyViT, path: Path) -> Path:
    tensors = {k: v.contiguous() for k, v in vit.state_dict().items()}
    return atomic_write(path, lambda p: save_file(tensors, str(p), metadata={"plelab": json.dumps(asdict(vit.cfg))}))


def load_encoder(path: Path) -> TinyViT:
    try:
        with safe_open(str(path), framework="pt") as f:
            cfg = EncoderConfig(**json.loads(f.metadata()["plelab"]))
        vit = TinyViT(cfg)
        vit.load_state_dict(load_file(str(path)))
    except (SafetensorError, OSError, KeyError, TypeError, ValueError, RuntimeError) as err:
        raise PlelabError(f"{path} is not a plelab encoder ({str(err).splitlines()[0]}); delete it to retrain") \
            from None
    return vit.eval().requires_grad_(False)


class HFSiglipEncoder(nn.Module):
    """A local ``transformers`` SigLIP vision tower as a patch encoder (``last_hidden_state``)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.model = from_pretrained("SiglipVisionModel", path, "a SigLIP vision tower").eval()
        self.model.requires_grad_(False)
        self.image_size = self.model.config.image_size
        self.patch = self.model.config.patch_size

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels, interpolate_pos_encoding=pixels.shape[-1] != self.image_size
                          ).last_hidden_state
