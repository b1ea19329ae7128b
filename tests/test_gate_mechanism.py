"""The seed's gate mechanism read off constructed gate trajectories, and a study's verdicts checked against the
calibrated range (both on synthetic sweep results)."""

from __future__ import annotations

import numpy as np
import pytest

from plelab.stats.analysis import analyse
from plelab.sweeps.results import SweepResults
from tests.test_sweep_stats import _synthetic


def _trajectory(init: float, final: float, move_at: int | None, seed: int, steps: int = 400, every: int = 10,
                noise: float = 0.002) -> list[tuple[int, float]]:
    """A learned gate's readings: at its init (plus reading noise) until ``move_at``, then a straight move to
    ``final`` by the last step (None: it never moves)."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(every, steps + 1, every):
        frac = 0.0 if move_at is None or step <= move_at else (step - move_at) / (steps - move_at)
        out.append((step, abs(init + (final - init) * frac + rng.normal(0, noise))))
    return out


def _with_gates(res: SweepResults, gates: dict[str, list]) -> SweepResults:
    """Each arm's runs get a gate trajectory (a list of readings) or, for Gemma's gate, a last activity."""
    for arm, values in gates.items():
        for seed, g in enumerate(values):
            hist = g if isinstance(g, list) else []
            last = hist[-1][1] if hist else (None if isinstance(g, list) else g)
            res.runs[arm][seed].signal = {} if last is None else {"gate": last, "grad_gate": last / 10,
                                                                   "grad_table": 0.5, "snr": 0.3}
            res.runs[arm][seed].gate_history = hist
    return res


def test_a_gate_opening_is_judged_against_its_own_noise():
    from plelab.stats.mechanism import movement

    opens = movement(_trajectory(0.01, 0.5, 200, seed=0), 0.01)
    assert opens["state"] == "opened" and 200 < opens["step"] <= 240 and opens["noise"] > 0
    flat = movement(_trajectory(0.01, 0.01, None, seed=1), 0.01)
    assert flat["state"] == "stayed" and flat["step"] is None
    shuts = movement(_trajectory(1.0, 0.05, 100, seed=2), 1.0)
    assert shuts["state"] == "closed" and 100 < shuts["step"] <= 140
    # a fixed 0.1× init rule would call this gate closed; against its own noise it never left its start
    assert movement(_trajectory(0.01, 0.01, None, seed=3, noise=0.004), 0.01)["state"] == "stayed"
    assert movement([], 1.0)["state"] == "unread"


def test_gate_mechanism_shows_only_when_a_shut_gate_stays_shut_below_one_that_opens():
    from plelab.stats.mechanism import gate_mechanism

    fam = "gate-scalar-small"
    losses = {a: [5.0, 5.1, 5.2] for a in ("dp0", "dp4", "dp8", f"dp4-{fam}", f"dp8-{fam}")}

    def mech(small, large, gemma=None):
        res = _with_gates(_synthetic(losses, controls=[fam]), {f"dp4-{fam}": small, f"dp8-{fam}": large, **(gemma or {})})
        return gate_mechanism(res)

    never = [_trajectory(0.01, 0.01, None, seed=s) for s in range(3)]
    opening = [_trajectory(0.01, 0.6, 100 + 40 * s, seed=s) for s in range(3)]
    shows = mech(never, opening, {"dp4": [0.4] * 3, "dp8": [0.4] * 3})
    finding = shows["families"][fam]
    assert finding.startswith(f"{fam}: the mechanism shows — the gate never opened from its near-closed start in "
                              "every run at dP 4 and opened in every run at dP 8")
    rows = {r["arm"]: r for r in shows["rows"]}
    assert rows[f"dp4-{fam}"]["opened"] == 0 and rows[f"dp8-{fam}"]["opened"] == 3
    assert 140 <= rows[f"dp8-{fam}"]["open_step"] <= 190  # the median run opened at 140 (+ detection lag)
    assert rows["dp4"]["opened"] is None and rows["dp4"]["gate_activity"] == pytest.approx(0.4)  # Gemma's gate
    assert list(shows["families"]) == [fam]  # no verdict for Gemma's gate: its post-norm fixes the RMS
    both = mech(opening, opening)["families"][fam]
    assert both.startswith(f"{fam}: the mechanism does not show — the gate opened in every run at every dP (dP 4 "
                           "median step")
    assert mech(opening, never)["families"][fam].startswith(f"{fam}: mixed")  # shut only above an open dP
    unread = mech(never, [[]] * 3)["families"][fam]
    assert unread.startswith(f"{fam}: no verdict — 3 run(s) have no gate reading (dP 8;")


def test_gate_mechanism_reads_a_gate_started_open_closing():
    from plelab.stats.mechanism import gate_mechanism

    losses = {a: [5.0, 5.1, 5.2] for a in ("dp0", "dp4", "dp8", "dp4-gate-scalar", "dp8-gate-scalar")}
    closes = [_trajectory(1.0, 0.02, 150, seed=s) for s in range(3)]
    stays = [_trajectory(1.0, 1.0 + 0.2 * s, None if s == 0 else 200, seed=s) for s in range(3)]
    res = _with_gates(_synthetic(losses, controls=["gate-scalar"]), {"dp4-gate-scalar": closes,
                                                                     "dp8-gate-scalar": stays})
    assert gate_mechanism(res)["families"]["gate-scalar"].startswith(
        "gate-scalar: the mechanism shows — the gate closed in every run at dP 4 and stayed open in every run at dP 8")
    res = _with_gates(_synthetic(losses, controls=["gate-scalar"]), {"dp4-gate-scalar": stays,
                                                                     "dp8-gate-scalar": stays})
    assert gate_mechanism(res)["families"]["gate-scalar"].startswith(
        "gate-scalar: the mechanism does not show — the gate closed in no run at any dP (final |g| ")


def test_a_study_report_checks_the_calibrated_range_of_its_verdicts():
    from plelab.reports.sweep import range_blocks
    from plelab.stats.analysis import calibrated_range

    res = _synthetic({"dp0": [5.0, 5.1, 5.2], "dp8": [4.9, 5.0, 5.1]})
    for run in res.runs["dp8"].values():
        run.tokens_seen = 100 * 512  # 100 tokens per table row (V = 512), inside the benchmark's 5–320
    inside = calibrated_range(res, "dp8")
    assert inside["inside"] is True, inside["line"] and calibrated_range(res, "dp0") is None  # cpu-tiny's H 64 is in the benchmark
    res.configs["dp8"]["model"]["hidden_size"] = 160  # a width the benchmark never saw
    outside = calibrated_range(res, "dp8")
    assert outside["inside"] is False and "H: 160 vs 32–96" in outside["line"]
    analysis = analyse(res)
    (row,) = [r for r in analysis["rows"] if r["arm"] == "dp8"]
    assert row["calibrated_range"]["inside"] is False
    (_, text), (_, items) = range_blocks(analysis)
    assert "outside the calibrated range" in text and items[0].startswith("dp8: outside the calibrated range (H: 160")
