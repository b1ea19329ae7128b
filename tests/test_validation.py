"""The preregistered validation: a plan frozen (thresholds, commit, corpora, design, truths, criteria) before any
run, refused when edited or run from another commit, every run stamped with it, and the result scored at the
plan's thresholds per configuration — on a tiny rung trained for real."""

import json
import shutil
from pathlib import Path

import pytest

import plelab.calibration.validation as V
from plelab.calibration.benchmark import SCALES
from plelab.calibration.validation import ValidationDesign, load_plan, preregister_validation, run_validation
from plelab.calibration.validation_report import judge, validation_result
from plelab.cli import main
from plelab.errors import PlelabError
from plelab.sweeps.analysis_plan import run_plan
from plelab.sweeps.spec import load_spec

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROOT = Path(__file__).resolve().parents[1]


def _calibration(path: Path, unit: str = "configuration") -> Path:
    rows = [{"fraction": k / 8, "lo": 1.0, "hi": 4.0} for k in range(1, 9)]
    rel = {kind: {"h32-embedded": {"unit": "configuration", "schemes": {"corpus": [
        {"fraction": k / 8, "wrong": 1, "decided": 10, "configurations": 14} for k in range(1, 9)]}}}
        for kind in ("LEARNED", "USED", "BENEFIT")}
    path.write_text(json.dumps({"benchmark": {"windows": 64}, "regimes": [], "reliability": rel,
                                "thresholds": {"LEARNED": rows, "USED": rows, "BENEFIT": rows},
                                "threshold_rule": {"rule": "quantile", "target": 0.05, "unit": unit}}))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Real text nobody wrote for this test: plelab's own sources, about a megabyte."""
    path = tmp_path_factory.mktemp("corpus") / "sources.txt"
    path.write_text("\n\n".join(p.read_text() for p in sorted((ROOT / "plelab").rglob("*.py"))))
    return path


def _design(corpus: Path) -> ValidationDesign:
    return ValidationDesign(corpora={"src": str(corpus)}, rungs={"t": {"overrides": list(SCALES["h32"]), "steps": 16}},
                  seeds=[100, 101, 102])


@pytest.fixture(scope="module")
def validated(tmp_path_factory, corpus):
    mp = pytest.MonkeyPatch()
    mp.setattr(V, "git_commit", lambda: COMMIT)
    root = tmp_path_factory.mktemp("validation")
    out = root / "val"
    # one worker: its runs train in this process; a worker process per 16-step run cost more (47 s against 20 s, quiet)
    plan = preregister_validation(out, _design(corpus), _calibration(root / "calibration.json"), jobs=1,
                                  log=lambda *a: None)
    run_validation(out, jobs=1, progress=False, log=lambda *a: None)
    mp.undo()
    return out, plan


@pytest.mark.slow
def test_the_plan_freezes_everything_before_any_run(validated, corpus):
    out, plan = validated
    assert load_plan(out) == plan and (out / "PLAN.md").exists()
    assert plan["commit"] == COMMIT and len(plan["thresholds"]["sha256"]) == 64
    assert plan["thresholds"]["rows"]["USED"][0] == {"fraction": 0.125, "lo": 1.0, "hi": 4.0}
    assert plan["corpora"]["src"]["path"] == str(corpus) and len(plan["corpora"]["src"]["sha256"]) == 64
    assert set(plan["truths"]) == {"LEARNED", "USED", "BENEFIT"} and "transfers" in plan["criteria"]
    assert plan["design"]["classes"] == ["real", "near0", "iid", "zero", "gate0", "none"]
    assert "estimated runtime" in plan["budget"] or "runtime" in plan["budget"]
    doc = (out / "PLAN.md").read_text()
    assert plan["sha256"] in doc and COMMIT in doc and "Frozen thresholds" in doc
    spec = load_spec(out / "t-src")
    assert spec.plan["design"]["validation"] == plan["sha256"] and spec.plan["design"]["commit"] == COMMIT
    runs = sorted((out / "t-src" / "runs").glob("*/seed-*"))
    assert len(runs) == 6 * 3  # every run stamped with the regime's plan, which carries the validation's hash
    assert all(run_plan(r)["sha256"] == spec.plan["sha256"] for r in runs)


@pytest.mark.slow
def test_the_result_is_scored_at_the_plans_thresholds_per_configuration(validated):
    out, plan = validated
    result = validation_result(out)
    rung = result["rungs"]["t"]
    for kind in ("LEARNED", "USED", "BENEFIT"):
        points = rung["kinds"][kind]["points"]
        assert [p["fraction"] for p in points] == [k / 8 for k in range(1, 9)]
        # 4 called arms (real, near0, iid, gate0); LEARNED's near0 is a weak positive, apart
        assert all(p["configurations"] == (3 if kind == "LEARNED" else 4) for p in points)
        assert rung["kinds"][kind]["verdict"] in ("transfers", "does not transfer", "inconclusive")
        assert all(p["decided"] <= p["known"] <= p["configurations"] for p in points)
    assert [(a["call"], a["cls"]) for a in rung["apart"]] == [("LEARNED", "near0")]
    assert not result["unfinished"] and result["plan"] == plan["sha256"]
    assert "before any of its runs" in result["plan_status"]["t-src"]
    report = (out / "report.md").read_text()
    assert "## Rung t" in report and "held out by corpus" in report and "1/10" in report


