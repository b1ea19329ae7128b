"""Process set-up shared by every entry point: CPU hygiene, threads, seeding, device choice; name-seeded
generators and epoch orders (every random draw plelab makes is a function of a seed and a name)."""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np
import torch

from plelab.errors import ConfigError


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def setup_torch(threads: int = 0) -> None:
    """Flush denormals (measured here: denormals in the LM-head backward make CPU matmuls ~80x
    slower) and use ``threads`` intra-op threads (0 = every core this process may use)."""
    torch.set_flush_denormal(True)
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
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"invalid device {name!r}: allowed auto | cpu | cuda | cuda:N | mps") from None


SEED_LIMIT = 2 ** 63  # seeds plelab takes: 0 to 2**63 - 1 (a torch generator's manual_seed overflows past 2**64)


def check_seed(seed: object, what: str = "--seed", headroom: int = 0) -> int:
    """``seed`` if it is an integer a torch generator takes, with ``headroom`` to spare for the offsets added to it
    (a held-out split's seed); else a one-line :class:`ConfigError` (a 31-digit seed was an overflow traceback)."""
    top = SEED_LIMIT - 1 - headroom
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= top:
        raise ConfigError(f"{what} {seed!r} is not an integer from 0 to {top:,} (a torch generator seed); give a "
                          "seed in that range")
    return seed


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
