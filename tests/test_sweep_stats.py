"""The sweep's statistics on synthetic loss tables with known structure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from plelab.config import resolve_config
from plelab.model.accounting import account
from plelab import stats
from plelab.stats.analysis import analyse
from plelab.sweeps.results import RunResult, SweepResults
from plelab.sweeps.spec import SweepSpec, dp_arms


def _synthetic(losses: dict[str, list[float]], controls=(), delta=0.02) -> SweepResults:
    dims = sorted(int(a[2:]) for a in losses if a.startswith("dp") and "-" not in a)
    spec = SweepSpec(preset="cpu-tiny", arms=dp_arms(dims, list(controls)), seeds=list(range(len(losses["dp0"]))),
                     delta=delta)
    runs, acc, cfgs = {}, {}, {}
    for arm in spec.arms:
        cfg = resolve_config("cpu-tiny", arm.overrides)
        acc[arm.name], cfgs[arm.name] = account(cfg.model, cfg.ple, 64).to_dict(), cfg.to_dict()
        if arm.name in losses:
            runs[arm.name] = {s: RunResult(arm.name, s, v, [(10, v)], [], 640, 1.0, 640.0)
                              for s, v in enumerate(losses[arm.name])}
    for arm in spec.arms:
        if arm.alias_of in runs:
            runs[arm.name] = runs[arm.alias_of]
    return SweepResults(None, spec, runs, acc, cfgs, [])


def test_known_structure_drop_null_noisy():
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 0.08, 6)  # large seed-to-seed spread, shared by every arm of a seed (pairing)
    base = 5.0 + seed_effect
    dp8 = base - 0.06 + rng.normal(0, 0.004, 6)  # a true drop
    dp16 = dp8 + rng.normal(0, 0.003, 6)  # a true null (dead zone)
    dp32 = dp16 - 0.01 + rng.normal(0, 0.06, 6)  # too noisy to tell
    res = _synthetic({"dp0": base, "dp8": dp8, "dp16": dp16, "dp32": dp32})
    labels = [c["label"] for c in analyse(res)["consecutive"]]
    assert labels == [stats.DROP, stats.EQUIVALENT, stats.INCONCLUSIVE]
    # without pairing the same drop would be buried in the seed spread: the unpaired CI is far wider
    cons = analyse(res)["consecutive"][0]
    assert cons["ci_high"] - cons["ci_low"] < 0.2 * (np.std(base, ddof=1) * 2)


def test_diminishing_returns_and_small_real_differences():
    base = np.array([5.0, 5.1, 4.9, 5.05, 4.95])
    res = _synthetic({"dp0": base, "dp8": base - 0.005 + np.array([0, 1e-4, -1e-4, 2e-4, -2e-4])})
    (c,) = analyse(res)["consecutive"]
    assert c["label"] == stats.DIMINISHING  # significant and yet within ±δ
    assert analyse(res)["vs_baseline"][0]["label"] == stats.SMALL_DROP


def test_one_or_two_seeds_never_claim():
    res = _synthetic({"dp0": [5.0], "dp8": [4.0]})
    (c,) = analyse(res)["consecutive"]
    assert c["label"] == stats.INCONCLUSIVE and "no variance" in c["reason"]
    c2 = stats.family([stats.paired("a", "b", [-0.05, -0.01], 0.02)])[0]
    assert c2.label == stats.INCONCLUSIVE and c2.mde > 0.05


def test_holm_matches_the_definition():
    p = [0.01, 0.04, 0.03, math.nan, 0.2]
    adj = stats.holm(p)
    assert adj[0] == pytest.approx(0.04) and adj[2] == pytest.approx(0.09) and adj[1] == pytest.approx(0.09)
    assert adj[4] == pytest.approx(0.2) and math.isnan(adj[3])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0]


def test_tost_and_ci_against_scipy():
    from scipy import stats as sps

    d = np.array([-0.012, 0.004, -0.003, 0.006, -0.001])
    c = stats.paired("a", "b", d, delta=0.02)
    t = sps.ttest_1samp(d, 0.0)
    assert c.p == pytest.approx(t.pvalue)
    lo = sps.ttest_1samp(d, -0.02, alternative="greater").pvalue
    hi = sps.ttest_1samp(d, 0.02, alternative="less").pvalue
    assert c.p_tost == pytest.approx(max(lo, hi))
    ci = t.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == pytest.approx((ci.low, ci.high))
    more = stats.paired("a", "b", np.tile(d, 4), delta=0.02)
    assert more.mde < c.mde  # more seeds, smaller detectable effect


def test_confound_arms_flag_a_transition_that_depends_on_scaling():
    rng = np.random.default_rng(1)
    base = 5.0 + rng.normal(0, 0.05, 6)
    dp8 = base - 0.001 + rng.normal(0, 0.002, 6)
    dp16 = dp8 - 0.08 + rng.normal(0, 0.004, 6)  # a "transition" on the main curve ...
    matched16 = dp8 + rng.normal(0, 0.002, 6)  # ... that vanishes when the table scale is held fixed
    res = _synthetic({"dp0": base, "dp8": dp8, "dp16": dp16, "dp16-matched": matched16}, controls=["matched"])
    notes = " ".join(analyse(res)["confounds"])
    assert "dP 8→16" in notes and "possibly an artefact" in notes


def test_families_are_blocked_with_a_pooled_error_and_fall_back_when_variances_differ():
    rng = np.random.default_rng(7)
    base = 5.0 + rng.normal(0, 0.08, 6)
    even = {"dp0": base, **{f"dp{d}": base - 0.01 * i + rng.normal(0, 0.01, 6) for i, d in enumerate((8, 16, 32), 1)}}
    analysis = analyse(_synthetic(even))
    assert analysis["methods"]["vs_baseline"]["method"] == "blocked"
    assert analysis["methods"]["vs_baseline"]["df"] == (4 - 1) * (6 - 1)
    assert {c["adjustment"] for c in analysis["vs_baseline"]} == {"Dunnett"}
    assert {c["adjustment"] for c in analysis["consecutive"]} == {"Holm"} and analysis["consecutive"][0]["df"] == 15
    noisy = dict(even, dp32=even["dp16"] + rng.normal(0, 0.3, 6))  # one arm far noisier: no pooled error
    how = analyse(_synthetic(noisy))["methods"]["consecutive"]
    assert how["method"] == "paired t per comparison" and "unequal variances" in how["fallback"]


def test_inconclusive_says_how_many_seeds_would_decide_and_delta_sensitivity_is_reported():
    rng = np.random.default_rng(8)
    base = 5.0 + rng.normal(0, 0.08, 3)
    res = _synthetic({"dp0": base, "dp8": base + rng.normal(0, 0.05, 3), "dp16": base + rng.normal(0, 0.05, 3)})
    analysis = analyse(res)
    c = analysis["consecutive"][0]
    assert c["label"] == stats.INCONCLUSIVE and c["seeds_to_decide"]["equivalence"] > 3
    assert f"≈{c['seeds_to_decide']['equivalence']} seeds would show equivalence" in c["reason"]
    labels = analysis["sensitivity"]["consecutive"][0]["labels"]
    assert set(labels) == {"0.01", "0.02", "0.04"}


def test_advise_never_reads_low_power_as_no_difference(tmp_path, monkeypatch):
    from plelab.stats.advise import advise

    def advise_text(res) -> str:
        monkeypatch.setattr("plelab.stats.advise.collect", lambda root, structure=False: res)
        advice = advise(tmp_path)
        assert advice.text() == str(advice) and advice.to_dict()["lines"] == advice.lines
        return advice

    rng = np.random.default_rng(9)
    base = 5.0 + rng.normal(0, 0.08, 3)
    res = _synthetic({"dp0": base, "dp8": base - 0.05 + rng.normal(0, 0.03, 3),
                      "dp16": base - 0.06 + rng.normal(0, 0.03, 3)})
    advice = advise_text(res)
    text = advice.text()
    assert "Cannot choose yet" in text and "seeds would decide" in text and "Recommendation" not in text
    assert advice.status == "cannot choose yet" and advice.recommendation is None and advice.undecided
    assert all(c["seeds_to_decide_noninferiority"] for c in advice.comparisons if c["status"] == "undecided")
    tight = 5.0 + rng.normal(0, 0.08, 8)
    res = _synthetic({"dp0": tight, "dp8": tight - 0.05 + rng.normal(0, 0.002, 8),
                      "dp16": tight - 0.052 + rng.normal(0, 0.002, 8)})
    advice = advise_text(res)
    assert "Recommendation: dP = 8." in advice.text() and "within δ" in advice.text()
    assert (advice.status, advice.recommendation, advice.best) == ("recommended", 8, 16)
    assert advice.arms[8]["label"] and advice.arms[0] == {"arm": "dp0", "added": 0, "added_pct_of_base": 0.0}



def check_findings_map_to_their_sources(res, analysis, reg) -> int:
    """Every finding names the analysis entries it came from, and quotes their numbers."""
    from plelab.reports.sweep_findings import findings

    out = findings(res, analysis, reg)
    for f in out:
        assert f.sources, f"finding without a source: {f}"
        for src in f.sources:
            if src[0] in ("consecutive", "vs_baseline"):
                row = next(c for c in analysis[src[0]] if (c["a"], c["b"]) == src[1:])
                if row["ci_low"] is not None and "Δ" in f:
                    assert f"{row['mean']:+.4f}" in f, (f, row["mean"])
                assert row["label"] in f or "dead zone" in f.lower() or "inconclusive" in f, (f, row["label"])
            elif src[0] == "regime":
                assert src[1] in reg
            elif src[0] == "confounds":
                assert analysis["confounds"][src[1]] == f
            else:
                assert src[1] in analysis[src[0]], src
    return len(out)


def test_every_finding_maps_to_the_row_and_test_it_comes_from():
    from plelab.sweeps.results import regime

    rng = np.random.default_rng(10)
    base = 5.0 + rng.normal(0, 0.05, 6)
    dp8 = base - 0.001 + rng.normal(0, 0.002, 6)
    dp16 = dp8 - 0.08 + rng.normal(0, 0.004, 6)
    res = _synthetic({"dp0": base, "dp8": dp8, "dp16": dp16, "dp16-matched": dp8 + rng.normal(0, 0.002, 6)},
                     controls=["matched"])
    analysis = analyse(res)
    assert check_findings_map_to_their_sources(res, analysis, regime(res)) >= 5


def test_early_verdict_check_is_within_arms_not_pooled():
    # the arm decides both the early metric and the final gain; within an arm the early metric is noise:
    # pooled, the runs correlate strongly; within arms, nothing is left to predict
    rng = np.random.default_rng(11)
    groups, xs, ys = [], [], []
    for arm_effect in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25):
        x = arm_effect + rng.normal(0, 0.01, 3)
        y = 2 * arm_effect + rng.normal(0, 0.01, 3)
        groups.append((list(x), list(y)))
        xs += list(x)
        ys += list(y)
    rho_pooled, p_pooled = stats.spearman(xs, ys)
    within = stats.within_group_spearman(groups)
    assert rho_pooled > 0.9 and p_pooled < 1e-4
    assert within["p"] > 0.05 and len(within["leave_one_out"]) == 6
    predictive = [(list(x), list(x + rng.normal(0, 0.001, 3))) for x, _ in groups]  # x predicts y within arms
    strong = stats.within_group_spearman(predictive)
    assert strong["rho"] > 0.8 and strong["p"] < 0.01


def test_plan_takes_delta_from_the_pilots_gain_and_never_reuses_its_seeds(monkeypatch):
    from plelab.errors import PlelabError
    from plelab.stats.planning import plan

    rng = np.random.default_rng(12)
    base = 5.0 + rng.normal(0, 0.08, 4)
    res = _synthetic({"dp0": base, "dp8": base - 0.04 + rng.normal(0, 0.01, 4),
                      "dp16": base - 0.08 + rng.normal(0, 0.01, 4)})
    monkeypatch.setattr("plelab.stats.planning.collect", lambda root, structure=False: res)
    p = plan("pilot", delta_fraction=0.25)
    gain = float(np.mean([base[s] - res.runs["dp16"][s].loss for s in range(4)]))
    assert p["delta"] == pytest.approx(0.25 * gain) and "dp16" in p["delta_origin"]
    assert p["seeds"] and min(p["confirmatory_seeds"]) == 4 and f"--delta {p['delta']:g}" in p["command"]
    flat = _synthetic({"dp0": base, "dp8": base + 0.01, "dp16": base + 0.02})
    monkeypatch.setattr("plelab.stats.planning.collect", lambda root, structure=False: flat)
    with pytest.raises(PlelabError, match="no mean gain"):
        plan("pilot", delta_fraction=0.25)


def test_plan_sizes_the_controls_against_their_references_as_their_own_family(monkeypatch, capsys):
    from plelab.cli import main
    from plelab.errors import PlelabError
    from plelab.stats.planning import plan, plan_text

    rng = np.random.default_rng(13)
    base = 5.0 + rng.normal(0, 0.08, 4)
    dp8 = base - 0.05 + rng.normal(0, 0.005, 4)
    dp16 = dp8 - 0.05 + rng.normal(0, 0.005, 4)
    noisy = {"dp8-zero": dp8 + rng.normal(0, 0.03, 4), "dp16-zero": dp16 + rng.normal(0, 0.03, 4)}
    res = _synthetic({"dp0": base, "dp8": dp8, "dp16": dp16, **noisy}, controls=["zero"])
    monkeypatch.setattr("plelab.stats.planning.collect", lambda root, structure=False: res)
    every, main_curve, controls = (plan("pilot", delta=0.02, families=f) for f in ("all", "main", "controls"))
    assert set(every["seeds_by_family"]) == {"consecutive", "vs_baseline", "controls"}
    assert set(main_curve["seeds_by_family"]) == {"consecutive", "vs_baseline"}
    assert set(controls["seeds_by_family"]) == {"controls"}
    rows = controls["by_last_k"][0]["families"]["controls"]["comparisons"]
    assert [(r["a"], r["b"]) for r in rows] == [("dp8", "dp8-zero"), ("dp16", "dp16-zero")]
    # the controls' spread (≈ 0.03 √2 per pair) needs more seeds than the main curve's (≈ 0.007); every family's
    # test is the report's own, so sizing them together asks for the larger of the two
    assert controls["seeds"] > main_curve["seeds"] and every["seeds"] == controls["seeds"]
    assert "each control against its reference" in plan_text(every)
    assert main(["plan", "--target", "seed-3b", "--tokens", "1e9", "--families", "main"]) == 2
    assert "--families belongs to the pilot plan" in capsys.readouterr().err
    plain = _synthetic({"dp0": base, "dp8": dp8, "dp16": dp16})
    monkeypatch.setattr("plelab.stats.planning.collect", lambda root, structure=False: plain)
    with pytest.raises(PlelabError, match="no finished control arm"):
        plan("pilot", delta=0.02, families="controls")
    with pytest.raises(PlelabError, match="--families must be one of"):
        plan("pilot", delta=0.02, families="nope")


def test_the_seeds_dead_zone_step_is_the_one_at_the_seeds_dp_over_h():
    """The seed's first step is dP/H 0.025 → 0.05: named as such only in a sweep that samples those ratios (H = 160:
    dP 4 → 8); elsewhere the first step is called a different regime."""
    from plelab.reports.sweep_findings import seed_step_finding

    rng = np.random.default_rng(3)
    base = 5.0 + rng.normal(0, 0.05, 4)
    res = _synthetic({"dp0": base, "dp4": base - 0.01 + rng.normal(0, 0.01, 4),
                      "dp8": base - 0.02 + rng.normal(0, 0.01, 4), "dp16": base - 0.02 + rng.normal(0, 0.01, 4)})
    cons = analyse(res)["consecutive"]
    same = seed_step_finding(cons, res.spec, hidden=160)
    assert "The same dP/H step here (H = 160), dP 4→8" in same and same.sources == (("consecutive", "dp4", "dp8"),)
    other = seed_step_finding(cons, res.spec, hidden=64)  # cpu-tiny: dP/H 0.0625, 0.125, 0.25
    assert "does not sample that step: its dP/H are 0.0625, 0.125, 0.25" in other and "different regime" in other
    assert other.sources == (("consecutive", "dp4", "dp8"),)


def test_a_dead_zone_between_arms_that_lose_to_the_baseline_is_called_that():
    """An equivalent step whose arms are both significantly above the baseline is not the seed's plateau after a
    gain: the finding says where the step's arms stand against the baseline, and that neither beats it."""
    from plelab.reports.sweep_findings import findings, seed_step_finding

    rng = np.random.default_rng(5)
    base = 5.0 + rng.normal(0, 0.05, 6)
    res = _synthetic({"dp0": base, "dp4": base + 0.05 + rng.normal(0, 0.002, 6),
                      "dp8": base + 0.05 + rng.normal(0, 0.002, 6), "dp16": base - 0.06 + rng.normal(0, 0.002, 6)})
    analysis = analyse(res)
    step = next(c for c in analysis["consecutive"] if (c["a"], c["b"]) == ("dp4", "dp8"))
    assert step["label"] == stats.EQUIVALENT
    same = seed_step_finding(analysis["consecutive"], res.spec, hidden=160, vs_baseline=analysis["vs_baseline"])
    assert "is a measured equivalence; against the baseline: dp4 +0.05" in same
    assert "worse than the baseline" in same and ("vs_baseline", "dp0", "dp8") in same.sources
    dead = next(f for f in findings(res, analysis, {"tokens_per_row": 1, "seed_tokens_per_row": 1, "base_params": 1})
                if f.startswith("Dead zone measured"))
    assert "dP 4→8" in dead and "not the seed's plateau after a gain" in dead
    # a step of arms below the baseline carries no such warning
    res = _synthetic({"dp0": base, "dp4": base - 0.05 + rng.normal(0, 0.002, 6),
                      "dp8": base - 0.05 + rng.normal(0, 0.002, 6), "dp16": base - 0.1 + rng.normal(0, 0.002, 6)})
    analysis = analyse(res)
    same = seed_step_finding(analysis["consecutive"], res.spec, hidden=160, vs_baseline=analysis["vs_baseline"])
    assert "against the baseline: dp4 -0.05" in same and "worse than the baseline" not in same


