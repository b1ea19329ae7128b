"""Which precision a run trains in: ``train.precision`` (``auto`` | ``fp32`` | ``bf16``) resolved once per run.

``bf16`` means autocast with fp32 master weights and optimizer state; on CPU attention stays fp32 (bf16 SDPA on
CPU was measured ≈ 2.2× slower than fp32). ``auto`` resolves:

- on CUDA: bf16;
- on CPU: bf16 only where the CPU has bf16 matrix instructions (``amx_bf16`` or ``avx512_bf16`` in its flags)
  *and* a timed probe of the model's own GEMMs at the run's thread count finds bf16 at least ``BF16_MARGIN``
  faster than fp32; fp32 otherwise. The flags decide whether to probe, the probe only confirms (timings on these
  machines vary by ±10–70%, so a probe alone never picks bf16, and ties go to fp32).

The probe's verdict is kept per machine (``$PLELAB_CACHE/precision/``, keyed by CPU model and flags, thread count,
torch version and GEMM list): a timed probe that lands near the margin would otherwise pick bf16 in one fresh
process and fp32 in the next, and the same seed would give two loss curves on one machine (seen on an AMX Xeon
at cpu-tiny: 6.2532797 or 6.2533469 for the first loss). Delete that folder to probe again.

A run records the resolution in ``config.json`` (``train.precision`` holds the resolved value) and in
``summary.json`` (``precision``: requested, resolved, why); a resumed run keeps its recorded precision and never
probes again. Studies resolve once for all their arms (:func:`study_precision`); a sweep's later arms keep what
its started runs recorded.
"""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from plelab.io import cache_dir, write_json

BF16_FLAGS = ("amx_bf16", "avx512_bf16")
BF16_MARGIN = 1.25  # the probe's bf16 GEMM time must be ≤ fp32's / 1.25: the margin pays for casts and noise
PROBE_REPEATS = 3


