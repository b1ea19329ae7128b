"""Process set-up shared by every entry point: CPU hygiene, threads, seeding, device choice; name-seeded
generators and epoch orders (every random draw plelab makes is a function of a seed and a name)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import sys

import numpy as np
import torch

from plelab.errors import ConfigError


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# glibc's mallopt parameters (malloc.h) and the values set_heap_allocator gives them.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
HEAP_MMAP_THRESHOLD = 256 << 20
HEAP_TRIM_THRESHOLD = 1 << 30
ALLOCATOR_ENV = "PLELAB_MALLOC"
_allocator: str | None = None


def set_heap_allocator() -> str:
    """Keep the memory of freed tensors for the next step instead of returning it to the OS.

    glibc serves every allocation above a (dynamic, at most 32 MiB) threshold with a fresh ``mmap`` and unmaps it
    on free, so a training step's large temporaries (the ``[B·T, V]`` logits and their gradient, the MLP's
    activations) are page-faulted in anew every step: measured here, a new zeroed ``[2048, 4096]`` fp32 tensor
    costs 16.6 ms against 1.4 ms to refill an existing one, and whole cpu-sweep steps run ≈ 1.3× faster with
    allocations up to ``HEAP_MMAP_THRESHOLD`` served from the heap and up to ``HEAP_TRIM_THRESHOLD`` of freed memory
    kept there (BENCHMARKS.md, "Allocator"). Numerics are unchanged. Process-wide and idempotent; returns what it
    did, which runs record. ``PLELAB_MALLOC=system`` leaves the allocator alone (e.g. under a preloaded jemalloc).
    """
    global _allocator
    if _allocator is None:
        _allocator = _configure_allocator()
    return _allocator


def allocator() -> str:
    """What :func:`set_heap_allocator` did in this process (runs record it)."""
    return _allocator or "system (set_heap_allocator not called)"


def _configure_allocator() -> str:
    choice = os.environ.get(ALLOCATOR_ENV, "heap")
    if choice not in ("heap", "system"):
        raise ConfigError(f"{ALLOCATOR_ENV}={choice!r} is not a choice: use heap (the default) or system")
    if choice == "system":
        return f"system ({ALLOCATOR_ENV}=system)"
    if not sys.platform.startswith("linux"):
        return "system (not Linux)"
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p  # absent from musl and other C libraries
        version = libc.gnu_get_libc_version().decode()
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return "system (not glibc)"
    ok = libc.mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD)
    if not ok:
        return f"system (glibc {version} refused mallopt)"
    return (f"glibc {version} heap (mmap above {HEAP_MMAP_THRESHOLD >> 20} MiB, "
            f"trim above {HEAP_TRIM_THRESHOLD >> 20} MiB)")


def setup_torch(threads: int = 0) -> None:
    """Flush denormals (measured here: denormals in the LM-head backward make CPU matmuls ~80x
    slower), keep freed memory in the heap (:func:`set_heap_allocator`) and use ``threads`` intra-op threads
    (0 = every core this process may use)."""
    torch.set_flush_denormal(True)
    set_heap_allocator()
    if threads <= 0:
        threads = available_cores()
    torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda if available else cpu; an explicit cuda request without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"invalid config value train.device={name!r}: no CUDA device here; use cpu or auto")
    return torch.device(name)


def uses_bf16(precision: str, device: torch.device) -> bool:
    """``train.precision`` resolved on ``device``: bf16 autocast when asked, or ``auto`` on CUDA (bf16 matmuls
    are slower than fp32 on CPUs)."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def param_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for ``(seed, name)`` (independent of Python's hash randomisation)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seeded_generator(seed: int, name: str, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded by :func:`param_seed` of ``(seed, name)``."""
    return torch.Generator(device=device).manual_seed(param_seed(seed, name))


class EpochOrder:
    """A fresh permutation of ``n`` items for every epoch, ``randperm(n)`` from the generator of
    ``(seed, tag(epoch))``; the ``keep`` most recent epochs are cached."""

    def __init__(self, n: int, seed: int, tag, keep: int = 1) -> None:
        self.n, self.seed, self.tag, self.keep = n, seed, tag, keep
        self._cache: dict[int, torch.Tensor] = {}

    def __call__(self, epoch: int) -> torch.Tensor:
        if epoch not in self._cache:
            if len(self._cache) >= self.keep:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = torch.randperm(self.n, generator=seeded_generator(self.seed, self.tag(epoch)))
        return self._cache[epoch]
