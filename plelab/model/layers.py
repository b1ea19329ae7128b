"""Trunk building blocks: RMSNorm, rotary embeddings, GQA attention, SwiGLU MLP.

All projections are bias-free ``nn.Linear`` modules named as in HF Llama / Gemma
(``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``).
Modules are created without initialising their values (they may live on the meta device);
:mod:`plelab.model.init` fills every parameter in one place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x**2, -1) + eps) * w`` — plain ``w`` (Gemma 3n / 4), not ``1 + w``.

    Computed in float32 and cast back to the input dtype, as HF ``Gemma4RMSNorm`` does.
    Shapes: ``x [..., dim]`` -> ``[..., dim]``.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).type_as(x)


def rotary_cos_sin(seq_len: int, head_dim: int, theta: float, device: torch.device,
                   dtype: torch.dtype, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables ``cos, sin`` of shape ``[T, head_dim]`` for positions ``offset … offset+T−1`` (half-split
    layout, as HF Llama)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(offset, offset + seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, n_heads, T, head_dim]`` by position: ``x*cos + rotate_half(x)*sin``."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def causal_mask(queries: int, keys: int, device: torch.device) -> torch.Tensor | None:
    """The boolean mask of ``queries`` new positions that follow ``keys − queries`` cached ones (``None``: use
    ``is_causal``, or nothing to mask for one new query)."""
    past = keys - queries
    if past == 0 or queries == 1:
        return None
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(diagonal=past)


class Attention(nn.Module):
    """Causal grouped-query self-attention. ``x [B, T, H]`` -> ``[B, T, H]``.

    ``cache``: anything with HF's ``update(k, v, layer_idx) -> (k_all, v_all)`` (plelab's
    :class:`~plelab.model.generate.KVCache`, or transformers' ``DynamicCache``); ``k, v [B, n_kv, T, head_dim]``.
    """

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None,
                layer_idx: int = 0, value_residual: torch.Tensor | None = None) -> torch.Tensor:
        """``value_residual [B, n_kv, T, head_dim]``: added to the values before they are cached and attended
        (a value embedding's term, :class:`~plelab.model.value_embed.ValueEmbeddings`)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if value_residual is not None:
            v = v + value_residual
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, layer_idx)
        mask = causal_mask(T, k.shape[2], x.device)
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            # bf16 SDPA on CPU measured ≈ 2.2× slower than fp32: attention stays fp32 under CPU autocast
            with torch.autocast("cpu", enabled=False):
                y = self._attend(q.float(), k.float(), v.float(), mask, T)
        else:
            y = self._attend(q, k, v, mask, T)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def _attend(self, q, k, v, mask, T):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and k.shape[2] == T,
                                              enable_gqa=self.n_heads != self.n_kv_heads)


class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``. ``x [..., H]`` -> ``[..., H]``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
