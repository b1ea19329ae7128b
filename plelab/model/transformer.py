"""The PLE transformer: a decoder-only trunk with optional Per-Layer Embeddings.

Equations (``docs/ple.md`` §1.2 and §1.4; Gemma 4 ``Gemma4TextModel`` plain form):

    e      = sqrt(H) · E[x]                                        # embed_tokens          [B,T,H]
    z      = sqrt(dP) · T[r(x)]  → [B,T,L,dP]   # embed_tokens_per_layer (ple.embed_scale); r(x) = x if x < Vp
                                               # else 0, or the frequency map per_layer_token_rows[x]
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

The other kinds of the table family (``aux.kind``; with ``dP = 0``) enter as their sources put them:

    value       layer l in aux.layers: v ← v + 3·sigmoid(W_g,l x[..., :c]) ⊙ VE_l[x]   model.value_embeddings.*
    ngram       before layer l:         h ← h + λ_l · W_proj concat_s E[hash_s(x)]     model.ngram_embedding.*
    modulation  layer l in aux.layers:  h ← h + MLP(RMSNorm(h)) ⊙ (1 + M[x]_l)          model.token_modulation.*
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plelab.config.aux_schema import AuxConfig
from plelab.config.schema import ModelConfig, PLEConfig
from plelab.model.layers import Attention, RMSNorm, SwiGLU, rotary_cos_sin
from plelab.model.losses import head_cross_entropy
from plelab.model.modulation import TokenModulation
from plelab.model.ngram import HashedNgramEmbedding, ngram_rows
from plelab.model.ple import PerLayerEmbedding, PerLayerInjection, keep_unregistered, token_table_ids
from plelab.model.value_embed import ValueEmbeddings


# aux.kind -> the attribute of the text model holding its module (model.<attribute>.* in the state dict)
AUX_ATTRIBUTES = {"value": "value_embeddings", "ngram": "ngram_embedding", "modulation": "token_modulation"}
AUX_CLASSES = {"value": ValueEmbeddings, "ngram": HashedNgramEmbedding, "modulation": TokenModulation}


def build_aux(mc: ModelConfig, ac: AuxConfig) -> nn.Module | None:
    """The module of the run's aux table (``aux.kind``; None for PLE), its values unset (:mod:`plelab.model.init`)."""
    L, H, V = mc.num_hidden_layers, mc.hidden_size, mc.vocab_size
    if ac.kind == "value":
        return ValueEmbeddings(V, L, mc.num_key_value_heads, mc.resolved_head_dim, layers=ac.layers or None,
                               gate_channels=ac.gate_channels)
    if ac.kind == "ngram":
        return HashedNgramEmbedding(V, H, L, orders=ac.orders, heads=ac.heads, dim=ac.dim, seed=ac.hash_seed,
                                    rows=ac.rows if ac.rows is not None else ngram_rows(V, ac.rows_multiple))
    if ac.kind == "modulation":
        return TokenModulation(V, H, L, layers=ac.layers or None)
    return None


