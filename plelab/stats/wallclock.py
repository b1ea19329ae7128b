"""The wall-clock and out-of-distribution readings of a comparison study: is a table worth its step time, and does
its in-distribution gain hold on text from elsewhere?

**Wall clock.** A table costs step time (its lookup, its optimizer update), so the question a practitioner asks is
whether the same seconds spent on the baseline would do as well. The study trains the baseline at more steps too:
the ``budget`` arms, dp0 at m × the steps (m > 1; each its own run with its own schedule, so a budget's loss is
what a run of that length reaches, not a point inside a longer cosine). For a table arm A:

- its time ratio k_A = median over seeds of s_A / s_0, s the run's median training-step time
  (:func:`~plelab.sweeps.records.median_step_seconds`: evaluations and checkpoint diagnostics left out; every run
  of a study runs one thread beside the same number of workers, so the times compare);
- the baseline at equal time on seed i, L_0(k_A; i), interpolated linearly in log m between that seed's ladder
  points (m = 1: dp0 itself, and the budget arms). k_A < 1 is read at m = 1 (the baseline at its own budget:
  conservative for the table); k_A beyond the ladder is **outside** it and gets no label;
- d_i = L_A(i) − L_0(k_A; i), paired by seed; the arms' tests form one family (Holm, TOST at ±δ:
  :func:`plelab.stats.paired` / :func:`plelab.stats.family`), so "better at equal wall clock" is a labelled claim;
- the token-budget reading: m_A(i), the budget at which seed i's ladder reaches L_A(i) (log-linear between points):
  how many of the baseline's tokens the table is worth. Censored below 1 ("worse than the baseline at its own
  budget") and above the ladder ("more than its largest budget"); the median over seeds is reported where most
  seeds are inside.

**Out of distribution.** With ``data.ood`` every evaluation also scores fixed windows of text from outside the
training corpus (:mod:`plelab.data.ood`); a run's OOD loss is the mean of its last ``last_k`` such evaluations,
and each arm − baseline is compared as the in-distribution losses are (:func:`plelab.stats.blocked.analyse_family`,
Dunnett over the arms), so "lower loss, worse evals" shows as an arm ahead in distribution and not out of it.
"""

from __future__ import annotations

import math

import numpy as np

from plelab import stats
from plelab.config.aux_schema import AUX_KEYS
from plelab.stats import blocked
from plelab.sweeps.results import SweepResults
from plelab.sweeps.spec import BUDGET


def table_arms(res: SweepResults) -> list[str]:
    """The arms a comparison reads: every arm with a table (the main curve's dP > 0 and the other kinds), in the
    spec's order; controls, variants and the budget ladder left out."""
    return [a.name for a in res.spec.arms if a.alias_of is None and a.name in res.runs
            and ((a.family == "dP" and a.x > 0) or a.family in AUX_KEYS)]


def ladder(res: SweepResults) -> dict[int, list[tuple[float, float]]]:
    """Each seed's ``[(m, loss), ...]``: the baseline (m = 1) and every budget arm, sorted by m — only the seeds
    whose ladder is complete (a study's report is also read while its runs are still coming in)."""
    base = res.runs.get(res.spec.baseline, {})
    budgets = [a for a in res.spec.arms if a.family == BUDGET and a.name in res.runs]
    return {seed: sorted([(1.0, run.loss)] + [(a.x, res.runs[a.name][seed].loss) for a in budgets])
            for seed, run in base.items() if budgets and all(seed in res.runs[a.name] for a in budgets)}


def loss_at(points: list[tuple[float, float]], m: float) -> float | None:
    """The ladder's loss at budget ``m`` (linear in log m between points); None outside it."""
    for (m0, l0), (m1, l1) in zip(points, points[1:]):
        if m0 <= m <= m1:
            w = math.log(m / m0) / math.log(m1 / m0) if m1 > m0 else 0.0
            return l0 + w * (l1 - l0)
    return points[0][1] if m == points[0][0] else None


def budget_at(points: list[tuple[float, float]], loss: float) -> float:
    """The budget m at which the ladder reaches ``loss`` (log-linear between points, where the ladder falls):
    ``0.0`` when even m = 1 is below it (the arm is worse than the baseline at its own budget), ``inf`` when the
    largest budget does not reach it."""
    if loss >= points[0][1]:
        return 0.0
    for (m0, l0), (m1, l1) in zip(points, points[1:]):
        if l1 <= loss < l0:
            return m0 * math.exp(math.log(m1 / m0) * (l0 - loss) / (l0 - l1))
    return math.inf


def wallclock(res: SweepResults) -> dict:
    """``{"ladder": [m, ...], "arms": {arm: entry}}`` (see the module docstring); {} without budget arms."""
    spec, base = res.spec, res.runs.get(res.spec.baseline, {})
    steps = ladder(res)
    if not steps:
        return {}
    top = max(m for points in steps.values() for m, _ in points)
    out, comps = {}, []
    for arm in table_arms(res):
        seeds = sorted(s for s in set(res.runs[arm]) & set(steps))
        ratios = [res.runs[arm][s].step_seconds / base[s].step_seconds for s in seeds
                  if res.runs[arm][s].step_seconds and base[s].step_seconds]
        entry: dict = {"arm": arm, "seeds": len(seeds)}
        out[arm] = entry
        if not seeds or len(ratios) < len(seeds):
            why = ("no seed of this arm has the baseline's whole budget ladder yet" if not seeds else
                   "no step times recorded for every seed (records written before plelab kept them)")
            entry.update(label=stats.INCONCLUSIVE, reason=why)
            continue
        k = float(np.median(ratios))
        entry["time_ratio"] = k
        read = max(k, 1.0)
        worth = [budget_at(steps[s], res.runs[arm][s].loss) for s in seeds]
        inside = [w for w in worth if 1.0 <= w <= top]
        entry.update(worth_median=float(np.median(worth)) if len(inside) * 2 > len(worth) else None,
                     worth_below=sum(w < 1.0 for w in worth), worth_above=sum(w > top for w in worth))
        if read > top:
            entry.update(label="outside", reason=f"the arm's steps take {k:.2f}× the baseline's, beyond the ladder's "
                                                 f"largest budget ({top:g}×): no equal-time baseline was trained")
            continue
        diffs = [res.runs[arm][s].loss - loss_at(steps[s], read) for s in seeds]
        c = stats.paired(spec.baseline + f"@{read:.3g}x", arm, diffs, spec.delta, spec.alpha)
        comps.append(c)
    stats.family(comps, steps=False)
    for c in comps:
        out[c.b].update(c.to_dict())
    return {"ladder": sorted({m for points in steps.values() for m, _ in points}), "arms": out}


def ood_vs_baseline(res: SweepResults) -> tuple[list[dict], dict]:
    """Each table arm − baseline on the OOD loss, as one many-to-one family; ``([], {})`` without OOD losses."""
    losses = {arm: {s: r.ood_loss for s, r in by_seed.items() if r.ood_loss is not None}
              for arm, by_seed in res.runs.items()}
    if not losses.get(res.spec.baseline):
        return [], {}
    pairs = [(res.spec.baseline, a) for a in table_arms(res) if losses.get(a)]
    comps, how = blocked.analyse_family(losses, pairs, res.spec.delta, res.spec.alpha, steps=False, many_to_one=True)
    return [c.to_dict() for c in comps], how
