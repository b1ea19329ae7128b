"""What users are shown of the calibration: the held-out-by-corpus rates counted by configuration (or the worst
scheme, named), an older calibration.json that counted calls said so, and the calibrated range — the benchmark's
measured span on every axis, no widening factor (an H = 160 model against a benchmark of H <= 96 is outside)."""

import math

from plelab.calibration.evaluate import NULL_FLOOR, upper_bound
from plelab.config.schema import TrainConfig
from plelab.diagnostics import verdict as V


def test_shipped_thresholds_quote_rates_per_configuration_and_an_old_calibration_says_it_counted_calls(monkeypatch):
    cal = V.calibration()
    assert {"thresholds", "regimes", "reliability"} <= set(cal)
    lo, hi, at = V.thresholds("LEARNED", 0.3)
    assert lo <= hi and hi >= NULL_FLOOR
    assert at == min((r["fraction"] for r in cal["thresholds"]["LEARNED"]), key=lambda f: abs(f - 0.3))
    big = V.verdict_reliability(2560, 262_144, 256, 0.1, 1e6, windows=64, layers=32)
    assert len(big) == 1 and big[0].startswith("outside the calibrated range") and "H: 2,560 vs 32–96" in big[0]
    reg = cal["regimes"][0]
    near = V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], 0.5, 50.0, windows=64,
                                 layers=reg["layers"])
    # the shipped file counts configurations (refitted after issue 51): each line quotes held out by corpus
    assert cal["threshold_rule"]["unit"] == "configuration"
    assert [line.split(" ")[0] for line in near] == ["LEARNED", "USED", "BENEFIT"]
    assert all(" of a run — " in line and "held out by corpus" in line and "not measured" not in line
               for line in near), near
    # a calibration.json that counted calls (the file shipped before issue 51): its rates are not quoted
    counted = {**cal, "reliability": {k: {n: {**r, "unit": "call"} for n, r in v.items()}
                                      for k, v in cal["reliability"].items()}}
    monkeypatch.setattr(V, "calibration", lambda: counted)
    old = V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], 0.5, 50.0, windows=64,
                                layers=reg["layers"])
    assert all("not measured per configuration" in line and "rerun plelab calibrate" in line for line in old), old
    monkeypatch.undo()
    assert V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], None, 50.0, windows=64,
                                 layers=reg["layers"])[0].startswith("outside")
    # the use test's window count is an axis: another count than the benchmark's is outside the range
    assert V.calibrated_windows() == cal["benchmark"]["windows"] == 64 == TrainConfig().diag_windows
    fewer = V.verdict_reliability(reg["hidden_size"], reg["rows"], reg["dims"][-1], 0.5, 50.0, windows=32,
                                  layers=reg["layers"])
    assert len(fewer) == 1 and "use-test windows: 32 vs 64" in fewer[0]
    # the shipped benchmark spans H 32–96: a real H = 160 model is outside (the old factor-2 range called it inside)
    h160 = V.range_status(hidden_size=160, layers=2, rows=2048, dim=8, tokens_per_row=100, windows=64, fraction=1.0)
    assert not h160.inside and h160.line() == "outside the calibrated range (H: 160 vs 32–96)"


def _point(fraction, wrong, decided, configurations):
    return {"fraction": fraction, "wrong": wrong, "decided": decided, "configurations": configurations,
            "calls": 3 * configurations, "coverage": decided / configurations,
            "wrong_upper": upper_bound(wrong, decided), "truth_undecided": 0}


