"""Parameter groups, exact parameter counts and per-token FLOPs.

Three views of one model, cross-checked against each other:

- ``accounting_groups(model)``: every parameter in exactly one named group (asserted). The
  optimizer's parameter groups are built from it, and counts are summed over it.
- ``closed_form_counts(mc, pc)``: the same group counts from formulas alone, including the
  seed's PLE formulas: table ``Vp·L·dP``; model-level ``H·L·dP + dP``; per-layer
  ``(2·H·dP + H)·L`` (``docs/ple.md`` §2.1).
- ``flops_per_token``: training FLOPs per token, ``6·N_matmul + 12·L·n_heads·head_dim·T``
  (PaLM appendix B / torchtitan / nanochat convention). Table lookups are not matmuls and
  are excluded; the tied LM head is a matmul and is included.

The table family's other kinds (``aux.kind``) are two groups: ``aux_table`` (the token- or bucket-indexed rows) and
``aux_other`` (value gates; the n-gram projection and per-layer scales), counted by their modules' closed forms.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from plelab.config.aux_schema import AuxConfig
from plelab.config.schema import ModelConfig, PLEConfig
from plelab.model import modulation, ngram, value_embed
from plelab.model.init import build_model
from plelab.model.ple import TABLE_KEY
from plelab.model.transformer import PLECausalLM

GROUPS: tuple[str, ...] = (
    "embed_tokens", "lm_head", "attention", "mlp", "norms",
    "ple_table", "ple_model_projection", "ple_per_layer", "aux_table", "aux_other",
)
PLE_GROUPS: tuple[str, ...] = ("ple_table", "ple_model_projection", "ple_per_layer")
AUX_GROUPS: tuple[str, ...] = ("aux_table", "aux_other")
ADDED_GROUPS = PLE_GROUPS + AUX_GROUPS  # what a table of the family adds over the trunk
AUX_ROOTS = ("value_embeddings", "ngram_embedding", "token_modulation")  # model.<root>.*
AUX_TABLES = ("embed",)  # their tables: model.value_embeddings.embed.weight, model.ngram_embedding.embed.weight, ...
_PER_LAYER_PLE = ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm", "per_layer_gate")


def group_of(name: str) -> str:
    """The accounting / optimizer group of a parameter, from its HF-style name."""
    parts = name.split(".")
    if name == "model.embed_tokens.weight":
        return "embed_tokens"
    if name == "lm_head.weight":
        return "lm_head"
    if name == TABLE_KEY:
        return "ple_table"
    if parts[1] in AUX_ROOTS:
        return "aux_table" if parts[2] in AUX_TABLES else "aux_other"
    if parts[1] in ("per_layer_model_projection", "per_layer_projection_norm"):
        return "ple_model_projection"
    if name == "model.norm.weight":
        return "norms"
    if parts[1] == "layers":
        sub = parts[3]
        if sub in _PER_LAYER_PLE:
            return "ple_per_layer"
        if sub == "self_attn":
            return "attention"
        if sub == "mlp":
            return "mlp"
        if sub in ("input_layernorm", "post_attention_layernorm"):
            return "norms"
    raise ValueError(f"parameter {name!r} belongs to no accounting group")


def accounting_groups(model: nn.Module) -> OrderedDict[str, list[tuple[str, nn.Parameter]]]:
    """Partition ``model.named_parameters()`` into ``GROUPS``; asserts the partition is exact."""
    groups: OrderedDict[str, list[tuple[str, nn.Parameter]]] = OrderedDict((g, []) for g in GROUPS)
    for name, p in model.named_parameters():
        groups[group_of(name)].append((name, p))
    seen = [id(p) for members in groups.values() for _, p in members]
    assert len(seen) == len(set(seen)) == len(list(model.parameters())), "parameter groups do not partition the model"
    return groups


def counts_from_model(model: nn.Module) -> dict[str, int]:
    """Parameter count per group, from the instantiated (possibly meta) model."""
    return {g: sum(p.numel() for _, p in members) for g, members in accounting_groups(model).items()}


def aux_counts(mc: ModelConfig, ac: AuxConfig | None) -> tuple[int, int, int]:
    """``(aux_table, aux_other, matmul weights)`` of the run's aux table (zeros for ``aux.kind=ple``), from the
    modules' closed forms."""
    if ac is None or not ac.extra:
        return 0, 0, 0
    H, L, V = mc.hidden_size, mc.num_hidden_layers, mc.vocab_size
    if ac.kind == "value":
        numbers = (V, L, mc.num_key_value_heads, mc.resolved_head_dim, ac.layers or None, ac.gate_channels)
        total = value_embed.added_params(*numbers)
        matmul = value_embed.flops_per_token(*numbers) // 2  # the gates: 2 FLOPs per weight per token
        return total - matmul, matmul, matmul
    if ac.kind == "ngram":
        rows = ac.rows if ac.rows is not None else ngram.ngram_rows(V, ac.rows_multiple)
        numbers = (V, H, L, ac.orders, ac.heads, rows, ac.dim)
        total = ngram.added_params(*numbers)
        matmul = ngram.flops_per_token(*numbers) // 2  # the projection
        return total - matmul - L, matmul + L, matmul
    return modulation.added_params(V, H, L, ac.layers or None), 0, 0


