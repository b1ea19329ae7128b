"""Statistics that cannot over-claim: t intervals, TOST equivalence, Holm, labels, MDE, seeds to decide.

Every comparison is *paired*: arm B minus arm A, seed by seed (same data order and the same
initial trunk weights), so seed-to-seed spread cancels. A comparison is built from an estimate d̄ of the
mean difference, its standard error se and the error's degrees of freedom ν:

- paired t (:func:`paired`): the pair's own differences d_i = loss_B,i − loss_A,i, se = sd(d)/√n, ν = n − 1;
- blocked (:func:`pooled`): the seeds as blocks across all arms of a family, se from the pooled residual,
  ν = (arms − 1)(seeds − 1) (:mod:`plelab.stats.blocked`);

then CI = d̄ ± t_{1−α/2, ν}·se, a two-sided p, and TOST (Schuirmann 1987): equivalence within ±δ when both
one-sided tests H0: d ≤ −δ and H0: d ≥ +δ are rejected, p_TOST = the larger one-sided p. A family's p-values
are adjusted by Holm (1979), or — many arms against one baseline on the pooled error — by Dunnett's
multivariate t; the equivalence p-values by Holm. The minimum detectable effect is exact: the smallest true
difference the two-sided test at α/m (m comparisons: Holm's first threshold) detects with 80% power
(noncentral t, :mod:`plelab.stats.power`). An inconclusive comparison says how many seeds would decide it.

The 95% CI is per comparison unless ``ci_kind`` says it is simultaneous (Dunnett's many-to-one intervals,
:mod:`plelab.stats.blocked`); the TOST at α is equivalent to the 90% per-comparison CI lying inside ±δ.

Labels, with α after the family's adjustment and δ the declared smallest effect of interest:

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

from plelab.stats.power import _scipy_stats, power_difference, seeds_to_decide

DROP, RISE, EQUIVALENT, DIMINISHING, INCONCLUSIVE = (
    "significant drop", "significant rise", "equivalent within ±δ", "diminishing returns", "inconclusive")
# DIMINISHING's names outside a step along the dP curve (e.g. a control against its arm)
SMALL_DROP, SMALL_RISE = "real drop smaller than δ", "real rise smaller than δ"


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
    sd: float  # sd of a paired difference (the pair's own, or √(2σ̂²) of the pooled error)
    ci_low: float
    ci_high: float
    p: float
    p_tost: float
    delta: float
    alpha: float
    mde: float
    se: float = math.nan
    df: float = math.nan
    method: str = "paired t"  # or "blocked: pooled error of k arms"
    adjustment: str = "Holm"  # how p_adj was adjusted in its family: Holm | Dunnett
    p_adj: float = math.nan
    p_tost_adj: float = math.nan
    seeds_to_decide: dict | None = None  # {"difference": n detecting δ, "equivalence": n showing ±δ at Δ = 0}
    error_arms: int = 2  # arms whose residuals make the error estimate (2: the pair itself)
    m_family: int = 1  # comparisons in the family (the MDE's level is α/m)
    label: str = INCONCLUSIVE
    reason: str = ""
    ci_kind: str = "per comparison"  # or "simultaneous (Dunnett, k)": what the 95% interval covers
    own_error: dict | None = None  # the same pair on its own error, beside a pooled-error comparison

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def mde(sd: float, n: int, alpha: float = 0.05, power: float = 0.8, m: int = 1, df: float | None = None) -> float:
    """The smallest true difference a two-sided t-test at α/m detects with ``power``: exact (noncentral t) for n
    seeds, paired-difference spread ``sd`` and ``df`` error degrees of freedom (default n − 1)."""
    nu = n - 1 if df is None else df
    if n < 2 or nu < 1 or not (sd > 0):
        return math.nan
    level = alpha / m
    hi = sd
    for _ in range(60):
        reached = power_difference(hi, sd, n, level, nu)
        if not math.isfinite(reached):  # the noncentral t's tail is not computable this far out (df = 1)
            return math.nan
        if reached >= power:
            break
        hi *= 2
    from scipy import optimize  # scipy is a dependency; loaded with the first MDE

    try:
        return float(optimize.brentq(lambda e: power_difference(e, sd, n, level, nu) - power, 0.0, hi, xtol=1e-7))
    except ValueError:  # a NaN inside the bracket (same cause)
        return math.nan


def from_estimate(a: str, b: str, n: int, mean: float, se: float, df: float, delta: float, alpha: float = 0.05,
                  power: float = 0.8, m: int = 1, method: str = "paired t", error_arms: int = 2) -> Comparison:
    """A comparison from an estimate ``mean`` (B − A), its ``se`` and the error's ``df`` (unadjusted p, TOST);
    ``error_arms``: how many arms' residuals the error pools (2: the pair's own differences)."""
    sd = se * math.sqrt(n)
    detectable = mde(sd, n, alpha, power, m, df)
    if se == 0.0:  # identical differences in every pair (e.g. two arms with the same config)
        p = 0.0 if mean != 0 else 1.0
        p_tost = 0.0 if abs(mean) < delta else 1.0
        return Comparison(a, b, n, mean, sd, mean, mean, p, p_tost, delta, alpha, detectable, se, df, method,
                          error_arms=error_arms)
    st = _scipy_stats()
    tq = t_quantile(1 - alpha / 2, df)
    p = float(2 * st.t.sf(abs(mean / se), df))
    p_lower = float(st.t.sf((mean + delta) / se, df))  # H0: d <= -delta
    p_upper = float(st.t.cdf((mean - delta) / se, df))  # H0: d >= +delta
    return Comparison(a, b, n, mean, sd, mean - tq * se, mean + tq * se, p, max(p_lower, p_upper), delta, alpha,
                      detectable, se, df, method, error_arms=error_arms)


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
    return from_estimate(a, b, n, mean, float(d.std(ddof=1)) / math.sqrt(n), n - 1, delta, alpha, power, m)


def tost_p(c: Comparison, delta: float) -> float:
    """The TOST p-value of ``c`` at another margin ``delta`` (for the δ-sensitivity table)."""
    if not (c.se > 0):
        return (0.0 if abs(c.mean) < delta else 1.0) if c.se == 0 else math.nan
    st = _scipy_stats()
    return float(max(st.t.sf((c.mean + delta) / c.se, c.df), st.t.cdf((c.mean - delta) / c.se, c.df)))


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
    if c.n < 2 or math.isnan(c.p_adj):
        return INCONCLUSIVE, c.reason or "no test"
    ci = (f"Δ {c.mean:+.4f} [{c.ci_low:+.4f}, {c.ci_high:+.4f}], p_{c.adjustment} {c.p_adj:.3g}, "
          f"p_TOST,Holm {c.p_tost_adj:.3g} ({c.method}, ν={c.df:g})")
    significant, equivalent = c.p_adj < c.alpha, c.p_tost_adj < c.alpha
    if significant and equivalent:
        small = (DIMINISHING if steps else SMALL_DROP) if c.mean < 0 else SMALL_RISE
        return small, f"{ci}: a real change smaller than δ={c.delta}"
    if significant:
        return (DROP if c.mean < 0 else RISE), ci
    if equivalent:
        return EQUIVALENT, f"{ci}: within ±{c.delta} (a dead zone, measured)"
    need = c.seeds_to_decide or {}
    decide = "; ".join(f"≈{n} seeds would {what}" for what, n in (
        (f"detect a true Δ of δ={c.delta}", need.get("difference")),
        (f"show equivalence within ±{c.delta} if the true Δ is 0", need.get("equivalence"))) if n)
    return INCONCLUSIVE, (f"{ci}: neither different nor shown equivalent with n={c.n} seeds (minimum detectable "
                          f"effect {c.mde:.4f} nats at 80% power, level α/{c.m_family})"
                          + (f" — {decide}" if decide else ""))


def seeds_to_label(c: Comparison | dict, level: float, power: float = 0.8) -> dict:
    """Seeds per arm at which comparison ``c`` gets a label at level ``level`` (α/m in its family) with ``power``:
    ``{"difference": n detecting a true Δ of δ, "equivalence": n showing ±δ at a true Δ of 0}``. Each is the larger
    of what its pooled error needs (ν = (k − 1)(n − 1) for k arms) and what the pair's own error needs (paired t),
    since a pooled label stands only where the own error agrees (:func:`plelab.stats.blocked.agree`); None when a
    spread is missing or the need is beyond :data:`~plelab.stats.power.MAX_SEEDS`. The one "seeds needed" number
    the report, ``plelab plan`` and an inconclusive label all quote."""
    get = c.get if isinstance(c, dict) else lambda k: getattr(c, k)
    errors = [(get("sd"), get("error_arms") or 2)]
    own = get("own_error")
    if own and own.get("sd") is not None:
        errors.append((own["sd"], 2))
    out = {}
    for key, test in (("difference", "difference"), ("equivalence", "tost")):
        needs = [seeds_to_decide(test, sd, get("delta"), level, power, df_per_seed=(k - 1, -(k - 1)))
                 for sd, k in errors if sd is not None and sd > 0]
        out[key] = None if not needs or None in needs else max(needs)
    return out


def family_seeds(comparisons: list[Comparison | dict], alpha: float, power: float = 0.8) -> int | None:
    """Seeds per arm that decide every comparison of a family (one question): the largest :func:`seeds_to_label`
    need at α/m; None when one of them is beyond reach or unknown."""
    m = max(1, len(comparisons))
    needs = [n for c in comparisons for n in seeds_to_label(c, alpha / m, power).values()]
    return None if not needs or None in needs else max(needs)


def family(comparisons: list[Comparison], steps: bool = True, p_adj: list[float] | None = None,
           adjustment: str = "Holm") -> list[Comparison]:
    """Adjust a family of comparisons in place (Holm, or the given ``p_adj`` from another adjustment such as
    Dunnett's; equivalence always by Holm), add the seeds that would decide each, and label each."""
    p_adj = holm([c.p for c in comparisons]) if p_adj is None else p_adj
    for c, p, pt in zip(comparisons, p_adj, holm([c.p_tost for c in comparisons])):
        c.p_adj, c.p_tost_adj, c.adjustment = p, pt, adjustment
        c.m_family = len(comparisons)
        if c.n >= 2 and c.sd > 0:
            c.seeds_to_decide = seeds_to_label(c, c.alpha / len(comparisons))
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


def sensitivity(comparisons: list[Comparison], delta: float, steps: bool = True) -> list[dict]:
    """Each comparison's labels at ½δ, δ and 2δ: ``[{"a", "b", "labels": {"0.01": label, ...}}]``."""
    margins = (delta / 2, delta, 2 * delta)
    labels = [labels_at(comparisons, d, steps) for d in margins]
    return [{"a": c.a, "b": c.b, "labels": {f"{d:g}": ls[i] for d, ls in zip(margins, labels)}}
            for i, c in enumerate(comparisons)]


def noninferiority_p(c: Comparison, delta: float) -> float:
    """One-sided p of H0: true B − A ≥ ``delta`` (B worse than A by δ or more): small p shows B within δ of A."""
    if not (c.se > 0):
        return (0.0 if c.mean < delta else 1.0) if c.se == 0 else math.nan
    return float(_scipy_stats().t.cdf((c.mean - delta) / c.se, c.df))


def labels_at(comparisons: list[Comparison], delta: float, steps: bool = True) -> list[str]:
    """The labels a family would get with margin ``delta`` instead of its own (the δ-sensitivity table): the
    difference test is unchanged, TOST is recomputed at ``delta`` and Holm-adjusted across the family."""
    adjusted = holm([tost_p(c, delta) for c in comparisons])
    out = []
    for c, pt in zip(comparisons, adjusted):
        other = Comparison(**{**asdict(c), "delta": delta, "p_tost_adj": pt, "seeds_to_decide": None})
        out.append(label(other, steps)[0])
    return out


def within_group_spearman(groups: list[tuple[list[float], list[float]]], draws: int = 10_000,
                          seed: int = 0) -> dict:
    """Does x predict y *within* groups (arms)? The mean of the groups' Spearman ρ, and a permutation p-value that
    shuffles y within each group (two-sided, ``draws`` seeded draws).

    Pooling the runs of several arms into one correlation treats them as independent and lets the arms' own
    differences (what the config alone predicts) pass for prediction; shuffling within arms keeps those fixed,
    so only what x says about y beyond the arm counts. Groups with fewer than 3 runs or a constant x or y are
    left out. ``leave_one_out``: the mean ρ with each group left out in turn (how much it rests on one arm).
    """
    st = _scipy_stats()
    kept = [(st.rankdata(x), st.rankdata(y)) for x, y in groups
            if len(x) >= 3 and len(set(x)) > 1 and len(set(y)) > 1]
    if not kept:
        return {"rho": math.nan, "p": math.nan, "groups": 0, "runs": 0, "per_group": [], "leave_one_out": []}

    def rho(rx: np.ndarray, ry: np.ndarray) -> np.ndarray:  # rows of ry: draws
        cx, cy = rx - rx.mean(), ry - ry.mean(-1, keepdims=True)
        return (cy @ cx) / (np.sqrt((cx ** 2).sum()) * np.sqrt((cy ** 2).sum(-1)))

    rng = np.random.default_rng(seed)
    per_group = [float(rho(rx, ry[None])[0]) for rx, ry in kept]
    observed = float(np.mean(per_group))
    null = np.mean([rho(rx, rng.permuted(np.tile(ry, (draws, 1)), axis=1)) for rx, ry in kept], axis=0)
    p = (1 + int((np.abs(null) >= abs(observed) - 1e-12).sum())) / (1 + draws)
    # leave one group out: how much the mean rests on a single arm
    loo = [float(np.mean(per_group[:i] + per_group[i + 1:])) for i in range(len(per_group))] if len(kept) > 1 else []
    return {"rho": observed, "p": float(p), "groups": len(kept), "runs": sum(len(rx) for rx, _ in kept),
            "per_group": per_group, "leave_one_out": loo}