def _new_calibration(schemes_h96=("configuration",)) -> dict:
    """A calibration.json as ``plelab calibrate`` now writes it: two regimes, rates per configuration."""
    regimes = [{"name": "h32-embedded", "hidden_size": 32, "layers": 2, "rows": 512, "dims": [4, 16],
                "tokens_per_row": [40.0, 320.0]},
               {"name": "h96-planted", "hidden_size": 96, "layers": 3, "rows": 4096, "dims": [4, 16],
                "tokens_per_row": [5.0, 40.0]}]
    h32 = {"configuration": [_point(0.5, 0, 6, 8), _point(1.0, 0, 8, 8)],
           "corpus": [_point(0.5, 1, 4, 8), _point(1.0, 2, 6, 8)]}
    rel = {"h32-embedded": {"unit": "configuration", "schemes": h32},
           "h96-planted": {"unit": "configuration", "schemes": {s: h32["corpus"] for s in schemes_h96}}}
    return {"benchmark": {"windows": 64}, "regimes": regimes,
            "thresholds": {k: [{"fraction": 0.125, "lo": 0.0, "hi": 5.0}, {"fraction": 1.0, "lo": 0.0, "hi": None}]
                           for k in ("LEARNED", "USED", "BENEFIT")},
            "reliability": {k: rel for k in ("LEARNED", "USED", "BENEFIT")}}


def test_range_is_the_benchmarks_measured_span_on_every_axis():
    cal = _new_calibration()
    inside = dict(hidden_size=64, layers=2, rows=1024, dim=8, tokens_per_row=100.0, windows=64, fraction=0.5)
    status = V.range_status(**inside, cal=cal)
    assert status.inside and status.line().startswith("inside the calibrated range (H: 64 vs 32–96")
    assert [a.axis for a in status.axes] == list(V.AXES) and status.to_dict()["inside"] is True
    beyond = {"hidden_size": (160, "H: 160 vs 32–96"), "layers": (4, "layers: 4 vs 2–3"),
              "rows": (8192, "table rows: 8,192 vs 512–4,096"), "dim": (2, "dP: 2 vs 4–16"),
              "tokens_per_row": (1150.0, "tokens per row: 1,150 vs 5–320"),
              "windows": (32, "use-test windows: 32 vs 64"),
              "fraction": (0.05, "position in the run: 0.05 vs 0.125–1")}
    for key, (value, text) in beyond.items():
        out = V.range_status(**{**inside, key: value}, cal=cal)
        assert not out.inside and out.line() == f"outside the calibrated range ({text})", key
        unknown = V.range_status(**{**inside, key: None}, cal=cal)
        assert unknown.inside == (key == "windows"), key  # no use test: no USED/BENEFIT call rests on windows
    assert not V.range_status(**{**inside, "hidden_size": 16}, cal=cal).inside  # no widening factor either way
    assert V.range_status(**{**inside, "hidden_size": 96, "layers": 3}, cal=cal).inside  # the span's ends are in
    older = _new_calibration()
    for reg in older["regimes"]:
        del reg["layers"]
    missing = V.range_status(**inside, cal=older)  # a span the file does not record is not a span
    assert missing.line() == "outside the calibrated range (layers: 2 vs not measured by the benchmark)"


def test_reliability_quotes_held_out_by_corpus_per_configuration_or_the_worst(monkeypatch):
    monkeypatch.setattr(V, "calibration", lambda: _new_calibration())
    lines = V.verdict_reliability(40, 1024, 8, 0.5, 100.0, windows=64, layers=2)
    assert len(lines) == 3 and lines[0].startswith("LEARNED at 0.500 of a run — h32-embedded: held out by corpus: "
                                                   "wrong in 1 of 4 decided configurations (95% upper bound")
    assert "4 of 8 configurations decided (50% coverage)" in lines[0] and "worst scheme" not in lines[0]
    near96 = V.verdict_reliability(90, 1024, 8, 1.0, 30.0, windows=64, layers=3)
    assert "h96-planted: held out by corpus not measured" in near96[0] and "held out by configuration: wrong in 2" \
        in near96[0]
    worse = _new_calibration(("corpus",))
    worse["reliability"]["USED"]["h96-planted"]["schemes"]["scale"] = [_point(1.0, 5, 6, 8)]
    monkeypatch.setattr(V, "calibration", lambda: worse)
    line = V.verdict_reliability(90, 1024, 8, 1.0, 30.0, windows=64, layers=3)[1]
    assert line.startswith("USED at 1.000 of a run — h96-planted: held out by corpus: wrong in 2 of 6")
    assert "; the worst scheme, held out by scale: wrong in 5 of 6 decided configurations" in line
    assert V.thresholds("USED", 1.0)[:2] == (0.0, math.inf)  # a side too few configurations could call: never
