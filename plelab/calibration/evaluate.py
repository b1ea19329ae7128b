"""Thresholds fitted on some configurations, error rates measured on the others — counted by configuration.

**The unit.** Calls of one configuration (a regime's arm: its seeds, or its seed pairs) share the arm, the data
order and, for LEARNED, the runs themselves, so they are not independent; the decision points of one run are not
either. Every count, bound and AUROC here is over *configurations at one decision point*, each one unit:

- its truth: the majority truth of its calls whose truth the finished runs decide (a tie, or none decided: the
  configuration's truth is open — counted in ``truth_undecided``, never scored);
- decided: at least half of its scored calls are decided (UNDECIDED calls never pad a denominator: a configuration
  the verdict mostly leaves open is not counted among the decided ones);
- wrong: decided, and at least half of its decided calls disagree with their truth (a tie counts as wrong);
- its score (for AUROC): the median score of its scored calls.

A configuration's calls are thus counted once, by majority, with ties held against the verdict; the one-sided 95%
Clopper–Pearson bounds (:func:`upper_bound`) then treat configurations as independent draws, which they are to the
extent that arms of one regime are (they share a corpus and trunk size; held out by corpus or scale shows what that
sharing hides).

**The threshold rule** (:func:`fit_thresholds`, conformal quantiles). On the training configurations of a decision
point, each configuration weighing 1 (its calls 1/k each) and labelled by its majority truth: ``hi`` is the
``⌈(n₋+1)(1−TARGET)⌉``-th of the n₋ negative configurations' scores (in weighted order), ``lo`` the ``⌊(n₊+1)·
TARGET⌋``-th of the n₊ positive ones. If a held-out configuration is exchangeable with the training ones, its call
is a false positive (given it is negative) with probability ≤ TARGET, and likewise a false negative: the held-out
error is targeted by construction. Too few training configurations of a truth to meet the target (n < 1/TARGET − 1)
leave that side infinite: never called. ``hi`` is never below :data:`NULL_FLOOR`; when ``hi < lo`` one cut at their
midpoint decides every call (it keeps both guarantees). The old rule (:func:`minmax_thresholds`: ``hi`` = the
largest training negative, ``lo`` = the smallest positive) is kept to compare on the same folds: under leave-one-
configuration-out it can get at most one negative and one positive configuration wrong per decision point, whatever
the data — its "1 wrong" is structural, not measured, and its implied target (1/(n+1)) is never stated. Held out
by configuration, the quantile rule's count also follows from the ranks (about TARGET of each truth): it confirms
the construction. The test is held out by corpus, scale or dP, where configurations are not exchangeable — and the
held-out-by-corpus rate is what users are shown.

Held-out schemes (:data:`SCHEMES`): leave one configuration out, one corpus out (the user's corpus is never in the
benchmark: the rate users are shown), one scale out, one dP out. Exchangeability holds only for the first; the others
measure whether the thresholds transfer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np

from plelab.calibration.features import Call
from plelab.stats.power import _scipy_stats

SCHEMES: dict[str, Callable[[Call], tuple]] = {
    "configuration": lambda c: (c.regime, c.config),
    "corpus": lambda c: (c.corpus,),
    "scale": lambda c: (c.scale,),
    "dP": lambda c: (c.dim,),
}
GOAL, STRETCH = 0.10, 0.05
TARGET = 0.05  # the conformal rule's stated per-side error: false positives among negatives, negatives among positives
COVERAGE_FLOOR = 0.5  # the earliest decision point must decide at least this share of configurations
# t_{0.999, 19}: a null-unit z whose sd comes from 20 null draws exceeds it with probability ≈ 0.001 under the null
NULL_FLOOR = 3.58


def config_key(c: Call) -> tuple[str, str]:
    return c.regime, c.config


def upper_bound(errors: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper–Pearson upper bound on a rate with ``errors`` in ``n`` (1.0 when n = 0)."""
    if n == 0:
        return 1.0
    if errors >= n:
        return 1.0
    return float(_scipy_stats().beta.ppf(level, errors + 1, n - errors))


def auroc(scores: np.ndarray, truths: np.ndarray) -> float | None:
    """Probability that a random positive scores above a random negative (ties count ½)."""
    pos, neg = int(truths.sum()), int((~truths).sum())
    if not pos or not neg:
        return None
    ranks = _scipy_stats().rankdata(scores)
    return float((ranks[truths].sum() - pos * (pos + 1) / 2) / (pos * neg))


def majority(truths: list[bool]) -> bool | None:
    """The majority of ``truths`` (None: a tie, or none)."""
    yes = sum(truths)
    return None if 2 * yes == len(truths) else 2 * yes > len(truths)


