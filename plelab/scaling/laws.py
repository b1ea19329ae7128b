"""Scaling laws: ``L(N, D) = E + A / N^α + B / D^β`` for the baseline, each PLE arm as an effective-parameter
multiplier on it, and a check on held-out rungs.

- **The law** (Hoffmann et al. 2022, arXiv:2203.15556, "approach 3"): fitted in log space,
  ``log L ≈ LSE(a − α log N, b − β log D, e)`` with ``A = e^a, B = e^b, E = e^e``, by minimising the Huber loss
  (δ = 1e-3, theirs) of the residuals with L-BFGS from a grid of starts. ``N`` is the trunk's parameter count
  (PLE excluded), ``D`` the training tokens; every run is a point.
- **The multiplier** of an arm: ``L_arm(N, D) ≈ E + A / (m·N)^α + B / D^β`` with the baseline's law held fixed,
  ``m`` fitted by the same loss. ``m = 2`` means the arm's loss is the baseline's at twice the trunk.
- **Intervals**: a two-stage bootstrap — a replicate draws *seeds* with replacement as blocks (the runs of one
  seed stay together, so arms and sizes stay paired by seed), then draws each drawn seed's (N, D) cells with
  replacement (a handful of seeds alone gives too few distinct replicates). Percentile 95% intervals.
- **Held-out check**: the law is refitted without the largest trunk size and predicts each of its budgets;
  the 95% prediction interval is the bootstrap's spread of the prediction plus a draw of one run's residual
  scatter (the fit's RMS residual), and the measured mean over seeds is reported against it.
- A prediction beyond :data:`EXTRAPOLATION_LIMIT` × the largest fitted ``N`` or ``D`` carries a warning.

The law is only identified by several sizes *and* several budgets: :func:`fit_study` refuses fewer than
``min_sizes`` × ``min_budgets`` (4 × 3 by default). Each budget should be its own run (evaluations inside one
cosine run mix the schedule's position with the tokens seen; the fit reads each run's final loss only).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from plelab.errors import PlelabError

HUBER_DELTA = 1e-3
EXTRAPOLATION_LIMIT = 4.0
BOOTSTRAPS = 200
_BOUNDS = [(-20, 60), (-20, 60), (-10, 5), (0.0, 3.0), (0.0, 3.0)]  # a, b, e, alpha, beta
_GRID = [(a, b, e, al, be) for a in (0.0, 5.0, 10.0) for b in (0.0, 5.0, 10.0) for e in (-1.0, 0.5)
         for al in (0.2, 0.6) for be in (0.2, 0.6)]


@dataclasses.dataclass(frozen=True)
class Point:
    """One finished run: its arm, trunk parameters ``n``, training tokens ``d``, final validation ``loss``."""

    arm: str
    n: float
    d: float
    loss: float
    seed: int
    run: str = ""


@dataclasses.dataclass(frozen=True)
class Law:
    """``L(N, D) = E + A / N^alpha + B / D^beta``."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    def predict(self, n, d, m: float = 1.0) -> np.ndarray:
        n, d = np.asarray(n, dtype=np.float64), np.asarray(d, dtype=np.float64)
        return self.E + self.A / (m * n) ** self.alpha + self.B / d ** self.beta

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _huber(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    small = np.abs(r) <= HUBER_DELTA
    value = np.where(small, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA))
    return value, np.where(small, r, HUBER_DELTA * np.sign(r))


def _objective(theta: np.ndarray, x: np.ndarray, y: np.ndarray, logl: np.ndarray) -> tuple[float, np.ndarray]:
    a, b, e, alpha, beta = theta
    u = np.stack([a - alpha * x, b - beta * y, np.full_like(x, e)])
    top = u.max(axis=0)
    ex = np.exp(u - top)
    total = ex.sum(axis=0)
    r = top + np.log(total) - logl  # log-sum-exp of the three terms, minus log L
    value, dr = _huber(r)
    value, dr = value / HUBER_DELTA, dr / HUBER_DELTA  # in units of δ: L-BFGS's tolerances are absolute
    w = ex / total * dr  # softmax(u) · dHuber/dr
    grad = np.array([w[0].sum(), w[1].sum(), w[2].sum(), -(w[0] * x).sum(), -(w[1] * y).sum()])
    return float(value.sum()), grad


