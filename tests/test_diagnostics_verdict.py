"""The two controlled cases of the early verdict, trained for real on CPU (a few hundred steps).

- text PLE on the embedded corpus (ids = the tokens) must come out LEARNED and USED;
- a table keyed by ids drawn i.i.d. for every occurrence from the real ids' frequencies
  (ids that carry no information) must never come out LEARNED, USED or BENEFIT. With the calibrated thresholds
  (``plelab calibrate``) it reads UNDECIDED rather than NOT DISTINGUISHABLE: the benchmark's weak positives
  (dP = 4 real ids) agree across seeds at z ≈ 0 too, so no negative call is made that close to the null.
"""

import json

import pytest
from background import VERDICT_STEPS as STEPS

from plelab.cli import main
from plelab.diagnostics.diagnose import diagnose_run as diagnose
from plelab.diagnostics.verdict import BENEFIT, LEARNED, UNCALIBRATED, UNUSED, USED, use_verdict

pytestmark = pytest.mark.background("verdict_runs")


@pytest.fixture(scope="module")
def runs(background):
    """Four runs of ``STEPS`` steps trained beside the suite (tests/background.py:verdict_runs)."""
    root = background("verdict_runs")
    return {(ids, seed): root / f"{ids}-{seed}" for ids in ("token", "iid") for seed in (0, 1)}


@pytest.mark.slow
def test_text_ple_is_learned_and_used(runs):
    rep = diagnose(runs["token", 0], reference=runs["token", 1], progress=False)
    v = rep["table"]["verdict"]
    assert (v["structure"], v["use"]) == (LEARNED, USED), v["reasons"]
    assert rep["table"]["use"]["permute"]["delta"] > 0.01
    assert rep["rows"]["used"] > 300
    pred = rep["predictiveness"]  # token ids tell the frozen model something about the next token
    assert pred["is_prediction_target"] and pred["val_gain_nats"] > 0.005 and pred["mean_row_grad_norm"] > 0


@pytest.mark.slow
def test_iid_ids_are_never_learned_used_or_benefit(runs):
    rep = diagnose(runs["iid", 0], reference=runs["iid", 1], progress=False)
    v = rep["table"]["verdict"]
    assert v["structure"] != LEARNED and v["use"] != USED and v["benefit"] != BENEFIT, v["reasons"]
    cs = rep["table"]["cross_seed"]
    assert abs(cs["cka"] - cs["null_mean"]) < 3 * cs["null_sd"]  # inside its null: z near 0
    for layer in rep["layers"]:  # per-layer calls: whole-table thresholds, L chances, no error rate measured
        v = layer["verdict"]
        assert (v["structure"], v["use"], v["benefit"]) == (UNCALIBRATED,) * 3 and "uncalibrated" in v["reasons"][-1]
        assert "z " in v["reasons"][0] and "z " in v["reasons"][1]
    # cpu-tiny sits inside the benchmark's span: the rates held out by corpus, counted by configuration, are quoted
    assert rep["reliability"][0].startswith("LEARNED at ") and "held out by corpus" in rep["reliability"][0]
    pred = rep["predictiveness"]  # the rows get gradient, but the ids carry no information
    assert not pred["is_prediction_target"] and pred["val_gain_nats"] < 0.002 and pred["mean_row_grad_norm"] > 0


@pytest.mark.slow
def test_w_t_alone_cannot_tell_the_two_apart(runs):
    """The trap the seeds fell into: W_t's raw metrics look the same for both (and like init)."""
    token = diagnose(runs["token", 0], use=False, progress=False)
    iid = diagnose(runs["iid", 0], use=False, progress=False)
    for a, b in zip(token["layers"], iid["layers"]):
        assert a["wt_all"]["erank_raw"] == pytest.approx(b["wt_all"]["erank_raw"], rel=0.02)
        assert a["wt_all"]["erank_raw"] == pytest.approx(a["null_all"]["erank_raw"], rel=0.02)
        assert abs(a["wt_all"]["mean_cos"]) < 0.02
    assert token["table"]["verdict"]["structure"] == "UNDECIDED"  # no second seed given


@pytest.mark.slow
def test_live_and_checkpoint_diagnostics_were_written(runs):
    run = runs["token", 0]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    diag = [r["diag"] for r in rows if "diag" in r]
    assert len(diag) == STEPS // 100
    assert len(diag[-1]["snr"]) == 2 and all(x > 0 for x in diag[-1]["snr"])
    assert 0 < diag[-1]["rows_touched"] <= 1 and all(g > 0 for g in diag[-1]["grad_table"])
    ck = json.loads((run / "checkpoints" / f"step-{STEPS:06d}" / "diagnostics.json").read_text())
    perm = ck["use"]["permute"]  # the trainer's use test: the calibrated call at the run's end
    assert ck["use_verdict"] == use_verdict(perm["delta"], perm["se"], fraction=1.0)[0] != UNUSED
    assert perm["delta"] > 0 and len(ck["layers"]) == 2


@pytest.mark.slow
def test_diagnose_cli_writes_json_and_plots(runs, tmp_path, capsys):
    assert main(["diagnose", str(runs["token", 0]), "--reference", str(runs["token", 1]), "--out", str(tmp_path),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "whole table: LEARNED, USED" in out and "cross-seed CKA" in out
    saved = json.loads((tmp_path / "diagnostics.json").read_text())
    assert saved["table"]["verdict"]["use"] == USED
    assert saved["table"]["use"]["permute"]["windows"] == 64  # the calibrated count: no windows caveat
    assert not any(line.startswith("outside") for line in saved["reliability"])
    for name in ("diagnostics_by_layer.png", "diagnostics_by_step.png"):
        png = (tmp_path / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "change since init by occurrences" in out


@pytest.mark.slow
def test_diagnose_a_checkpoint_folder_with_a_null_run(runs, capsys):
    ckpt = runs["token", 0] / "checkpoints" / f"step-{STEPS:06d}"
    assert main(["diagnose", str(ckpt), "--null", str(runs["iid", 0]), "--no-use", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "(step 300)" in out and "(null run" in out