@dataclass(frozen=True)
class PrecisionChoice:
    """A resolved ``train.precision``: what was asked, what runs, and why."""

    requested: str
    resolved: str  # "fp32" | "bf16"
    reason: str

    @property
    def bf16(self) -> bool:
        return self.resolved == "bf16"

    def to_dict(self) -> dict:
        return asdict(self)


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags from ``/proc/cpuinfo`` (Linux; elsewhere the platform's word, no flags)."""
    import platform  # only for the fallback name

    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.processor() or platform.machine(), frozenset()
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return name, frozenset(flags)


def cpu_bf16_flags() -> tuple[str, ...]:
    """Which of :data:`BF16_FLAGS` this CPU reports."""
    return tuple(f for f in BF16_FLAGS if f in cpu_info()[1])


def cpu_model() -> str:
    """The CPU's model name and its bf16 matrix flags, e.g. ``"AMD EPYC [no bf16 matrix flags]"``."""
    flags = cpu_bf16_flags()
    return cpu_info()[0] + (f" [{', '.join(flags)}]" if flags else " [no bf16 matrix flags]")


def step_gemms(forward: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """A training step's GEMMs ``(m, k, n)`` for forward GEMMs ``[m,k]·[k,n]`` (activations × weightᵀ): each
    forward one, its input gradient ``[m,n]·[n,k]`` and its weight gradient ``[n,m]·[m,k]``."""
    out = []
    for m, k, n in forward:
        out += [(m, k, n), (m, n, k), (n, m, k)]
    return out


def time_gemms(gemms: Sequence[tuple[int, int, int]], dtype: torch.dtype, repeats: int = 1) -> float:
    """Median over ``repeats`` of the seconds one pass over ``gemms`` takes in ``dtype`` (after one warm-up pass),
    operands made once per distinct shape."""
    operands = {s: (torch.randn(s[0], s[1]).to(dtype), torch.randn(s[1], s[2]).to(dtype)) for s in set(gemms)}

    def one_pass() -> float:
        t0 = time.perf_counter()
        for s in gemms:
            a, b = operands[s]
            torch.mm(a, b)
        return time.perf_counter() - t0
    one_pass()
    return statistics.median(one_pass() for _ in range(repeats))


def probe_bf16(gemms: Sequence[tuple[int, int, int]], repeats: int = PROBE_REPEATS) -> tuple[float, float]:
    """Seconds per pass over ``gemms`` in fp32 and in bf16, the two interleaved ``repeats`` times (medians)."""
    fp32, bf16 = [], []
    for _ in range(repeats):
        fp32.append(time_gemms(gemms, torch.float32))
        bf16.append(time_gemms(gemms, torch.bfloat16))
    return statistics.median(fp32), statistics.median(bf16)


def resolve_precision(requested: str, device: torch.device, gemms: Sequence[tuple[int, int, int]] = (), *,
                      probe: Callable[[Sequence[tuple[int, int, int]]], tuple[float, float]] | None = None
                      ) -> PrecisionChoice:
    """``train.precision`` on ``device`` for a model whose step runs ``gemms`` (:func:`step_gemms`), probed at the
    current ``torch.get_num_threads()`` by ``probe`` (default :func:`probe_bf16`). See the module docstring for
    the rule."""
    if requested in ("fp32", "bf16"):
        return PrecisionChoice(requested, requested, f"train.precision={requested} in the config")
    if device.type == "cuda":
        return PrecisionChoice(requested, "bf16", "auto on CUDA")
    if device.type != "cpu":
        return PrecisionChoice(requested, "fp32", f"auto on {device.type}")
    flags = cpu_bf16_flags()
    if not flags:
        return PrecisionChoice(requested, "fp32", f"auto: this CPU ({cpu_info()[0]}) has no bf16 matrix flags")
    if not gemms:
        return PrecisionChoice(requested, "fp32", "auto: no GEMM list to probe bf16 with")
    fp32_s, bf16_s, when = probe(gemms) + ("now",) if probe is not None else machine_probe(gemms)
    ratio = fp32_s / bf16_s if bf16_s > 0 else 0.0
    measured = (f"the model's GEMMs at {torch.get_num_threads()} thread(s): fp32 {fp32_s * 1e3:.1f} ms, bf16 "
                f"{bf16_s * 1e3:.1f} ms ({ratio:.2f}×; bf16 needs ≥ {BF16_MARGIN}×)")
    resolved = "bf16" if ratio >= BF16_MARGIN else "fp32"
    return PrecisionChoice(requested, resolved, f"auto: {', '.join(flags)}; {measured}; probed {when}")


def machine_probe(gemms: Sequence[tuple[int, int, int]]) -> tuple[float, float, str]:
    """:func:`probe_bf16` once per machine, thread count, torch version and GEMM list; later calls read the stored
    result, so every run of one shape on one machine resolves alike. Returns ``(fp32_s, bf16_s, when)``."""
    key = json.dumps([cpu_model(), torch.get_num_threads(), torch.__version__, sorted(gemms)])
    path = cache_dir("precision") / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    try:
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return float(saved["fp32_s"]), float(saved["bf16_s"]), f"{saved['when']} (stored in {path})"
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not probed yet, or unreadable: probe (again)
    fp32_s, bf16_s = probe_bf16(gemms)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        write_json(path, {"key": key, "fp32_s": fp32_s, "bf16_s": bf16_s, "when": when})
    except OSError:
        pass  # a read-only cache: this run is still resolved, the next one probes again
    return fp32_s, bf16_s, when


def study_precision(requested: str, device: torch.device) -> PrecisionChoice:
    """The one precision every arm of a study (``sweep``, ``demo``, ``visual-study``) trains in.

    ``auto`` is bf16 on CUDA and fp32 on CPU, even where single runs pick bf16: paired bf16-vs-fp32 runs passed a
    TOST at 0.01 nats (``cpu-sweep``, 3 seeds; ``cpu-small``, 5 seeds), but the demo rerun in bf16 on an
    ``avx512_bf16`` EPYC (where the probe finds the GEMMs 2.85× faster at 1 thread) finished only 1.03× sooner than
    in fp32 — the small shapes' step is mostly not matmul — and two of its visual labels changed at 3 seeds (README:
    precision). A time tie goes to fp32. An explicit ``fp32`` / ``bf16`` is kept.
    """
    if requested in ("fp32", "bf16") or device.type != "cpu":
        return resolve_precision(requested, device)
    return PrecisionChoice(requested, "fp32", "auto: a CPU study trains in fp32 (bf16 measured no faster end to end "
                                              "at the demo's shapes; train.precision=bf16 forces it)")
