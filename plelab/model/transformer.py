"""The PLE transformer: a decoder-only trunk with optional Per-Layer Embeddings.

Equations (``ple_reference.md`` §1.2 and §1.4; Gemma 4 ``Gemma4TextModel`` plain form):

    e      = sqrt(H) · E[x]                                        # embed_tokens          [B,T,H]
    z      = sqrt(dP) · T[x if x < Vp else 0]  → [B,T,L,dP]         # embed_tokens_per_layer (ple.embed_scale)
    c      = RMSNorm_dP((W_m e) · H^-½ → [B,T,L,dP]; g_m)           # per_layer_model_projection, _norm
    P      = (c + z) · 2^-½                                        # per-layer inputs      [B,T,L,dP]
    layer l:
    h      = h + Attn(RMSNorm(h));  h = h + SwiGLU(RMSNorm(h))
    h      = h + RMSNorm_H(W_p^l (gelu_tanh(W_g^l h) ⊙ P[:,:,l]); γ_l)   # gate = "gemma"
    logits = RMSNorm(h) Eᵀ                                         # tied (or lm_head)

Tensor names are HF's: ``model.embed_tokens``, ``model.embed_tokens_per_layer``,
``model.per_layer_model_projection``, ``model.per_layer_projection_norm``,
``model.layers.{l}.per_layer_input_gate``, ``.per_layer_projection``,
``.post_per_layer_input_norm``, ``model.norm``. With ``dP = 0`` none of the PLE tensors
exist and the model is exactly the baseline trunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plelab.config.schema import ModelConfig, PLEConfig
from plelab.model.layers import Attention, RMSNorm, SwiGLU, rotary_cos_sin


class _HostToDevice(torch.autograd.Function):
    """Copy looked-up table rows to the trunk's device (pinned + asynchronous to CUDA); the gradient goes back."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
        ctx.source = rows.device
        if device.type == "cuda" and rows.device.type == "cpu":
            rows = rows.pin_memory()
        return rows.to(device, non_blocking=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.source), None


