"""The calibrated verdict: threshold fitting, held-out error rates with their bounds, the truths read from
finished runs, and ``plelab calibrate --quick`` through the whole pipeline on real (tiny) runs."""

import json
import math

import numpy as np
import pytest

from plelab.calibration.evaluate import NULL_FLOOR, auroc, decide, fit_thresholds, held_out, upper_bound
from plelab.calibration.features import Call
from plelab.calibration.planted import planted_tokens, write_planted
from plelab.calibration.truth import benefit_truth, used_truth
from plelab.cli import main
from plelab.config import resolve_config
from plelab.config.schema import TrainConfig
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


def test_thresholds_separate_overlap_and_floor():
    # separable: one cut between the classes, but never below the null floor
    assert fit_thresholds([10.0, 12.0, 0.0, 1.0], [True, True, False, False]) == (5.5, 5.5)
    assert fit_thresholds([5.0, 6.0, 0.0, 1.0], [True, True, False, False]) == (NULL_FLOOR, NULL_FLOOR)
    # overlapping: UNDECIDED between the smallest positive and the largest negative
    lo, hi = fit_thresholds([2.0, 9.0, 0.0, 6.0], [True, True, False, False])
    assert (lo, hi) == (2.0, 6.0)
    assert decide(7.0, (lo, hi)) is True and decide(1.0, (lo, hi)) is False and decide(4.0, (lo, hi)) is None
    assert fit_thresholds([1.0, 2.0], [True, True]) is None and decide(3.0, None) is None
    assert fit_thresholds([5.0, 6.0, 0.0, 1.0], [True, True, False, False], floor=None) == (3.0, 3.0)


def _call(config, score, truth, cls="real", corpus="a", scale="s", dim=16):
    return Call("LEARNED", f"{scale}-{corpus}", scale, corpus, config, cls, dim, [0, 1], 10, 0.5, 100, 1.0, score,
                truth)


def test_held_out_rates_count_errors_coverage_and_classes():
    calls = [_call("p1", 20.0, True), _call("p2", 30.0, True), _call("p3", 4.0, True),
             _call("n1", 0.0, False, "iid"), _call("n2", 1.0, False, "iid"), _call("n3", 25.0, False, "frozen"),
             _call("u1", 50.0, None, "slow")]
    r = held_out(calls, "configuration").to_dict()
    # n3 held out: the others separate (negatives <= 1, positives >= 4), one cut at max(2.5, floor 3.58); n3 scores
    # 25 -> a false positive. p3 held out: negatives reach 25 (n3), positives start at 20 -> UNDECIDED in [20, 25];
    # p3 scores 4 < 20 -> a false negative
    assert r["false_positives"] == 1 and r["fp_by_class"]["frozen"] == [1, 1] and r["fp_by_class"]["iid"] == [0, 2]
    assert r["false_negatives"] == 1 and r["calls"] == 6 and r["truth_undecided"] == 1
    assert r["positive_by_class"]["slow"][1] == 1 and r["wrong_configurations"] == 2
    assert 0 < r["coverage"] <= 1 and r["wrong_upper"] > r["wrong"] / r["decided"]
    assert r["auroc"] == pytest.approx(held_out(calls, "corpus").auroc)  # the statistic's, not the threshold's


def test_held_out_by_dp_fits_on_the_other_table_widths():
    # at dP 16 the classes separate widely; at dP 8 the positive scores low. Held out by dP, the dP-8 calls are
    # judged with dP 16's cut ((1 + 20) / 2 = 10.5): its positive is missed.
    calls = [_call("p16a", 20.0, True), _call("p16b", 30.0, True), _call("n16", 1.0, False, "iid"),
             _call("p8", 2.0, True, dim=8), _call("n8", 0.0, False, "iid", dim=8)]
    by_dp = held_out(calls, "dP").to_dict()
    assert by_dp["false_negatives"] == 1 and by_dp["false_positives"] == 0 and by_dp["calls"] == 5
    # dP 16 held out: dP 8's calls alone (positive 2, negative 0) put the cut at the null floor, 3.58
    assert held_out(calls, "dP", where=lambda c: c.dim == 16).to_dict()["decided"] == 3
    only8 = held_out(calls, "dP", where=lambda c: c.dim == 8).to_dict()
    assert only8["calls"] == 2 and only8["false_negatives"] == 1


def test_truths_from_held_out_seeds():
    assert used_truth([(0.02, 0.002), (0.03, 0.003)])[0] is True
    assert used_truth([(0.0, 0.001), (0.001, 0.001)])[0] is False
    assert used_truth([(0.005, 0.004), (0.004, 0.004)])[0] is None
    better = benefit_truth([4.00, 4.01, 4.02], {"zero": [4.05, 4.07, 4.06], "iid": [4.04, 4.06, 4.05]})
    assert better[0] is True and "vs zero" in better[1]
    same = benefit_truth([4.00, 4.01, 4.02], {"zero": [4.05, 4.07, 4.06], "iid": [4.00, 4.01, 4.02]})
    assert same[0] is False  # equal to the i.i.d. arm seed by seed: no benefit from the ids
    assert benefit_truth([4.0], {"zero": [4.1]})[0] is None


