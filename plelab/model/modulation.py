"""Token modulation: a per-layer vector looked up by token id that scales a layer's update element-wise.

After JTok (arXiv 2602.00800, "Joint-Token self-modulation"): a token-indexed table gives each layer a modulation
vector that acts on the backbone through an element-wise product. Equation (this module's form):

    TokenModulation     ids [B,T]  ->  m [B,T,S,H]     S = |layers| (the modulated layers; default all L)
        m = T[ids]                          embed.weight [V, S·H]  (row = layer-major: the s-th modulated layer is
                                                                    columns s·H … s·H+H-1)
    modulate            h [B,T,H], m_l = m[:,:,s(l)] [B,T,H]  ->  h ⊙ (1 + m_l)     (layers outside ``layers``: h)

The paper's own equation could not be read here (only its abstract and secondary summaries were reachable). Those
summaries describe the vector as normalised before use, applied to the layer's FFN update (``h ← h + f(h) ⊙ ·``),
and JTok-M as a router mixing the top-K of a per-token pool of such vectors, added as an extra residual. This module
implements the plain form ``h ⊙ (1 + m)`` with no normalisation and no router: pass as ``h`` whatever the decoder
modulates (the MLP's output, to follow the summaries). With the table at zero the product is exactly ``h``.

A subset of the layers (``layers``) sizes the table in steps of ``V·H``, as nanochat's layer rule sizes the value
embeddings. One table ``[V, S·H]`` rather than one per layer: a token's rows for every layer are one contiguous read (one
lookup per forward, as Gemma's ``embed_tokens_per_layer [V, L·dP]``), and the one tensor fits plelab's table
machinery unchanged (sparse row gradients, the row-sparse optimizer, per-row counts).
"""

from __future__ import annotations

import torch
from torch import nn

INITS = ("function-preserving", "normal")


def selected_layers(num_layers: int, layers=None) -> tuple[int, ...]:
    """The modulated layers: ``layers`` checked (distinct, each in [0, num_layers)) and sorted; None or empty: all."""
    if not layers:
        return tuple(range(num_layers))
    chosen = tuple(sorted(int(layer) for layer in layers))
    if len(set(chosen)) != len(chosen) or chosen[0] < 0 or chosen[-1] >= num_layers:
        raise ValueError(f"modulated layers must be distinct layer indices in [0, {num_layers}), got {list(layers)}")
    return chosen


def added_params(vocab_size: int, hidden_size: int, num_layers: int, layers=None) -> int:
    """The exact parameter count of :class:`TokenModulation`: ``V · |layers| · H`` (the table alone)."""
    return vocab_size * len(selected_layers(num_layers, layers)) * hidden_size


def flops_per_token(vocab_size: int, hidden_size: int, num_layers: int, layers=None) -> int:
    """Forward FLOPs per token of :class:`TokenModulation`: 0.

    Convention (as :mod:`plelab.model.accounting`): 2 × the multiply-adds of the matmuls only; the module has none.
    Its lookup counts 0, and so do the ``2·S·H`` element-wise operations of :meth:`TokenModulation.modulate`.
    """
    return 0


class TokenModulation(nn.Module):
    """The per-layer modulation table (see module doc): ``layers`` the modulated layers (None: all ``num_layers``).
    ``sparse`` gives it sparse row gradients. Built with ``init="function-preserving"`` values (table zero)."""

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, sparse: bool = False,
                 layers=None) -> None:
        super().__init__()
        if min(vocab_size, hidden_size, num_layers) < 1:
            raise ValueError("TokenModulation needs vocab_size, hidden_size and num_layers >= 1, got "
                             f"{vocab_size}, {hidden_size} and {num_layers}")
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.layers = selected_layers(num_layers, layers)
        self.embed = nn.Embedding(vocab_size, len(self.layers) * hidden_size, sparse=sparse)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None, std: float = 0.02,
                         init: str = "function-preserving") -> None:
        """``"function-preserving"``: table zero — ``modulate`` returns ``h`` exactly and the table gets a gradient at
        the first step. ``"normal"``: normal(0, std) (the paper's init is not known here)."""
        if init not in INITS:
            raise ValueError(f"unknown TokenModulation init {init!r}: choose one of {', '.join(INITS)}")
        if init == "function-preserving":
            self.embed.weight.zero_()
        else:
            self.embed.weight.normal_(0.0, std, generator=generator)

    def blank(self) -> TokenModulation:
        """A new module of this one's sizes, on the CPU in float32 (its values: :meth:`reset_parameters`' to set)."""
        with torch.random.fork_rng(devices=[]):
            return TokenModulation(self.embed.num_embeddings, self.hidden_size, self.num_layers, layers=self.layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``m = T[ids]``: ``ids [B,T]`` -> ``[B,T,S,H]`` (S = the modulated layers)."""
        if ids.dim() != 2:
            raise ValueError(f"TokenModulation needs ids [B,T], got shape {tuple(ids.shape)}")
        return self.embed(ids).view(*ids.shape, len(self.layers), self.hidden_size)

    def at(self, m: torch.Tensor, layer: int) -> torch.Tensor | None:
        """Layer ``layer``'s ``m_l [B,T,H]`` from this forward's ``m [B,T,S,H]``; None where it is not modulated."""
        return m[:, :, self.layers.index(layer)] if layer in self.layers else None

    @staticmethod
    def modulate(h: torch.Tensor, m_l: torch.Tensor) -> torch.Tensor:
        """``h ⊙ (1 + m_l)``: ``h [B,T,H]``, one layer's ``m_l = m[:,:,l] [B,T,H]`` -> ``[B,T,H]`` in ``h``'s dtype.

        Not named ``apply``: that is ``nn.Module.apply(fn)``, which a parent module's ``apply`` calls on every child.
        """
        if h.shape != m_l.shape:
            raise ValueError(f"modulate needs h and m_l of one shape [B,T,H], got {tuple(h.shape)} and "
                             f"{tuple(m_l.shape)}")
        return (h * (1 + m_l)).to(h.dtype)
