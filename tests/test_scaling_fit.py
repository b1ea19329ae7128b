"""Scaling fits (issue 25 item 1): L(N, D) recovered from synthetic runs within its intervals, the multiplier of a
PLE arm, the held-out rung (passing on a true law, failing on a broken one), refusals, and ``plelab fit`` on real
tiny runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plelab.cli import main
from plelab.config import resolve_config
from plelab.data.pipeline import prepare_token_data
from plelab.errors import PlelabError
from plelab.model.accounting import account
from plelab.runs import train
from plelab.scaling.laws import Law, Point, fit_study

# Hoffmann et al. 2022's fitted constants (arXiv:2203.15556, approach 3), used as a known truth
TRUE = Law(E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)
SIZES, BUDGETS = (1e5, 3e5, 1e6, 3e6, 1e7), (1e6, 1e7, 1e8)


def _synthetic(seeds=3, m=1.5, noise=0.005, broken=0.0) -> list[Point]:
    """Runs from ``TRUE`` with log-normal noise; a PLE arm at multiplier ``m``; ``broken`` nats added to the
    largest size (a law that stops holding there)."""
    rng = np.random.default_rng(0)
    out = []
    for seed in range(seeds):
        for n in SIZES:
            for d in BUDGETS:
                for arm, mult in (("baseline", 1.0), ("dP/H=0.05", m)):
                    loss = float(TRUE.predict(n, d, mult)) * float(np.exp(rng.normal(0, noise)))
                    out.append(Point(arm, n, d, loss + (broken if n == SIZES[-1] else 0.0), seed))
    return out


@pytest.fixture(scope="module")
def synthetic_fit():
    return fit_study(_synthetic(), boots=100, predict=[(2.5e9, 4e11), (1.5e7, 1e8)])


@pytest.mark.slow
def test_known_law_and_multiplier_are_recovered_within_their_intervals(synthetic_fit):
    r = synthetic_fit
    for name, value in TRUE.to_dict().items():
        lo, hi = r["law"][name]["ci"]
        assert lo <= value <= hi, (name, value, r["law"][name])
        assert hi - lo < 0.5 * value  # an interval, not the whole axis
    m = r["multipliers"]["dP/H=0.05"]
    assert m["ci"][0] <= 1.5 <= m["ci"][1] and m["ci"][0] > 1.3
    assert r["resampling"].startswith("seeds as blocks (3 seeds)") and r["bootstraps"] == 100
    h = r["holdout"]
    assert h["held_out"] == SIZES[-1] and h["fit_sizes"] == list(SIZES[:-1]) and (h["inside"], h["of"]) == (3, 3)
    far, near = r["predictions"]
    assert far["extrapolation"] == pytest.approx(4e11 / 1e8) and near["extrapolation"] == pytest.approx(1.5)
    assert len(r["warnings"]) == 1 and "2.5e+09" in r["warnings"][0] and "untested" in r["warnings"][0]
    assert near["ci"][0] <= near["loss"] <= near["ci"][1] and near["ci"][1] - near["ci"][0] < 0.1


def test_the_held_out_rung_catches_a_law_that_stops_holding():
    h = fit_study(_synthetic(broken=0.3), boots=60)["holdout"]
    assert h["inside"] == 0 and all(row["measured"] > row["pi"][1] for row in h["rows"])


def test_no_gain_arm_has_a_multiplier_interval_holding_one():
    m = fit_study(_synthetic(m=1.0), boots=60)["multipliers"]["dP/H=0.05"]
    assert m["ci"][0] <= 1.0 <= m["ci"][1]


def test_an_unidentified_grid_is_refused_and_one_seed_resamples_cells():
    few = [p for p in _synthetic() if p.n in SIZES[:3]]
    with pytest.raises(PlelabError, match=r"has 3 trunk size\(s\).*at least 4 sizes × 3 budgets"):
        fit_study(few)
    short = [p for p in _synthetic() if p.d != BUDGETS[0]]
    with pytest.raises(PlelabError, match="2 at N=100,000"):
        fit_study(short)
    one = fit_study([p for p in _synthetic() if p.seed == 0], boots=30)
    assert one["resampling"].startswith("(N, D) cells (one seed")


def base_overrides() -> list[str]:
    return ["ple.dim=0", "train.precision=fp32", "train.eval_every=1000", "train.checkpoint_every=1000",
            "train.batch_size=4", "train.warmup_steps=2"]


@pytest.mark.slow
def test_plelab_fit_on_real_tiny_runs(tmp_path, capsys):
    data = prepare_token_data(resolve_config("cpu-tiny", base_overrides()), progress=False)
    quiet = {"data": data, "progress": False, "log": lambda *a, **k: None}
    widths = (32, 48, 64, 80)
    for h in widths:
        for steps in (4, 8, 12):
            shape = [f"model.hidden_size={h}", f"model.intermediate_size={h * 2}", f"train.steps={steps}"]
            train(resolve_config("cpu-tiny", [*base_overrides(), *shape]), tmp_path / "ladder" / f"H{h}-s{steps}",
                  **quiet)
        train(resolve_config("cpu-tiny", [*base_overrides(), f"model.hidden_size={h}",
                                          f"model.intermediate_size={h * 2}", "train.steps=12",
                                          f"ple.dim={h // 8}"]), tmp_path / "ladder" / f"H{h}-ple", **quiet)
    out = tmp_path / "fit.json"
    assert main(["fit", str(tmp_path / "ladder"), "--boots", "20", "--predict", "1e6:1e7", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "L(N, D) = E + A/N^α + B/D^β on 12 baseline runs (4 sizes × 3 budgets" in text
    assert "Effective-parameter multiplier" in text and "dP/H=0.125: m = " in text
    assert "Held-out check: fitted on N ≤" in text and "Prediction at N = 1e+06" in text
    r = json.loads(out.read_text())
    assert r["runs"] == 16 and r["count"] == "non-embedding"
    cfg = resolve_config("cpu-tiny", ["model.hidden_size=32", "model.intermediate_size=64", "ple.dim=0"])
    acc = account(cfg.model, cfg.ple, cfg.train.seq_len)
    assert r["sizes"][0] == acc.base - acc.groups["embed_tokens"] - acc.groups.get("lm_head", 0)
    assert r["budgets"] == [4 * 4 * 64, 8 * 4 * 64, 12 * 4 * 64]  # tokens_seen of each budget
    # too few sizes: one line, exit 2, nothing written
    assert main(["fit", str(tmp_path / "ladder" / "H32-s4"), str(tmp_path / "ladder" / "H48-s4")]) != 0
    assert "at least 4 sizes × 3 budgets" in capsys.readouterr().err
    assert main(["fit", str(tmp_path / "ladder"), "--predict", "1e6"]) != 0
    assert "write N:D" in capsys.readouterr().err
    # a summary whose loss reads "NaN" (a float to Python) is skipped by name, never fitted
    summary = tmp_path / "ladder" / "H80-ple" / "summary.json"
    summary.write_text(summary.read_text().replace('"final_val_loss": ', '"final_val_loss": "NaN", "was": ', 1))
    assert main(["fit", str(tmp_path / "ladder"), "--boots", "20", "--out", str(out)]) == 0
    assert "H80-ple: its final loss nan or tokens_seen" in capsys.readouterr().out
    assert json.loads(out.read_text())["runs"] == 15

