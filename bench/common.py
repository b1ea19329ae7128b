"""Shared helpers for the benchmarks: the measured matmul peak, interleaved timing, intervals.

Every benchmark runs its arms alternately (A, B, A, B, ... with the order rotated each repeat) in one
process, so that machine drift hits all arms alike, and reports medians and per-repeat ratios with a
95% t-interval over repeats.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
from scipy import stats

from plelab.precision import cpu_model

# What a timed trainer leaves out: checkpoints, evaluation and live diagnostics (only training steps are timed).
TIMING_ONLY = ["train.checkpoint_every=0", "train.eval_every=1000000", "train.diag_every=0"]


def matmul_peak(n: int = 4096, reps: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Measured FLOP/s of an ``n×n @ n×n`` GEMM on this device (median of ``reps``, after one warm-up)."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times)


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and the two-sided t-interval over repeats: ``(mean, low, high)``."""
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return m, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return m, m - half, m + half


def fmt_ci(values: list[float], scale: float = 1.0, digits: int = 3, unit: str = "") -> str:
    m, lo, hi = mean_ci(values)
    return f"{m * scale:.{digits}f}{unit} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]"


def rotated(items: list, repeat: int) -> list:
    """``items`` rotated by ``repeat`` (so that each arm is first as often as the others)."""
    k = repeat % len(items)
    return items[k:] + items[:k]


def block_medians(arms: dict, repeats: int, block: int, warmup: int = 0, before_repeat=None) -> dict[str, list[float]]:
    """Per arm, per repeat: the median wall time of ``block`` calls of ``arms[name]()``, the arms in rotated order
    in every repeat, after ``warmup`` untimed calls of each; ``before_repeat()`` runs at the start of each repeat."""
    for fn in arms.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(repeats):
        if before_repeat is not None:
            before_repeat()
        for k in rotated(list(arms), r):
            calls = []
            for _ in range(block):
                t0 = time.perf_counter()
                arms[k]()
                calls.append(time.perf_counter() - t0)
            times[k].append(statistics.median(calls))
    return times


def machine() -> str:
    import os
    import platform

    return (f"{os.cpu_count()} CPUs ({cpu_model()}), torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, Python {platform.python_version()}")
