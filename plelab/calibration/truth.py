"""What each call claims, and the truth that scores it on the benchmark — never the call's own statistic.

============  ===========================================  =====================================================
call          the construct (what a positive claims)       its truth
============  ===========================================  =====================================================
LEARNED       the table holds id-specific structure        the class's construction: real ids (either gate)
              beyond its frequency-matched null            learn; i.i.d. ids, a frozen table and a gate held at
                                                           0 do not (their z is computed through the path
                                                           ``plelab diagnose`` runs, never assigned). The weak
                                                           positives (``slow``, ``small``, ``near0``) have no label
                                                           independent of how weak they are: reported apart,
                                                           never in a fitted threshold or a rate.
USED          the finished model relies on what each row   by construction where it holds — i.i.d. ids (rows
              says beyond what its frequency explains      exchangeable: no row says anything of its token) and
                                                           a gate held at 0 (the branch is identically 0): not
                                                           USED. Otherwise a *different* intervention on the
                                                           *other* seeds' final checkpoints and on *other*
                                                           windows (:func:`used_truth`).
BENEFIT       adding the table beats the same model        the other seeds' final losses (mean of the last 3
              without PLE, and its content beats the same  evaluations), paired by seed, against both references:
              branch with a zero table                     the no-PLE baseline (dP 0: the user's decision) and
                                                           the zero table (:func:`benefit_truth`). A gate held
                                                           at 0 is the trunk with inert parameters: no BENEFIT
                                                           by construction, in every regime.
============  ===========================================  =====================================================

**USED's intervention.** The call permutes rows within frequency bins on the run's first validation windows; the
truth replaces every row by the mean of its frequency bin (:func:`plelab.diagnostics.usage.ablation_losses`) on
validation windows that share no token with any window the evaluation or the use test reads
(:func:`plelab.data.tokens.disjoint_val_windows`), in the other seeds' final checkpoints. Both remove what
distinguishes a row from rows of similar frequency and keep what frequency explains — the construct — but by
different means (averaging vs exchange: the bin mean shrinks the rows' spread, a permutation keeps it), on other
runs and other text. The truth pools the other seeds' per-window changes d[s, w] with an error that counts both
sources of variation: se² = var_s(mean_w d)/n_s + var_w(mean_s d)/n_w, on a one-sided t with n_s − 1 degrees of
freedom (the seeds are the independent unit; the shared windows are the second term). USED when the mean ≥
DELTA_USE and its one-sided 95% lower bound > 0; not USED when its one-sided 95% upper bound < DELTA_USE; else
open (counted, never scored).

**BENEFIT's test.** A paired t interval per reference on the other seeds' finals (:func:`plelab.stats.
paired`): BENEFIT when both 95% intervals lie below 0; no BENEFIT when either reference is equivalent within
±DELTA_BENEFIT (TOST at α) or significantly better; else open. No arm is ever its own reference.

DELTA_USE and DELTA_BENEFIT are declared smallest effects of interest, not fitted numbers.
"""

from __future__ import annotations

import math

import numpy as np

from plelab.stats.power import _scipy_stats
from plelab.stats import paired

DELTA_USE = 0.005  # nats: the smallest reliance worth calling USED
DELTA_BENEFIT = 0.01  # nats: the smallest final-loss gain worth calling BENEFIT at CPU scale
ALPHA = 0.05

#: LEARNED's weak positives: scored apart (their label is the construction's, with no independent check)
WEAK = ("slow", "small", "near0")  # near0: a gate started at 0.01 may stay shut, and the table with it
#: classes that are not USED by construction, and why
NOT_USED = {"iid": "by construction: ids drawn independently of the text, rows exchangeable",
            "gate0": "by construction: the gate is held at 0, the branch is identically 0"}
#: classes that have no BENEFIT by construction, and why
NO_BENEFIT = {"gate0": "by construction: the gate is held at 0, the model is the trunk without PLE"}
#: BENEFIT's references, by name: the benchmark arm each one is (``{d}``: the call's dP)
REFERENCES = {"no PLE": "none-dp0", "zero table": "zero-dp{d}"}
#: what each call claims and what scores it (written into calibration.json and the report)
TRUTHS = {
    "LEARNED": "construct: id-specific structure beyond the frequency-matched null; truth: the class's construction "
               "(weak positives slow/small reported apart)",
    "USED": "construct: the finished model relies on what each row says beyond its frequency; truth: not USED by "
            "construction for i.i.d. ids and a gate held at 0, else each row replaced by its frequency bin's mean "
            "in the other seeds' final checkpoints, on validation windows disjoint from the use test's",
    "BENEFIT": "construct: adding the table beats the same model without PLE and its content beats a zero table; "
               "truth: the other seeds' final losses against the no-PLE baseline and the zero table, paired by "
               "seed; a gate held at 0 has none by construction",
}


def used_truth(deltas: list[np.ndarray]) -> tuple[bool | None, str]:
    """``deltas``: each held-out seed's per-window loss change ``[n_w]`` under the bin-mean ablation (the same
    windows for every seed). The module doc gives the error and the rule."""
    if len(deltas) < 2:
        return None, f"{len(deltas)} held-out seed(s): no between-seed error"
    d = np.stack([np.asarray(x, dtype=np.float64) for x in deltas])
    n_s, n_w = d.shape
    mean = float(d.mean())
    se = math.sqrt(d.mean(1).var(ddof=1) / n_s + (d.mean(0).var(ddof=1) / n_w if n_w > 1 else 0.0))
    t = float(_scipy_stats().t.ppf(1 - ALPHA, n_s - 1))
    what = (f"held-out final bin-mean ablation Δ {mean:+.4f}±{se:.4f} over {n_s} seeds × {n_w} disjoint windows "
            f"(t {t:.2f})")
    if mean >= DELTA_USE and mean - t * se > 0:
        return True, what
    if mean + t * se < DELTA_USE:
        return False, what
    return None, what + ": neither"


def benefit_truth(arm: list[float], refs: dict[str, list[float]]) -> tuple[bool | None, str]:
    """``arm``: held-out seeds' final losses; ``refs``: the same seeds' final losses of each reference arm."""
    if len(arm) < 2:
        return None, f"{len(arm)} held-out seed(s): no test"
    parts, better, not_better = [], [], []
    for name, ref in refs.items():
        c = paired(name, "arm", np.asarray(arm) - np.asarray(ref), DELTA_BENEFIT, ALPHA)
        parts.append(f"vs {name} {c.mean:+.4f} [{c.ci_low:+.4f}, {c.ci_high:+.4f}]")
        better.append(c.ci_high < 0)
        not_better.append(c.p_tost < ALPHA or c.ci_low > 0 or (c.se == 0 and c.mean == 0))
    what = f"held-out final Δ {', '.join(parts)} over {len(arm)} seeds"
    if all(better):
        return True, what
    if any(not_better):
        return False, what
    return None, what + ": neither"
