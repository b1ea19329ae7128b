"""The comparison study's machinery (issue 56 item 5): the out-of-distribution validation set (data.ood), the
baseline's budget ladder (--budgets), the wall-clock and token-worth readings, and their report sections."""

from __future__ import annotations

import gzip
import json
import math
from types import SimpleNamespace

import pytest
import torch

import plelab
from plelab.cli import main
from plelab.config import resolve_config
from plelab.data.ood import ood_set
from plelab.errors import ConfigError, PlelabError
from plelab.stats.wallclock import budget_at, loss_at, wallclock
from plelab.sweeps.commands import dp_spec
from plelab.sweeps.records import median_step_seconds
from plelab.sweeps.spec import Arm, SweepSpec, sweep_command


def test_the_ladder_is_read_log_linearly_between_its_points():
    points = [(1.0, 3.0), (1.5, 2.9), (2.0, 2.85)]
    assert loss_at(points, 1.0) == 3.0 and loss_at(points, 2.0) == 2.85
    m = math.sqrt(1.5)  # half-way in log m between 1 and 1.5
    assert loss_at(points, m) == pytest.approx(2.95)
    assert loss_at(points, 2.5) is None and loss_at(points, 0.9) is None  # outside: no extrapolation
    assert budget_at(points, 2.95) == pytest.approx(m)
    assert budget_at(points, 3.1) == 0.0 and budget_at(points, 2.8) == math.inf  # censored both ways
    assert budget_at(points, 2.875) == pytest.approx(1.5 * math.exp(math.log(2.0 / 1.5) * 0.5))


def test_the_median_step_time_leaves_out_warm_up_and_reads_each_steps_rate():
    rows = [{"step": s, "tokens": 100 * s, "tokens_per_second": 1000.0 if s > 5 else 10.0} for s in range(1, 12)]
    rows.append({"step": 11, "val_loss": 3.0})
    assert median_step_seconds(rows) == pytest.approx(0.1)
    assert median_step_seconds([{"step": 3, "val_loss": 1.0}]) is None


def _run(loss, step_seconds, ood=None):
    return SimpleNamespace(loss=loss, step_seconds=step_seconds, ood_loss=ood)


def test_wallclock_pairs_each_arm_with_the_baseline_at_its_step_time():
    arms = [Arm("dp0", ["ple.dim=0"], "dP", 0), Arm("dp8", ["ple.dim=8"], "dP", 8),
            Arm("ngram-rows1031", ["ple.dim=0", "aux.kind=ngram"], "ngram", 0),
            Arm("dp0-x1.5", ["ple.dim=0", "train.steps=12"], "budget", 1.5)]
    spec = SweepSpec(preset="cpu-tiny", arms=arms, seeds=[0, 1, 2], delta=0.01)
    base = {0: 3.00, 1: 3.02, 2: 2.98}
    longer = {s: v - 0.10 for s, v in base.items()}
    res = SimpleNamespace(spec=spec, runs={
        "dp0": {s: _run(v, 1.0) for s, v in base.items()},
        "dp0-x1.5": {s: _run(v, 1.0) for s, v in longer.items()},
        # PLE: 0.05 below the baseline, steps 1.2× slower -> read at m = 1.2 on the ladder
        "dp8": {s: _run(v - 0.05, 1.2) for s, v in base.items()},
        # n-gram: steps 2× slower, beyond the ladder's 1.5× -> outside, no label
        "ngram-rows1031": {s: _run(v - 0.2, 2.0) for s, v in base.items()}})
    out = wallclock(res)
    assert out["ladder"] == [1.0, 1.5]
    ple = out["arms"]["dp8"]
    at = 0.10 * math.log(1.2) / math.log(1.5)  # the ladder's drop by m = 1.2
    assert ple["time_ratio"] == pytest.approx(1.2) and ple["mean"] == pytest.approx(-0.05 + at)
    assert ple["worth_median"] == pytest.approx(math.exp(math.log(1.5) * 0.5))  # 0.05 of the ladder's 0.10
    assert out["arms"]["ngram-rows1031"]["label"] == "outside" and "mean" not in out["arms"]["ngram-rows1031"]
    assert out["arms"]["ngram-rows1031"]["worth_above"] == 3  # 0.2 below: more than the ladder's largest budget


def test_a_seed_without_its_whole_ladder_is_left_out_not_read_past_its_end():
    """A report read mid-study: seed 2 has no 1.5× run yet, so it has no ladder to read an arm at 1.4× on."""
    arms = [Arm("dp0", ["ple.dim=0"], "dP", 0), Arm("dp8", ["ple.dim=8"], "dP", 8),
            Arm("dp0-x1.25", ["ple.dim=0", "train.steps=10"], "budget", 1.25),
            Arm("dp0-x1.5", ["ple.dim=0", "train.steps=12"], "budget", 1.5)]
    spec = SweepSpec(preset="cpu-tiny", arms=arms, seeds=[0, 1, 2], delta=0.01)
    res = SimpleNamespace(spec=spec, runs={
        "dp0": {s: _run(3.0, 1.0) for s in (0, 1, 2)}, "dp0-x1.25": {s: _run(2.95, 1.0) for s in (0, 1, 2)},
        "dp0-x1.5": {s: _run(2.9, 1.0) for s in (0, 1)}, "dp8": {s: _run(2.93, 1.4) for s in (0, 1, 2)}})
    out = wallclock(res)
    assert out["arms"]["dp8"]["seeds"] == 2 and out["arms"]["dp8"]["n"] == 2


