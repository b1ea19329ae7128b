"""Token-budget curves: the iso-loss step ratio by hand, and the verdicts on curves whose answer is known."""

import math

import numpy as np
import pytest
from test_sweep_stats import _synthetic

from plelab.stats import budget
from plelab.sweeps.results import RunResult


def test_iso_ratio_by_hand():
    base = [(10, 4.0), (20, 3.0), (40, 2.0)]
    assert budget.iso_ratio(base, 2.5, 20) == pytest.approx(30 / 20)   # halfway between steps 20 and 40
    assert budget.iso_ratio(base, 4.5, 10) == pytest.approx(1.0)       # already at the first evaluation
    assert budget.iso_ratio(base, 1.0, 40) == math.inf                 # never reached: censored


def _curves(kind: str, seeds: int = 6):
    """Baseline L(s) = 3 + 8/√s; 'speedup': the arm is the baseline at 2s (its gain shrinks as the curve
    flattens); 'capacity': the baseline minus 0.1 throughout; 'none': the baseline plus noise."""
    rng = np.random.default_rng({"speedup": 1, "capacity": 2, "none": 3}[kind])
    steps = [25 * k for k in range(1, 17)]
    base = {sd: [(s, 3 + 8 / math.sqrt(s) + 0.02 * sd) for s in steps] for sd in range(seeds)}
    shift = {"speedup": lambda s: 3 + 8 / math.sqrt(2 * s), "capacity": lambda s: 3 + 8 / math.sqrt(s) - 0.1,
             "none": lambda s: 3 + 8 / math.sqrt(s)}[kind]
    arm = {sd: [(s, shift(s) + 0.02 * sd + rng.normal(0, 0.003)) for s in steps] for sd in range(seeds)}
    return base, arm


@pytest.mark.parametrize("kind, label", [("speedup", budget.CLOSING), ("capacity", budget.STAYING),
                                         ("none", budget.NO_GAIN)])
def test_known_curves_get_their_verdict(kind, label):
    base, arm = _curves(kind)
    res = _synthetic({"dp0": [v[-1][1] for v in base.values()], "dp8": [v[-1][1] for v in arm.values()]})
    for name, curves in (("dp0", base), ("dp8", arm)):
        for sd, hist in curves.items():
            res.runs[name][sd] = RunResult(name, sd, hist[-1][1], hist, [], 640, 1.0, 640.0)
    out = budget.token_budget(res)["dp8"]
    assert out["label"] == label, out["reason"]
    assert (out["half_step"], out["final_step"]) == (200, 400)
    if kind == "speedup":  # the arm is the baseline at twice the steps: the ratio is 2 wherever both are measured
        ratios = [r["iso_ratio_median"] for r in out["curve"] if r["iso_ratio_median"] is not None]
        assert ratios and all(r == pytest.approx(2.0, rel=0.05) for r in ratios[:5])
        assert out["curve"][-1]["iso_censored"] == 6  # at the end the baseline never gets that low
    if kind == "capacity":
        assert out["gain_final"]["mean"] == pytest.approx(-0.1, abs=0.01)


def test_one_evaluation_is_inconclusive_not_a_crash():
    res = _synthetic({"dp0": [5.0, 5.1, 5.2], "dp8": [4.9, 5.0, 5.1]})
    out = budget.token_budget(res)["dp8"]
    assert out["label"] == "inconclusive" and "no curve to compare" in out["reason"]