class DecoderLayer(nn.Module):
    """One block: attention, SwiGLU, then the PLE injection (:class:`PerLayerInjection`) as a third residual
    update. The injection's tensors are registered on the layer under HF's flat names."""

    def __init__(self, mc: ModelConfig, pc: PLEConfig) -> None:
        super().__init__()
        H = mc.hidden_size
        self.input_layernorm = RMSNorm(H, mc.rms_norm_eps)
        self.self_attn = Attention(H, mc.num_attention_heads, mc.num_key_value_heads, mc.resolved_head_dim)
        self.post_attention_layernorm = RMSNorm(H, mc.rms_norm_eps)
        self.mlp = SwiGLU(H, mc.intermediate_size)
        self.gate_kind = pc.gate if pc.enabled else None
        injection = (PerLayerInjection(H, pc.dim, pc.gate, eps=mc.rms_norm_eps, gate_init=pc.gate_init,
                                       register_on=self) if pc.enabled else None)
        keep_unregistered(self, "per_layer_injection", injection)

    def ple_branch(self, h: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The PLE update added to the residual stream: ``h [B,T,H]``, ``p [B,T,dP]`` -> ``[B,T,H]``."""
        return self.per_layer_injection(h, p)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                per_layer_input: torch.Tensor | None = None, cache=None, layer_idx: int = 0,
                value_embed=None, modulation: torch.Tensor | None = None) -> torch.Tensor:
        """``value_embed``: ``x [B,T,H] -> [B,n_kv,T,hd]``, the value embedding's term from the attention input;
        ``modulation [B,T,H]``: this layer's ``M[x]_l``, scaling the MLP update by ``1 + M[x]_l``."""
        x = self.input_layernorm(h)
        h = h + self.self_attn(x, cos, sin, cache, layer_idx, value_embed(x) if value_embed is not None else None)
        update = self.mlp(self.post_attention_layernorm(h))
        h = h + (update if modulation is None else TokenModulation.modulate(update, modulation))
        if per_layer_input is not None:
            h = h + self.per_layer_injection(h, per_layer_input)
        return h


class PLETextModel(nn.Module):
    """Embeddings, the model-level PLE pipeline (:class:`PerLayerEmbedding`, its tensors registered here
    under HF's names) and the layer stack (HF ``model.*`` names). No state besides the parameters.

    ``activation_checkpointing``: in a forward that records gradients, each decoder layer keeps only its input and
    recomputes the rest during backward (``torch.utils.checkpoint``, non-reentrant): the same values and gradients,
    about one layer's activations instead of L layers', one more forward of the stack per step."""

    def __init__(self, mc: ModelConfig, pc: PLEConfig, table_sparse: bool = False,
                 activation_checkpointing: bool = False, ac: AuxConfig | None = None) -> None:
        super().__init__()
        self.mc, self.pc, self.ac = mc, pc, ac if ac is not None else AuxConfig()
        self.activation_checkpointing = activation_checkpointing
        if pc.enabled and pc.vocab_remap == "frequency":
            # the table row of every token id (ple.vocab_remap=frequency); -1 until filled by build_model's
            # token_rows or a checkpoint, so an unfilled map cannot be read by mistake
            self.register_buffer("per_layer_token_rows", torch.full((mc.vocab_size,), -1, dtype=torch.int64))
        H, L = mc.hidden_size, mc.num_hidden_layers
        self.embed_tokens = nn.Embedding(mc.vocab_size, H)
        embedding = None
        if pc.enabled:
            self.ple_vocab_size = pc.resolved_vocab_size(mc)
            embedding = PerLayerEmbedding(self.ple_vocab_size, H, L, pc.dim, eps=mc.rms_norm_eps,
                                          embed_scale=pc.embed_scale, sparse=table_sparse, register_on=self)
        keep_unregistered(self, "per_layer_embedding", embedding)
        self.layers = nn.ModuleList(DecoderLayer(mc, pc) for _ in range(L))
        self.norm = RMSNorm(H, mc.rms_norm_eps)
        aux = build_aux(mc, self.ac)
        if aux is not None:
            setattr(self, AUX_ATTRIBUTES[self.ac.kind], aux)
        # A Python float (HF keeps it as a non-persistent buffer; same value in fp32).
        self.embed_scale = math.sqrt(H) if mc.scale_embeddings else 1.0

    def table_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``embed_tokens_per_layer`` that ``input_ids [B,T]`` look up (ids >= Vp -> 0, or the
        frequency map ``per_layer_token_rows`` under ``ple.vocab_remap=frequency``)."""
        if self.pc.vocab_remap == "frequency":
            rows = self.per_layer_token_rows[input_ids]
            if bool((rows < 0).any()):
                raise ValueError("the model's id -> row map (per_layer_token_rows) is unfilled: build the model with "
                                 "build_model(..., token_rows=plelab.frequency_rows(counts, Vp)) or load a checkpoint")
            return rows
        return token_table_ids(input_ids, self.ple_vocab_size)

    def _resolve_table_ids(self, input_ids: torch.Tensor, table_ids: torch.Tensor | None) -> torch.Tensor:
        if table_ids is not None:
            return table_ids
        if self.pc.ids == "iid":
            raise ValueError("ple.ids='iid' (the null control) needs table_ids: draw them with "
                             "plelab.IIDTableIds(counts).draw(input_ids) and pass table_ids=...")
        return self.table_ids(input_ids)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``e = sqrt(H)·E[x]``: ``[B,T]`` -> ``[B,T,H]``."""
        return self.embed_tokens(input_ids) * self.embed_scale

    def per_layer_token_embeddings(self, input_ids: torch.Tensor,
                                   table_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Token-identity part ``z = sqrt(dP)·T[ids]``: ``[B,T]`` -> ``[B,T,L,dP]`` (ids: ``table_ids``, or the
        token ids with ids >= Vp mapped to 0)."""
        return self.per_layer_embedding.token_part(self._resolve_table_ids(input_ids, table_ids))

    def per_layer_inputs(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor,
                         token_part: torch.Tensor | None = None, table_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``P = (RMSNorm_dP(W_m e · H^-½) + z) · 2^-½``: ``[B,T,H]`` -> ``[B,T,L,dP]``.

        ``token_part`` replaces the table lookup ``z`` when given (e.g. a visual table).
        """
        ids = None if token_part is not None else self._resolve_table_ids(input_ids, table_ids)
        return self.per_layer_embedding(inputs_embeds, ids, token_part)

    def forward(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor | None = None,
                token_part: torch.Tensor | None = None, table_ids: torch.Tensor | None = None,
                past_key_values=None) -> torch.Tensor:
        """``input_ids [B,T]`` -> final normed hidden states ``[B,T,H]``.

        ``table_ids [B,T]``: the table rows to look up when they are not the token ids (the i.i.d. null
        control). ``inputs_embeds [B,T,H]`` replaces ``embed(input_ids)`` and ``token_part [B,T,L,dP]`` the
        table lookup (a multimodal sequence: image positions carry projected features and visual-table rows).
        ``past_key_values``: a KV cache (see :class:`~plelab.model.layers.Attention`) holding the positions before
        ``input_ids``; it is extended in place.
        """
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        P = self.per_layer_inputs(input_ids, h, token_part, table_ids) if self.pc.enabled else None
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        cos, sin = rotary_cos_sin(h.shape[1], self.mc.resolved_head_dim, self.mc.rope_theta, h.device, h.dtype,
                                  offset=past)
        keys = self._aux_ids(input_ids, table_ids) if self.ac.extra else None
        y = self.ngram_term(input_ids, past_key_values, keys) if self.ac.kind == "ngram" else None
        M = self.token_modulation(keys) if self.ac.kind == "modulation" else None
        values = self.value_embeddings if self.ac.kind == "value" else None
        rows = values.lookup(keys) if values is not None else None
        recompute = self.activation_checkpointing and torch.is_grad_enabled() and past_key_values is None
        for i, layer in enumerate(self.layers):
            p = P[:, :, i] if P is not None else None
            if y is not None:
                h = h + self.ngram_embedding.layer_term(y, i)
            ve = (lambda x, i=i: values(x, input_ids, i, rows)) if values is not None and i in values.layers else None
            m = self.token_modulation.at(M, i) if M is not None else None
            if recompute:
                h = checkpoint(layer, h, cos, sin, p, None, i, ve, m, use_reentrant=False)
            else:
                h = layer(h, cos, sin, p, past_key_values, i, ve, m)
        return self.norm(h)

    def _aux_ids(self, input_ids: torch.Tensor, table_ids: torch.Tensor | None) -> torch.Tensor | None:
        """What keys the aux table: ``table_ids`` when given (the null control's draws: ``[B,T]``, or ``[B,T,S]``
        buckets for the n-gram table), else the token ids (None for the n-gram table: it hashes them)."""
        if table_ids is not None:
            return table_ids
        if self.ac.ids == "iid":
            raise ValueError("aux.ids='iid' (the null control) needs table_ids: draw them with "
                             "plelab.IIDTableIds(counts, slots).draw(input_ids) and pass table_ids=...")
        return None if self.ac.kind == "ngram" else input_ids

    def ngram_term(self, input_ids: torch.Tensor, cache=None, buckets: torch.Tensor | None = None) -> torch.Tensor:
        """The hashed n-gram table's ``y [B,T,H]`` for ``input_ids [B,T]``; with a KV cache the n-grams reach back
        into the positions before ``input_ids`` (the cache keeps their last tokens), as one forward over the whole
        sequence would. ``buckets [B,T,S]``: the rows to look up instead of the hash's (the null control)."""
        ngram = self.ngram_embedding
        if buckets is not None:
            return ngram(input_ids, bucket_ids=buckets)
        if cache is None:
            return ngram(input_ids)
        keep = max(ngram.orders) - 1
        before = getattr(cache, "ngram_tokens", None) if cache.get_seq_length() > 0 else None
        if cache.get_seq_length() > 0 and before is None:
            raise ValueError("a hashed n-gram table decoding with a KV cache needs the cache to keep the last tokens "
                             "(plelab's KVCache does): use plelab.model.generate.KVCache, or no cache")
        seen = input_ids if before is None else torch.cat([before, input_ids], dim=1)
        cache.ngram_tokens = seen[:, seen.shape[1] - min(keep, seen.shape[1]):]
        return ngram(seen)[:, seen.shape[1] - input_ids.shape[1]:]


@dataclass
class CausalLMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None
    past_key_values: object | None = None


class PLECausalLM(nn.Module):
    """Decoder-only LM with optional PLE. Build it with :func:`plelab.model.build_model`."""

    def __init__(self, mc: ModelConfig, pc: PLEConfig, table_sparse: bool = False,
                 activation_checkpointing: bool = False, ac: AuxConfig | None = None) -> None:
        super().__init__()
        self.mc, self.pc = mc, pc
        self.model = PLETextModel(mc, pc, table_sparse=table_sparse, activation_checkpointing=activation_checkpointing,
                                  ac=ac)
        self.ac = self.model.ac
        if not mc.tie_word_embeddings:
            self.lm_head = nn.Linear(mc.hidden_size, mc.vocab_size, bias=False)

    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.mc.tie_word_embeddings else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, *,
                targets: torch.Tensor | None = None, table_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, token_part: torch.Tensor | None = None,
                past_key_values=None, return_logits: bool = True, loss_reduction: str = "mean") -> CausalLMOutput:
        """``input_ids [B,T]`` -> logits ``[B,T,V]`` and, given targets, the mean next-token CE.

        ``labels [B,T]`` follow HF: aligned with ``input_ids`` and shifted inside (position t predicts
        ``labels[t+1]``), -100 ignored — ``model(ids, labels=ids)`` is language modelling. ``targets [B,T]``
        are already shifted (nanoGPT's convention: position t predicts ``targets[t]``), as the trainer passes
        ``window[:, :-1]`` / ``window[:, 1:]``. ``return_logits=False`` (with labels or targets) computes the
        loss through the head in row chunks (:func:`~plelab.model.losses.head_cross_entropy`: no ``[B,T,V]``
        logits, the same loss up to summation order) and returns ``logits=None``, as the trainer does;
        ``loss_reduction="none"`` makes the loss one value per scored position, ``[B, T]`` (``[B, T−1]`` with labels).
        ``table_ids``, ``inputs_embeds``, ``token_part``, ``past_key_values``: see :meth:`PLETextModel.forward`
        (the cache comes back in the output).
        """
        if labels is not None and targets is not None:
            raise ValueError("give labels (HF: shifted inside) or targets (already shifted), not both")
        if loss_reduction not in ("mean", "none"):
            raise ValueError(f"loss_reduction={loss_reduction!r}: use 'mean' or 'none'")
        hidden = self.model(input_ids, inputs_embeds, token_part, table_ids, past_key_values)
        shift = labels is not None  # position t predicts labels[t + 1]
        if shift:
            targets = labels[:, 1:]
        if not return_logits and targets is not None:
            loss = head_cross_entropy(hidden[:, :-1] if shift else hidden, self.output_weight(), targets,
                                      reduction=loss_reduction)
            return CausalLMOutput(logits=None, loss=_per_position(loss, targets, loss_reduction),
                                  past_key_values=past_key_values)
        logits = F.linear(hidden, self.output_weight())
        loss = None
        if targets is not None:
            scored = (logits[:, :-1] if shift else logits).float()
            loss = F.cross_entropy(scored.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                                   reduction=loss_reduction)
            loss = _per_position(loss, targets, loss_reduction)
        return CausalLMOutput(logits=logits, loss=loss, past_key_values=past_key_values)


def _per_position(loss: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    return loss.view(targets.shape) if reduction == "none" else loss
