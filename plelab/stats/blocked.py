"""The study as a randomised complete block design: seeds are blocks, arms are treatments.

Every arm of a sweep runs with the same seeds, and a seed fixes the data order and the trunk's initial weights for
every arm: the seed is a block. For the losses ``y [arms, seeds]`` of the seeds all arms share, the additive model
``y_ij = μ + a_i + b_j + e_ij`` gives the residuals ``e_ij = y_ij − ȳ_i· − ȳ_·j + ȳ_··`` and one pooled error
variance ``σ̂² = Σ e² / ν`` on ``ν = (arms − 1)(seeds − 1)`` degrees of freedom — every comparison is then judged
with all seeds of all arms, not with the ``n − 1`` of its own pair (3 seeds × 6 arms: ν = 10 instead of 2).

A contrast between arms i and k has ``d̂ = ȳ_i· − ȳ_k·`` and ``se = √(2σ̂²/s)``; ``t = d̂/se`` on ν.

- Many-to-one against the baseline (Dunnett 1955): the k contrasts share the baseline, so under equal variances
  their t's are correlated 0.5; the family-wise p of contrast i is ``P(max_j |T_j| ≥ |t_i|)`` for
  ``T ~ t_ν(0, R)``, ``R = ½(I + 11ᵀ)`` (the multivariate t, ``scipy.stats.multivariate_t``), and the family's
  intervals are simultaneous: ``d̂ ± c·se`` with ``P(max_j |T_j| < c) = 1 − α`` (:func:`dunnett_critical`), labelled
  so (``Comparison.ci_kind``).
- Steps along a curve: Holm over the steps' pooled-error p-values (the steps share arms, so they are correlated;
  Holm needs no assumption about that).
- TOST within ±δ on the same pooled error.

The pooled error assumes sphericity: every paired difference ``y_i − y_k`` has the same variance ``2σ²``. With a
few seeds no pretest can check that (each difference vector gives the test n − 1 df: paired sds 10× apart pass
Bartlett at 3 seeds), so the pretest does not license a label alone: every blocked comparison is also analysed on
its pair's own error (paired t, Holm), and **a label stands only where both analyses give it**; where they differ
the comparison is inconclusive, says both, and the seeds that would decide are the larger of the two estimates. The
pretest is Bartlett's test (``scipy.stats.bartlett``) across the ``arms·(arms − 1)/2`` pairwise difference vectors. They
share arms, so the test is approximate. Under sphericity it falls back in ≈ 2% of studies, fewer than its nominal
5%. One arm ten times noisier than the rest is caught at p ≈ 1e-14 with 6 seeds, where a Brown–Forsythe test on
the additive model's residuals gives p ≈ 0.09, because the noisy arm leaks into every residual through the seed
means. Where the check rejects at the 5% level, or the arms did not all run the same seeds, the analysis falls
back to per-comparison paired t-tests and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plelab import stats
from plelab.stats.power import _scipy_stats

EQUAL_VARIANCE_ALPHA = 0.05
MVT_SEED = 20_250_101  # the multivariate-t CDF is a randomised quadrature: seeded, so reports are reproducible


@dataclass
class BlockedFit:
    """The fitted additive model over the arms and the seeds every one of them ran."""

    arms: list[str]
    seeds: list[int]
    y: np.ndarray  # [arms, seeds]
    sigma2: float  # pooled residual variance σ̂²
    df: int  # (arms − 1)(seeds − 1)
    equal_variance_p: float  # Bartlett across the pairwise difference vectors (sphericity; NaN: not testable)

    @property
    def pooled(self) -> bool:
        """Whether the pooled error may be used (equal variances not rejected)."""
        return not (self.equal_variance_p < EQUAL_VARIANCE_ALPHA)

    def mean(self, arm: str) -> float:
        return float(self.y[self.arms.index(arm)].mean())

    def contrast(self, a: str, b: str) -> tuple[float, float]:
        """``(d̂ = ȳ_b − ȳ_a, its se from the pooled error)``."""
        return self.mean(b) - self.mean(a), math.sqrt(2 * self.sigma2 / len(self.seeds))

    @property
    def sd_paired(self) -> float:
        """The sd of a paired difference the pooled error implies (√(2σ̂²)), for power and seeds-needed."""
        return math.sqrt(2 * self.sigma2)


def fit(losses: dict[str, dict[int, float]], arms: list[str]) -> BlockedFit | None:
    """The additive fit over ``arms`` and the seeds all of them have; None with fewer than 2 arms or 2 seeds."""
    shared = sorted(set.intersection(*(set(losses.get(a, {})) for a in arms))) if arms else []
    if len(arms) < 2 or len(shared) < 2:
        return None
    y = np.array([[losses[a][s] for s in shared] for a in arms], dtype=np.float64)
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    df = (len(arms) - 1) * (len(shared) - 1)
    sigma2 = float((resid ** 2).sum() / df)
    p = math.nan
    diffs = [y[i] - y[k] for i in range(len(arms)) for k in range(i + 1, len(arms))]
    if len(shared) >= 3 and len(diffs) >= 2 and all(np.ptp(d) > 0 for d in diffs):
        p = float(_scipy_stats().bartlett(*diffs).pvalue)
    return BlockedFit(arms=list(arms), seeds=shared, y=y, sigma2=sigma2, df=df, equal_variance_p=p)


def _mvt_box(k: int, df: float, c: float) -> float:
    """``P(max_j |T_j| < c)`` for ``T ~ t_df(0, R)``, R with unit diagonal and 0.5 elsewhere."""
    st = _scipy_stats()
    if k == 1:
        return float(1 - 2 * st.t.sf(c, df))
    shape = np.full((k, k), 0.5) + 0.5 * np.eye(k)
    dist = st.multivariate_t(loc=np.zeros(k), shape=shape, df=df)
    return float(dist.cdf(np.full(k, c), lower_limit=np.full(k, -c), random_state=MVT_SEED))


def dunnett_p(t: np.ndarray, df: float) -> np.ndarray:
    """Family-wise (two-sided) p-values of k many-to-one t statistics with equal-n correlation 0.5."""
    t = np.abs(np.asarray(t, dtype=np.float64))
    return np.array([min(1.0, max(0.0, 1 - _mvt_box(len(t), df, ti))) for ti in t])


def dunnett_critical(k: int, df: float, alpha: float = 0.05) -> float:
    """The two-sided critical value c with ``P(max_j |T_j| < c) = 1 − alpha`` (k contrasts, correlation 0.5)."""
    st = _scipy_stats()
    from scipy import optimize  # scipy is a dependency; its root finder loads with the first critical value

    lo, hi = st.t.ppf(1 - alpha / 2, df), st.t.ppf(1 - alpha / (2 * k), df)  # unadjusted ≤ c ≤ Bonferroni
    if k == 1:
        return float(lo)
    return float(optimize.brentq(lambda c: _mvt_box(k, df, c) - (1 - alpha), lo * 0.999, hi * 1.001, xtol=1e-6))


def comparison(fit: BlockedFit, a: str, b: str, delta: float, alpha: float = 0.05, m: int = 1) -> stats.Comparison:
    """B − A on the pooled error of ``fit`` (unadjusted p and TOST; adjust with :func:`stats.family`)."""
    mean, se = fit.contrast(a, b)
    return stats.from_estimate(a, b, len(fit.seeds), mean, se, fit.df, delta, alpha, m=m,
                               method=f"blocked: pooled error of {len(fit.arms)} arms", error_arms=len(fit.arms))


def simultaneous(comps: list[stats.Comparison], df: float, alpha: float) -> None:
    """Give a many-to-one family on one pooled error Dunnett's simultaneous (1 − α) intervals, in place."""
    c = dunnett_critical(len(comps), df, alpha)
    for comp in comps:
        if comp.se > 0:
            comp.ci_low, comp.ci_high = comp.mean - c * comp.se, comp.mean + c * comp.se
        comp.ci_kind = f"simultaneous (Dunnett, {len(comps)})"


