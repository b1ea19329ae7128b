"""The early verdict on three axes, with the reasons in numbers and thresholds measured on a benchmark.

STRUCTURE — has the table learned something that is not initialisation noise?
  The raw metrics of W_t cannot say: a Gaussian N×d table with N ≫ d already has erank ≈ d and mean cosine ≈ 0,
  and so may a well-trained one. The evidence is the change since initialisation, Δ = W_t − αW_0, compared across
  seeds: learned structure replicates, init and gradient noise do not. The statistic is linear CKA between two
  seeds' Δ on the rows both runs used, after removing what a smooth function of row frequency explains and
  normalising rows, in units of its permutation null (one seed's rows shuffled among rows of similar frequency,
  20 draws): z = (CKA − null mean) / null sd. With a matched null-run pair (``--null`` and
  ``--null-reference``, ``ple.ids=iid``) a real table must also agree more than that pair does.
USE — does the model rely on the table?
  z = Δ / se of the paired validation-loss change when rows are permuted among rows of similar frequency
  (``usage.py``), se across windows.
BENEFIT — will the table beat the zero-table and i.i.d.-id arms at the end? Called from the same use z with its
  own thresholds. Reliance is not benefit; the calibration report says how often this call is wrong and whether it
  beats the early paired loss Δ, which needs the control arms trained.

Each call is positive when z > hi, negative when z < lo, UNDECIDED between. ``hi`` and ``lo`` are fitted by
``plelab calibrate --write-thresholds`` on a labelled benchmark (planted negatives: i.i.d. ids, a frozen table, a
gate held at 0; positives: real ids, weak ones among them) at each decision point (fraction of the run), and shipped
in ``calibration.json`` beside this file with their held-out error rates; ``hi`` is never below the null's
1-in-1,000 quantile (:data:`plelab.calibration.evaluate.NULL_FLOOR`). :func:`verdict_reliability` says how often a call
was wrong in the nearest benchmark regime, or that a model is outside the calibrated range.
DELTA_USE (0.005 nats, a fifth of the seed's dP=256 gain) is the declared smallest reliance of interest: the
benchmark's truth for USED, and the visual study's equivalence margin; no call is thresholded on it.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from plelab.errors import PlelabError

#: the thresholds and held-out error rates ``plelab calibrate --write-thresholds`` measured
SHIPPED = Path(__file__).with_name("calibration.json")

LEARNED, NOT_DIST, UNDECIDED = "LEARNED", "NOT DISTINGUISHABLE FROM NULL", "UNDECIDED"
USED, UNUSED = "USED", "UNUSED"

DELTA_USE = 0.005  # nats: the smallest reliance of interest (a declared margin, not a fitted threshold)
BENEFIT, NO_BENEFIT = "BENEFIT", "NO BENEFIT"


@functools.cache
def calibration() -> dict:
    """The shipped calibration (``calibration.json``): thresholds per call and decision point, the benchmark's
    regimes and their held-out error rates."""
    try:
        cal = json.loads(SHIPPED.read_text())
        if not all(isinstance(cal["thresholds"][k], list) for k in ("LEARNED", "USED", "BENEFIT")):
            raise ValueError("thresholds are not lists")
        int(cal["benchmark"]["windows"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PlelabError(f"{SHIPPED} is missing or damaged ({err}); reinstall plelab, or refit it with "
                          "plelab calibrate --write-thresholds") from None
    return cal


def calibrated_windows() -> int:
    """The validation-window count of the benchmark's use tests: the default of every use test the verdict reads
    (``plelab diagnose --windows``, ``train.diag_windows``), so that its z is on the calibrated scale."""
    return int(calibration()["benchmark"]["windows"])


def thresholds(kind: str, fraction: float | None = None) -> tuple[float, float, float] | None:
    """``(lo, hi, fraction)`` of call ``kind`` at the calibrated decision point nearest ``fraction`` of the run
    (None: the run's end); None when the benchmark could not fit it (no truly positive or negative call)."""
    rows = calibration()["thresholds"][kind]
    if not rows:
        return None
    f = 1.0 if fraction is None else fraction
    row = min(rows, key=lambda r: (abs(r["fraction"] - f), -r["fraction"]))
    return row["lo"], row["hi"], row["fraction"]


def _call(z: float, kind: str, fraction: float | None, yes: str, no: str) -> tuple[str, str]:
    th = thresholds(kind, fraction)
    if th is None:
        return UNDECIDED, f"z {z:.1f} (not calibrated: the benchmark had no call of both truths to fit {yes} on)"
    lo, hi, at = th
    word = yes if z > hi else no if z < lo else UNDECIDED
    cut = f"> {hi:.2f}" if lo == hi else f"> {hi:.2f} / < {lo:.2f}"
    return word, f"z {z:.1f} ({yes} {cut}, calibrated at {at:.3f} of a run)"


@dataclass
class Verdict:
    structure: str
    use: str
    reasons: list[str]
    benefit: str = UNDECIDED

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return f"{'; '.join(self.reasons)} → {self.structure}, {self.use}, {self.benefit}"


def structure_verdict(cka: float | None, null_mean: float | None, null_sd: float | None,
                      null_run_cka: float | None = None, fraction: float | None = None) -> tuple[str, str]:
    if cka is None or null_mean is None:
        return UNDECIDED, ("no second seed's Δ to compare with (give a reference run of another seed): W_t alone "
                           "cannot tell")
    z = (cka - null_mean) / null_sd if null_sd and null_sd > 0 else 0.0
    word, why = _call(z, "LEARNED", fraction, LEARNED, NOT_DIST)
    reason = f"cross-seed CKA of Δ {cka:.3f} vs permutation null {null_mean:.3f}±{null_sd:.3f}: {why}"
    if null_run_cka is not None:
        reason += f"; matched null-run pair {null_run_cka:.3f}"
        if cka <= null_run_cka:
            word = NOT_DIST
    else:
        reason += " (frequency-only agreement excluded up to a smooth function of log-frequency; "\
                  "a null-control pair of runs controls it fully)"
    return word, reason


def use_z(delta: float, se: float) -> float:
    """The use test's statistic in null units: Δ / se (0 for a change that is exactly 0)."""
    if se is not None and se > 0 and math.isfinite(se):
        return delta / se
    return 0.0 if delta == 0 else math.copysign(1e6, delta)


def use_verdict(delta: float | None, se: float | None, kind: str = "permute",
                fraction: float | None = None) -> tuple[str, str]:
    if delta is None:
        return UNDECIDED, "use test not run (turned off, or no model and validation windows to run it with)"
    word, why = _call(use_z(delta, se), "USED", fraction, USED, UNUSED)
    return word, f"{kind} rows costs {delta:+.4f}±{se:.4f} nats: {why}"


def benefit_verdict(delta: float | None, se: float | None, fraction: float | None = None) -> tuple[str, str]:
    if delta is None:
        return UNDECIDED, "no use test: BENEFIT is called from it"
    word, why = _call(use_z(delta, se), "BENEFIT", fraction, BENEFIT, NO_BENEFIT)
    return word, f"benefit over the zero-table and i.i.d.-id arms predicted from the use test: {why}"


def verdict(cka=None, null_mean=None, null_sd=None, null_run_cka=None, delta=None, se=None,
            extra: list[str] | None = None, fraction: float | None = None) -> Verdict:
    """The three calls; ``fraction``: how far through its run the checkpoint is (None: the end, or unknown)."""
    s, s_reason = structure_verdict(cka, null_mean, null_sd, null_run_cka, fraction)
    u, u_reason = use_verdict(delta, se, fraction=fraction)
    b, b_reason = benefit_verdict(delta, se, fraction)
    return Verdict(structure=s, use=u, reasons=[s_reason, u_reason, b_reason, *(extra or [])], benefit=b)


# How far a model may sit from every benchmark regime (a factor either way) and still be "near" one.
RANGE_FACTOR = {"hidden size": 2.0, "table rows": 4.0, "dP": 2.0, "tokens per row": 2.0}


def verdict_reliability(hidden_size: int | None, rows: int | None, dim: int | None, fraction: float | None,
                        tokens_per_row: float | None, windows: int | None = None) -> list[str]:
    """How often each call was wrong, held out by configuration, in the benchmark regimes nearest this model, at
    the decision point nearest ``fraction``; or why the model is outside the calibrated range (then the rates do
    not apply). Unknown facts (None) put a model outside: a checkpoint plelab did not train has no run length.
    ``windows``: the use test's validation windows, when known; a count other than the benchmark's adds a line
    (a real effect's z grows with √windows, a null table's does not)."""
    cal = calibration()
    regs = cal["regimes"]
    spans = {"hidden size": [r["hidden_size"] for r in regs], "table rows": [r["rows"] for r in regs],
             "dP": [d for r in regs for d in r["dims"]],
             "tokens per row": [x for r in regs for x in r["tokens_per_row"]]}
    facts = {"hidden size": hidden_size, "table rows": rows, "dP": dim, "tokens per row": tokens_per_row}
    outside = []
    for name, value in facts.items():
        lo, hi, k = min(spans[name]), max(spans[name]), RANGE_FACTOR[name]
        if value is None:
            outside.append(f"{name} unknown")
        elif not lo / k <= value <= hi * k:
            outside.append(f"{name} {value:,.0f} (benchmark {lo:,.0f}–{hi:,.0f})")
    if fraction is None:
        outside.append("position in the run unknown")
    if outside:
        return ["outside the calibrated range (" + "; ".join(outside) + "): the benchmark's error rates do not apply "
                "to this verdict"]
    near = min(regs, key=lambda r: abs(math.log(r["hidden_size"] / hidden_size)))
    same = [r["name"] for r in regs if r["hidden_size"] == near["hidden_size"]]
    lines = []
    for kind in ("LEARNED", "USED", "BENEFIT"):
        parts = []
        for name in same:
            pts = cal["reliability"][kind][name]
            p = min(pts, key=lambda q: abs(q["fraction"] - fraction))
            parts.append(f"{name}: wrong in {p['wrong']} of {p['decided']} decided held-out calls (95% upper bound "
                         f"{100 * p['wrong_upper']:.0f}%), decided {100 * p['coverage']:.0f}% of {p['calls']}")
        lines.append(f"{kind} at {p['fraction']:.3f} of a run — " + "; ".join(parts))
    calibrated = calibrated_windows()
    if windows is not None and windows != calibrated:
        more = "more" if windows > calibrated else "less"
        lines.append(f"the use test ran on {windows} validation windows, the benchmark's on {calibrated}: USED and "
                     f"BENEFIT decide {more} often than these rates say (a real effect's z grows with √windows; a "
                     f"null table's does not); use {calibrated} windows for the calibrated rates")
    return lines