def closed_form_counts(mc: ModelConfig, pc: PLEConfig, ac: AuxConfig | None = None) -> dict[str, int]:
    """Parameter count per group from formulas alone (no model is built)."""
    H, L, V, hd = mc.hidden_size, mc.num_hidden_layers, mc.vocab_size, mc.resolved_head_dim
    nq, nkv, F = mc.num_attention_heads, mc.num_key_value_heads, mc.intermediate_size
    c = dict.fromkeys(GROUPS, 0)
    c["embed_tokens"] = V * H
    c["lm_head"] = 0 if mc.tie_word_embeddings else V * H
    c["attention"] = L * (2 * H * nq * hd + 2 * H * nkv * hd)
    c["mlp"] = L * 3 * H * F
    c["norms"] = (2 * L + 1) * H
    if pc.enabled:
        dP, Vp = pc.dim, pc.resolved_vocab_size(mc)
        c["ple_table"] = Vp * L * dP
        c["ple_model_projection"] = H * L * dP + dP
        per_layer = {"gemma": 2 * H * dP + H, "scalar": H * dP + 1, "vector": H * dP + H, "none": H * dP}[pc.gate]
        c["ple_per_layer"] = per_layer * L
    c["aux_table"], c["aux_other"], _ = aux_counts(mc, ac)
    return c


def matched_trunk(mc: ModelConfig, pc: PLEConfig, seq_len: int, match: str,
                  ac: AuxConfig | None = None) -> ModelConfig:
    """The PLE-free trunk whose wider FFN spends what PLE at ``pc`` adds: ``match="params"`` equal total
    parameters, ``"flops"`` equal training FLOPs per token (both linear in ``intermediate_size``: the nearest
    integer width). The baseline a PLE gain must beat to be worth its parameters or its compute. ``ac``: the same
    for another kind of the table family (with ``ple.dim=0``)."""
    off, no_aux = dataclasses.replace(pc, dim=0), AuxConfig()
    per_unit = {"params": 3 * mc.hidden_size * mc.num_hidden_layers,  # gate, up, down: H·F each, per layer
                "flops": 6 * 3 * mc.hidden_size * mc.num_hidden_layers}[match]
    cost = {"params": lambda m, p, a: sum(closed_form_counts(m, p, a).values()),
            "flops": lambda m, p, a: flops_per_token(m, p, seq_len, a)}[match]
    extra = round((cost(mc, pc, ac) - cost(mc, off, no_aux)) / per_unit)
    return dataclasses.replace(mc, intermediate_size=mc.intermediate_size + extra)