def test_gate_held_at_zero_closes_the_branch():
    cfg = resolve_config("cpu-tiny", ["ple.gate=scalar", "ple.gate_init=0", "ple.gate_learn=false"])
    model = build_model(cfg.model, cfg.ple, seed=0)
    gates = [p for n, p in model.named_parameters() if n.endswith("per_layer_gate")]
    assert gates and all(not p.requires_grad and float(p.abs().max()) == 0 for p in gates)
    with pytest.raises(ConfigError, match="ple.gate_learn=false"):
        resolve_config("cpu-tiny", ["ple.gate_learn=false"])


def test_shipped_thresholds_and_reliability():
    cal = V.calibration()
    assert {"thresholds", "regimes", "reliability"} <= set(cal)
    lo, hi, at = V.thresholds("LEARNED", 0.3)
    assert lo <= hi and hi >= NULL_FLOOR
    assert at == min((r["fraction"] for r in cal["thresholds"]["LEARNED"]), key=lambda f: abs(f - 0.3))
    big = V.verdict_reliability(2560, 262_144, 256, 0.1, 1e6)
    assert len(big) == 1 and big[0].startswith("outside the calibrated range") and "hidden size 2,560" in big[0]
    reg = cal["regimes"][0]
    near = V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], 0.5, 50.0)
    assert [line.split(" ")[0] for line in near] == ["LEARNED", "USED", "BENEFIT"]
    assert all("held-out calls (95% upper bound" in line for line in near)
    assert V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], None, 50.0)[0].startswith("outside")
    # the use test's window count is part of the regime: another count is said, the calibrated one is not
    assert V.calibrated_windows() == cal["benchmark"]["windows"] == 64 == TrainConfig().diag_windows
    fewer = V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], 0.5, 50.0, windows=32)
    assert len(fewer) == 4 and "ran on 32 validation windows" in fewer[-1] and "decide less often" in fewer[-1]
    assert V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], 0.5, 50.0, windows=64) == near


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrate") / "bench"
    assert main(["calibrate", "--quick", "--out", str(out), "--no-progress"]) == 0
    return out


def test_quick_calibration_runs_the_whole_pipeline(quick, capsys):
    result = json.loads((quick / "calibration.json").read_text())
    b = result["benchmark"]
    assert b["quick"] and b["runs"] == 30 and b["configurations"] == 8  # 10 arms, the two zero arms not called
    assert b["calls"]["LEARNED"] == b["calls"]["USED"] == b["calls"]["BENEFIT"] == 8 * 3 * 8
    calls = [json.loads(line) for line in (quick / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == sum(b["calls"].values())
    assert {c["cls"] for c in calls} == {"real", "scalar", "slow", "small", "iid", "frozen", "gate0"}
    for c in calls:  # frozen tables and closed gates never move: their agreement is 0 by construction
        if c["call"] == "LEARNED" and c["cls"] in ("frozen", "gate0"):
            assert c["score"] == 0.0 and c["truth"] is False
        assert math.isfinite(c["score"])
    points = result["curves"]["LEARNED"]["configuration"]
    assert [p["fraction"] for p in points] == [k / 8 for k in range(1, 9)]
    assert points[0]["tokens"] == 16 * 8 * 64 and points[-1]["tokens_per_row"] == pytest.approx(128 * 8 * 64 / 512)
    for kind in ("LEARNED", "USED", "BENEFIT"):  # an i.i.d.-id table is never called positive, held out
        for p in result["curves"][kind]["configuration"]:
            hits, n = p["positive_by_class"]["iid"]
            assert hits == 0 and n > 0
    for name in ("early paired Δ", "early loss slope"):
        assert len(result["baselines"][name]["configuration"]) == 8
    assert result["thresholds"]["LEARNED"] and result["thresholds"]["USED"]  # both truths occur: fitted
    report = (quick / "report.md").read_text()
    assert "pipeline check" in report and "Baseline for BENEFIT: early paired Δ" in report
    assert "leave-one-corpus-out needs >= 2" in report
    assert "LEARNED: held out by dP" in report and len(result["curves"]["BENEFIT"]["dP"]) == 8  # dP 4 and 16
    assert "i.i.d.-id tables called positive (held out by configuration, all decision points): LEARNED 0 of" in report
    # LEARNED per frequency stratum: each half of the rows against its own null, thresholds fitted per stratum
    assert b["windows"] == 64 and result["planted"] is None
    learned = [c for c in calls if c["call"] == "LEARNED"]
    assert all(set(c["strata"]) == {"frequent", "rare"} for c in learned)
    assert all(c["strata"] == {"frequent": 0.0, "rare": 0.0} for c in learned if c["cls"] in ("frozen", "gate0"))
    assert {c["strata"]["frequent"] for c in learned if c["cls"] == "real"} != {c["score"] for c in learned
                                                                                 if c["cls"] == "real"}
    for name in ("frequent", "rare"):
        assert len(result["strata"][name]["curve"]) == 8
        assert f"LEARNED on the {name} half of the rows only" in report


def test_quick_calibration_resumes_and_refuses_what_it_cannot_honour(quick, capsys, tmp_path):
    assert main(["calibrate", "--quick", "--out", str(quick), "--no-progress", "--json"]) == 0
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
