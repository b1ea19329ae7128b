"""Token-budget curves: does a PLE arm's gain over the baseline close with more tokens (a speed-up) or stay
(added capacity)?

For every arm of the main dP curve against the baseline, at each evaluation step both arms share on every
seed:

- the paired Δ(s) = L_arm(s) − L_base(s) over seeds, its mean and 95% t-interval (:func:`stats.paired`);
- the iso-loss step ratio r(s) = s_base / s: s_base is the step at which the baseline's own evaluation curve
  (linear between its evaluations) first reaches L_arm(s). When the baseline never gets there within its
  run, r(s) is censored: more than ``last / s``. A ratio of 2 means the baseline needs twice the tokens for
  the arm's loss.

The verdict compares the gain at the evaluation nearest half-way with the final one, paired by seed:
c = Δ(final) − Δ(half), so c > 0 means the gain shrank. The c's of all arms form one family (Holm, TOST at
±δ, the statistics of :mod:`plelab.stats`):

A *gain of interest* at a step is a significant drop there that is not shown smaller than δ (the label
"significant drop", unadjusted: it describes one point of the curve).

- "no established gain to track": no gain of interest at half-way or at the end, by the pair's own paired
  t (which can be wider than the blocked test of the main curve: a gain the main curve finds may still be
  unestablished here).
- "closing (a speed-up)": a gain of interest at half-way, and c > 0 significantly. Said "closed" when
  no gain of interest is left at the end.
- "staying (capacity)": a gain of interest at the end, and c equivalent to 0 within ±δ (or a real
  change smaller than δ).
- "growing": c < 0 significantly, so the gain widened with tokens.
- "inconclusive": none of these, with the seeds that would decide c.

Evaluations inside one cosine run mix the schedule's position with the tokens seen, so a closing gain is
evidence of a speed-up *within this schedule*. Runs at other token budgets (``plelab plan --target``)
settle what happens past it.
"""

from __future__ import annotations

import math

import numpy as np

from plelab import stats
from plelab.sweeps.results import SweepResults

CLOSING, CLOSED, STAYING, GROWING, NO_GAIN = ("closing (a speed-up)", "closed (a speed-up)", "staying (capacity)",
                                              "growing", "no established gain to track")


def _history(run) -> dict[int, float]:
    return {int(s): float(v) for s, v in run.val_history}


def iso_ratio(base: list[tuple[int, float]], loss: float, step: int) -> float:
    """Baseline steps to reach ``loss`` (linear between evaluations) divided by ``step``; ``inf`` if it never does."""
    prev = None
    for s, v in sorted(base):
        if v <= loss:
            if prev is None or prev[1] == v:
                return s / step
            ps, pv = prev
            return (ps + (pv - loss) / (pv - v) * (s - ps)) / step
        prev = (s, v)
    return math.inf


def _gain(diffs, delta, alpha) -> dict:
    """The paired gain at one step, labelled on its own (unadjusted: it describes a point of the curve)."""
    c = stats.paired("base", "arm", diffs, delta, alpha)
    return stats.family([c], steps=False)[0].to_dict()


def token_budget(res: SweepResults) -> dict:
    """``{arm: curve and verdict}`` for the main dP curve's arms against the baseline (see the module docstring)."""
    spec = res.spec
    base = spec.baseline
    arms = [a.name for a in sorted((a for a in spec.arms if a.family == "dP" and a.x > 0), key=lambda a: a.x)
            if a.name in res.runs and base in res.runs]
    out, changes = {}, []
    for arm in arms:
        seeds = sorted(set(res.runs[arm]) & set(res.runs[base]))
        hists = {x: {sd: _history(res.runs[x][sd]) for sd in seeds} for x in (arm, base)}
        common = sorted(set.intersection(*(set(h) for x in hists for h in hists[x].values()))) if seeds else []
        rows = []
        for s in common:
            d = [hists[arm][sd][s] - hists[base][sd][s] for sd in seeds]
            ratios = [iso_ratio(res.runs[base][sd].val_history, hists[arm][sd][s], s) for sd in seeds]
            g = _gain(d, spec.delta, spec.alpha)
            finite = [r for r in ratios if math.isfinite(r)]
            rows.append({"step": s, "delta": g["mean"], "ci_low": g["ci_low"], "ci_high": g["ci_high"],
                         "iso_ratio_median": float(np.median(ratios)) if len(finite) * 2 > len(ratios) else None,
                         "iso_censored": len(ratios) - len(finite), "seeds": len(seeds)})
        entry = {"arm": arm, "baseline": base, "seeds": len(seeds), "curve": rows}
        if len(common) < 2 or len(seeds) < 2:
            entry.update(label=stats.INCONCLUSIVE, reason=f"{len(common)} shared evaluation(s) over {len(seeds)} "
                         "seed(s): no curve to compare (set train.eval_every below train.steps / 2)")
            out[arm] = entry
            continue
        final = common[-1]
        half = min(common[:-1], key=lambda s: abs(s - final / 2))
        d_half = np.array([hists[arm][sd][half] - hists[base][sd][half] for sd in seeds])
        d_final = np.array([hists[arm][sd][final] - hists[base][sd][final] for sd in seeds])
        c = stats.paired(f"{arm}@{half}", f"{arm}@{final}", d_final - d_half, spec.delta, spec.alpha)
        changes.append(c)
        entry.update(half_step=half, final_step=final, gain_half=_gain(d_half, spec.delta, spec.alpha),
                     gain_final=_gain(d_final, spec.delta, spec.alpha))
        out[arm] = entry
    stats.family(changes, steps=False)
    for c in changes:
        entry = out[c.a.split("@")[0]]
        entry["change"] = c.to_dict()
        entry["label"], entry["reason"] = _verdict(entry, c)
    return out


def _significant_gain(g: dict) -> bool:
    """A gain of interest: a significant drop not shown smaller than δ."""
    return g["label"] == stats.DROP


def _verdict(entry: dict, c: stats.Comparison) -> tuple[str, str]:
    half, final = entry["gain_half"], entry["gain_final"]
    numbers = (f"Δ {half['mean']:+.4f} [{half['ci_low']:+.4f}, "
               f"{half['ci_high']:+.4f}] at step {entry['half_step']}, {final['mean']:+.4f} [{final['ci_low']:+.4f}, "
               f"{final['ci_high']:+.4f}] at step {entry['final_step']}; change in Δ {c.mean:+.4f} "
               f"[{c.ci_low:+.4f}, {c.ci_high:+.4f}], p_Holm {c.p_adj:.3g}, p_TOST,Holm {c.p_tost_adj:.3g}")
    if not _significant_gain(half) and not _significant_gain(final):
        return NO_GAIN, numbers + (f": no gain of interest half-way or at the end (that takes a significant drop, "
                                   f"paired t over {c.n} seeds, not shown smaller than δ = {c.delta})")
    if c.label in (stats.RISE,) and _significant_gain(half):
        return (CLOSING if _significant_gain(final) else CLOSED), numbers
    if c.label == stats.DROP:
        return GROWING, numbers
    if _significant_gain(final) and c.label in (stats.EQUIVALENT, stats.SMALL_RISE, stats.SMALL_DROP):
        return STAYING, numbers + f": the gain holds within ±{c.delta} from half-way to the end"
    return stats.INCONCLUSIVE, c.reason


__all__ = ["CLOSED", "CLOSING", "GROWING", "NO_GAIN", "STAYING", "iso_ratio", "token_budget"]