def _units(scores, truths, groups) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per call: score, its configuration's majority truth, weight 1/k (k: the configuration's calls with known
    truth); calls of a configuration whose truths tie are dropped. ``groups`` None: every call is its own unit."""
    s, t = np.asarray(list(scores), dtype=np.float64), np.asarray(list(truths), dtype=bool)
    g = list(range(len(s))) if groups is None else list(groups)
    members: dict = {}
    for i, key in enumerate(g):
        members.setdefault(key, []).append(i)
    keep, label, weight = [], [], []
    for idx in members.values():
        m = majority([bool(t[i]) for i in idx])
        if m is not None:
            keep += idx
            label += [m] * len(idx)
            weight += [1.0 / len(idx)] * len(idx)
    return s[keep], np.asarray(label, dtype=bool), np.asarray(weight, dtype=np.float64)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, p: float) -> float:
    """The smallest value whose weighted share of values at or below it is ≥ ``p``."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(int(np.searchsorted(cum, p - 1e-12)), len(values) - 1)])


def fit_thresholds(scores: Iterable[float], truths: Iterable[bool], floor: float | None = NULL_FLOOR,
                   groups: Iterable | None = None, target: float = TARGET) -> tuple[float, float] | None:
    """``(lo, hi)`` by the conformal quantile rule (module doc) from training calls with known truth; ``groups``:
    each call's configuration (None: every call its own); ``floor``: the lowest ``hi`` may be (None for a statistic
    not in null units). ±inf: a side the training configurations are too few to call at ``target``. None without
    configurations of both truths."""
    s, t, w = _units(scores, truths, groups)
    if not t.any() or t.all():
        return None
    n_neg, n_pos = round(w[~t].sum()), round(w[t].sum())
    j_hi, j_lo = math.ceil((n_neg + 1) * (1 - target) - 1e-9), math.floor((n_pos + 1) * target + 1e-9)
    hi = math.inf if j_hi > n_neg else weighted_quantile(s[~t], w[~t], j_hi / n_neg)
    lo = -math.inf if j_lo < 1 else weighted_quantile(s[t], w[t], j_lo / n_pos)
    if floor is not None:
        hi = max(hi, floor)
    if hi < lo:
        cut = (hi + lo) / 2
        return cut, cut
    return lo, hi


def minmax_thresholds(scores: Iterable[float], truths: Iterable[bool], floor: float | None = NULL_FLOOR,
                      groups: Iterable | None = None, target: float = TARGET) -> tuple[float, float] | None:
    """The rule the verdict shipped with (kept to compare): ``hi`` = the largest training negative, ``lo`` = the
    smallest positive, no training error; separable training calls get one cut at the midpoint (never below
    ``floor``). ``groups`` and ``target`` are ignored."""
    s, t = np.asarray(list(scores), dtype=np.float64), np.asarray(list(truths), dtype=bool)
    if not t.any() or t.all():
        return None
    neg_max, lo = float(s[~t].max()), float(s[t].min())
    hi = neg_max if floor is None else max(neg_max, floor)
    if hi < lo:
        cut = (neg_max + lo) / 2 if floor is None else max((neg_max + lo) / 2, floor)
        return cut, cut
    return lo, hi


RULES = {"quantile": fit_thresholds, "minmax": minmax_thresholds}


def decide(score: float, th: tuple[float, float] | None) -> bool | None:
    if th is None:
        return None
    lo, hi = th
    return True if score > hi else False if score < lo else None


@dataclass
class Unit:
    """One held-out configuration at one decision point, its calls aggregated (module doc)."""

    key: tuple
    cls: str
    calls: int  # every held-out call, truth known or not
    scored: int  # calls with known truth
    truth: bool | None  # the majority truth of its scored calls (None: open)
    decided: bool
    wrong: bool
    positive: bool  # at least half of its calls are called positive
    score: float


def unit_of(key: tuple, cls: str, predictions: list[tuple[Call, bool | None]],
            score: Callable[[Call], float]) -> Unit:
    known = [(c, p) for c, p in predictions if c.truth is not None]
    made = [(c, p) for c, p in known if p is not None]
    decided = bool(made) and 2 * len(made) >= len(known)
    wrong = decided and 2 * sum(p != c.truth for c, p in made) >= len(made)
    positive = 2 * sum(p is True for _, p in predictions) >= len(predictions)
    truth = majority([bool(c.truth) for c, _ in known])
    mid = float(np.median([score(c) for c, _ in known])) if known else math.nan
    return Unit(key, cls, len(predictions), len(known), truth, decided and truth is not None,
                wrong and truth is not None, positive, mid)


