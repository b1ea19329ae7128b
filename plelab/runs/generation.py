"""``plelab generate``: text from a trained run, with a KV cache and the per-layer table memory-mapped.

    text = plelab.generate_text("runs/my-run", "Once upon a time", max_new_tokens=40, temperature=0.8, top_k=50)

The run's ``tokenizer.json`` (every text run folder holds it) encodes the prompt and decodes the continuation;
the model is loaded by :func:`plelab.training.loading.load_for_eval` (table mapped from ``model.safetensors``) and
sampled by :func:`plelab.model.generate.generate`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from plelab.data.tokenizer import EOS, load_tokenizer
from plelab.errors import PlelabError
from plelab.integrations.hf import refuse_attached
from plelab.model.generate import check_sampling, generate
from plelab.runtime import check_seed, resolve_device
from plelab.training.loading import checkpoint_of, load_for_eval, run_tokenizer_file


def generate_text(run: str | Path, prompt: str, max_new_tokens: int = 64, *, temperature: float = 0.8,
                  top_k: int | None = 50, seed: int = 0, device: str = "cpu", stop_at_eos: bool = True) -> str:
    """The continuation of ``prompt`` by the run's latest checkpoint (or the checkpoint folder given)."""
    try:
        check_sampling(max_new_tokens, temperature, top_k)
    except ValueError as err:
        raise PlelabError(f"{err} (plelab generate: --max-new-tokens, --temperature, --top-k)") from None
    check_seed(seed)
    device = resolve_device(str(device))  # an unknown name is one line here, not a traceback from torch
    refuse_attached(run, "plelab generate")
    ckpt = checkpoint_of(run)
    tokenizer = load_tokenizer(run_tokenizer_file(ckpt))
    model, cfg = load_for_eval(ckpt, device=device)
    if cfg.ple.enabled and cfg.ple.ids != "token":
        raise PlelabError(f"{ckpt} is a null-control run (ple.ids={cfg.ple.ids}): its table is keyed by random draws; "
                          "generate from a run with ple.ids=token")
    if tokenizer.get_vocab_size() > cfg.model.vocab_size:
        raise PlelabError(f"{ckpt}'s tokenizer.json has {tokenizer.get_vocab_size()} entries, the model "
                          f"{cfg.model.vocab_size}: it is not this run's tokenizer")
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise PlelabError("the prompt encodes to no tokens; give some text with --prompt")
    eos = tokenizer.token_to_id(EOS) if stop_at_eos else None
    new = generate(model, torch.tensor([ids], device=model.model.embed_tokens.weight.device), max_new_tokens,
                   temperature=temperature, top_k=top_k, seed=seed, eos_token_id=eos)[0].tolist()
    if eos is not None and eos in new:
        new = new[:new.index(eos)]
    return tokenizer.decode(new)
