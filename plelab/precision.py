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

A probe can be wrong safely: each reading is checked against physically plausible bounds before it decides
anything — the bf16/fp32 speed ratio of the model's GEMMs must lie within ``[1/MAX_BF16_RATIO,
min(MAX_BF16_RATIO, PEAK_SLACK × peak)]``, ``peak`` the ratio of one large square GEMM timed beside it in the
same process (:func:`gemm_peak_ratio`; under load one such probe read bf16 "73.10×" faster). A reading outside is
discarded and measured again (``PROBE_ATTEMPTS`` in all); when none is plausible the run trains in fp32 and
nothing is stored, so the next run probes again. The stored file holds every reading of the probe (the discarded
ones too), the bound each was checked against and which one decided; a stored reading outside the bounds (an
older plelab's) is not trusted: it is probed again.

A run records the resolution in ``config.json`` (``train.precision`` holds the resolved value) and in
``summary.json`` (``precision``: requested, resolved, why); a resumed run keeps its recorded precision and never
probes again. Studies resolve once for all their arms (:func:`study_precision`); a sweep's later arms keep what
its started runs recorded.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from plelab.io import cache_dir, write_json

BF16_FLAGS = ("amx_bf16", "avx512_bf16")
BF16_MARGIN = 1.25  # the probe's bf16 GEMM time must be ≤ fp32's / 1.25: the margin pays for casts and noise
PROBE_REPEATS = 3
# The most bf16 can gain over fp32 on a CPU: AMX's bf16 tile peak over AVX-512's fp32 FMA peak, per core and cycle
# (2,048 vs 64 FLOP); a ratio beyond it either way is a disturbed reading, whatever the peak measured.
MAX_BF16_RATIO = 32.0
# The model's GEMMs gain at most PEAK_SLACK × what one large square GEMM gains (halved operand bytes on
# memory-bound shapes, and timing noise).
PEAK_SLACK = 2.0
PEAK_SIZE = 1024  # the square GEMM of gemm_peak_ratio
PROBE_ATTEMPTS = 3  # readings taken at most before the probe gives up (fp32, nothing stored)


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


def gemm_peak_ratio(size: int = PEAK_SIZE, repeats: int = PROBE_REPEATS) -> float:
    """fp32 time over bf16 time of one ``size``³ GEMM (the two interleaved ``repeats`` times, medians): the most
    bf16 gains on this CPU, now, at the current thread count."""
    fp32, bf16 = [], []
    for _ in range(repeats):
        fp32.append(time_gemms([(size, size, size)], torch.float32))
        bf16.append(time_gemms([(size, size, size)], torch.bfloat16))
    low = statistics.median(bf16)
    return statistics.median(fp32) / low if low > 0 else math.inf


def plausible_bound(peak: float) -> float:
    """The largest bf16/fp32 speed ratio of a model's GEMMs a reading may show beside a measured ``peak``."""
    return min(MAX_BF16_RATIO, PEAK_SLACK * peak) if math.isfinite(peak) and peak > 0 else MAX_BF16_RATIO


def is_plausible(fp32_s: float, bf16_s: float, bound: float = MAX_BF16_RATIO) -> bool:
    """Whether a reading is physically possible: both times positive and finite, the ratio within
    ``[1/MAX_BF16_RATIO, bound]``."""
    if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in (fp32_s, bf16_s)):
        return False
    return 1 / MAX_BF16_RATIO <= fp32_s / bf16_s <= bound


def checked_probe(gemms: Sequence[tuple[int, int, int]],
                  probe: Callable[[Sequence[tuple[int, int, int]]], tuple[float, float]] | None = None) -> dict:
    """``probe`` (default :func:`probe_bf16`) of ``gemms`` beside :func:`gemm_peak_ratio`, read again while the
    reading is implausible (:func:`is_plausible` under :func:`plausible_bound`), ``PROBE_ATTEMPTS`` readings at
    most. Returns ``{"readings": [{fp32_s, bf16_s, ratio, peak_ratio, bound, plausible}, ...], "decided_from":
    the index of the plausible reading, or None}``."""
    probe = probe or probe_bf16
    readings = []
    for _ in range(PROBE_ATTEMPTS):
        peak = gemm_peak_ratio()
        fp32_s, bf16_s = (float(t) for t in probe(gemms))
        bound = plausible_bound(peak)
        ok = is_plausible(fp32_s, bf16_s, bound)
        readings.append({"fp32_s": fp32_s, "bf16_s": bf16_s, "ratio": fp32_s / bf16_s if bf16_s > 0 else None,
                         "peak_ratio": peak if math.isfinite(peak) else None, "bound": bound, "plausible": ok})
        if ok:
            return {"readings": readings, "decided_from": len(readings) - 1}
    return {"readings": readings, "decided_from": None}