def test_budget_arms_in_a_spec_and_its_command(tmp_path):
    spec = dp_spec(preset="cpu-tiny", dp=[0, 8], aux=["value"], budgets=[1.5, 1.25], steps=8)
    budget = [a for a in spec.arms if a.family == "budget"]
    assert [(a.name, a.overrides) for a in budget] == [("dp0-x1.25", ["ple.dim=0", "train.steps=10"]),
                                                      ("dp0-x1.5", ["ple.dim=0", "train.steps=12"])]
    assert "--budgets 1.25,1.5" in sweep_command(spec, tmp_path)
    for bad in ([1.0], [1.5, 1.5]):
        with pytest.raises((ConfigError, PlelabError)):
            dp_spec(preset="cpu-tiny", dp=[0, 8], budgets=bad, steps=8)


def test_the_ood_set_is_the_other_libraries_encoded_with_the_runs_tokenizer(tiny_data):
    ood = ood_set("other-libraries", tiny_data.tokenizer_json, 32, 16, tiny_data.corpus_fingerprint)
    assert ood.windows.shape == (16, 33) and ood.windows.dtype == torch.int64
    assert "other-libraries" in ood.name and len(ood.fingerprint) == 64
    again = ood_set("other-libraries", tiny_data.tokenizer_json, 32, 16, tiny_data.corpus_fingerprint)
    assert torch.equal(ood.windows, again.windows)  # the same windows for every run: paired by seed
    with pytest.raises(PlelabError, match="needs the run's tokenizer"):
        ood_set("other-libraries", None, 32, 16, tiny_data.corpus_fingerprint)
    with pytest.raises(PlelabError, match="is the training corpus itself"):
        ood_set("other-libraries", tiny_data.tokenizer_json, 32, 16, ood.fingerprint)
    with pytest.raises(PlelabError, match="data.ood=/no/such.txt does not exist"):
        ood_set("/no/such.txt", tiny_data.tokenizer_json, 32, 16, tiny_data.corpus_fingerprint)


def test_a_missing_ood_path_is_one_line_before_any_run_folder(tmp_path, capsys):
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--set", f"data.ood={tmp_path}/none.txt",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "data.ood=" in err and "does not exist" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_data_ood_is_scored_at_every_evaluation_and_kept_in_the_summary(tmp_path, tiny_data):
    cfg = resolve_config("cpu-tiny", ["data.ood=other-libraries", "train.steps=4", "train.eval_every=2"])
    plelab.train(cfg, tmp_path / "run", data=tiny_data, progress=False, log=lambda *a: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4] and all(r["ood_loss"] > 0 for r in evals)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_ood_loss"] == evals[-1]["ood_loss"] and summary["ood"]["windows"] > 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["ood"] == "other-libraries"


@pytest.mark.slow
def test_a_comparison_sweep_reports_the_family_ood_and_wall_clock(tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--aux", "ngram:match=8", "--aux", "value",
                 "--budgets", "1.5", "--set", "data.ood=other-libraries", "--seeds", "3", "--steps", "8", "--out",
                 str(out), "--no-progress"]) == 0
    results = json.loads((out / "report" / "results.json").read_text())
    analysis = results["analysis"]
    ood = {c["b"]: c for c in analysis["ood_vs_baseline"]}
    names = set(analysis["wallclock"]["arms"])
    ngram = [a for a in names if a.startswith("ngram-rows")]
    assert len(ngram) == 1 and names == {"dp8", "value", ngram[0]} and set(ood) == names
    assert analysis["wallclock"]["ladder"] == [1.0, 1.5]
    assert all(e.get("time_ratio", 0) > 0 for e in analysis["wallclock"]["arms"].values())
    assert "dp0-x1.5" not in {c["b"] for c in analysis["controls_vs_baseline"]}  # the ladder is not a control
    report = (out / "report" / "report.md").read_text()
    assert "The table family side by side" in report and "What a table is worth in the baseline's tokens" in report
    assert (out / "report" / "plots" / "loss_vs_time.png").exists()
    # the records carry what the readings need, so they survive the run folders
    record = out / "records" / "dp8" / "seed-0.json.gz"
    body = json.loads(gzip.decompress(record.read_bytes()))
    assert body["step_seconds"] > 0 and any("ood_loss" in r for r in body["metrics"])