def test_the_study_profile_sweeps_the_seeds_ratios_with_every_control():
    from plelab.config import resolve_config
    from plelab.demo import PROFILES
    from plelab.sweeps.commands import dp_spec
    from plelab.sweeps.spec import CONTROLS

    prof = PROFILES["study"]
    hidden = resolve_config(prof.preset).model.hidden_size
    assert [d / hidden for d in prof.dims if d] == [0.025, 0.05, 0.1, 0.2]
    spec = dp_spec(preset=prof.preset, overrides=prof.overrides, dp=prof.dims, seeds=prof.seeds,
                   controls=prof.controls, steps=prof.steps)
    assert {a.family for a in spec.arms} == {"dP", *CONTROLS}
    widths = {a.family: a.overrides for a in spec.arms if a.family.startswith("trunk-")}
    assert all(o[0] == "ple.dim=0" and int(o[1].split("=")[1]) > 480 for o in widths.values())  # wider than 3H


def test_the_long_profile_trains_past_20_tokens_per_trunk_parameter_on_the_packages_corpus():
    from plelab.config import resolve_config
    from plelab.demo import PROFILES
    from plelab.model.accounting import account
    from plelab.sweeps.commands import dp_spec

    prof = PROFILES["long"]
    cfg = resolve_config(prof.preset, [f"data.embedded={prof.corpus}"], steps=prof.steps)
    assert cfg.data.embedded == "packages"
    acc = account(cfg.model, cfg.ple, cfg.train.seq_len)
    trunk = acc.base - acc.groups["embed_tokens"] - acc.groups["lm_head"]
    assert 300_000 <= trunk <= 500_000  # issue 25: a trunk of ≈ 0.3–0.5 M non-embedding parameters
    assert prof.steps * cfg.train.batch_size * cfg.train.seq_len / trunk >= 20
    assert [d / cfg.model.hidden_size for d in prof.dims if d] == [0.025, 0.05, 0.1, 0.2]
    spec = dp_spec(preset=prof.preset, overrides=[f"data.embedded={prof.corpus}"], dp=prof.dims, seeds=prof.seeds,
                   controls=prof.controls, steps=prof.steps)
    assert {a.family for a in spec.arms} == {"dP", "iid", "zero", "gate-scalar"} and len(spec.arms) == 17
    gates = {run_gate for a in spec.arms for run_gate in a.overrides if run_gate.startswith("ple.gate=")}
    assert gates == {"ple.gate=scalar"}  # the rest keep Gemma's gate


