"""The calibrated verdict: threshold fitting, held-out error rates with their bounds, the truths read from
finished runs, and ``plelab calibrate --quick`` through the whole pipeline on real (tiny) runs."""

import json
import math

import numpy as np
import pytest

from plelab.calibration.evaluate import (
    NULL_FLOOR,
    TARGET,
    auroc,
    decide,
    earliest,
    fit_thresholds,
    held_out,
    minmax_thresholds,
    rates,
    unit_of,
    upper_bound,
)
from plelab.calibration.features import Call
from plelab.calibration.planted import planted_tokens, write_planted
from plelab.calibration.truth import benefit_truth, used_truth
from plelab.cli import main
from plelab.config import resolve_config
from plelab.diagnostics import verdict as V
from plelab.errors import ConfigError
from plelab.model.init import build_model


def test_clopper_pearson_upper_bounds():
    assert upper_bound(0, 59) == pytest.approx(1 - 0.05 ** (1 / 59)) and upper_bound(0, 59) < 0.05
    assert upper_bound(0, 58) > 0.05  # 59 error-free calls are what a 5% bound needs
    assert upper_bound(0, 0) == 1.0 and upper_bound(3, 3) == 1.0
    assert upper_bound(2, 40) > 2 / 40


def test_auroc_counts_ties_as_half():
    t = np.array([True, True, False, False])
    assert auroc(np.array([3.0, 2.0, 1.0, 0.0]), t) == 1.0
    assert auroc(np.array([0.0, 1.0, 2.0, 3.0]), t) == 0.0
    assert auroc(np.array([1.0, 1.0, 1.0, 1.0]), t) == 0.5
    assert auroc(np.array([1.0, 2.0]), np.array([True, True])) is None


def test_old_minmax_thresholds_separate_overlap_and_floor():
    # separable: one cut between the classes, but never below the null floor
    assert minmax_thresholds([10.0, 12.0, 0.0, 1.0], [True, True, False, False]) == (5.5, 5.5)
    assert minmax_thresholds([5.0, 6.0, 0.0, 1.0], [True, True, False, False]) == (NULL_FLOOR, NULL_FLOOR)
    # overlapping: UNDECIDED between the smallest positive and the largest negative
    lo, hi = minmax_thresholds([2.0, 9.0, 0.0, 6.0], [True, True, False, False])
    assert (lo, hi) == (2.0, 6.0)
    assert decide(7.0, (lo, hi)) is True and decide(1.0, (lo, hi)) is False and decide(4.0, (lo, hi)) is None
    assert minmax_thresholds([1.0, 2.0], [True, True]) is None and decide(3.0, None) is None
    assert minmax_thresholds([5.0, 6.0, 0.0, 1.0], [True, True, False, False], floor=None) == (3.0, 3.0)