@dataclass
class Rates:
    """Held-out error rates of one call kind at one decision point, every count over configurations."""

    calls: int  # held-out calls with known truth (the configurations' size, for information: never a denominator)
    configurations: int  # held-out configurations with a truth (scored)
    positives: int
    negatives: int
    decided: int
    false_positives: int
    false_negatives: int
    truth_undecided: int  # held-out configurations whose truth the finished runs leave open (not scored)
    fp_by_class: dict[str, list[int]]  # class -> [false-positive configurations, truly negative configurations]
    positive_by_class: dict[str, list[int]]  # class -> [configurations called positive, all held-out configurations]
    auroc: float | None  # over configurations (their median scores), no threshold involved
    unit: str = "configuration"

    @property
    def coverage(self) -> float:
        return self.decided / self.configurations if self.configurations else 0.0

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
                 wrong_upper=upper_bound(self.wrong, self.decided))
        return d


def held_out_units(calls: list[Call], scheme: str, score: Callable[[Call], float] = lambda c: c.score,
                   where: Callable[[Call], bool] = lambda c: True, floor: float | None = NULL_FLOOR,
                   rule: str = "quantile") -> list[Unit]:
    """Every held-out configuration of ``calls`` (one kind, one decision point), its calls decided with
    thresholds fitted (by ``rule``) on the configurations outside its ``scheme`` group; ``where``: only these."""
    key, fit = SCHEMES[scheme], RULES[rule]
    known = [c for c in calls if c.truth is not None]
    units = []
    for group in sorted({key(c) for c in calls if where(c)}):
        train = [c for c in known if key(c) != group]
        th = fit([score(c) for c in train], [c.truth for c in train], floor, [config_key(c) for c in train])
        units += decided_units([c for c in calls if key(c) == group and where(c)], th, score)
    return units


def decided_units(calls: list[Call], th, score: Callable[[Call], float] = lambda c: c.score) -> list[Unit]:
    """``calls`` decided with the thresholds ``th`` and grouped into their configurations (one unit each)."""
    mine: dict[tuple, list] = {}
    for c in calls:
        mine.setdefault(config_key(c), []).append((c, decide(score(c), th)))
    return [unit_of(k, preds[0][0].cls, preds, score) for k, preds in sorted(mine.items())]


def rates(units: list[Unit]) -> Rates:
    scored = [u for u in units if u.truth is not None]
    by_class: dict[str, list[int]] = {}
    positive: dict[str, list[int]] = {}
    for u in units:
        positive.setdefault(u.cls, [0, 0])
        positive[u.cls][0] += u.positive
        positive[u.cls][1] += 1
        if u.truth is False:
            by_class.setdefault(u.cls, [0, 0])
            by_class[u.cls][0] += u.wrong
            by_class[u.cls][1] += 1
    s = np.array([u.score for u in scored], dtype=np.float64)
    t = np.array([bool(u.truth) for u in scored], dtype=bool)
    return Rates(sum(u.scored for u in scored), len(scored), int(t.sum()), int((~t).sum()),
                 sum(u.decided for u in scored), sum(u.wrong and not u.truth for u in scored),
                 sum(u.wrong and bool(u.truth) for u in scored), len(units) - len(scored), by_class, positive,
                 auroc(s, t) if len(s) else None)


def held_out(calls: list[Call], scheme: str, score: Callable[[Call], float] = lambda c: c.score,
             where: Callable[[Call], bool] = lambda c: True, floor: float | None = NULL_FLOOR,
             rule: str = "quantile") -> Rates:
    """Error rates of ``calls`` (one kind, one decision point) held out by ``scheme``, counted by configuration."""
    return rates(held_out_units(calls, scheme, score, where, floor, rule))


def fractions(calls: list[Call]) -> list[float]:
    return sorted({c.fraction for c in calls})


def time_curve(calls: list[Call], kind: str, scheme: str = "configuration",
               score: Callable[[Call], float] = lambda c: c.score, floor: float | None = NULL_FLOOR,
               rule: str = "quantile") -> list[dict]:
    """Per decision point: when (fraction, tokens, tokens per row) and the held-out rates of ``kind``."""
    out = []
    mine = [c for c in calls if c.call == kind]
    for f in fractions(mine):
        at = [c for c in mine if c.fraction == f]
        out.append({"fraction": f, "tokens": int(np.median([c.tokens for c in at])),
                    "tokens_per_row": float(np.median([c.tokens_per_row for c in at])),
                    **held_out(at, scheme, score, floor=floor, rule=rule).to_dict()})
    return out


