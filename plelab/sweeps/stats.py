"""Paired statistics that cannot over-claim: t intervals, TOST equivalence, Holm, labels, MDE.

Every comparison is *paired*: arm B minus arm A, seed by seed (same data order and the same
initial trunk weights), so seed-to-seed spread cancels and only the within-pair differences
d_i = loss_B,i − loss_A,i enter. With n seeds:

- paired t: mean d̄, s = sd(d), se = s/√n, CI = d̄ ± t_{1−α/2, n−1}·se, two-sided p;
- TOST (Schuirmann 1987): equivalence within ±δ when both one-sided tests
  H0: d ≤ −δ and H0: d ≥ +δ are rejected; p_TOST = max of the two one-sided p;
- Holm (1979): step-down correction of the p-values of a family of comparisons (both the
  difference and the equivalence p-values are corrected within the family);
- minimum detectable effect at power 1−β: (t_{1−α'/2,n−1} + t_{1−β,n−1})·s/√n (the usual
  normal-shift approximation with the t quantiles), at α' = α/m for a family of m comparisons —
  Holm's threshold for its smallest p-value, so the MDE is what the corrected test can detect.

The 95% CI is per comparison; the TOST at α is equivalent to the 90% CI lying inside ±δ.

Labels, with α after Holm correction and δ the declared smallest effect of interest:

- "diminishing returns": a step along the dP curve with a significant drop that is also
  equivalent within ±δ — real, but smaller than the effect the study said would matter
  (outside a step, e.g. a control against its arm: "real but smaller than δ");
- "significant drop" / "significant rise": p_Holm < α, sign of d̄;
- "equivalent within ±δ": p_TOST,Holm < α (a dead zone, measured);
- "inconclusive": neither — the usual outcome with few seeds, and the report says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

DROP, RISE, EQUIVALENT, DIMINISHING, INCONCLUSIVE = (
    "significant drop", "significant rise", "equivalent within ±δ", "diminishing returns", "inconclusive")
# DIMINISHING's names outside a step along the dP curve (e.g. a control against its arm)
SMALL_DROP, SMALL_RISE = "real drop smaller than δ", "real rise smaller than δ"


def _scipy_stats():
    """``scipy.stats``, imported when a statistic is first computed."""
    import scipy.stats  # heavy (about 1 s): every CLI start would pay it, and most verbs never compute one

    return scipy.stats


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom."""
    return float(_scipy_stats().t.ppf(q, df))


@dataclass
class Comparison:
    """B − A over paired seeds (negative ``mean`` = B has the lower loss)."""

    a: str
    b: str
    n: int
    mean: float
    sd: float
    ci_low: float
    ci_high: float
    p: float
    p_tost: float
    delta: float
    alpha: float
    mde: float
    p_holm: float = math.nan
    p_tost_holm: float = math.nan
    label: str = INCONCLUSIVE
    reason: str = ""

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def mde(sd: float, n: int, alpha: float = 0.05, power: float = 0.8, m: int = 1) -> float:
    """Minimum detectable effect of a paired t-test with n pairs and spread sd, at α/m (two-sided)."""
    if n < 2:
        return math.nan
    return (t_quantile(1 - alpha / (2 * m), n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def paired(a: str, b: str, diffs: list[float] | np.ndarray, delta: float, alpha: float = 0.05,
           power: float = 0.8, m: int = 1) -> Comparison:
    """Paired t and TOST for the differences ``diffs`` (B − A, one per seed), uncorrected; the MDE is
    computed for a family of ``m`` comparisons."""
    d = np.asarray(diffs, dtype=np.float64)
    n = len(d)
    mean = float(d.mean()) if n else math.nan
    if n < 2:
        return Comparison(a, b, n, mean, math.nan, math.nan, math.nan, math.nan, math.nan, delta, alpha, math.nan,
                          reason=f"{n} paired seed(s): no variance estimate, no test")
    sd = float(d.std(ddof=1))
    df = n - 1
    se = sd / math.sqrt(n)
    tq = t_quantile(1 - alpha / 2, df)
    detectable = mde(sd, n, alpha, power, m)
    if se == 0.0:  # identical differences in every pair (e.g. two arms with the same config)
        p = 0.0 if mean != 0 else 1.0
        p_tost = 0.0 if abs(mean) < delta else 1.0
        return Comparison(a, b, n, mean, sd, mean, mean, p, p_tost, delta, alpha, detectable)
    t = mean / se
    p = float(2 * _scipy_stats().t.sf(abs(t), df))
    p_lower = float(_scipy_stats().t.sf((mean + delta) / se, df))  # H0: d <= -delta
    p_upper = float(_scipy_stats().t.cdf((mean - delta) / se, df))  # H0: d >= +delta
    return Comparison(a, b, n, mean, sd, mean - tq * se, mean + tq * se, p, max(p_lower, p_upper), delta, alpha,
                      detectable)


def holm(pvalues: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (NaN entries are skipped and stay NaN)."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    m = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def label(c: Comparison, steps: bool = True) -> tuple[str, str]:
    """The label of a Holm-corrected comparison and its reason in numbers. ``steps``: the comparison is a
    step along a dP curve (a significant drop within ±δ is then "diminishing returns")."""
    if c.n < 2 or math.isnan(c.p_holm):
        return INCONCLUSIVE, c.reason or "no test"
    ci = f"Δ {c.mean:+.4f} [{c.ci_low:+.4f}, {c.ci_high:+.4f}], p_Holm {c.p_holm:.3g}, p_TOST,Holm {c.p_tost_holm:.3g}"
    significant, equivalent = c.p_holm < c.alpha, c.p_tost_holm < c.alpha
    if significant and equivalent:
        small = (DIMINISHING if steps else SMALL_DROP) if c.mean < 0 else SMALL_RISE
        return small, f"{ci}: a real change smaller than δ={c.delta}"
    if significant:
        return (DROP if c.mean < 0 else RISE), ci
    if equivalent:
        return EQUIVALENT, f"{ci}: within ±{c.delta} (a dead zone, measured)"
    return INCONCLUSIVE, (f"{ci}: neither different nor shown equivalent with n={c.n} seeds "
                          f"(minimum detectable effect {c.mde:.4f} nats at 80% power after Holm)")


def family(comparisons: list[Comparison], steps: bool = True) -> list[Comparison]:
    """Holm-correct a family of comparisons in place and label each."""
    for c, p, pt in zip(comparisons, holm([c.p for c in comparisons]), holm([c.p_tost for c in comparisons])):
        c.p_holm, c.p_tost_holm = p, pt
        c.label, c.reason = label(c, steps)
    return comparisons


def mean_sd(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else math.nan)


def spearman(x: list[float], y: list[float]) -> tuple[float, float]:
    """Spearman rank correlation and its p-value (NaN with fewer than 3 points or a constant input)."""
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan, math.nan
    r = _scipy_stats().spearmanr(x, y)
    return float(r.statistic), float(r.pvalue)