def test_quantile_thresholds_sit_at_the_stated_rank_of_configurations():
    neg, pos = [float(x) for x in range(39)], [float(100 + x) for x in range(39)]
    # 39 negatives: hi is the ceil(40 * 0.95) = 38th smallest (37.0); lo the floor(40 * 0.05) = 2nd smallest positive
    assert fit_thresholds(neg + pos, [False] * 39 + [True] * 39, floor=None) == ((37.0 + 101.0) / 2,) * 2
    lo, hi = fit_thresholds(neg + [20.0, 30.0, 40.0], [False] * 39 + [True] * 3, floor=None)
    assert hi == 37.0 and lo == -math.inf  # 3 positives cannot target 5%: never called negative
    assert fit_thresholds(neg[:18] + pos[:18], [False] * 18 + [True] * 18) == (-math.inf, math.inf)
    assert fit_thresholds(neg[:19] + pos[:19], [False] * 19 + [True] * 19, floor=None) == ((18.0 + 100.0) / 2,) * 2
    assert fit_thresholds(neg + pos, [False] * 39 + [True] * 39)[1] >= NULL_FLOOR
    # the unit is the configuration: 19 negative configurations of 4 calls each are 19, not 76 (too few for 5%
    # below 19; the weighted quantile at 19/19 is the largest call); 4 copies of 18 configurations still cannot call
    groups = [i // 4 for i in range(76)]
    scores = [float(g) + 0.1 * (i % 4) for i, g in enumerate(groups)]
    assert fit_thresholds(scores, [False] * 76, groups=groups) is None
    both = fit_thresholds(scores + [200.0] * 76, [False] * 76 + [True] * 76, floor=None,
                          groups=groups + [100 + g for g in groups])
    assert both == ((max(scores) + 200.0) / 2,) * 2 and max(scores) == 18.3
    assert fit_thresholds(scores[:72] + [200.0] * 72, [False] * 72 + [True] * 72,
                          groups=groups[:72] + [100 + g for g in groups[:72]]) == (-math.inf, math.inf)
    by_call = fit_thresholds(scores[:72] + [200.0] * 72, [False] * 72 + [True] * 72, floor=None)
    assert by_call == ((17.1 + 200.0) / 2,) * 2  # counted by call, 72 "units" would let it call at 5%


def test_quantile_rule_meets_its_target_on_fresh_configurations():
    """The conformal guarantee: a fresh negative exchangeable with n training negatives is called positive with
    probability (n + 1 - ceil((n + 1)(1 - TARGET))) / (n + 1) = 5% at n = 39; the min/max rule's is 1 / (n + 1)."""
    rng = np.random.default_rng(0)
    hits = {"quantile": 0, "minmax": 0}
    trials = 3000
    for _ in range(trials):
        neg, pos, fresh = rng.normal(0, 1, 39), rng.normal(1, 1, 39), rng.normal(0, 1)  # overlapping: no cut
        truths = [False] * 39 + [True] * 39
        for name, rule in (("quantile", fit_thresholds), ("minmax", minmax_thresholds)):
            hits[name] += decide(fresh, rule([*neg, *pos], truths, floor=None)) is True
    assert abs(hits["quantile"] / trials - TARGET) < 0.015
    assert abs(hits["minmax"] / trials - 1 / 40) < 0.01


def test_new_rule_against_the_old_on_the_same_folds():
    """Held out by configuration, the min/max rule can get at most one configuration of each truth wrong whatever
    the overlap (structural), and leaves the whole overlap UNDECIDED; the quantile rule's error sits at its target
    and it decides more. Held out by corpus, with corpus b's scores shifted up, both rules' errors exceed it."""
    rng = np.random.default_rng(1)
    calls = []
    for corpus, shift in (("a", 0.0), ("b", 1.5)):
        for i in range(40):
            for truth, mean in ((False, 0.0), (True, 2.0)):
                centre = rng.normal(mean + shift, 1.0)  # one configuration: its 3 seeds' calls correlated
                cls = "real" if truth else "iid"
                calls += [_call(f"{cls}{i}", centre + rng.normal(0, 0.2), truth, cls, corpus) for _ in range(3)]
    for seed_calls in (calls, [c for c in calls if c.corpus == "a"]):
        old = held_out(seed_calls, "configuration", floor=None, rule="minmax")
        new = held_out(seed_calls, "configuration", floor=None, rule="quantile")
        assert old.false_positives <= 1 and old.false_negatives <= 1  # whatever the data
        assert new.decided > old.decided  # the old rule leaves the whole overlap UNDECIDED
        assert new.false_positives / new.negatives <= TARGET + 1 / new.negatives
        assert new.false_negatives / new.positives <= TARGET + 1 / new.positives
    shifted = held_out(calls, "corpus", floor=None, where=lambda c: c.corpus == "b")
    assert shifted.false_positives / shifted.negatives > 2 * TARGET  # thresholds from corpus a do not transfer


def _call(config, score, truth, cls="real", corpus="a", scale="s", dim=16):
    return Call("LEARNED", f"{scale}-{corpus}", scale, corpus, config, cls, dim, [0, 1], 10, 0.5, 100, 1.0, score,
                truth)


def test_held_out_rates_count_errors_coverage_and_classes():
    calls = [_call("p1", 20.0, True), _call("p2", 30.0, True), _call("p3", 4.0, True),
             _call("n1", 0.0, False, "iid"), _call("n2", 1.0, False, "iid"), _call("n3", 25.0, False, "frozen"),
             _call("u1", 50.0, None, "slow")]
    r = held_out(calls, "configuration", rule="minmax").to_dict()
    # n3 held out: the others separate (negatives <= 1, positives >= 4), one cut at max(2.5, floor 3.58); n3 scores
    # 25 -> a false positive. p3 held out: negatives reach 25 (n3), positives start at 20 -> UNDECIDED in [20, 25];
    # p3 scores 4 < 20 -> a false negative
    assert r["false_positives"] == 1 and r["fp_by_class"]["frozen"] == [1, 1] and r["fp_by_class"]["iid"] == [0, 2]
    assert r["false_negatives"] == 1 and r["configurations"] == r["calls"] == 6 and r["truth_undecided"] == 1
    assert r["positive_by_class"]["slow"][1] == 1 and r["unit"] == "configuration"
    assert 0 < r["coverage"] <= 1 and r["wrong_upper"] > r["wrong"] / r["decided"]
    assert r["auroc"] == pytest.approx(held_out(calls, "corpus").auroc)  # the statistic's, not the threshold's
    # three positive and three negative configurations are too few for the quantile rule's 5%: nothing is decided
    assert held_out(calls, "configuration").decided == 0


def test_held_out_by_dp_fits_on_the_other_table_widths():
    # at dP 16 the classes separate widely; at dP 8 the positive scores low. Held out by dP, the dP-8 calls are
    # judged with dP 16's cut ((1 + 20) / 2 = 10.5): its positive is missed.
    calls = [_call("p16a", 20.0, True), _call("p16b", 30.0, True), _call("n16", 1.0, False, "iid"),
             _call("p8", 2.0, True, dim=8), _call("n8", 0.0, False, "iid", dim=8)]
    by_dp = held_out(calls, "dP", rule="minmax").to_dict()
    assert by_dp["false_negatives"] == 1 and by_dp["false_positives"] == 0 and by_dp["calls"] == 5
    # dP 16 held out: dP 8's calls alone (positive 2, negative 0) put the cut at the null floor, 3.58
    assert held_out(calls, "dP", where=lambda c: c.dim == 16, rule="minmax").to_dict()["decided"] == 3
    only8 = held_out(calls, "dP", where=lambda c: c.dim == 8, rule="minmax").to_dict()
    assert only8["calls"] == 2 and only8["false_negatives"] == 1


def test_a_configuration_is_one_unit_counted_by_majority():
    def unit(truths, predictions, cls="real"):
        calls = [_call("c", float(i), t, cls) for i, t in enumerate(truths)]
        return unit_of(("r", "c"), cls, list(zip(calls, predictions)), lambda c: c.score)

    all_wrong = unit([True] * 4, [False] * 4)  # four seeds, one configuration: one error, not four
    one_wrong = unit([True] * 4, [True, True, True, False])
    split = unit([True] * 4, [True, False, None, None])  # half decided (decided), half of those wrong (wrong)
    mostly_open = unit([True] * 4, [False, None, None, None])  # UNDECIDED by majority: not in the denominator
    tied_truth = unit([True, False, None], [True, True, True])
    assert (all_wrong.decided, all_wrong.wrong) == (True, True)
    assert (one_wrong.decided, one_wrong.wrong) == (True, False)
    assert (split.decided, split.wrong) == (True, True) and (mostly_open.decided, mostly_open.wrong) == (False, False)
    assert tied_truth.truth is None and tied_truth.positive
    r = rates([all_wrong, one_wrong, split, mostly_open, tied_truth])
    assert (r.configurations, r.decided, r.wrong, r.false_negatives, r.truth_undecided) == (4, 3, 2, 2, 1)
    assert r.calls == 16 and r.to_dict()["wrong_upper"] == upper_bound(2, 3)
    assert r.positive_by_class["real"] == [2, 5]  # one_wrong (3 of 4) and tied_truth (3 of 3) called positive


def test_correlated_calls_are_bounded_per_configuration():
    """Forty configurations, four seeds each, their calls identical within a configuration (perfectly correlated):
    the bound is the one of configurations, not of 4x as many calls, which would be tighter than the data allow."""
    rng = np.random.default_rng(2)
    calls = []
    for i in range(20):
        for truth, mean in ((False, 0.0), (True, 9.0)):
            z = rng.normal(mean, 3.0)
            calls += [_call(f"{truth}{i}", z, truth, "real" if truth else "iid") for _ in range(4)]
    r = held_out(calls, "configuration").to_dict()
    assert r["calls"] == 160 and r["configurations"] == 40 and 0 < r["decided"] <= 40
    assert r["wrong_upper"] == upper_bound(r["wrong"], r["decided"])
    assert r["wrong_upper"] > upper_bound(4 * r["wrong"], 4 * r["decided"])  # what counting calls would claim
    assert r["negatives"] == r["positives"] == 20 and r["fp_by_class"]["iid"][1] == 20


def test_earliest_needs_coverage_and_names_its_looks():
    def point(fraction, wrong_upper, coverage, decided=10):
        return {"fraction": fraction, "wrong_upper": wrong_upper, "coverage": coverage, "decided": decided}

    curve = [point(0.125, 0.04, 0.2), point(0.25, 0.3, 0.9), point(0.375, 0.08, 0.5), point(0.5, 0.03, 0.7)]
    first = earliest(curve, 0.10)
    assert first["fraction"] == 0.375 and first["looks"] == 3 and first["of"] == 4 and first["coverage_floor"] == 0.5
    assert earliest(curve, 0.05)["looks"] == 4  # 0.125's bound is lower, but it decides only 20%
    assert earliest(curve, 0.01) is None and earliest([point(0.125, 0.0, 1.0, decided=0)], 0.1) is None


def test_truths_from_held_out_seeds():
    rng = np.random.default_rng(0)
    windows = rng.normal(0, 0.01, 64)  # the same windows for every seed: their spread is shared

    def seeds(means):
        return [m + windows + rng.normal(0, 0.001, 64) for m in means]

    assert used_truth(seeds([0.03, 0.032, 0.031]))[0] is True
    assert used_truth(seeds([0.0, 0.0005, -0.0005]))[0] is False
    assert used_truth(seeds([0.003, 0.005, 0.004]))[0] is None
    # the seeds are the unit: per-window errors alone would call this USED, the between-seed spread does not
    spread = seeds([0.001, 0.03, 0.002])
    assert used_truth(spread)[0] is None and "over 3 seeds × 64 disjoint windows" in used_truth(spread)[1]
    assert used_truth(seeds([0.03]))[0] is None  # one held-out seed: no between-seed error
    better = benefit_truth([4.00, 4.01, 4.02], {"no PLE": [4.05, 4.07, 4.06], "zero table": [4.04, 4.06, 4.05]})
    assert better[0] is True and "vs no PLE" in better[1] and "vs zero table" in better[1]
    same = benefit_truth([4.00, 4.01, 4.02], {"no PLE": [4.05, 4.07, 4.06], "zero table": [4.00, 4.01, 4.02]})
    assert same[0] is False  # equal to the zero table seed by seed: the branch helps, the table's content does not
    assert benefit_truth([4.0], {"no PLE": [4.1]})[0] is None


def test_gate_held_at_zero_closes_the_branch():
    cfg = resolve_config("cpu-tiny", ["ple.gate=scalar", "ple.gate_init=0", "ple.gate_learn=false"])
    model = build_model(cfg.model, cfg.ple, seed=0)
    gates = [p for n, p in model.named_parameters() if n.endswith("per_layer_gate")]
    assert gates and all(not p.requires_grad and float(p.abs().max()) == 0 for p in gates)
    with pytest.raises(ConfigError, match="ple.gate_learn=false"):
        resolve_config("cpu-tiny", ["ple.gate_learn=false"])


@pytest.fixture(scope="module")
def quick(background):
    """``plelab calibrate --quick --kinds ngram``, run beside the suite (tests/background.py). One other kind (the
    n-gram table: its rows are hash buckets, the case that differs most from PLE's) keeps it short; --quick itself
    covers every kind (test_quick_covers_every_kind_of_the_family)."""
    return background("quick_calibration") / "bench"


def test_quick_covers_every_kind_of_the_family():
    from plelab.calibration.benchmark import MECHANISMS, QUICK, arms
    assert QUICK.kinds == list(MECHANISMS) == ["value", "ngram", "modulation"]
    names = [a.name for a in arms(QUICK.dims, QUICK.kinds)]
    assert {f"{k}-{c}" for k in MECHANISMS for c in ("real", "iid")} <= set(names) and len(names) == 17


@pytest.mark.slow
@pytest.mark.background("quick_calibration")
def test_quick_calibration_runs_the_whole_pipeline(quick, capsys):
    result = json.loads((quick / "calibration.json").read_text())
    b = result["benchmark"]
    # 11 PLE arms (the no-PLE baseline and the two zero arms are BENEFIT's references, not called) and a real and an
    # i.i.d.-keyed n-gram table (issue 56): 13 arms, 10 called configurations
    assert b["quick"] and b["runs"] == 39 and b["configurations"] == 10
    assert b["kinds"] == ["ngram"]
    for regime in result["regimes"]:  # the facts each regime records (steps and seeds were once lost in a comment)
        assert regime["steps"] > 0 and regime["seeds"] == 3 and regime["runs"] == 39 and 0 not in regime["dims"]
    # LEARNED's weak positives (slow, small: 2 configurations) are reported apart, never scored
    assert b["calls"]["USED"] == b["calls"]["BENEFIT"] == 8 * 3 * 8 and b["calls"]["LEARNED"] == 6 * 3 * 8
    assert b["calls_apart"] == {"LEARNED": 2 * 3 * 8, "USED": 0, "BENEFIT": 0}
    # the other kind's calls never fit a threshold nor enter PLE's rates: 2 configurations × 8 decision points × 3
    # seeds (LEARNED: 3 cyclic seed pairs)
    assert b["calls_other_kinds"] == {"LEARNED": 2 * 3 * 8, "USED": 2 * 3 * 8, "BENEFIT": 2 * 3 * 8}
    calls = [json.loads(line) for line in (quick / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == sum(b["calls"].values()) + sum(b["calls_apart"].values()) + sum(
        b["calls_other_kinds"].values())
    assert {c["cls"] for c in calls} == {"real", "scalar", "slow", "small", "iid", "frozen", "gate0"}
    for c in calls:
        # frozen tables and closed gates never move: their agreement comes out 0 through diagnose's functions
        if c["call"] == "LEARNED" and c["cls"] in ("frozen", "gate0"):
            assert c["score"] == 0.0 and c["truth"] is False and not c["apart"]
        assert bool(c["apart"]) == (c["call"] == "LEARNED" and c["cls"] in ("slow", "small"))
        assert math.isfinite(c["score"])
        if c["call"] == "USED" and c["cls"] in ("iid", "gate0") or c["call"] == "BENEFIT" and c["cls"] == "gate0":
            assert c["truth"] is False and c["truth_reason"].startswith("by construction")
        elif c["call"] == "USED":  # a different intervention, on the other seeds' finals and other windows
            assert "bin-mean ablation" in c["truth_reason"] and "over 2 seeds × 64 disjoint windows" in \
                c["truth_reason"]
        elif c["call"] == "BENEFIT":  # against the no-PLE baseline and (PLE) the zero table, never the arm itself
            assert "vs no PLE" in c["truth_reason"]
            assert ("vs zero table" in c["truth_reason"]) == (c["mechanism"] == "ple")
    final_used = {c["config"]: c["truth"] for c in calls if c["call"] == "USED" and c["fraction"] == 1.0}
    assert final_used["real-dp16"] is True and final_used["iid-dp16"] is False
    assert all(final_used[f"{k}-iid"] is False for k in b["kinds"])  # not USED by construction, any kind
    # held out by mechanism: PLE's thresholds scored on each other kind, at every decision point
    for kind in ("LEARNED", "USED", "BENEFIT"):
        assert sorted(result["by_mechanism"][kind]) == ["ngram"]
        for points in result["by_mechanism"][kind].values():
            assert [p["fraction"] for p in points] == [k / 8 for k in range(1, 9)]
            # the real and the i.i.d.-keyed table (a truth the finished runs leave open is counted apart)
            assert all(p["configurations"] + p["truth_undecided"] == 2 for p in points)
    report = (quick / "report.md").read_text()
    assert "USED: held out by mechanism — ngram (thresholds fitted on PLE only)" in report
    points = result["curves"]["LEARNED"]["configuration"]
    assert [p["fraction"] for p in points] == [k / 8 for k in range(1, 9)]
    assert points[0]["tokens"] == 16 * 8 * 64 and points[-1]["tokens_per_row"] == pytest.approx(128 * 8 * 64 / 512)
    for kind in ("LEARNED", "USED", "BENEFIT"):  # an i.i.d.-id table is never called positive, held out
        for p in result["curves"][kind]["configuration"]:
            hits, n = p["positive_by_class"]["iid"]
            assert hits == 0 and n > 0
    for name in ("early paired Δ", "early loss slope"):
        assert len(result["baselines"][name]["configuration"]) == 8
    # every count is over configurations; 8 of them are too few for the quantile rule's 5% target: no threshold,
    # said why, nothing decided, no earliest point — while the old min/max rule is compared on the same folds
    assert result["threshold_rule"] == {"rule": "quantile", "target": 0.05, "unit": "configuration",
                                        "coverage_floor": 0.5}
    assert result["thresholds"] == {"LEARNED": [], "USED": [], "BENEFIT": []}
    assert "LEARNED: no threshold at any decision point: the quantile rule at a 5% target per side needs >= 19" \
        in report
    assert all(p["decided"] == 0 and p["configurations"] + p["truth_undecided"] == 6 for p in points)  # LEARNED: 2 apart
    assert result["earliest"]["LEARNED"]["goal"] is None and "none of the 8 decision points" in report
    rules = result["rules"]["LEARNED"]
    assert len(rules) == 8 and all(r["quantile"]["decided"] == 0 and r["minmax"]["configurations"] == 6 for r in rules)
    assert "Threshold rules on the same folds" in report and "configs (calls)" in report
    rel = result["reliability"]["USED"]["h32-embedded"]
    assert rel["unit"] == "configuration" and set(rel["schemes"]) == {"configuration", "dP"}
    assert len(rel["schemes"]["dP"]) == 8 and rel["schemes"]["dP"][0]["configurations"] <= 8
    assert "pipeline check" in report and "Baseline for BENEFIT: early paired Δ" in report
    assert "leave-one-corpus-out needs >= 2" in report
    assert "LEARNED: held out by dP" in report and len(result["curves"]["BENEFIT"]["dP"]) == 8  # dP 4 and 16
    assert ("i.i.d.-id configurations called positive (held out by configuration, all decision points): LEARNED 0 "
            "of") in report
    # LEARNED per frequency stratum: each half of the rows against its own null, thresholds fitted per stratum
    assert b["windows"] == 64 and result["planted"] is None
    learned = [c for c in calls if c["call"] == "LEARNED"]
    assert all(set(c["strata"]) == {"frequent", "rare"} for c in learned)
    assert all(c["strata"] == {"frequent": 0.0, "rare": 0.0} for c in learned if c["cls"] in ("frozen", "gate0"))
    assert "What each call claims, and what scores it" in report and "apart: LEARNED slow (weak positive" in report
    assert set(result["truths"]) == {"LEARNED", "USED", "BENEFIT"}
    assert [a["cls"] for a in result["apart"]] == ["slow", "small"] and len(result["apart"][0]["points"]) == 8
    assert {c["strata"]["frequent"] for c in learned if c["cls"] == "real"} != {c["score"] for c in learned
                                                                                 if c["cls"] == "real"}
    for name in ("frequent", "rare"):
        assert len(result["strata"][name]["curve"]) == 8
        assert f"LEARNED on the {name} half of the rows only" in report


@pytest.mark.slow
@pytest.mark.background("quick_calibration")
def test_quick_calibration_resumes_and_refuses_what_it_cannot_honour(quick, capsys, tmp_path):
    assert main(["calibrate", "--quick", "--kinds", "ngram", "--out", str(quick), "--no-progress", "--json"]) == 0
    assert "0 to run" in capsys.readouterr().out  # every run kept: nothing retrained
    before = V.SHIPPED.read_bytes()
    assert main(["calibrate", "--quick", "--write-thresholds", "--out", str(tmp_path / "x")]) == 2
    assert "never rewrites the shipped thresholds" in capsys.readouterr().err
    assert main(["calibrate", "--out", str(tmp_path / "y"), "--corpus", "kjv=/no/such.txt"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["calibrate", "--quick", "--out", str(tmp_path / "z"), "--seeds", "2"]) == 2
    assert ">= 3 seeds" in capsys.readouterr().err
    assert V.SHIPPED.read_bytes() == before and not (tmp_path / "x").exists()


def test_planted_corpus_gives_away_the_next_token(tmp_path):
    ids = planted_tokens(tokens=50_000, vocab=64, seed=3)
    assert ids.dtype == np.uint16 and ids.max() < 64 and (ids == planted_tokens(tokens=50_000, vocab=64, seed=3)).all()
    # each key's most frequent successor is its value: a row-specific rule, ~p of the time
    pairs = np.zeros((64, 64), dtype=np.int64)
    np.add.at(pairs, (ids[:-1], ids[1:]), 1)
    top = pairs.max(1) / np.maximum(pairs.sum(1), 1)
    assert (top > 0.7).sum() >= 28 and (top < 0.3).sum() >= 28  # half the ids are keys, the rest are not
    path = write_planted(tmp_path / "c" / "planted.npy", vocab=64)
    assert np.load(path).shape == (1 << 21,) and write_planted(path, vocab=64) == path


def test_planted_check_counts_the_runs_truth_against_the_construction():
    from plelab.calibration.commands import planted_check

    def benefit(cls, truth, corpus="planted", fraction=1.0):
        c = _call(f"{cls}-dp16", 1.0, truth, cls, corpus)
        c.call, c.fraction = "BENEFIT", fraction
        return c

    calls = [benefit("real", True), benefit("scalar", None), benefit("real", False), benefit("iid", False),
             benefit("real", True, fraction=0.5), benefit("real", False, corpus="kjv")]
    assert planted_check(calls) == {"calls": 3, "benefit": 1, "no_benefit": 1, "open": 1,
                                    "configurations": ["s-planted/real-dp16", "s-planted/scalar-dp16"]}
    assert planted_check(calls[3:]) is None


def test_monitor_records_where_its_checkpoints_sit(tmp_path):
    import plelab

    cfg = resolve_config("cpu-tiny")
    model = build_model(cfg.model, cfg.ple, seed=0)
    with pytest.raises(plelab.PlelabError, match="total_steps"):
        plelab.Monitor(model, tmp_path / "bad", total_steps=0)
    with plelab.Monitor(model, tmp_path / "m", every=0, total_steps=40):
        pass
    saved = json.loads((tmp_path / "m" / "monitor.json").read_text())
    assert saved["total_steps"] == 40 and saved["hidden_size"] == cfg.model.hidden_size


def test_beats_says_where_the_verdict_wins_and_where_neither_dominates():
    from plelab.calibration.report import _beats

    def point(wrong, decided, auc=0.9):
        return {"wrong": wrong, "decided": decided, "auroc": auc}

    def result(mine, base):
        return {"curves": {"BENEFIT": {"configuration": mine}}, "baselines": {"b": {"configuration": base}}}

    verdict = [point(1, 60), point(1, 70)]
    assert _beats(result(verdict, [point(2, 20), point(2, 30)]))[0].endswith(": the verdict beats it")
    line = _beats(result(verdict, [point(2, 20), point(2, 130)]))[0]  # more decided, more wrong: no dominance
    assert "better at 1, worse at 0, neither dominates at 1" in line and "neither dominates elsewhere" in line
    assert _beats(result(verdict, [point(0, 80), point(1, 70)]))[0].endswith("the verdict does NOT beat it")


def test_a_benchmark_folder_may_gain_dims_but_not_change_its_settings():
    from plelab.calibration.benchmark import Benchmark, extends, regime_spec

    old = regime_spec(Benchmark(dims=[4, 16]), "h32", "embedded")
    more = regime_spec(Benchmark(dims=[4, 8, 16]), "h32", "embedded")
    assert extends(old, more) and {a.name for a in old.arms} < {a.name for a in more.arms}
    assert not extends(old, regime_spec(Benchmark(dims=[4, 16], steps=160), "h32", "embedded"))
    assert not extends(old, regime_spec(Benchmark(dims=[4, 16]), "h64", "embedded"))
    changed = regime_spec(Benchmark(dims=[4, 8, 16]), "h32", "embedded")
    changed.arms[0].overrides = [*changed.arms[0].overrides, "train.lr=1e-3"]  # a finished arm, redefined
    assert not extends(old, changed)


def test_held_out_by_mechanism_fits_on_ple_and_scores_each_other_kind_by_configuration():
    from dataclasses import replace

    from plelab.calibration.evaluate import mechanism_rates
    ple = [_call("real-dp16", 20.0, True), _call("real-dp4", 30.0, True), _call("iid-dp16", 0.0, False, "iid"),
           _call("iid-dp4", 1.0, False, "iid")]
    # the n-gram table's real configuration scores high (a positive) and so does its i.i.d. one: thresholds fitted on
    # PLE call the i.i.d. one positive too — a false positive that only the held-out-by-mechanism rates show
    ngram = [replace(_call("ngram-real", 50.0, True), mechanism="ngram"),
             replace(_call("ngram-iid", 40.0, False, "iid"), mechanism="ngram"),
             replace(_call("ngram-iid", 42.0, False, "iid"), seeds=[1, 2], mechanism="ngram")]  # one config, 2 calls
    out = mechanism_rates(ple + ngram, rule="minmax")
    assert list(out) == ["ngram"] and len(out["ngram"]) == 1
    r = out["ngram"][0]
    assert r["fraction"] == 0.5 and r["positives"] == 1 and r["negatives"] == 1  # configurations, not calls
    assert r["false_negatives"] == 0 and r["false_positives"] == 1