def earliest(curve: list[dict], bound: float, floor: float = COVERAGE_FLOOR) -> dict | None:
    """The first decision point whose wrong-configuration upper bound is ≤ ``bound`` while it decides at least
    ``floor`` of the configurations (None if none does), with ``looks``: how many decision points were examined to
    find it (each a look at the same runs: a minimum over looks is optimistic, and no correction is made for it)
    and ``of``: how many the curve has."""
    for i, p in enumerate(curve):
        if p["decided"] and p["wrong_upper"] <= bound and p["coverage"] >= floor:
            return {**p, "looks": i + 1, "of": len(curve), "coverage_floor": floor}
    return None


def shipped_thresholds(calls: list[Call], rule: str = "quantile") -> dict[str, list[dict]]:
    """Per call kind, per decision point: thresholds fitted on every configuration with known truth (what the
    verdict uses); a side the rule cannot call is written as None (never called). A point where neither side can
    be called is left out."""
    out: dict[str, list[dict]] = {}
    for kind in ("LEARNED", "USED", "BENEFIT"):
        mine = [c for c in calls if c.call == kind and c.truth is not None]
        rows = []
        for f in fractions(mine):
            at = [c for c in mine if c.fraction == f]
            th = RULES[rule]([c.score for c in at], [c.truth for c in at], groups=[config_key(c) for c in at])
            if th is not None and any(math.isfinite(x) for x in th):
                rows.append({"fraction": f, "lo": th[0] if math.isfinite(th[0]) else None,
                             "hi": th[1] if math.isfinite(th[1]) else None})
        out[kind] = rows
    return out


def rule_comparison(calls: list[Call], kind: str, scheme: str = "configuration") -> list[dict]:
    """Both threshold rules on the same folds, per decision point: wrong, decided and configurations of each."""
    out = []
    mine = [c for c in calls if c.call == kind]
    for f in fractions(mine):
        at = [c for c in mine if c.fraction == f]
        row: dict = {"fraction": f}
        for rule in RULES:
            r = held_out(at, scheme, rule=rule)
            row[rule] = {"wrong": r.wrong, "false_positives": r.false_positives, "false_negatives": r.false_negatives,
                         "decided": r.decided, "configurations": r.configurations}
        out.append(row)
    return out


def apart_summary(apart: list[Call], thresholds: dict[str, list[dict]]) -> list[dict]:
    """Calls reported apart (``Call.apart``), per call kind and class: why, and at each decision point how the
    fitted ``thresholds`` (:func:`shipped_thresholds`) call their configurations (each by the majority of its
    calls: positive, negative or undecided). Counts for reading, never a rate: these calls have no independent
    truth."""
    out = []
    for kind, cls in sorted({(c.call, c.cls) for c in apart}):
        mine = [c for c in apart if c.call == kind and c.cls == cls]
        rows = {r["fraction"]: r for r in thresholds.get(kind, [])}
        points = []
        for f in fractions(mine):
            row = rows.get(f)
            th = None if row is None else (-math.inf if row["lo"] is None else row["lo"],
                                           math.inf if row["hi"] is None else row["hi"])
            votes: dict[tuple, list[bool | None]] = {}
            for c in mine:
                if c.fraction == f:
                    votes.setdefault(config_key(c), []).append(decide(c.score, th))
            counts = {"positive": 0, "negative": 0, "undecided": 0}
            for v in votes.values():
                word = ("positive" if 2 * v.count(True) > len(v) else "negative" if 2 * v.count(False) > len(v)
                        else "undecided")
                counts[word] += 1
            points.append({"fraction": f, **counts})
        out.append({"call": kind, "cls": cls, "why": mine[0].apart,
                    "configurations": len({config_key(c) for c in mine}), "points": points})
    return out



def mechanism_rates(calls: list[Call], rule: str = "quantile") -> dict[str, list[dict]]:
    """Held out by mechanism: at each decision point, ``calls`` of one kind of verdict decided with thresholds fitted
    on PLE's configurations only (by ``rule``), scored on each other table kind's configurations, counted by
    configuration — whether the thresholds transfer to a kind they never saw. ``{kind: [{fraction, rates}]}``."""
    out: dict[str, list[dict]] = {}
    for f in fractions(calls):
        at = [c for c in calls if c.fraction == f]
        train = [c for c in at if c.mechanism == "ple" and c.truth is not None]
        th = RULES[rule]([c.score for c in train], [c.truth for c in train], NULL_FLOOR,
                         [config_key(c) for c in train])
        for mech in sorted({c.mechanism for c in at} - {"ple"}):
            theirs = [c for c in at if c.mechanism == mech]
            units = decided_units(theirs, th)
            out.setdefault(mech, []).append({"fraction": f, "tokens": int(np.median([c.tokens for c in theirs])),
                                             "tokens_per_row": float(np.median([c.tokens_per_row for c in theirs])),
                                             **rates(units).to_dict()})
    return out