def agree(pooled: list[stats.Comparison], own: list[stats.Comparison]) -> int:
    """Keep a pooled-error label only where the pair's own-error analysis gives the same label; otherwise the
    comparison becomes inconclusive, saying both. Each comparison keeps its own-error reading in ``own_error`` and
    its seeds to decide become the larger of the two errors' needs (:func:`stats.seeds_to_label`). Returns the
    number of disagreements."""
    disagree = 0
    for c, o in zip(pooled, own):
        c.own_error = {k: getattr(o, k) for k in ("label", "mean", "sd", "ci_low", "ci_high", "p_adj", "p_tost_adj",
                                                   "df", "mde")}
        if c.n >= 2 and c.sd > 0:
            c.seeds_to_decide = stats.seeds_to_label(c, c.alpha / c.m_family)
        if c.label == o.label:
            continue
        disagree += 1
        need = c.seeds_to_decide or {}
        decide = "; ".join(f"≈{n} seeds would {what}" for what, n in (
            (f"detect a true Δ of δ={c.delta}", need.get("difference")),
            (f"show equivalence within ±{c.delta} if the true Δ is 0", need.get("equivalence"))) if n)
        c.reason = (f"the pooled error says '{c.label}' ({c.reason}); the pair's own error says '{o.label}' "
                    f"([{o.ci_low:+.4f}, {o.ci_high:+.4f}], p_Holm {o.p_adj:.3g}, p_TOST,Holm {o.p_tost_adj:.3g}, "
                    f"ν={o.df:g}): the analyses disagree, so no label stands" + (f" — {decide}" if decide else ""))
        c.label = stats.INCONCLUSIVE
    return disagree