def _implausible(readings: list[dict]) -> str:
    shown = ", ".join(f"{r['ratio']:.2f}× (bound {r['bound']:.2f}×)" if r["ratio"] is not None else "no ratio"
                      for r in readings)
    return (f"the probe's {len(readings)} readings were all physically implausible ({shown}): discarded, not "
            "stored; fp32 (the next run probes again)")


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
    result = {**checked_probe(gemms, probe), "when": "now"} if probe is not None else machine_probe(gemms)
    if result["decided_from"] is None:
        return PrecisionChoice(requested, "fp32", f"auto: {', '.join(flags)}; {_implausible(result['readings'])}")
    kept = result["readings"][result["decided_from"]]
    fp32_s, bf16_s, when = kept["fp32_s"], kept["bf16_s"], result["when"]
    ratio = fp32_s / bf16_s if bf16_s > 0 else 0.0
    measured = (f"the model's GEMMs at {torch.get_num_threads()} thread(s): fp32 {fp32_s * 1e3:.1f} ms, bf16 "
                f"{bf16_s * 1e3:.1f} ms ({ratio:.2f}×; bf16 needs ≥ {BF16_MARGIN}×)")
    if kept.get("bound") is not None:
        tries = f"; {result['decided_from']} implausible reading(s) discarded" if result["decided_from"] else ""
        measured += f", within the plausible ≤ {kept['bound']:.2f}×{tries}"
    resolved = "bf16" if ratio >= BF16_MARGIN else "fp32"
    return PrecisionChoice(requested, resolved, f"auto: {', '.join(flags)}; {measured}; probed {when}")


def machine_probe(gemms: Sequence[tuple[int, int, int]]) -> dict:
    """:func:`checked_probe` once per machine, thread count, torch version and GEMM list; later calls read the
    stored result, so every run of one shape on one machine resolves alike. Returns :func:`checked_probe`'s dict
    with ``when`` (the time of the probe, and where it is stored); nothing is stored when no reading was plausible.
    A stored reading outside the bounds (:func:`is_plausible`) is not trusted: probed again."""
    key = json.dumps([cpu_model(), torch.get_num_threads(), torch.__version__, sorted(gemms)])
    path = cache_dir("precision") / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    try:
        saved = json.loads(path.read_text())
        fp32_s, bf16_s = float(saved["fp32_s"]), float(saved["bf16_s"])
        if saved.get("key") == key and is_plausible(fp32_s, bf16_s, float(saved.get("bound", MAX_BF16_RATIO))):
            reading = {"fp32_s": fp32_s, "bf16_s": bf16_s}
            return {"readings": [reading], "decided_from": 0, "when": f"{saved['when']} (stored in {path})"}
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        pass  # not probed yet, unreadable or implausible: probe (again)
    result = {**checked_probe(gemms), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if result["decided_from"] is None:
        return result
    kept = result["readings"][result["decided_from"]]
    try:  # the reading it decided from, with every reading taken (the discarded ones too)
        write_json(path, {"key": key, "fp32_s": kept["fp32_s"], "bf16_s": kept["bf16_s"], "bound": kept["bound"],
                          "peak_ratio": kept["peak_ratio"], **result})
    except OSError:
        pass  # a read-only cache: this run is still resolved, the next one probes again
    return result


def study_precision(requested: str, device: torch.device) -> PrecisionChoice:
    """The one precision every arm of a study (``sweep``, ``demo``, ``visual-study``) trains in.

    ``auto`` is bf16 on CUDA and fp32 on CPU, even where single runs pick bf16: paired bf16-vs-fp32 runs passed a
    TOST at 0.01 nats (``cpu-sweep``, 3 seeds; ``cpu-small``, 5 seeds), but the demo rerun in bf16 on an
    ``avx512_bf16`` EPYC (where the probe finds the GEMMs 2.85× faster at 1 thread) finished only 1.03× sooner than
    in fp32 — the small shapes' step is mostly not matmul — and two of its visual labels changed at 3 seeds
    (``studies/FINDINGS.md``, "The demo in both precisions"). A time tie goes to fp32. An explicit ``fp32`` /
    ``bf16`` is kept.
    """
    if requested in ("fp32", "bf16") or device.type != "cpu":
        return resolve_precision(requested, device)
    return PrecisionChoice(requested, "fp32", "auto: a CPU study trains in fp32 (bf16 measured no faster end to end "
                                              "at the demo's shapes; train.precision=bf16 forces it)")
