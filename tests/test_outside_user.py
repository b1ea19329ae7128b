"""An outside user's model: their own ~30-line decoder with PLE from ``plelab.PerLayerEmbedding`` and
``plelab.PerLayerInjection`` (nothing else from plelab inside the model). On plelab's weights it computes what
plelab's ``DecoderLayer`` stack computes, and it trains."""

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

import plelab


class ToyBlock(nn.Module):
    def __init__(self, H: int, heads: int, inter: int, dP: int, gate: str) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(H, eps=1e-6), nn.RMSNorm(H, eps=1e-6)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(H, H, bias=False) for _ in range(4))
        self.gate_proj, self.up_proj = nn.Linear(H, inter, bias=False), nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)
        self.ple = plelab.PerLayerInjection(H, dP, gate)

    def attend(self, x, cos, sin):
        B, T, H = x.shape
        q, k, v = (p(x).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        rot = lambda t: t * cos + torch.cat((-t[..., t.shape[-1] // 2:], t[..., :t.shape[-1] // 2]), -1) * sin  # noqa: E731
        y = F.scaled_dot_product_attention(rot(q), rot(k), v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H))

    def forward(self, h, cos, sin, p):
        h = h + self.attend(self.input_layernorm(h), cos, sin)
        x = self.post_attention_layernorm(h)
        h = h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return h + self.ple(h, p)  # the PLE branch, a third residual update


class ToyDecoder(nn.Module):
    def __init__(self, V: int, H: int, L: int, heads: int, inter: int, dP: int, gate: str = "gemma") -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H)
        self.ple = plelab.PerLayerEmbedding(V, H, L, dP)
        self.blocks = nn.ModuleList(ToyBlock(H, heads, inter, dP, gate) for _ in range(L))
        self.norm = nn.RMSNorm(H, eps=1e-6)

    def forward(self, ids):
        e = self.embed_tokens(ids) * math.sqrt(self.embed_tokens.embedding_dim)
        P = self.ple(e, ids)  # [B,T,L,dP]
        hd = e.shape[-1] // self.blocks[0].heads
        freqs = torch.outer(torch.arange(ids.shape[1]).float(), 1e4 ** (-torch.arange(0, hd, 2).float() / hd))
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
        h = e
        for i, block in enumerate(self.blocks):
            h = block(h, cos, sin, P[:, :, i])
        return F.linear(self.norm(h), self.embed_tokens.weight)  # tied head


def _plelab_model(gate: str):
    cfg = plelab.resolve_config("cpu-tiny", overrides=["model.num_key_value_heads=4"], dp=8, gate=gate)
    return cfg, plelab.build_model(cfg.model, cfg.ple, seed=3)


NESTED = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def plelab_name(key: str) -> str:
    """The toy's parameter name -> plelab's (HF's): the PLE modules' names are HF's already."""
    parts = re.sub(r"(^|\.)ple\.", r"\1", key.replace("blocks.", "layers.")).split(".")
    if len(parts) == 4 and parts[2] in NESTED:  # plelab nests attention and MLP; the toy keeps them flat
        parts.insert(2, NESTED[parts[2]])
    return "model." + ".".join(parts)


def _toy_from(cfg, lm, gate: str) -> ToyDecoder:
    m = cfg.model
    toy = ToyDecoder(m.vocab_size, m.hidden_size, m.num_hidden_layers, m.num_attention_heads,
                     m.intermediate_size, cfg.ple.dim, gate)
    theirs = lm.state_dict()
    toy.load_state_dict({key: theirs[plelab_name(key)] for key in toy.state_dict()})
    return toy


def test_public_ple_modules_reproduce_plelab_and_train():
    for gate in ("gemma", "scalar", "none"):
        cfg, lm = _plelab_model(gate)
        toy = _toy_from(cfg, lm, gate)
        ids = torch.randint(0, cfg.model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ours, theirs = toy(ids), lm(ids).logits
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (gate, (ours - theirs).abs().max())

    # their loop, their loss: a repeating sequence is learned quickly
    torch.manual_seed(0)
    toy = ToyDecoder(64, 32, 2, 4, 64, 8)
    opt = torch.optim.AdamW(toy.parameters(), lr=3e-3)
    data = torch.arange(64).repeat(2)[None, :65].repeat(4, 1)
    losses = []
    for _ in range(40):
        logits = toy(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 64), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    # the table learned: its gradient reached it through the per-layer path
    assert toy.ple.embed_tokens_per_layer.weight.grad is not None


def test_standalone_modules_hold_hf_names_and_can_be_hooked():
    emb = plelab.PerLayerEmbedding(50, 16, 3, 4)
    inj = plelab.PerLayerInjection(16, 4, "vector", gate_init=0.5)
    assert set(emb.state_dict()) == {"embed_tokens_per_layer.weight", "per_layer_model_projection.weight",
                                     "per_layer_projection_norm.weight"}
    assert set(inj.state_dict()) == {"per_layer_projection.weight", "per_layer_gate"}
    assert torch.all(inj.per_layer_gate == 0.5)
    seen = {}

    def record(key):
        def hook(module, args, out) -> None:
            seen[key] = tuple(out.shape)
        return hook
    emb.register_forward_hook(record("P"))
    inj.register_forward_hook(record("branch"))
    ids = torch.randint(0, 50, (2, 5))
    P = emb(torch.randn(2, 5, 16), ids)
    inj(torch.randn(2, 5, 16), P[:, :, 1])
    assert seen == {"P": (2, 5, 3, 4), "branch": (2, 5, 16)}