def fit_law(n: Sequence[float], d: Sequence[float], loss: Sequence[float],
            starts: Sequence[Sequence[float]] | None = None) -> Law:
    """The law fitted to points ``(n, d, loss)`` (see the module docstring); ``starts``: L-BFGS starts as
    ``(a, b, e, alpha, beta)`` (default: the 8 best of a grid of 72)."""
    x, y, logl = np.log(np.asarray(n, float)), np.log(np.asarray(d, float)), np.log(np.asarray(loss, float))
    if starts is None:  # L-BFGS from the grid's 8 best points (the rest start on worse ground)
        starts = sorted(_GRID, key=lambda t: _objective(np.asarray(t, float), x, y, logl)[0])[:8]
    from scipy.optimize import minimize  # heavy (≈ 0.6 s): a `plelab sweep` start would pay it before any fit

    best = None
    for start in starts:
        res = minimize(_objective, np.asarray(start, float), args=(x, y, logl), jac=True, method="L-BFGS-B",
                       bounds=_BOUNDS,
                       options={"ftol": 1e-12, "gtol": 1e-8, "maxiter": 500})
        if best is None or res.fun < best.fun:
            best = res
    a, b, e, alpha, beta = best.x
    return Law(E=math.exp(e), A=math.exp(a), alpha=float(alpha), B=math.exp(b), beta=float(beta))


def _theta(law: Law) -> np.ndarray:
    return np.array([math.log(law.A), math.log(law.B), math.log(law.E), law.alpha, law.beta])


def fit_multiplier(law: Law, n: Sequence[float], d: Sequence[float], loss: Sequence[float]) -> float:
    """The effective-parameter multiplier ``m`` of an arm's points on the baseline ``law`` (held fixed)."""
    n, d, logl = np.asarray(n, float), np.asarray(d, float), np.log(np.asarray(loss, float))

    from scipy.optimize import minimize_scalar  # heavy: loaded with the first fit, as in fit_law

    def cost(log_m: float) -> float:
        return float(_huber(np.log(law.predict(n, d, math.exp(log_m))) - logl)[0].sum())

    res = minimize_scalar(cost, bounds=(-12.0, 12.0), method="bounded", options={"xatol": 1e-6})
    return math.exp(res.x)


def _arrays(points: Sequence[Point]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.array([p.n for p in points]), np.array([p.d for p in points]), np.array([p.loss for p in points]))


def _replicates(points: Sequence[Point], boots: int, seed: int) -> tuple[str, list[list[Point]]]:
    """Bootstrap samples of ``points`` in two stages: seeds drawn with replacement as blocks (a seed's runs stay
    together), then each drawn seed's (N, D) cells drawn with replacement (the law's scatter about the cells)."""
    rng = np.random.default_rng(seed)
    seeds = sorted({p.seed for p in points})
    cells = {s: sorted({(p.n, p.d) for p in points if p.seed == s}) for s in seeds}
    runs = {(s, c): [p for p in points if p.seed == s and (p.n, p.d) == c] for s in seeds for c in cells[s]}
    reps = []
    for _ in range(boots):
        rep = []
        for s in rng.choice(seeds, size=len(seeds)):
            own = cells[int(s)]
            rep += [p for i in rng.choice(len(own), size=len(own)) for p in runs[(int(s), own[int(i)])]]
        reps.append(rep)
    how = (f"seeds as blocks ({len(seeds)} seeds), then (N, D) cells within each seed" if len(seeds) >= 2 else
           "(N, D) cells (one seed: seed noise is not separated from the law's scatter)")
    return how, reps


def _interval(values: Sequence[float]) -> list[float]:
    v = np.asarray([x for x in values if math.isfinite(x)], float)
    return [float(np.quantile(v, 0.025)), float(np.quantile(v, 0.975))] if len(v) else [math.nan, math.nan]


def _refit(law: Law, sample: Sequence[Point]) -> Law | None:
    """The law refitted to a bootstrap sample, started from the full fit; None below 5 distinct cells (the law has
    five parameters)."""
    if len({(p.n, p.d) for p in sample}) < 5:
        return None
    return fit_law(*_arrays(sample), starts=[_theta(law)])


def _rms(law: Law, points: Sequence[Point]) -> float:
    n, d, loss = _arrays(points)
    return float(np.sqrt(np.mean((law.predict(n, d) - loss) ** 2)))


def _grid_ok(points: Sequence[Point], min_sizes: int, min_budgets: int, what: str) -> None:
    sizes = sorted({p.n for p in points})
    budgets = {s: {p.d for p in points if p.n == s} for s in sizes}
    if len(sizes) < min_sizes or min(len(b) for b in budgets.values()) < min_budgets:
        per = ", ".join(f"{len(budgets[s])} at N={s:,.0f}" for s in sizes)
        raise PlelabError(f"{what} has {len(sizes)} trunk size(s) with token budgets {per or 'none'}: L(N, D) needs "
                          f"at least {min_sizes} sizes × {min_budgets} budgets each (a run per budget: "
                          "plelab sweep --steps …), or lower --min-sizes / --min-budgets")