def matmul_params(mc: ModelConfig, pc: PLEConfig, ac: AuxConfig | None = None) -> int:
    """Weights used in matmuls per token: every Linear, plus the LM head (tied or not)."""
    c = closed_form_counts(mc, pc)
    lm_head = mc.vocab_size * mc.hidden_size
    H, L = mc.hidden_size, mc.num_hidden_layers
    ple = 0
    if pc.enabled:
        ple = H * L * pc.dim  # per_layer_model_projection
        ple += L * H * pc.dim * (2 if pc.gate == "gemma" else 1)  # gate (gemma only) + projection
    return c["attention"] + c["mlp"] + lm_head + ple + aux_counts(mc, ac)[2]


def matmul_params_from_model(model: PLECausalLM) -> int:
    """The same, counted from the model's ``nn.Linear`` modules and its output weight."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    tied_head = model.output_weight().numel() if model.mc.tie_word_embeddings else 0
    return linear + tied_head


def forward_gemms(model: nn.Module, tokens: int) -> list[tuple[int, int, int]]:
    """The forward GEMMs ``(m, k, n)`` of ``model`` on ``tokens`` positions: one per ``nn.Linear`` (``[tokens,
    in]·[in, out]``) and, for a :class:`PLECausalLM` with a tied head, the LM head. Attention's own products are
    left out (SDPA, not a GEMM). Shapes only: ``model`` may live on the meta device."""
    out = [(tokens, m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    if isinstance(model, PLECausalLM) and model.mc.tie_word_embeddings:
        V, H = model.output_weight().shape
        out.append((tokens, H, V))
    return out


def flops_per_token(mc: ModelConfig, pc: PLEConfig, seq_len: int, ac: AuxConfig | None = None) -> int:
    """Training FLOPs per token (forward + backward): ``6·N_matmul + 12·L·n_heads·head_dim·T``."""
    attn = 12 * mc.num_hidden_layers * mc.num_attention_heads * mc.resolved_head_dim * seq_len
    return 6 * matmul_params(mc, pc, ac) + attn


@dataclass
class Accounting:
    """Exact counts of one configuration. ``added`` is everything its table (PLE or another kind) adds over the
    dP=0 trunk."""

    dim: int
    groups: dict[str, int]
    base: int
    matmul: int
    flops_per_token: int
    seq_len: int
    aux: str = "ple"

    @property
    def total(self) -> int:
        return sum(self.groups.values())

    @property
    def added(self) -> int:
        return sum(self.groups[g] for g in ADDED_GROUPS)

    @property
    def added_pct(self) -> float:
        return 100.0 * self.added / self.base

    def to_dict(self) -> dict:
        return {"dP": self.dim, "total": self.total, "base": self.base, "added": self.added,
                "added_pct_of_base": round(self.added_pct, 4),
                "ple_table": self.groups["ple_table"],
                "ple_model_projection": self.groups["ple_model_projection"],
                "ple_per_layer": self.groups["ple_per_layer"], "aux_kind": self.aux,
                "aux_table": self.groups["aux_table"], "aux_other": self.groups["aux_other"],
                "matmul_params": self.matmul, "train_flops_per_token": self.flops_per_token,
                "seq_len": self.seq_len, "groups": dict(self.groups)}


def account(mc: ModelConfig, pc: PLEConfig, seq_len: int, ac: AuxConfig | None = None) -> Accounting:
    """Count on a meta-device model and cross-check every number against the closed form."""
    model = build_model(mc, pc, device="meta", ac=ac)
    groups = counts_from_model(model)
    formula = closed_form_counts(mc, pc, ac)
    if groups != formula:
        raise AssertionError(f"parameter count mismatch: model {groups} vs closed form {formula}")
    matmul = matmul_params_from_model(model)
    if matmul != matmul_params(mc, pc, ac):
        raise AssertionError(f"matmul count mismatch: model {matmul} vs closed form {matmul_params(mc, pc, ac)}")
    base = sum(v for g, v in groups.items() if g not in ADDED_GROUPS)
    return Accounting(dim=pc.dim, groups=groups, base=base, matmul=matmul,
                      flops_per_token=flops_per_token(mc, pc, seq_len, ac), seq_len=seq_len,
                      aux=ac.kind if ac is not None else "ple")
