"""A size budget checked before anything is allocated: a run whose parameters (with their training state) and
per-layer inputs cannot fit in the memory that would hold them is refused in one line, with the bytes it needs and
a way forward — instead of an allocator's traceback (or, for a huge vocabulary, the BPE trainer aborting the
process) minutes later.

The estimate counts what scales with the configuration's large numbers: the per-layer table (Vp × L × dP), its
model-level projection (H × L·dP), the embeddings (V × H, twice when untied), each at 16 bytes a trained parameter
(fp32 weight, gradient and AdamW's two moments; 4 for a frozen or zero table), and one micro-batch's per-layer
inputs ``[B, T, L, dP]`` in fp32, forward and gradient. The trunk's blocks are left out, so the estimate is a lower
bound: a run refused here cannot fit; one let through may still not.

Memory: the host's physical memory (``os.sysconf``), lowered by a cgroup limit or ``RLIMIT_AS`` where one is set;
on CUDA the device's memory (times the world size under FSDP) for what lives there.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Callable
from pathlib import Path

import torch

from plelab.config.schema import RunConfig
from plelab.errors import ConfigError
from plelab.runtime import resolve_device

TRAINED_BYTES = 16  # a trained fp32 parameter: weight, gradient, AdamW's exp_avg and exp_avg_sq
FROZEN_BYTES = 4
ACTIVATION_COPIES = 2  # the per-layer inputs of one micro-batch and their gradient
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def gigabytes(n: float) -> str:
    """``n`` bytes as GB (10^9), e.g. ``"25.6 GB"``; very large numbers in scientific notation."""
    return f"{n / 1e9:,.1f} GB" if n < 1e15 else f"{n / 1e9:.2e} GB"


def host_memory() -> tuple[int, str]:
    """``(bytes, what)``: the memory this process may use on the host — physical memory, or a smaller cgroup limit
    or address-space limit (``ulimit -v``)."""
    found = [(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory")]
    for name in CGROUP_LIMITS:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            found.append((int(text), f"the cgroup limit ({name})"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
        found.append((int(soft), "the address-space limit (ulimit -v)"))
    return min(found)


def device_memory(cfg: RunConfig) -> tuple[int, str] | None:
    """``(bytes, what)`` of the accelerator a run's trunk would live on (times the world size under FSDP), or
    None when it trains on the host."""
    device = resolve_device(cfg.train.device)
    if device.type != "cuda":
        return None
    world = int(os.environ.get("WORLD_SIZE", "1")) if cfg.train.parallel == "fsdp" else 1
    total = torch.cuda.get_device_properties(device.index or 0).total_memory * world
    return total, f"the memory of {world} GPU(s)" if world > 1 else "the GPU's memory"


def run_parts(cfg: RunConfig) -> dict[str, int]:
    """The estimated bytes of a run's large parts (see the module docstring), by name."""
    mc, pc, tc = cfg.model, cfg.ple, cfg.train
    H, L, V = mc.hidden_size, mc.num_hidden_layers, mc.vocab_size
    parts = {"embeddings": V * H * (1 if mc.tie_word_embeddings else 2) * TRAINED_BYTES}
    if pc.enabled:
        dP, Vp = pc.dim, pc.resolved_vocab_size(mc)
        parts["per-layer table"] = Vp * L * dP * (TRAINED_BYTES if pc.table == "learned" else FROZEN_BYTES)
        parts["table projection"] = H * L * dP * TRAINED_BYTES
        micro = max(1, tc.batch_size // tc.grad_accum)
        parts["per-layer inputs"] = micro * tc.seq_len * L * dP * 4 * ACTIVATION_COPIES
    return parts


def _way_forward(cfg: RunConfig, parts: dict[str, int], need: int, limit: int) -> str:
    """What to change: the largest part's knob, with the largest value that would fit."""
    largest = max(parts, key=parts.get)
    rest = need - parts[largest]
    if largest == "embeddings":
        fits = max(0, (limit - rest) * cfg.model.vocab_size // max(1, parts[largest]))
        return f"lower model.vocab_size (≤ {fits:,} would fit)" if fits >= 2 else "lower model.vocab_size"
    scaled = sum(v for k, v in parts.items() if k != "embeddings")  # linear in dP
    fits = max(0, (limit - parts["embeddings"]) * cfg.ple.dim // max(1, scaled))
    knob = f"lower ple.dim (≤ {fits:,} would fit)" if fits >= 1 else "lower ple.dim"
    if largest == "per-layer table":
        knob += " or ple.vocab_size"
    return knob


def check_run_budget(cfg: RunConfig, memory: tuple[int, str] | None = None) -> None:
    """Refuse, before anything is allocated, a run of ``cfg`` whose large parts (:func:`run_parts`) exceed the
    memory that would hold them (``memory``: ``(bytes, what)``, default :func:`host_memory`, or the GPU's for the
    parts on a GPU)."""
    parts = run_parts(cfg)
    gpu = device_memory(cfg) if memory is None else None
    on_host = {k: v for k, v in parts.items() if gpu is None or (k == "per-layer table"
                                                                 and cfg.train.table_device == "cpu")}
    places = [(on_host, memory or host_memory())]
    if gpu is not None:
        places.append(({k: v for k, v in parts.items() if k not in on_host}, gpu))
    for held, (limit, what) in places:
        need = sum(held.values())
        if held and need > limit:
            shown = ", ".join(f"{k} {gigabytes(v)}" for k, v in sorted(held.items(), key=lambda kv: -kv[1]) if v)
            raise ConfigError(f"this run needs at least {gigabytes(need)} ({need:,} bytes: {shown}; weights, "
                              f"gradients and AdamW state at {TRAINED_BYTES} bytes a parameter), more than "
                              f"{what} holds ({gigabytes(limit)}); {_way_forward(cfg, held, need, limit)}, or train "
                              "on a machine with more memory")


def check_tokenizer_vocab(cfg: RunConfig, trains_bpe: Callable[[], bool]) -> None:
    """Refuse a ``model.vocab_size`` that a byte-level BPE trained on at most ``data.tokenizer_sample_chars``
    characters cannot reach (256 bytes, the end-of-text token and one merge per sampled character at most) when the
    run trains its BPE (``trains_bpe()``, asked only then) — the trainer would try to reserve it and abort."""
    reachable = 256 + 1 + cfg.data.tokenizer_sample_chars
    if cfg.model.vocab_size > reachable and trains_bpe():
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size:,} cannot be reached by a BPE trained on at most "
                          f"data.tokenizer_sample_chars={cfg.data.tokenizer_sample_chars:,} characters (≤ "
                          f"{reachable:,} entries); lower model.vocab_size, or give --tokenizer with a vocabulary "
                          "that size")


def check_bytes(what: str, need: int, fix: str, memory: tuple[int, str] | None = None) -> None:
    """Refuse, before allocating, ``need`` bytes for ``what`` when more than the host's memory
    (:func:`host_memory`); ``fix`` is the way forward named in the message."""
    limit, where = memory or host_memory()
    if not math.isfinite(need) or need > limit:
        raise ConfigError(f"{what} needs {gigabytes(need)} ({need:,} bytes), more than {where} holds "
                          f"({gigabytes(limit)}); {fix}")