def fit_study(points: Sequence[Point], baseline: str = "baseline", boots: int = BOOTSTRAPS, seed: int = 0,
              min_sizes: int = 4, min_budgets: int = 3, predict: Sequence[tuple[float, float]] = ()) -> dict:
    """Fit the baseline's law and every other arm's multiplier, with bootstrap intervals and the held-out check.

    Returns a JSON-ready dict: ``law`` (values and intervals), ``multipliers`` per arm, ``holdout`` (the largest
    size predicted from the others), ``predictions`` for the ``(N, D)`` pairs asked for, and ``warnings``.
    """
    base = [p for p in points if p.arm == baseline]
    _grid_ok(base, min_sizes, min_budgets, f"the baseline arm {baseline!r}")
    law = fit_law(*_arrays(base))
    how, reps = _replicates(points, boots, seed)
    laws = [_refit(law, [p for p in rep if p.arm == baseline]) for rep in reps]
    fitted = [x for x in laws if x is not None]
    out = {"baseline": baseline, "resampling": how, "bootstraps": len(fitted), "points": len(base),
           "sizes": sorted({p.n for p in base}), "budgets": sorted({p.d for p in base}),
           "law": {k: {"value": v, "ci": _interval([getattr(x, k) for x in fitted])} for k, v in law.to_dict().items()},
           "rms_residual": _rms(law, base),
           "multipliers": {}, "warnings": []}
    for arm in sorted({p.arm for p in points} - {baseline}):
        own = [p for p in points if p.arm == arm]
        ms = [fit_multiplier(x, *_arrays(a)) for x, rep in zip(laws, reps) if x is not None
              for a in [[p for p in rep if p.arm == arm]] if a]
        out["multipliers"][arm] = {"m": fit_multiplier(law, *_arrays(own)), "ci": _interval(ms), "points": len(own),
                                   "sizes": sorted({p.n for p in own})}
    for name, value, (lo, hi) in zip(("A", "B", "E", "alpha", "beta"), _theta(law), _BOUNDS):
        if min(value - lo, hi - value) < 1e-3:
            out["warnings"].append(f"{name} sits at the fit's bound ({name} = {getattr(law, name):.3g}): these runs do "
                                   f"not identify it, so the law is an empirical fit over their range only")
    out["holdout"] = holdout(base, boots, seed) if len(out["sizes"]) >= 4 else None  # 3 sizes left to fit
    n_max, d_max = max(out["sizes"]), max(out["budgets"])
    out["predictions"] = []
    for n, d in predict:
        lo, hi = _interval([x.predict(n, d) for x in fitted])
        factor = max(n / n_max, d / d_max)
        row = {"n": n, "d": d, "loss": float(law.predict(n, d)), "ci": [lo, hi], "extrapolation": factor}
        if factor > EXTRAPOLATION_LIMIT:
            out["warnings"].append(f"the prediction at N={n:.3g}, D={d:.3g} extrapolates {factor:,.0f}× beyond the "
                                   f"largest fitted N or D (more than {EXTRAPOLATION_LIMIT:g}×): the law is untested "
                                   "there")
        out["predictions"].append(row)
    return out


def holdout(base: Sequence[Point], boots: int = BOOTSTRAPS, seed: int = 0) -> dict:
    """Fit on every size but the largest, predict the largest size's budgets (see the module docstring)."""
    sizes = sorted({p.n for p in base})
    held, fit_on = sizes[-1], [p for p in base if p.n < sizes[-1]]
    law = fit_law(*_arrays(fit_on))
    rms = _rms(law, fit_on)
    _, reps = _replicates(fit_on, boots, seed)
    laws = [x for x in (_refit(law, r) for r in reps) if x is not None]
    noise = np.random.default_rng(seed + 1).normal(0.0, rms, size=len(laws))
    rows = []
    for d in sorted({p.d for p in base if p.n == held}):
        measured = [p.loss for p in base if p.n == held and p.d == d]
        lo, hi = _interval([x.predict(held, d) + e for x, e in zip(laws, noise)])
        mean = float(np.mean(measured))
        rows.append({"n": held, "d": d, "measured": mean, "seeds": len(measured),
                     "predicted": float(law.predict(held, d)), "pi": [lo, hi], "inside": bool(lo <= mean <= hi)})
    return {"fit_sizes": sizes[:-1], "held_out": held, "extrapolation": held / sizes[-2], "law": law.to_dict(),
            "rms_residual": rms, "rows": rows, "inside": sum(r["inside"] for r in rows), "of": len(rows)}


__all__ = ["BOOTSTRAPS", "EXTRAPOLATION_LIMIT", "Law", "Point", "fit_law", "fit_multiplier", "fit_study", "holdout"]