@pytest.mark.slow
def test_fit_ladder_adds_every_rung_but_the_studys_own(tmp_path):
    from plelab.demo import PROFILES
    from plelab.errors import ConfigError
    from plelab.scaling.fit_ladder import FitLadder, ladder_specs
    from plelab.sweeps.runner import study_estimate

    lad = PROFILES["long"].ladder
    plans = ladder_specs(lad, tmp_path, "cpu-long-h160", ["data.embedded=packages"], (160, 2300))
    assert len(plans) == 4 * 3 - 1 and all(f.parent == tmp_path / "ladder" for f, _ in plans)
    by_name = {f.name: s for f, s in plans}
    assert "H160-s2300" not in by_name and set(by_name) >= {"H40-s575", "H160-s1150"}
    rung = by_name["H40-s575"]
    assert rung.steps == 575 and len(rung.seeds) == 2
    assert "model.hidden_size=40" in rung.overrides and "model.intermediate_size=80" in rung.overrides  # FFN 2H held
    assert [a.overrides for a in rung.runnable()] == [["ple.dim=0"], ["ple.dim=4"]]  # dP/H = 0.1
    line = study_estimate(plans, jobs=2)
    assert line.startswith("the whole study, 11 sweep(s): estimated runtime") and "44 run(s)" in line
    with pytest.raises(ConfigError, match="dP/H = 0.1 at H = 44 is dP 4.4, not a whole number"):
        ladder_specs(FitLadder((44, 160), (575, 2300), 0.1), tmp_path, "cpu-long-h160", [], (160, 2300))
    with pytest.raises(ConfigError, match="at least 2 seeds"):
        ladder_specs(FitLadder((40, 160), (2300,), 0.1, seeds=1), tmp_path, "cpu-long-h160", [], (160, 2300))
    with pytest.raises(ConfigError, match="the study's own H = 160, 2300 steps is not one of its cells"):
        ladder_specs(FitLadder((40, 80), (575,), 0.1), tmp_path, "cpu-long-h160", [], (160, 2300))