def analyse_family(losses: dict[str, dict[int, float]], pairs: list[tuple[str, str]], delta: float, alpha: float,
                   steps: bool = True, many_to_one: bool = False) -> tuple[list[stats.Comparison], dict]:
    """The comparisons ``pairs`` (A, B) as one family, labelled, and how they were analysed.

    Blocked on the pooled error when the family's arms ran the same seeds (≥ 2), there are ≥ 3 of them and equal
    variances are not rejected; many-to-one families (``many_to_one``: every pair shares its A, the baseline) are
    then Dunnett-adjusted with simultaneous intervals, others Holm-adjusted; each label then stands only where the
    pair's own paired t (Holm) agrees (:func:`agree`). Otherwise each comparison is its own paired t-test,
    Holm-adjusted, and ``how["fallback"]`` says why.
    """
    pairs = [(a, b) for a, b in pairs if set(losses.get(a, {})) & set(losses.get(b, {}))]
    if not pairs:
        return [], {"method": "none", "comparisons": 0}
    arms = list(dict.fromkeys(x for pair in pairs for x in pair))
    seed_sets = {frozenset(losses[x]) for x in arms}
    fit_ = fit(losses, arms) if len(seed_sets) == 1 else None
    why = None
    if len(arms) < 3:
        why = "two arms: the pair's own paired t is the blocked analysis"
    elif fit_ is None:
        why = "the arms did not all run the same seeds (incomplete blocks)"
    elif not fit_.pooled:
        why = (f"unequal variances of the arms' paired differences (Bartlett p = {fit_.equal_variance_p:.3g} < "
               f"{EQUAL_VARIANCE_ALPHA}): a pooled error would misstate some comparisons")
    if why is None:
        comps = [comparison(fit_, a, b, delta, alpha, m=len(pairs)) for a, b in pairs]
        p_adj = None
        if many_to_one:
            p_adj = dunnett_p(np.array([c.mean / c.se if c.se > 0 else math.inf for c in comps]), fit_.df).tolist()
            simultaneous(comps, fit_.df, alpha)
        stats.family(comps, steps, p_adj=p_adj, adjustment="Dunnett" if many_to_one else "Holm")
        disagree = agree(comps, _paired_family(losses, pairs, delta, alpha, steps))
        how = {"method": "blocked", "arms": len(arms), "seeds": len(fit_.seeds), "df": fit_.df,
               "sigma": math.sqrt(fit_.sigma2), "equal_variance_p": fit_.equal_variance_p,
               "adjustment": "Dunnett" if many_to_one else "Holm", "comparisons": len(comps),
               "intervals": f"simultaneous (Dunnett, {len(comps)})" if many_to_one else "per comparison",
               "own_error_disagreements": disagree}
        return comps, how
    comps = _paired_family(losses, pairs, delta, alpha, steps)
    return comps, {"method": "paired t per comparison", "fallback": why, "adjustment": "Holm",
                   "comparisons": len(comps), "intervals": "per comparison"}


def _paired_family(losses: dict[str, dict[int, float]], pairs: list[tuple[str, str]], delta: float, alpha: float,
                   steps: bool) -> list[stats.Comparison]:
    """Each pair on its own error (paired t over the seeds both arms ran), Holm-adjusted and labelled."""
    comps = [stats.paired(a, b, [losses[b][s] - losses[a][s] for s in sorted(set(losses[a]) & set(losses[b]))],
                          delta, alpha, m=len(pairs)) for a, b in pairs]
    return stats.family(comps, steps)
