"""Mixtures of sources: ``--data a/:0.7 --data b/:0.3`` parsed, and sampled deterministically by weight.

Every optimizer step's global batch of ``G`` sequences is a run of *slots* ``[k·G, (k+1)·G)`` of one
endless schedule. The schedule repeats a pattern of ``PERIOD`` slots in which source ``s`` holds
``q_s`` slots (``q`` the largest-remainder rounding of ``PERIOD · w``), spread evenly by smooth weighted
round-robin. The ``j``-th slot of source ``s`` takes the ``j``-th sequence of that source's own
:class:`~plelab.data.tokens.PackedSampler` (its own epoch order, tagged by the source's index). A slot's
source and sequence are therefore functions of the slot number alone: resume, paired arms and torchrun
rank slices behave exactly as with one source. The realised weights are ``q_s / PERIOD``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from plelab.data.tokens import PackedSampler, TokenData
from plelab.errors import ConfigError

PERIOD = 1000  # slots per pattern: weights are realised to 0.001


def parse_mixture(entries: list[str]) -> list[tuple[str, float]]:
    """``["a/:0.7", "b/:0.3"]`` -> ``[("a/", 0.7), ("b/", 0.3)]`` normalised to sum 1; one-line errors otherwise."""
    out = []
    for entry in entries:
        path, sep, weight = str(entry).rpartition(":")
        try:
            w = float(weight) if sep else math.nan
        except ValueError:
            w = math.nan
        if not sep or not path or not math.isfinite(w) or w <= 0:
            raise ConfigError(f"invalid mixture source {entry!r}: give PATH:WEIGHT with a weight > 0, "
                              "e.g. --data web/:0.7 --data code/:0.3")
        out.append((path, w))
    if len(out) < 2:
        raise ConfigError("a mixture needs at least two sources (PATH:WEIGHT each); for one source give --data PATH")
    if len({p for p, _ in out}) != len(out):
        raise ConfigError(f"a mixture names a source twice ({', '.join(p for p, _ in out)}); give each path once")
    total = sum(w for _, w in out)
    if not math.isfinite(total):
        raise ConfigError(f"mixture weights {', '.join(f'{w:g}' for _, w in out)} sum to {total:g}; they are "
                          "relative: scale them down (e.g. 0.7 and 0.3)")
    if len(out) > PERIOD:
        raise ConfigError(f"a mixture of {len(out):,} sources: a batch pattern has {PERIOD} slots, one per source at "
                          f"least; merge sources into at most {PERIOD} folders")
    small = [(p, w / total) for p, w in out if w / total < 1 / PERIOD]
    if small:
        raise ConfigError(f"mixture source {small[0][0]} has weight {small[0][1]:.2g} of the mix; weights are realised "
                          f"in steps of {1 / PERIOD:g} (a batch pattern of {PERIOD} slots): give every source at least "
                          f"{1 / PERIOD:g}, or leave it out")
    return [(p, w / total) for p, w in out]


def quotas(weights: list[float], period: int = PERIOD) -> list[int]:
    """Largest-remainder rounding of ``period · w``; every source keeps at least one slot."""
    raw = [w * period for w in weights]
    q = [max(1, math.floor(r)) for r in raw]
    order = sorted(range(len(q)), key=lambda i: raw[i] - math.floor(raw[i]), reverse=True)
    i = 0
    while sum(q) < period:
        q[order[i % len(q)]] += 1
        i += 1
    while sum(q) > period:
        j = max(range(len(q)), key=lambda k: q[k])
        q[j] -= 1
    return q


def pattern(q: list[int]) -> np.ndarray:
    """Smooth weighted round-robin over ``sum(q)`` slots: source ``s`` appears ``q[s]`` times, evenly spread."""
    current, total, out = [0] * len(q), sum(q), []
    for _ in range(total):
        current = [c + w for c, w in zip(current, q)]
        s = max(range(len(q)), key=lambda k: current[k])
        current[s] -= total
        out.append(s)
    return np.asarray(out, dtype=np.int64)


class MixtureSampler:
    """Step-addressed batches drawn from several train streams by weight (see the module docstring)."""

    def __init__(self, streams: list, weights: list[float], seq_len: int, seed: int) -> None:
        self.samplers = [PackedSampler(s, seq_len, seed, tag=f"mix{i}:epoch") for i, s in enumerate(streams)]
        self.quotas = quotas(weights)
        self.pattern = pattern(self.quotas)
        self.rank = np.zeros(len(self.pattern), dtype=np.int64)  # slot's position among its source's slots
        seen = [0] * len(self.quotas)
        for i, s in enumerate(self.pattern.tolist()):
            self.rank[i], seen[s] = seen[s], seen[s] + 1
        self.seq_len = seq_len
        self.num_sequences = sum(s.num_sequences for s in self.samplers)

    @property
    def weights(self) -> list[float]:
        return [q / len(self.pattern) for q in self.quotas]

    def slots(self, step: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, position in that source's sequence order)`` of each slot of step ``step``."""
        pos = np.arange(step * global_batch, (step + 1) * global_batch)
        cycle, within = np.divmod(pos, len(self.pattern))
        src = self.pattern[within]
        return src, cycle * np.asarray(self.quotas)[src] + self.rank[within]

    def batch(self, step: int, global_batch: int, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` ``[b, T]`` int64 for ``rows`` of step ``step``'s global batch."""
        src, order = self.slots(step, global_batch)
        t = torch.from_numpy(np.stack([self.samplers[s].sequence(j)
                                       for s, j in zip(src[rows].tolist(), order[rows].tolist())]))
        return t[:, :-1], t[:, 1:]

    def epochs(self, steps_done: int, global_batch: int) -> float:
        """Epochs of the most-repeated source."""
        slots = steps_done * global_batch
        return max(slots * q / len(self.pattern) / s.num_sequences for q, s in zip(self.quotas, self.samplers))


def train_sampler(data: TokenData, seq_len: int, seed: int):
    """The data's training sampler: one source's :class:`PackedSampler`, or a :class:`MixtureSampler`."""
    if data.mixture:
        return MixtureSampler([s for _, s, _ in data.mixture], [w for _, _, w in data.mixture], seq_len, seed)
    return PackedSampler(data.train, seq_len, seed)


__all__ = ["MixtureSampler", "PERIOD", "parse_mixture", "train_sampler"]
