"""Value embeddings: a token-indexed table per selected layer, added to that layer's attention values.

Equation (nanochat ``nanochat/gpt.py``, ``CausalSelfAttention.forward`` and ``has_ve``, read at commit 92d63d4;
the value residual of ResFormer, arXiv 2410.17897, with the first layer's values replaced by a learned table):

    ValueEmbeddings     x [B,T,H] (the attention input, the normed stream), ids [B,T], layer l  ->  [B,n_kv,T,hd]
        g  = gate_scale · sigmoid(W_g,l x[..., :gate_channels])     → [B,T,n_kv]     gates.{l}   (one per kv head)
        ve = VE[ids][..., slot(l), :]                               → [B,T,n_kv,hd]  embed      (slot: l's place)
        v ← v + g ⊙ ve                                              v [B,n_kv,T,hd], before attention (and the cache)

Layers: nanochat's rule by default (:func:`value_embed_layers`: every other layer, the last always included).
Tensor names: ``embed.weight [V, |layers|·n_kv·hd]`` — the selected layers' tables side by side, as Gemma keeps its
per-layer table ``[V, L·dP]``: one lookup per forward (:meth:`ValueEmbeddings.lookup`), one tensor for the row
counts, the optimizer's table group and the diagnostics — and ``gates.{l}.weight [n_kv, gate_channels]`` per selected
layer ``l`` (nanochat holds one ``value_embeds.{l}.weight [V, n_kv·hd]`` per layer and ``h.{l}.attn.ve_gate.weight``).
"""

from __future__ import annotations

import torch
from torch import nn

INITS = ("function-preserving", "nanochat")


def value_embed_layers(num_layers: int) -> tuple[int, ...]:
    """The layers that get a value embedding under nanochat's ``has_ve`` rule: those of the last layer's parity
    (every other layer, counted back from the last, which is always one)."""
    if num_layers < 1:
        raise ValueError(f"value_embed_layers needs num_layers >= 1, got {num_layers}")
    return tuple(layer for layer in range(num_layers) if layer % 2 == (num_layers - 1) % 2)


def _selected(num_layers: int, layers) -> tuple[int, ...]:
    """``layers`` checked (distinct, each in [0, num_layers)) and sorted; None: nanochat's rule."""
    if layers is None:
        return value_embed_layers(num_layers)
    chosen = tuple(sorted(int(layer) for layer in layers))
    if not chosen or len(set(chosen)) != len(chosen) or chosen[0] < 0 or chosen[-1] >= num_layers:
        raise ValueError(f"value-embedding layers must be distinct layer indices in [0, {num_layers}), got "
                         f"{list(layers)}")
    return chosen


def added_params(vocab_size: int, num_layers: int, num_kv_heads: int, head_dim: int, layers=None,
                 gate_channels: int = 12) -> int:
    """The exact parameter count of :class:`ValueEmbeddings` with these numbers:
    ``|layers| · (V · n_kv · hd + gate_channels · n_kv)`` (one table and one bias-free gate per selected layer)."""
    count = len(_selected(num_layers, layers))
    return count * (vocab_size * num_kv_heads * head_dim + gate_channels * num_kv_heads)


def flops_per_token(vocab_size: int, num_layers: int, num_kv_heads: int, head_dim: int, layers=None,
                    gate_channels: int = 12) -> int:
    """Forward FLOPs per token of :class:`ValueEmbeddings`: ``2 · |layers| · gate_channels · n_kv``.

    Convention (as :mod:`plelab.model.accounting`): 2 × the multiply-adds of the matmuls (here the gates) only;
    a table lookup counts 0, and so do the element-wise sigmoid, product and sum (``|layers| · n_kv · hd`` of
    each). Training is 3× this (forward + backward). Takes the constructor's numbers, some of them unused.
    """
    return 2 * len(_selected(num_layers, layers)) * gate_channels * num_kv_heads


