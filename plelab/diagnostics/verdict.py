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
BENEFIT — will adding the table beat the same model without PLE, and its content beat the same branch with a zero
  table, at the end? Called from the same use z with its own thresholds. Reliance is not benefit; the calibration
  report says how often this call is wrong and whether it beats the early paired loss Δ, which needs the control
  arms trained. What scores each call on the benchmark: :mod:`plelab.calibration.truth`.

Each call is positive when z > hi, negative when z < lo, UNDECIDED between. ``hi`` and ``lo`` are fitted by
``plelab calibrate --write-thresholds`` on a labelled benchmark (planted negatives: i.i.d. ids, a frozen table, a
gate held at 0; positives: real ids, weak ones among them) at each decision point (fraction of the run), and shipped
in ``calibration.json`` beside this file with their held-out error rates; ``hi`` is never below the null's
1-in-1,000 quantile (:data:`plelab.calibration.evaluate.NULL_FLOOR`); a side written as null is never called.
:func:`verdict_reliability` says how often a call was wrong in the nearest benchmark regime — counted by
configuration, held out by corpus (or the worst scheme, named), with coverage — or that the model is outside the
calibrated range (:func:`range_status`: inside only within the benchmark's measured span on every axis, no widening
factor). A calibration.json that counted calls (written before issue 51) is said to be "not measured per
configuration". Per-layer calls are printed UNCALIBRATED (:func:`layer_verdict`).
DELTA_USE (0.005 nats, a fifth of the seed's dP=256 gain) is the declared smallest reliance of interest: the
benchmark's truth for USED, and the visual study's equivalence margin; no call is thresholded on it.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from plelab.errors import PlelabError

#: the thresholds and held-out error rates ``plelab calibrate --write-thresholds`` measured
SHIPPED = Path(__file__).with_name("calibration.json")

LEARNED, NOT_DIST, UNDECIDED = "LEARNED", "NOT DISTINGUISHABLE FROM NULL", "UNDECIDED"
USED, UNUSED = "USED", "UNUSED"

DELTA_USE = 0.005  # nats: the smallest reliance of interest (a declared margin, not a fitted threshold)
BENEFIT, NO_BENEFIT = "BENEFIT", "NO BENEFIT"
UNCALIBRATED = "UNCALIBRATED"  # a per-layer call: no threshold was fitted or error rate measured for it


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
    (None: the run's end); None when the benchmark could not fit it (no truly positive or negative call). A side the
    benchmark had too few configurations to call (written as null) is ±inf: never called."""
    rows = calibration()["thresholds"][kind]
    if not rows:
        return None
    f = 1.0 if fraction is None else fraction
    row = min(rows, key=lambda r: (abs(r["fraction"] - f), -r["fraction"]))
    lo = -math.inf if row["lo"] is None else row["lo"]
    return lo, math.inf if row["hi"] is None else row["hi"], row["fraction"]


def _call(z: float, kind: str, fraction: float | None, yes: str, no: str) -> tuple[str, str]:
    th = thresholds(kind, fraction)
    if th is None:
        return UNDECIDED, f"z {z:.1f} (not calibrated: the benchmark had no call of both truths to fit {yes} on)"
    lo, hi, at = th
    word = yes if z > hi else no if z < lo else UNDECIDED
    up = f"> {hi:.2f}" if math.isfinite(hi) else "never"
    cut = up if lo == hi else f"{up} / {no} " + (f"< {lo:.2f}" if math.isfinite(lo) else "never")
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
    z = structure_z(cka, null_mean, null_sd)
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


def structure_z(cka: float, null_mean: float, null_sd: float | None) -> float:
    """The LEARNED statistic in null units: (CKA − null mean) / null sd (0 where the null has no spread: a table
    that never moved, :func:`plelab.diagnostics.agreement.cka_against_null`)."""
    return (cka - null_mean) / null_sd if null_sd and null_sd > 0 else 0.0


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
    return word, (f"benefit over the same model without the table (and, for PLE, over the same branch with a zero "
                  f"table), predicted from the use test: {why}")


def verdict(cka=None, null_mean=None, null_sd=None, null_run_cka=None, delta=None, se=None,
            extra: list[str] | None = None, fraction: float | None = None) -> Verdict:
    """The three calls; ``fraction``: how far through its run the checkpoint is (None: the end, or unknown)."""
    s, s_reason = structure_verdict(cka, null_mean, null_sd, null_run_cka, fraction)
    u, u_reason = use_verdict(delta, se, fraction=fraction)
    b, b_reason = benefit_verdict(delta, se, fraction)
    return Verdict(structure=s, use=u, reasons=[s_reason, u_reason, b_reason, *(extra or [])], benefit=b)


def layer_verdict(cka=None, null_mean=None, null_sd=None, delta=None, se=None, layers: int = 1) -> Verdict:
    """One layer's calls, printed as UNCALIBRATED: the thresholds and their error rates were measured on whole-table
    calls, and ``layers`` per-layer calls are that many chances to cross a threshold (no multiplicity control).
    The reasons keep the layer's statistics (z in null units) for reading beside the whole-table verdict."""
    parts = []
    if cka is None or null_mean is None:
        parts.append("no cross-seed comparison")
    else:
        z = structure_z(cka, null_mean, null_sd)
        parts.append(f"cross-seed CKA of Δ {cka:.3f} vs null {null_mean:.3f} (z {z:.1f})")
    parts.append("use test not run" if delta is None else f"permute costs {delta:+.4f}±{se:.4f} nats "
                 f"(z {use_z(delta, se):.1f})")
    why = (f"uncalibrated: the thresholds were fitted on whole-table calls and {layers} layers are {layers} chances to "
           "cross one (no multiplicity control); read the whole-table verdict")
    return Verdict(UNCALIBRATED, UNCALIBRATED, [*parts, why], UNCALIBRATED)


# The axes a benchmark spans, each read off calibration.json's regimes (the windows and decision points off the
# benchmark, thresholds and rates). A span the file lacks is "not measured": every value is outside it.
AXES = ("H", "layers", "table rows", "dP", "tokens per row", "use-test windows", "position in the run")


def _span(values) -> tuple[float, float] | None:
    try:
        xs = [float(v) for v in values]
    except (KeyError, TypeError, ValueError):
        return None
    return (min(xs), max(xs)) if xs and all(math.isfinite(x) for x in xs) else None


def benchmark_spans(cal: dict | None = None) -> dict[str, tuple[float, float] | None]:
    """The benchmark's measured (min, max) on every axis of :data:`AXES` (None: the file does not record it)."""
    cal = calibration() if cal is None else cal
    regs = cal.get("regimes") or []

    def each(key):
        return (r[key] for r in regs)

    def flat(key):
        return (x for r in regs for x in r[key])

    windows = cal.get("benchmark", {}).get("windows")
    fractions = [r["fraction"] for rows in (cal.get("thresholds") or {}).values() for r in rows]
    for by_regime in (cal.get("reliability") or {}).values():
        for rel in by_regime.values():  # a list of points (an older file) or {"schemes": {scheme: points}}
            groups = rel["schemes"].values() if isinstance(rel, dict) else [rel]
            fractions += [q["fraction"] for points in groups for q in points]
    return {"H": _span(each("hidden_size")), "layers": _span(each("layers")), "table rows": _span(each("rows")),
            "dP": _span(flat("dims")), "tokens per row": _span(flat("tokens_per_row")),
            "use-test windows": _span([r.get("windows", windows) for r in regs] if regs else []),
            "position in the run": _span(fractions)}


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 or x == int(x) else f"{x:.3g}"


@dataclass
class AxisStatus:
    """One axis of :func:`range_status`: the model's value, the benchmark's span, and whether it lies inside
    (None: not applicable — no use test ran, so no USED or BENEFIT call rests on the window count)."""

    axis: str
    value: float | None
    span: tuple[float, float] | None
    inside: bool | None
    note: str | None = None  # an axis that is not a number (the trunk): what it is

    def text(self) -> str:
        if self.note is not None:
            return f"{self.axis}: {self.note}"
        value = "unknown" if self.value is None else _num(self.value)
        span = "not measured by the benchmark" if self.span is None else (
            _num(self.span[0]) if self.span[0] == self.span[1] else f"{_num(self.span[0])}–{_num(self.span[1])}")
        return f"{self.axis}: {value} vs {span}"


@dataclass
class RangeStatus:
    """Where a model sits against the benchmark on every axis; ``inside`` only when no axis is outside."""

    axes: list[AxisStatus] = field(default_factory=list)

    @property
    def inside(self) -> bool:
        return all(a.inside is not False for a in self.axes)

    @property
    def outside(self) -> list[AxisStatus]:
        return [a for a in self.axes if a.inside is False]

    def line(self) -> str:
        if self.inside:
            return "inside the calibrated range (" + "; ".join(a.text() for a in self.axes if a.inside) + ")"
        return "outside the calibrated range (" + "; ".join(a.text() for a in self.outside) + ")"

    def to_dict(self) -> dict:
        return {"inside": self.inside, "line": self.line(), "axes": [asdict(a) for a in self.axes]}


def range_status(*, hidden_size: float | None, layers: float | None, rows: float | None, dim: float | None,
                 tokens_per_row: float | None, windows: float | None, fraction: float | None,
                 cal: dict | None = None, trunk: str = "plelab", kind: str = "ple") -> RangeStatus:
    """Is a model (and the checkpoint a call reads) inside the benchmark's measured span on every axis — hidden
    size, layers, table rows, dP, tokens per table row, the use test's validation windows and the position in the
    run? No widening factor: no validation has measured how far the thresholds transfer. An unknown value (None)
    is outside, except ``windows`` (None: no use test ran, the axis does not apply). ``cal``: a calibration dict
    (default: the shipped one), for a study's own benchmark. ``trunk``: the decoder the table sits in —
    ``"plelab"`` (the only one the benchmark trains) or any other name (an HF trunk, your own model, a monitored
    run), which is outside whatever its sizes. ``kind``: the table's kind (``aux.kind``); the benchmark trains PLE
    tables only, so any other kind is outside (its thresholds were never measured on it)."""
    spans = benchmark_spans(cal)
    values = {"H": hidden_size, "layers": layers, "table rows": rows, "dP": dim, "tokens per row": tokens_per_row,
              "use-test windows": windows, "position in the run": fraction}
    axes = []
    for axis in AXES:
        value, span = values[axis], spans[axis]
        if value is None and axis == "use-test windows":
            axes.append(AxisStatus(axis, None, span, None))
            continue
        inside = value is not None and span is not None and span[0] <= float(value) <= span[1]
        axes.append(AxisStatus(axis, None if value is None else float(value), span, inside))
    if trunk != "plelab":
        axes.append(AxisStatus("trunk", None, None, False,
                               note=f"{trunk} vs plelab's decoder, the only trunk the benchmark trains"))
    if kind != "ple":
        axes.append(AxisStatus("table kind", None, None, False,
                               note=f"{kind} vs PLE, the only kind of table the benchmark trains"))
    return RangeStatus(axes)


def _point_text(scheme: str, p: dict) -> str:
    return (f"held out by {scheme}: wrong in {p['wrong']} of {p['decided']} decided configurations (95% upper bound "
            f"{100 * p['wrong_upper']:.0f}%), {p['decided']} of {p['configurations']} configurations decided "
            f"({100 * p['coverage']:.0f}% coverage)")


def _regime_reliability(name: str, rel, fraction: float) -> tuple[float, str] | None:
    """One regime's line part: held out by corpus, and the worst scheme when another is worse (None: the file
    counted calls, not configurations)."""
    if not isinstance(rel, dict) or rel.get("unit") != "configuration":
        return None
    points = {s: min(rows, key=lambda q: abs(q["fraction"] - fraction)) for s, rows in rel["schemes"].items() if rows}
    if not points:
        return None
    worst = max(points, key=lambda s: (points[s]["wrong_upper"], s == "corpus"))
    at = points[worst]["fraction"]
    if "corpus" not in points:
        return at, (f"{name}: held out by corpus not measured (the benchmark has one corpus); the worst scheme "
                    f"measured, {_point_text(worst, points[worst])}")
    text = f"{name}: {_point_text('corpus', points['corpus'])}"
    if worst != "corpus":
        text += f"; the worst scheme, {_point_text(worst, points[worst])}"
    return at, text


def verdict_reliability(hidden_size: int | None, rows: int | None, dim: int | None, fraction: float | None,
                        tokens_per_row: float | None, windows: int | None = None,
                        layers: int | None = None, trunk: str = "plelab", kind: str = "ple") -> list[str]:
    """How often each call was wrong in the benchmark regimes of the nearest hidden size, at the decision point
    nearest ``fraction``: counted by configuration, held out by corpus (a user's corpus is never in the benchmark)
    and, when another held-out scheme is worse, that one too, named; with coverage. Or why the model is outside the
    calibrated range (:func:`range_status`; then the rates do not apply). A calibration that counted calls rather
    than configurations (the shipped file before issue 51) says its rates were not measured per configuration.
    ``trunk``, ``kind``: :func:`range_status`'s."""
    status = range_status(hidden_size=hidden_size, layers=layers, rows=rows, dim=dim, tokens_per_row=tokens_per_row,
                          windows=windows, fraction=fraction, trunk=trunk, kind=kind)
    if not status.inside:
        return [status.line() + ": the benchmark's error rates do not apply to this verdict"]
    cal = calibration()
    regs = cal["regimes"]
    near = min(regs, key=lambda r: abs(math.log(r["hidden_size"] / hidden_size)))
    same = [r["name"] for r in regs if r["hidden_size"] == near["hidden_size"]]
    lines = []
    for kind in ("LEARNED", "USED", "BENEFIT"):
        parts = [_regime_reliability(name, cal["reliability"][kind].get(name), fraction) for name in same]
        if any(p is None for p in parts) or not parts:
            lines.append(f"{kind}: error rate not measured per configuration (this calibration counted each seed's "
                         "call as independent, and they are not): rerun plelab calibrate --write-thresholds")
            continue
        lines.append(f"{kind} at {parts[0][0]:.3f} of a run — " + "; ".join(text for _, text in parts))
    return lines
