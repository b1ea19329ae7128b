"""Sampling text from a causal LM with a KV cache: :class:`KVCache` and :func:`generate`.

The prompt runs through the model once (prefill) and fills the cache; every further step feeds only the newest
token, its keys and values appended to the cache. Each step's next token is drawn from
``softmax(logits[-1] / temperature)`` restricted to the ``top_k`` largest logits; ``temperature=0`` takes the
argmax. The draws come from one ``torch.Generator`` seeded with ``seed``, so a seed gives the same text on CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class KVCache:
    """Keys and values of the positions seen so far, per layer: ``k, v [B, n_kv, T_seen, head_dim]``.

    The interface is the part of HF's ``Cache`` that :class:`~plelab.model.layers.Attention` uses
    (``update``, ``get_seq_length``), so transformers' ``DynamicCache`` works in its place.
    """

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        # the last n-1 tokens seen, for a hashed n-gram table's next positions (set by the model that has one)
        self.ngram_tokens: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's ``k, v`` for ``layer_idx``; return every position's."""
        if layer_idx == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.keys[layer_idx].shape[2] if layer_idx < len(self.keys) else 0


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
               generator: torch.Generator) -> torch.Tensor:
    """One draw per row of ``logits [B, V]`` -> ``[B]`` (argmax when ``temperature == 0``)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(logits.device)


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None) -> None:
    """``ValueError`` for settings :func:`generate` cannot honour."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 (or None: no top-k cut), got {top_k}")


@torch.no_grad()
def generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int = 0, eos_token_id: int | None = None) -> torch.Tensor:
    """Continue ``input_ids [B, T]`` by up to ``max_new_tokens`` tokens; returns the new tokens ``[B, ≤ max_new]``.

    ``model`` is a :class:`~plelab.model.transformer.PLECausalLM` (or anything taking ``past_key_values`` and
    returning ``.logits``). Generation stops early once every row has produced ``eos_token_id``; rows that
    finished keep producing ``eos_token_id``.
    """
    check_sampling(max_new_tokens, temperature, top_k)
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [B, T] with T >= 1, got shape {list(input_ids.shape)}")
    was = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    cache = KVCache()
    step_input, out = input_ids, []
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for _ in range(max_new_tokens):
        logits = model(step_input, past_key_values=cache).logits[:, -1]
        token = next_token(logits, temperature, top_k, generator)
        if eos_token_id is not None:
            token = torch.where(done, torch.full_like(token, eos_token_id), token)
            done |= token == eos_token_id
        out.append(token)
        if eos_token_id is not None and bool(done.all()):
            break
        step_input = token[:, None]
    model.train(was)
    return torch.stack(out, dim=1)
