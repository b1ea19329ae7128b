"""The blocked design's statistics, validated: against statsmodels' OLS with arm and seed factors, against SciPy's
Dunnett test, and by Monte Carlo over many simulated studies (family-wise error under the null, power at the stated
effect, TOST's error at the margin). Seeded; the whole file runs in well under a minute."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st

from plelab.stats import blocked, power

ALPHA = 0.05


def study(rng, arms: int, seeds: int, effects=None, sigma: float = 0.05, reps: int = 1) -> np.ndarray:
    """``[reps, arms, seeds]`` losses: a seed (block) effect shared by every arm, arm effects, noise."""
    effects = np.zeros(arms) if effects is None else np.asarray(effects)
    block = rng.normal(0, 0.2, (reps, 1, seeds))
    return 2.0 + effects[None, :, None] + block + rng.normal(0, sigma, (reps, arms, seeds))


def pooled(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Vectorised fit: arm means ``[reps, arms]``, σ̂² ``[reps]``, ν."""
    a, s = y.shape[1:]
    resid = y - y.mean(2, keepdims=True) - y.mean(1, keepdims=True) + y.mean((1, 2), keepdims=True)
    df = (a - 1) * (s - 1)
    return y.mean(2), (resid ** 2).sum((1, 2)) / df, df


def mc_bound(rate: float, reps: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / reps)


def test_the_pooled_fit_matches_statsmodels_ols_with_arm_and_seed_factors():
    smf = pytest.importorskip("statsmodels.formula.api")
    import pandas as pd

    rng = np.random.default_rng(0)
    y = study(rng, 4, 5, effects=[0, -0.03, 0.01, -0.05])[0]
    arms = [f"a{i}" for i in range(4)]
    fit = blocked.fit({a: dict(enumerate(row)) for a, row in zip(arms, y)}, arms)
    frame = pd.DataFrame([(arms[i], j, y[i, j]) for i in range(4) for j in range(5)], columns=["arm", "seed", "loss"])
    ols = smf.ols("loss ~ C(arm) + C(seed)", frame).fit()
    assert fit.df == ols.df_resid == 12
    assert fit.sigma2 == pytest.approx(ols.mse_resid, rel=1e-10)
    for i in range(1, 4):
        d, se = fit.contrast("a0", arms[i])
        test = ols.t_test(f"C(arm)[T.{arms[i]}] = 0")
        assert d == pytest.approx(float(test.effect[0]), rel=1e-10)
        assert se == pytest.approx(float(test.sd[0, 0]), rel=1e-10)


def test_dunnett_p_values_match_scipy_on_independent_groups():
    rng = np.random.default_rng(1)
    groups = [rng.normal(m, 1.0, 8) for m in (0.0, 0.3, 1.1, -0.9)]
    control, others = groups[0], groups[1:]
    df = sum(len(g) for g in groups) - len(groups)
    s2 = sum(((g - g.mean()) ** 2).sum() for g in groups) / df
    t = np.array([(g.mean() - control.mean()) / math.sqrt(s2 * 2 / 8) for g in others])
    ours = blocked.dunnett_p(t, df)
    theirs = st.dunnett(*others, control=control, rng=0).pvalue
    np.testing.assert_allclose(ours, theirs, atol=2e-3)
    c = blocked.dunnett_critical(3, df)
    assert blocked.dunnett_p(np.array([c, c, c]), df) == pytest.approx([ALPHA] * 3, abs=1e-3)


def test_many_to_one_family_wise_error_is_alpha_under_the_null():
    rng = np.random.default_rng(2)
    reps, arms, seeds = 4000, 5, 4
    means, s2, df = pooled(study(rng, arms, seeds, reps=reps))
    t = (means[:, 1:] - means[:, :1]) / np.sqrt(2 * s2 / seeds)[:, None]
    c = blocked.dunnett_critical(arms - 1, df)
    fwer = float((np.abs(t).max(1) > c).mean())
    assert abs(fwer - ALPHA) < mc_bound(ALPHA, reps), fwer  # exact, neither liberal nor conservative
    bonferroni_free = float((np.abs(t) > st.t.ppf(1 - ALPHA / 2, df)).any(1).mean())
    assert bonferroni_free > 2 * ALPHA  # what an uncorrected family would claim


