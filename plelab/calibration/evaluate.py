"""Thresholds fitted on some configurations, error rates measured on the others.

A call's statistic ``s`` is turned into a verdict by two thresholds fitted on the training calls of one
decision point: ``hi`` = the largest score of a truly negative call and ``lo`` = the smallest of a truly
positive one (no training error). ``s > hi``: positive; ``s < lo``: negative; in between UNDECIDED. When the
training calls separate (``hi < lo``) one cut at the midpoint decides every call. A statistic in null units
also has a floor under ``hi``: :data:`NULL_FLOOR`, which its null alone exceeds about once in a thousand calls
(a handful of training negatives cannot set a positive threshold inside the null's own spread).

Held-out schemes (:data:`SCHEMES`): leave one configuration out (a regime's arm: every seed and pair of it),
leave one corpus out, leave one scale out, leave one dP out (does a threshold fitted at other table widths
transfer to this one?). For each scheme and decision point: false positives among truly
negative calls, false negatives among truly positive ones, wrong calls among decided ones, each with its
one-sided 95% Clopper–Pearson upper bound (0 errors in 59 calls bound the rate at 5%), the coverage (decided /
called: "always UNDECIDED" has coverage 0 and cannot look perfect), the same counted by configuration (a
configuration with any wrong call is wrong), and false positives per negative class. AUROC is the statistic's
(no threshold involved). Calls whose truth the finished runs do not decide are counted and never scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np

from plelab.calibration.features import Call
from plelab.sweeps.power import _scipy_stats

SCHEMES: dict[str, Callable[[Call], tuple]] = {
    "configuration": lambda c: (c.regime, c.config),
    "corpus": lambda c: (c.corpus,),
    "scale": lambda c: (c.scale,),
    "dP": lambda c: (c.dim,),
}
GOAL, STRETCH = 0.10, 0.05
# t_{0.999, 19}: a null-unit z whose sd comes from 20 null draws exceeds it with probability ≈ 0.001 under the null
NULL_FLOOR = 3.58


def upper_bound(errors: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper–Pearson upper bound on a rate with ``errors`` in ``n`` (1.0 when n = 0)."""
    if n == 0:
        return 1.0
    if errors >= n:
        return 1.0
    return float(_scipy_stats().beta.ppf(level, errors + 1, n - errors))


def auroc(scores: np.ndarray, truths: np.ndarray) -> float | None:
    """Probability that a random positive call scores above a random negative one (ties count ½)."""
    pos, neg = int(truths.sum()), int((~truths).sum())
    if not pos or not neg:
        return None
    ranks = _scipy_stats().rankdata(scores)
    return float((ranks[truths].sum() - pos * (pos + 1) / 2) / (pos * neg))


def fit_thresholds(scores: Iterable[float], truths: Iterable[bool],
                   floor: float | None = NULL_FLOOR) -> tuple[float, float] | None:
    """``(lo, hi)`` from training calls with known truth (None without both kinds); ``floor``: the lowest ``hi``
    may be (None for a statistic not in null units)."""
    s, t = np.asarray(list(scores), dtype=np.float64), np.asarray(list(truths), dtype=bool)
    if not t.any() or t.all():
        return None
    neg_max, lo = float(s[~t].max()), float(s[t].min())
    hi = neg_max if floor is None else max(neg_max, floor)
    if hi < lo:
        cut = (neg_max + lo) / 2 if floor is None else max((neg_max + lo) / 2, floor)
        return cut, cut
    return lo, hi


def decide(score: float, th: tuple[float, float] | None) -> bool | None:
    if th is None:
        return None
    lo, hi = th
    return True if score > hi else False if score < lo else None


@dataclass
class Rates:
    calls: int
    configurations: int
    positives: int
    negatives: int
    decided: int
    false_positives: int
    false_negatives: int
    wrong_configurations: int
    truth_undecided: int  # calls whose truth the finished runs leave open (not scored)
    fp_by_class: dict[str, list[int]]  # class -> [false positives, truly negative calls]
    positive_by_class: dict[str, list[int]]  # class -> [positive calls, all held-out calls, truth known or not]
    auroc: float | None

    @property
    def coverage(self) -> float:
        return self.decided / self.calls if self.calls else 0.0

    @property
    def wrong(self) -> int:
        return self.false_positives + self.false_negatives

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(coverage=self.coverage, wrong=self.wrong,
                 fp_rate=self.false_positives / self.negatives if self.negatives else None,
                 fn_rate=self.false_negatives / self.positives if self.positives else None,
                 fp_upper=upper_bound(self.false_positives, self.negatives),
                 fn_upper=upper_bound(self.false_negatives, self.positives),
                 wrong_upper=upper_bound(self.wrong, self.decided),
                 wrong_configurations_upper=upper_bound(self.wrong_configurations, self.configurations))
        return d


