"""A study's analysis is fixed before its runs: the plan is declared, hashed, stamped on every run and never
rewritten; labels need the pooled and the own-error analyses to agree; intervals say what they cover."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from plelab.cli import main
from plelab.errors import PlelabError
from plelab import stats
from plelab.stats import blocked
from plelab.sweeps.analysis_plan import plan_status, run_plan
from plelab.sweeps.records import read_record, write_record
from plelab.sweeps.spec import dp_arms, load_spec, merge_spec, run_dir, save_spec
from tests.tiny_sweeps import tiny_spec

STUDIES = Path(__file__).resolve().parent.parent / "studies"
EMIT = ["sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "2", "--steps", "4", "--emit", "torchrun"]


def test_a_rerun_that_changes_delta_alpha_or_last_k_is_refused(tmp_path):
    root = tmp_path / "s"
    saved = save_spec(root, merge_spec(root, tiny_spec(arms=dp_arms([0, 8]))))
    assert saved.plan["delta"] == 0.02 and len(saved.plan["sha256"]) == 64
    before = (root / "sweep.json").read_bytes()
    for key, value in (("delta", 0.08), ("alpha", 0.1), ("last_k", 1)):
        with pytest.raises(PlelabError, match=f"analysis plan fixed {key}=") as err:
            merge_spec(root, tiny_spec(arms=dp_arms([0, 8]), **{key: value}))
        assert "new study folder" in str(err.value)
    assert "plelab report" in str(pytest.raises(PlelabError, merge_spec, root,
                                                tiny_spec(arms=dp_arms([0, 8]), delta=0.01)).value)
    grown = merge_spec(root, tiny_spec(arms=dp_arms([0, 8, 16])))  # growing is still allowed, the plan kept
    assert grown.plan == saved.plan and (root / "sweep.json").read_bytes() == before


def test_the_cli_refuses_another_delta_in_one_line_and_keeps_the_plan(tmp_path, capsys):
    root = tmp_path / "cli"
    assert main([*EMIT, "--delta", "0.01", "--out", str(root)]) == 0
    before = (root / "sweep.json").read_bytes()
    capsys.readouterr()
    assert main([*EMIT, "--delta", "0.08", "--out", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fixed delta=0.01" in err and "Traceback" not in err
    assert (root / "sweep.json").read_bytes() == before
    assert main([*EMIT, "--out", str(root)]) == 0  # without --delta: the plan's own margin, continued
    assert load_spec(root).delta == 0.01 and (root / "sweep.json").read_bytes() == before


def test_every_new_run_records_the_plans_hash_and_its_record_carries_it(tmp_path):
    root = tmp_path / "stamped"
    assert main([*EMIT, "--out", str(root)]) == 0
    spec = load_spec(root)
    stamps = [json.loads(p.read_text()) for p in sorted(root.glob("runs/*/seed-*/plan.json"))]
    assert len(stamps) == 4 and {s["sha256"] for s in stamps} == {spec.plan["sha256"]}
    assert all(s["prepared"] >= spec.plan["declared"] for s in stamps)
    run = run_dir(root, "dp8", 1)  # a finished run (summary only: enough for a record)
    (run / "summary.json").write_text(json.dumps({"steps": 4}))
    write_record(run, ())
    shutil.rmtree(run)
    assert read_record(run)["plan"]["sha256"] == spec.plan["sha256"] == run_plan(run)["sha256"]
    status = plan_status(spec, [run_dir(root, a, s) for a in ("dp0", "dp8") for s in (0, 1)])
    assert status["before_runs"] and "before any of its runs" in status["text"]


def test_an_edited_sweep_json_is_refused(tmp_path):
    root = tmp_path / "edited"
    save_spec(root, tiny_spec())
    body = json.loads((root / "sweep.json").read_text())
    (root / "sweep.json").write_text(json.dumps(body | {"delta": 0.08}))
    with pytest.raises(PlelabError, match="edited"):
        load_spec(root)
    body["delta"], body["plan"]["delta"] = 0.08, 0.08  # both moved: the hash no longer matches
    (root / "sweep.json").write_text(json.dumps(body))
    with pytest.raises(PlelabError, match="does not match its sha256"):
        load_spec(root)


def test_a_legacy_sweep_says_its_plan_came_after_its_runs(tmp_path):
    """The committed studies predate plans: they load, and their status says the plan is not shown first; a
    legacy sweep grown later gets a dated plan that only its new runs carry."""
    spec = load_spec(STUDIES / "dp32-confirm")
    assert spec is not None and spec.plan is None
    runs = [run_dir(STUDIES / "dp32-confirm", a.name, s) for a in spec.runnable() for s in spec.seeds]
    status = plan_status(spec, runs)
    assert not status["before_runs"] and "not shown to be declared before its runs" in status["text"]
    root = tmp_path / "legacy"
    save_spec(root, tiny_spec(arms=dp_arms([0, 8])))
    body = json.loads((root / "sweep.json").read_text())
    del body["plan"]
    (root / "sweep.json").write_text(json.dumps(body))
    old = run_dir(root, "dp0", 0)
    old.mkdir(parents=True)
    (old / "summary.json").write_text("{}")
    grown = save_spec(root, merge_spec(root, tiny_spec(arms=dp_arms([0, 8]))))
    new = run_dir(root, "dp8", 0)
    new.mkdir(parents=True)
    (new / "plan.json").write_text(json.dumps({"sha256": grown.plan["sha256"], "declared": grown.plan["declared"],
                                               "prepared": grown.plan["declared"]}))
    status = plan_status(grown, [old, new])
    assert not status["before_runs"] and "1 of 2 runs record its hash" in status["text"]


@pytest.mark.slow
def test_a_study_report_states_its_plan_and_a_posthoc_margin_is_labelled_apart(tmp_path, capsys):
    root = tmp_path / "dpc"
    shutil.copytree(STUDIES / "dp32-confirm", root)
    before = (root / "sweep.json").read_bytes()
    assert main(["report", str(root)]) == 0
    text = (root / "report" / "report.md").read_text()
    assert "No analysis plan was recorded" in text and "not shown to be fixed before the runs" in text
    assert main(["report", str(root), "--delta", "0.005"]) == 0
    post = (root / "report-posthoc-delta-0.005" / "report.md").read_text()
    assert "post-hoc sensitivity analysis" in post and "δ = 0.005 nats" in post
    assert "fixed in the analysis plan" not in post and "declared by" not in post
    assert (root / "report" / "report.md").read_text() == text and (root / "sweep.json").read_bytes() == before
    capsys.readouterr()
    assert main(["report", str(root), "--delta", "-1"]) == 2 and "--delta must be > 0" in capsys.readouterr().err


def _losses(table: dict[str, np.ndarray]) -> dict[str, dict[int, float]]:
    return {arm: {s: float(v) for s, v in enumerate(vals)} for arm, vals in table.items()}


def test_a_label_stands_only_where_pooled_and_own_error_agree():
    """Heteroscedastic by construction: the last step's differences are 4× noisier than the others'. Bartlett cannot
    see it with 3 seeds (p 0.22), so the pooled error calls the step a drop; the pair's own error cannot — the
    comparison is inconclusive and says both."""
    table = {"dp0": np.array([5.0, 5.1, 4.95]), "dp8": np.array([4.9755, 5.0608, 4.9229]),
             "dp16": np.array([4.9457, 5.0347, 4.894]), "dp32": np.array([4.9376, 5.0051, 4.8578])}
    losses = _losses(table)
    pairs = [("dp0", "dp8"), ("dp8", "dp16"), ("dp16", "dp32")]
    comps, how = blocked.analyse_family(losses, pairs, delta=0.02, alpha=0.05)
    assert how["method"] == "blocked" and how["own_error_disagreements"] == 1
    step = comps[2]
    assert step.own_error["label"] == stats.INCONCLUSIVE and step.label == stats.INCONCLUSIVE
    assert "the pooled error says 'significant drop'" in step.reason and "disagree" in step.reason
    assert step.seeds_to_decide["difference"] >= 3
    assert comps[0].label == comps[0].own_error["label"] == stats.DROP
    own = blocked._paired_family(losses, pairs, 0.02, 0.05, True)
    assert [c.label for c in own][:2] == [c.label for c in comps][:2]


def test_many_to_one_intervals_are_simultaneous_dunnett_intervals():
    rng = np.random.default_rng(1)  # equal variances by construction (Bartlett p 0.94)
    base = 5.0 + rng.normal(0, 0.05, 6)
    table = {"dp0": base, **{f"dp{d}": base - 0.01 * i + rng.normal(0, 0.01, 6) for i, d in enumerate((8, 16), 1)}}
    comps, how = blocked.analyse_family(_losses(table), [("dp0", "dp8"), ("dp0", "dp16")], 0.02, 0.05,
                                        steps=False, many_to_one=True)
    assert how["intervals"] == "simultaneous (Dunnett, 2)" and how["df"] == 10
    crit = blocked.dunnett_critical(2, 10)
    assert crit == pytest.approx(2.57, abs=0.01)  # Dunnett's (1955) table, two-sided α 0.05, k = 2, ν = 10
    assert blocked.dunnett_critical(4, 15) == pytest.approx(2.73, abs=0.01)
    for c in comps:
        assert c.ci_kind == "simultaneous (Dunnett, 2)"
        assert (c.ci_high - c.mean) / c.se == pytest.approx(crit) and crit > stats.t_quantile(0.975, 10)
    holm, how = blocked.analyse_family(_losses(table), [("dp0", "dp8"), ("dp8", "dp16")], 0.02, 0.05)
    assert how["intervals"] == "per comparison" and {c.ci_kind for c in holm} == {"per comparison"}


def test_the_committed_long_study_labels_are_rechecked_on_own_errors():
    """The long study's main curve (FINDINGS' "8 → 16" and "16 → 32" drops) on own errors: reported, not assumed."""
    recs = sorted((STUDIES / "long" / "records").glob("*/seed-*.json.gz"))
    assert recs, "studies/long records are missing"
    losses: dict[str, dict[int, float]] = {}
    spec = load_spec(STUDIES / "long")
    for r in recs:
        body = json.loads(gzip.decompress(r.read_bytes()))
        vals = [m["val_loss"] for m in body["metrics"] if "val_loss" in m][-spec.last_k:]
        losses.setdefault(r.parent.name, {})[int(r.name.split("-")[1].split(".")[0])] = float(np.mean(vals))
    main_curve = ["dp0", "dp4", "dp8", "dp16", "dp32"]
    comps, how = blocked.analyse_family(losses, list(zip(main_curve, main_curve[1:])), spec.delta, spec.alpha)
    assert how["method"] == "blocked"
    by_step = {(c.a, c.b): c for c in comps}
    for step in (("dp8", "dp16"), ("dp16", "dp32")):
        c = by_step[step]
        assert c.own_error["label"] == stats.INCONCLUSIVE and c.label == stats.INCONCLUSIVE


@pytest.mark.slow
def test_a_preregistered_study_freezes_its_design_and_says_it_in_plan_md(tmp_path, monkeypatch, capsys):
    from plelab.sweeps import preregister as prereg

    monkeypatch.setattr(prereg, "git_commit", lambda: "0123abcd" * 5)
    root = tmp_path / "confirm"
    args = ["sweep", "--preset", "cpu-tiny", "--dp", "0,8,16", "--controls", "zero", "--seed-list", "5,6",
            "--steps", "4", "--delta", "0.01", "--out", str(root)]
    assert main([*args, "--preregister"]) == 0
    assert "commit" in capsys.readouterr().out and not (root / "runs").exists()
    spec = load_spec(root)
    design = spec.plan["design"]
    assert design["commit"] == "0123abcd" * 5 and len(design["corpus"]) == 64 and "runtime" in design["budget"]
    assert design["seeds"] == [5, 6] and [a["name"] for a in design["arms"]] == [a.name for a in spec.arms]
    doc = (root / "PLAN.md").read_text()
    assert spec.plan["sha256"] in doc and "δ = 0.01" in doc
    assert "does not have both arms of the seed's dead-zone step" in doc
    assert main([*args, "--emit", "torchrun"]) == 0  # the study itself: every run stamped with the plan's hash
    assert {json.loads(p.read_text())["sha256"] for p in root.glob("runs/*/seed-*/plan.json")} == {spec.plan["sha256"]}
    capsys.readouterr()
    grown = [a if a != "5,6" else "5,6,7" for a in args]
    assert main([*grown, "--emit", "torchrun"]) == 2
    assert "preregistered study" in capsys.readouterr().err
    assert main([*args, "--controls", "zero,iid", "--emit", "torchrun"]) == 2
    assert main([*args, "--preregister"]) == 2 and "new, empty folder" in capsys.readouterr().err
    body = json.loads((root / "sweep.json").read_text())
    body["seeds"] = [5]  # the design edited by hand
    (root / "sweep.json").write_text(json.dumps(body))
    with pytest.raises(PlelabError, match="another seeds than its analysis plan declared"):
        load_spec(root)


def test_preregistering_needs_a_clean_checkout_and_finds_the_seeds_dead_zone_step(tmp_path, monkeypatch):
    from plelab.sweeps import preregister as prereg
    from plelab.sweeps.commands import dp_spec

    monkeypatch.setattr(prereg, "git_commit", lambda: "0123abcd" * 5 + "+dirty")
    with pytest.raises(PlelabError, match="commit \\(or stash\\) the checkout's changes first"):
        prereg.preregister(tmp_path / "p", tiny_spec())
    assert not (tmp_path / "p").exists()
    spec = dp_spec(preset="cpu-sweep-h160", dp=[0, 4, 8, 16, 32])
    assert prereg.dead_zone_step(spec, 160) == ("dp4", "dp8")
    assert prereg.dead_zone_step(dp_spec(preset="cpu-tiny", dp=[0, 8, 16]), 64) is None