def test_holm_over_consecutive_steps_keeps_the_family_wise_error():
    from plelab.stats import holm

    rng = np.random.default_rng(3)
    reps, arms, seeds = 3000, 5, 4
    means, s2, df = pooled(study(rng, arms, seeds, reps=reps))
    t = np.diff(means, axis=1) / np.sqrt(2 * s2 / seeds)[:, None]
    p = 2 * st.t.sf(np.abs(t), df)
    fwer = float(np.mean([min(holm(list(row))) < ALPHA for row in p]))
    assert fwer <= ALPHA + mc_bound(ALPHA, reps), fwer


def test_power_at_the_stated_effect_is_what_the_exact_formula_says():
    rng = np.random.default_rng(4)
    reps, arms, seeds, sigma = 4000, 4, 6, 0.05
    df = (arms - 1) * (seeds - 1)
    sd_pair = math.sqrt(2) * sigma
    effect = next(e for e in np.arange(0.001, 0.2, 0.0005)  # the effect the pooled test detects with power 0.8
                  if power.power_difference(e, sd_pair, seeds, ALPHA, df=df) >= 0.8)
    means, s2, _ = pooled(study(rng, arms, seeds, effects=[0, effect, 0, 0], sigma=sigma, reps=reps))
    t = (means[:, 1] - means[:, 0]) / np.sqrt(2 * s2 / seeds)
    hit = float((np.abs(t) > st.t.ppf(1 - ALPHA / 2, df)).mean())
    assert abs(hit - 0.8) < mc_bound(0.8, reps) + 0.001, hit


@pytest.mark.parametrize("n", [6, 20])
def test_exact_tost_and_difference_power_match_simulation(n):
    rng = np.random.default_rng(5 + n)
    reps, sigma, delta = 20000, 0.058, 0.02
    for mu in (0.0, delta):  # at the margin TOST's rejection rate is its error rate: at most α
        d = rng.normal(mu, sigma, (reps, n))
        m, se = d.mean(1), d.std(1, ddof=1) / math.sqrt(n)
        tc = st.t.ppf(1 - ALPHA, n - 1)
        rate = float((((m + delta) / se > tc) & ((m - delta) / se < -tc)).mean())
        exact = power.power_tost(mu, sigma, n, delta, ALPHA)
        assert abs(rate - exact) < mc_bound(max(exact, 0.01), reps), (mu, rate, exact)
        if mu == delta:
            assert exact <= ALPHA
    d = rng.normal(delta, sigma, (reps, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    rate = float((np.abs(t) > st.t.ppf(1 - ALPHA / 2, n - 1)).mean())
    assert abs(rate - power.power_difference(delta, sigma, n, ALPHA)) < mc_bound(0.5, reps)


def test_seeds_to_decide_at_the_measured_noise():
    # paired sd 0.058, δ = 0.02 (the numbers of the stored demo study): a dead-zone claim needs ~74 seeds
    n = power.seeds_to_decide("tost", 0.058, 0.02)
    assert power.power_tost(0, 0.058, n, 0.02) >= 0.8 > power.power_tost(0, 0.058, n - 1, 0.02)
    assert power.power_tost(0, 0.058, 6, 0.02) == pytest.approx(0.0034, abs=3e-4)
    assert power.seeds_to_decide("difference", 0.058, 0.02) < n
    blocked_n = power.seeds_to_decide("tost", 0.058, 0.02, df_per_seed=(5, -5))  # 6 arms share the error
    assert blocked_n <= n
    assert power.seeds_to_decide("tost", float("nan"), 0.02) is None