def held_out(calls: list[Call], scheme: str, score: Callable[[Call], float] = lambda c: c.score,
             where: Callable[[Call], bool] = lambda c: True, floor: float | None = NULL_FLOOR) -> Rates:
    """Error rates of ``calls`` (one kind, one decision point) when each group of ``scheme`` is called with
    thresholds fitted on the other groups; ``where``: count only these held-out calls (e.g. one regime's)."""
    key = SCHEMES[scheme]
    known = [c for c in calls if c.truth is not None]
    predictions: list[tuple[Call, bool | None]] = []  # every held-out call, its truth known or not
    for group in sorted({key(c) for c in calls if where(c)}):
        train = [c for c in known if key(c) != group]
        th = fit_thresholds([score(c) for c in train], [c.truth for c in train], floor)
        predictions += [(c, decide(score(c), th)) for c in calls if key(c) == group and where(c)]
    scored = [(c, p) for c, p in predictions if c.truth is not None]
    fp = sum(p is True and not c.truth for c, p in scored)
    fn = sum(p is False and c.truth for c, p in scored)
    wrong_cfg = {(c.regime, c.config) for c, p in scored if p is not None and p != c.truth}
    by_class: dict[str, list[int]] = {}
    positive: dict[str, list[int]] = {}
    for c, p in predictions:
        positive.setdefault(c.cls, [0, 0])
        positive[c.cls][0] += p is True
        positive[c.cls][1] += 1
        if c.truth is False:
            by_class.setdefault(c.cls, [0, 0])
            by_class[c.cls][0] += p is True
            by_class[c.cls][1] += 1
    s = np.array([score(c) for c, _ in scored], dtype=np.float64)
    t = np.array([bool(c.truth) for c, _ in scored], dtype=bool)
    return Rates(len(scored), len({(c.regime, c.config) for c, _ in scored}), int(t.sum()), int((~t).sum()),
                 sum(p is not None for _, p in scored), fp, fn, len(wrong_cfg),
                 sum(c.truth is None for c, _ in predictions), by_class, positive, auroc(s, t) if len(s) else None)


def fractions(calls: list[Call]) -> list[float]:
    return sorted({c.fraction for c in calls})


def time_curve(calls: list[Call], kind: str, scheme: str = "configuration",
               score: Callable[[Call], float] = lambda c: c.score, floor: float | None = NULL_FLOOR) -> list[dict]:
    """Per decision point: when (fraction, tokens, tokens per row) and the held-out rates of ``kind``."""
    out = []
    mine = [c for c in calls if c.call == kind]
    for f in fractions(mine):
        at = [c for c in mine if c.fraction == f]
        out.append({"fraction": f, "tokens": int(np.median([c.tokens for c in at])),
                    "tokens_per_row": float(np.median([c.tokens_per_row for c in at])),
                    **held_out(at, scheme, score, floor=floor).to_dict()})
    return out


def earliest(curve: list[dict], bound: float) -> dict | None:
    """The first decision point whose wrong-call upper bound is ≤ ``bound`` (None if none is)."""
    return next((p for p in curve if p["wrong_upper"] <= bound and p["decided"]), None)


def shipped_thresholds(calls: list[Call]) -> dict[str, list[dict]]:
    """Per call kind, per decision point: thresholds fitted on every call with known truth (what the verdict
    uses), with the held-out rates they were measured to have."""
    out: dict[str, list[dict]] = {}
    for kind in ("LEARNED", "USED", "BENEFIT"):
        mine = [c for c in calls if c.call == kind and c.truth is not None]
        rows = []
        for f in fractions(mine):
            at = [c for c in mine if c.fraction == f]
            th = fit_thresholds([c.score for c in at], [c.truth for c in at])
            if th is not None and all(math.isfinite(x) for x in th):
                rows.append({"fraction": f, "lo": th[0], "hi": th[1]})
        out[kind] = rows
    return out