class ValueEmbeddings(nn.Module):
    """The value-embedding tables and gates of a decoder (see module doc); call it once per selected layer.

    ``sparse`` gives the tables sparse row gradients (``nn.Embedding(sparse=True)``). Built with
    ``init="function-preserving"`` values (:meth:`reset_parameters`).
    """

    def __init__(self, vocab_size: int, num_layers: int, num_kv_heads: int, head_dim: int, layers=None,
                 gate_channels: int = 12, gate_scale: float = 3.0, sparse: bool = False) -> None:
        super().__init__()
        if min(vocab_size, num_kv_heads, head_dim, gate_channels) < 1:
            raise ValueError("ValueEmbeddings needs vocab_size, num_kv_heads, head_dim and gate_channels >= 1, got "
                             f"{vocab_size}, {num_kv_heads}, {head_dim} and {gate_channels}")
        self.layers = _selected(num_layers, layers)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.gate_channels, self.gate_scale = gate_channels, gate_scale
        self.embed = nn.Embedding(vocab_size, len(self.layers) * num_kv_heads * head_dim, sparse=sparse)
        self.gates = nn.ModuleDict({str(layer): nn.Linear(gate_channels, num_kv_heads, bias=False)
                                    for layer in self.layers})
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None, std: float = 0.02,
                         init: str = "function-preserving") -> None:
        """``"function-preserving"``: tables and gate weights zero, so every term is exactly 0 and the model starts
        equal to the one without value embeddings; the tables get a gradient at the first step (the gate is then
        ``gate_scale / 2`` everywhere), the gates from the second.

        ``"nanochat"`` (``GPT.init_weights``): tables uniform in ``±√3·std`` (std ``std``, as nanochat's ``c_v``;
        nanochat's std is ``n_embd^-½`` — pass ``std=hidden_size**-0.5`` for its exact init), gate weights
        uniform in ``[0, 0.02)`` (gates start slightly above ``gate_scale / 2``). The model then starts changed.
        """
        if init not in INITS:
            raise ValueError(f"unknown ValueEmbeddings init {init!r}: choose one of {', '.join(INITS)}")
        bound = 3.0 ** 0.5 * std
        if init == "function-preserving":
            self.embed.weight.zero_()
        else:
            self.embed.weight.uniform_(-bound, bound, generator=generator)
        for gate in self.gates.values():
            if init == "function-preserving":
                gate.weight.zero_()
            else:
                gate.weight.uniform_(0.0, 0.02, generator=generator)

    def blank(self) -> ValueEmbeddings:
        """A new module of this one's sizes, on the CPU in float32 (its values: :meth:`reset_parameters`' to set)."""
        with torch.random.fork_rng(devices=[]):  # the default init draws from the global RNG: leave it as it was
            return ValueEmbeddings(self.embed.num_embeddings, self.num_layers, self.num_kv_heads, self.head_dim,
                                   layers=self.layers, gate_channels=self.gate_channels, gate_scale=self.gate_scale)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Every selected layer's rows: ``ids [B,T]`` -> ``[B,T,|layers|,n_kv,hd]`` (one lookup per forward)."""
        return self.embed(ids).view(*ids.shape, len(self.layers), self.num_kv_heads, self.head_dim)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, layer: int, rows: torch.Tensor | None = None
                ) -> torch.Tensor:
        """``g ⊙ VE_l[ids]``: ``x [B,T,H]``, ``ids [B,T]`` -> the term added to layer ``layer``'s values
        ``v [B,n_kv,T,hd]``, in ``x``'s dtype. ``rows``: this forward's :meth:`lookup` (looked up here without)."""
        key = str(layer)
        if key not in self.gates:
            raise ValueError(f"layer {layer} has no value embedding: the selected layers are {list(self.layers)}")
        if x.dim() != 3 or tuple(ids.shape) != tuple(x.shape[:2]):
            raise ValueError(f"ValueEmbeddings needs x [B,T,H] and ids [B,T], got {tuple(x.shape)} and "
                             f"{tuple(ids.shape)}")
        if x.shape[-1] < self.gate_channels:
            raise ValueError(f"the gate reads the first {self.gate_channels} channels of x, but x has only "
                             f"{x.shape[-1]}")
        gate = self.gate_scale * torch.sigmoid(self.gates[key](x[..., :self.gate_channels]))
        ve = (self.lookup(ids) if rows is None else rows)[:, :, self.layers.index(layer)]
        return (gate.unsqueeze(-1) * ve).transpose(1, 2).to(x.dtype)
