"""plelab versus HF transformers ``Gemma4ForCausalLM``: training tokens/s at equal shape and dP, one process.

Both models get the same dimensions (vocab, hidden, layers, heads, KV heads, head_dim — full attention in
every layer, ``global_head_dim`` = ``head_dim``, default RoPE, tied embeddings, per-layer inputs of width dP
over the full vocabulary), the same batch, and the same training step: forward with labels, backward,
gradient clipping at 1.0, ``torch.optim.AdamW(foreach=False)``, ``zero_grad``. HF Gemma 4 keeps its own
extras (q/k/v norms, layer scalars, GeGLU instead of SwiGLU: the same three matmuls). Arms alternate in
rotated order for ``--repeats`` repeats of ``--block`` steps; denormals are flushed for both.

    python bench/hf_gemma4.py --preset cpu-small --dp 64 --repeats 10 --block 4 --hf-defaults
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
from common import block_medians, fmt_ci, machine

from plelab.config import resolve_config
from plelab.model import build_model
from plelab.runtime import setup_torch


def hf_model(cfg, equal: bool = True):
    """HF Gemma 4 of the config's shape; ``equal=False`` keeps Gemma4TextConfig's own full-attention geometry
    (``global_head_dim`` 512, proportional RoPE): what these dimensions give with HF's defaults."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    m, L = cfg.model, cfg.model.num_hidden_layers
    rope = {"rope_type": "default", "rope_theta": m.rope_theta}
    same = {"global_head_dim": m.resolved_head_dim,
            "rope_parameters": {"full_attention": rope, "sliding_attention": rope}} if equal else {}
    hf_cfg = Gemma4TextConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=L, num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
        head_dim=m.resolved_head_dim, layer_types=["full_attention"] * L,
        hidden_size_per_layer_input=cfg.ple.dim, vocab_size_per_layer_input=cfg.ple.resolved_vocab_size(m),
        max_position_embeddings=cfg.train.seq_len, tie_word_embeddings=True, use_cache=False, **same)
    hf_cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Gemma4ForCausalLM(hf_cfg).train()


def step_fn(model, x, y, hf: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=False)

    def step():
        # HF shifts labels; plelab's targets are shifted, and its loss runs as the trainer's (the head in chunks)
        out = model(input_ids=x, labels=x) if hf else model(x, targets=y, return_logits=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(out.loss.detach())
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--hf-defaults", action="store_true",
                    help="also time HF with Gemma4TextConfig's default full-attention geometry (global_head_dim 512)")
    args = ap.parse_args()
    setup_torch(0)
    cfg = resolve_config(args.preset, args.overrides, dp=args.dp)
    B, T, V = cfg.train.batch_size, cfg.train.seq_len, cfg.model.vocab_size
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, V, (B, T + 1), generator=gen)
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
    ours = build_model(cfg.model, cfg.ple, seed=0).train()
    models = {"plelab": ours, "hf": hf_model(cfg)}
    if args.hf_defaults:
        models["hf-defaults"] = hf_model(cfg, equal=False)
    arms = {k: step_fn(mod, x, y, k != "plelab") for k, mod in models.items()}
    n_params = {k: sum(p.numel() for p in mod.parameters()) for k, mod in models.items()}
    times = block_medians(arms, args.repeats, args.block, args.warmup)
    tokens = B * T
    m = cfg.model
    print(f"{args.preset} shape: V={V} H={m.hidden_size} L={m.num_hidden_layers} heads={m.num_attention_heads}/"
          f"{m.num_key_value_heads} head_dim={m.resolved_head_dim} FFN={m.intermediate_size} dP={args.dp}; "
          f"B={B} T={T}; {machine()}")
    print("parameters: " + ", ".join(f"{k} {n:,}" for k, n in n_params.items()))
    print(f"{args.repeats} repeats × {args.block} steps, rotated order")
    for name in arms:
        med = statistics.median(times[name])
        print(f"{name}: median step {med * 1e3:.1f} ms, {tokens / med:,.0f} tokens/s")
    for k in list(arms)[1:]:
        ratio = [h / p for p, h in zip(times["plelab"], times[k])]
        print(f"plelab tokens/s ÷ {k} tokens/s (per repeat, paired): {fmt_ci(ratio, 1, 3)}× (target ≥ 1.3×)")


if __name__ == "__main__":
    main()