def test_criteria_as_declared():
    ok = {"wrong": 0, "known": 4, "coverage": 0.75, "iid_positive": 0}
    assert judge({0.25: ok, 0.5: ok, 1.0: ok}, [0.25, 0.5, 1.0]) == "transfers"
    assert judge({0.25: ok, 0.5: ok | {"wrong": 2}, 1.0: ok}, [0.25, 0.5, 1.0]) == "does not transfer"
    assert judge({0.25: ok, 0.5: ok, 1.0: ok | {"iid_positive": 1}}, [0.25, 0.5, 1.0]) == "does not transfer"
    assert judge({0.25: ok, 0.5: ok | {"wrong": 1}, 1.0: ok}, [0.25, 0.5, 1.0]) == "inconclusive"
    assert judge({0.25: ok, 0.5: ok | {"coverage": 0.25}, 1.0: ok}, [0.25, 0.5, 1.0]) == "inconclusive"


@pytest.mark.slow
def test_what_the_plan_refuses(validated, corpus, tmp_path, monkeypatch, capsys):
    out, plan = validated
    monkeypatch.setattr(V, "git_commit", lambda: "f" * 40)
    with pytest.raises(PlelabError, match="run it from a worktree of that commit"):
        run_validation(out)
    with pytest.raises(PlelabError, match="not empty"):
        preregister_validation(out, _design(corpus), _calibration(tmp_path / "c.json"))
    with pytest.raises(PlelabError, match="counted calls"):
        preregister_validation(tmp_path / "new", _design(corpus), _calibration(tmp_path / "old.json", unit="call"))
    monkeypatch.setattr(V, "git_commit", lambda: "f" * 40 + "+dirty")
    with pytest.raises(PlelabError, match="commit"):
        preregister_validation(tmp_path / "dirty", _design(corpus), _calibration(tmp_path / "c2.json"))
    edited = tmp_path / "edited"
    edited.mkdir()
    text = json.loads((out / "plan.json").read_text())
    text["design"]["seeds"] = [1, 2, 3]
    (edited / "plan.json").write_text(json.dumps(text))
    with pytest.raises(PlelabError, match="edited after it was declared"):
        load_plan(edited)
    assert main(["validate", str(out), "--corpus", f"x={corpus}"]) == 2
    assert "fixed by the validation's plan" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "n"), "--preregister", "--no-run", "--corpus", f"x={corpus}"]) == 2
    assert "never runs anything" in capsys.readouterr().err
    monkeypatch.setattr(V, "git_commit", lambda: COMMIT)
    for bad in ("/no/such/calibration.json", str(corpus)):  # missing, and not JSON: one line, no traceback
        assert main(["validate", str(tmp_path / "m"), "--preregister", "--corpus", f"x={corpus}", "--calibration",
                     bad]) == 2
        assert "not a readable calibration.json" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "n"), "--preregister", "--corpus", "x=/no/such.txt"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_a_regime_carried_without_its_weights_scores_the_same(validated, tmp_path, capsys):
    """A validation rung outlives its machine: ``plelab pack`` writes each finished arm's evidence (what its calls
    read from the weights) beside the run records, which keep every decision point's use test; a regime whose run
    folders are gone then gives the same calls. An arm held only as records without evidence is refused."""
    from plelab.calibration.evidence import evidence_path
    from plelab.calibration.features import regime_calls
    from plelab.sweeps.commands import pack
    from plelab.sweeps.runner import jobs_of, run_state

    out, _ = validated
    spec = load_spec(out / "t-src")
    order = [(j.arm.name, j.seed) for j in jobs_of(out / "t-src", spec)]
    assert order[:3] == [("none-dp0", 100), ("none-dp0", 101), ("none-dp0", 102)]  # arm by arm, seeds inner
    carried = tmp_path / "carried"
    packed = pack(out, carried)
    assert packed["records"] == 18 and packed["evidence"] == 4  # real, near0, iid, gate0; zero and none uncalled
    assert pack(out, tmp_path / "again")["evidence"] == 0  # written once
    assert not (carried / "t-src" / "runs").exists() and evidence_path(carried / "t-src", "real-dp16").is_file()
    here = [c.to_dict() for c in regime_calls(out / "t-src")]
    there = [c.to_dict() for c in regime_calls(carried / "t-src")]
    assert there == here and len(here) == 4 * 8 * 9  # 4 called arms × 8 points × (3 pairs + 3 seeds × 2 calls)
    evidence_path(carried / "t-src", "iid-dp16").unlink()
    with pytest.raises(PlelabError, match="held only as records .* no evidence file"):
        regime_calls(carried / "t-src")
    # a session ends mid-arm: the arm's finished seeds are not carried (their weights, which the arm's evidence
    # needs, stay behind), so the next machine trains the whole arm again instead of never scoring it
    half = tmp_path / "half"
    shutil.copytree(out, half)
    shutil.rmtree(half / "t-src" / "evidence")
    (half / "t-src" / "runs" / "gate0-dp16" / "seed-102" / "summary.json").unlink()  # its last seed unfinished
    (half / "t-src" / "records" / "gate0-dp16" / "seed-102.json.gz").unlink()
    left = pack(half, tmp_path / "half-carried")
    assert left["evidence"] == 3 and left["held"] == 2
    moved = load_spec(tmp_path / "half-carried" / "t-src")
    states = {j.name: run_state(j) for j in jobs_of(tmp_path / "half-carried" / "t-src", moved)}
    assert [n for n, s in states.items() if s != "done"] == [f"gate0-dp16/seed-{k}" for k in (100, 101, 102)]
    capsys.readouterr()
    assert main(["pack", str(half), str(tmp_path / "by-cli")]) == 0
    assert "2 finished run(s) of unfinished calibrate arms left to train again" in capsys.readouterr().out