class DecoderLayer(nn.Module):
    """One block: attention, SwiGLU, then the PLE injection as a third residual update."""

    def __init__(self, mc: ModelConfig, pc: PLEConfig) -> None:
        super().__init__()
        H = mc.hidden_size
        self.input_layernorm = RMSNorm(H, mc.rms_norm_eps)
        self.self_attn = Attention(H, mc.num_attention_heads, mc.num_key_value_heads, mc.resolved_head_dim)
        self.post_attention_layernorm = RMSNorm(H, mc.rms_norm_eps)
        self.mlp = SwiGLU(H, mc.intermediate_size)
        self.gate_kind = pc.gate if pc.enabled else None
        if pc.enabled:
            dP = pc.dim
            self.per_layer_projection = nn.Linear(dP, H, bias=False)
            if pc.gate == "gemma":
                self.per_layer_input_gate = nn.Linear(H, dP, bias=False)
                self.post_per_layer_input_norm = RMSNorm(H, mc.rms_norm_eps)
            elif pc.gate in ("scalar", "vector"):
                self.per_layer_gate = nn.Parameter(torch.empty(1 if pc.gate == "scalar" else H))
        # Diagnostics hook: called as probe(layer, h, per_layer_input, branch) when set.
        self.probe = None

    def ple_branch(self, h: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The PLE update added to the residual stream. ``h [B,T,H]``, ``p [B,T,dP]`` -> ``[B,T,H]``.

        gemma: ``RMSNorm_H(W_p (gelu_tanh(W_g h) ⊙ p))``; scalar/vector: ``g ⊙ W_p p``;
        none: ``W_p p`` (the seed's ``h_l + gate_l · proj_l(PLE_l[token])``).
        """
        if self.gate_kind == "gemma":
            u = F.gelu(self.per_layer_input_gate(h), approximate="tanh") * p
            return self.post_per_layer_input_norm(self.per_layer_projection(u))
        out = self.per_layer_projection(p)
        if self.gate_kind in ("scalar", "vector"):
            out = out * self.per_layer_gate
        return out

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                per_layer_input: torch.Tensor | None = None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        h = h + self.mlp(self.post_attention_layernorm(h))
        if per_layer_input is not None:
            branch = self.ple_branch(h, per_layer_input)
            if self.probe is not None:
                self.probe(self, h, per_layer_input, branch)
            h = h + branch
        return h


class PLETextModel(nn.Module):
    """Embeddings, the model-level PLE pipeline and the layer stack (HF ``model.*`` names)."""

    def __init__(self, mc: ModelConfig, pc: PLEConfig) -> None:
        super().__init__()
        self.mc, self.pc = mc, pc
        H, L = mc.hidden_size, mc.num_hidden_layers
        self.embed_tokens = nn.Embedding(mc.vocab_size, H)
        if pc.enabled:
            self.ple_vocab_size = pc.resolved_vocab_size(mc)
            self.embed_tokens_per_layer = nn.Embedding(self.ple_vocab_size, L * pc.dim)
            self.per_layer_model_projection = nn.Linear(H, L * pc.dim, bias=False)
            self.per_layer_projection_norm = RMSNorm(pc.dim, mc.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(mc, pc) for _ in range(L))
        self.norm = RMSNorm(H, mc.rms_norm_eps)
        # Python-float scales (HF keeps them as non-persistent buffers; same values in fp32).
        self.embed_scale = math.sqrt(H) if mc.scale_embeddings else 1.0
        self.ple_embed_scale = pc.embed_scale
        self.per_layer_projection_scale = H ** -0.5
        self.per_layer_input_scale = 2.0 ** -0.5
        # ple.ids == "iid": frequencies the null ids are drawn from (set by the trainer), and an
        # optional generator so that paired evaluations draw the same ids.
        self.iid_probs: torch.Tensor | None = None
        self.iid_generator: torch.Generator | None = None
        # Diagnostics: the rows looked up by the last forward, and a probe(c, z) hook.
        self.last_table_ids: torch.Tensor | None = None
        self.probe = None

    def table_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``embed_tokens_per_layer`` that ``input_ids [B,T]`` look up (ids >= Vp -> 0)."""
        if self.pc.ids == "iid":
            if self.iid_probs is None:
                raise RuntimeError("ple.ids='iid' needs the id frequencies: call set_iid_frequencies(counts) first")
            draws = torch.multinomial(self.iid_probs, input_ids.numel(), replacement=True,
                                      generator=self.iid_generator)
            ids = draws.view(input_ids.shape).to(input_ids.device)
        else:
            ids = torch.where(input_ids < self.ple_vocab_size, input_ids, torch.zeros_like(input_ids))
        self.last_table_ids = ids
        return ids

    def set_iid_frequencies(self, counts: torch.Tensor) -> None:
        """Id frequencies (``[Vp]`` counts of the real ids) for ``ple.ids == "iid"``."""
        counts = counts.to(torch.float64)
        self.iid_probs = (counts / counts.sum()).float()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``e = sqrt(H)·E[x]``: ``[B,T]`` -> ``[B,T,H]``."""
        return self.embed_tokens(input_ids) * self.embed_scale

    def per_layer_token_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token-identity part ``z = sqrt(dP)·T[x̃]``, ids >= Vp mapped to 0: ``[B,T]`` -> ``[B,T,L,dP]``.

        A table kept on another device (``train.table_device=cpu``, or a memory-mapped table) is read
        there: only the batch's rows travel, through pinned memory and an asynchronous copy to CUDA.
        """
        ids = self.table_ids(input_ids)
        table = self.embed_tokens_per_layer
        if table.weight.device != ids.device:
            z = _HostToDevice.apply(table(ids.to(table.weight.device)), ids.device) * self.ple_embed_scale
        else:
            z = table(ids) * self.ple_embed_scale
        return z.view(*input_ids.shape, self.mc.num_hidden_layers, self.pc.dim)

    def per_layer_inputs(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor,
                         token_part: torch.Tensor | None = None) -> torch.Tensor:
        """``P = (RMSNorm_dP(W_m e · H^-½) + z) · 2^-½``: ``[B,T,H]`` -> ``[B,T,L,dP]``.

        ``token_part`` replaces the table lookup ``z`` when given (e.g. a visual table).
        """
        c = self.per_layer_model_projection(inputs_embeds) * self.per_layer_projection_scale
        c = self.per_layer_projection_norm(c.view(*inputs_embeds.shape[:-1], self.mc.num_hidden_layers, self.pc.dim))
        z = self.per_layer_token_embeddings(input_ids) if token_part is None else token_part
        if self.probe is not None:
            self.probe(c, z)
        return (c + z) * self.per_layer_input_scale

    def forward(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor | None = None,
                token_part: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids [B,T]`` -> final normed hidden states ``[B,T,H]``.

        ``inputs_embeds [B,T,H]`` replaces ``embed(input_ids)`` and ``token_part [B,T,L,dP]`` the table
        lookup (a multimodal sequence: image positions carry projected features and visual-table rows).
        """
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        P = self.per_layer_inputs(input_ids, h, token_part) if self.pc.enabled else None
        cos, sin = rotary_cos_sin(h.shape[1], self.mc.resolved_head_dim, self.mc.rope_theta, h.device, h.dtype)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, P[:, :, i] if P is not None else None)
        return self.norm(h)


@dataclass
class CausalLMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class PLECausalLM(nn.Module):
    """Decoder-only LM with optional PLE. Build it with :func:`plelab.model.build_model`."""

    def __init__(self, mc: ModelConfig, pc: PLEConfig) -> None:
        super().__init__()
        self.mc, self.pc = mc, pc
        self.model = PLETextModel(mc, pc)
        if not mc.tie_word_embeddings:
            self.lm_head = nn.Linear(mc.hidden_size, mc.vocab_size, bias=False)

    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.mc.tie_word_embeddings else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, token_part: torch.Tensor | None = None) -> CausalLMOutput:
        """``input_ids [B,T]`` -> logits ``[B,T,V]``; with ``labels [B,T]`` (-100 = ignore) also the mean CE.
        ``inputs_embeds`` / ``token_part``: see :meth:`PLETextModel.forward`."""
        logits = F.linear(self.model(input_ids, inputs_embeds, token_part), self.output_weight())
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        return CausalLMOutput(logits=logits, loss=loss)
