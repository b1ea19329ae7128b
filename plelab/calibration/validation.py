"""A preregistered validation of the verdict beyond its benchmark: frozen thresholds, scored on model sizes, corpora
and seeds that no fit and no development saw.

``plelab validate OUT --preregister --corpus NAME=PATH …`` (:func:`preregister_validation`) runs nothing: it writes
``OUT/plan.json`` and ``OUT/PLAN.md`` — the frozen thresholds (the shipped ``calibration.json``'s sha256 and its
rows), the code commit (a clean checkout only), the rungs, corpora (each with the sha256 of its text as plelab
reads it), classes, dP, seeds, decision points, the truth definitions (:data:`~plelab.calibration.truth.TRUTHS`),
the analysis and the success criteria (:data:`CRITERIA`), and the runtime plelab's clock states for it — hashed
(sha256 of the canonical JSON). Every regime folder ``OUT/{rung}-{corpus}`` is a preregistered calibrate sweep whose
plan carries the validation's hash, so every run records it before it starts. ``plelab validate OUT`` then runs
what is left (only from the plan's commit) and writes ``OUT/report.md`` and ``OUT/validation.json``
(:func:`validation_result`); a plan edited after it was declared is refused, and so is a rerun that would change
it (a new design is a new folder).

**Scoring** uses the plan's thresholds, never the installed ones. Each call is decided at its decision point's
thresholds; a *configuration* (a regime's arm) is the unit, its seeds' calls counted once by majority
(:func:`plelab.calibration.evaluate.unit_of`); the bounds are one-sided 95% Clopper–Pearson over configurations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from plelab.calibration.benchmark import CLASS_OVERRIDES, DECISIONS, PRESET, regime_overrides
from plelab.calibration.evaluate import decide, upper_bound
from plelab.calibration.features import Call
from plelab.calibration.truth import TRUTHS
from plelab.config import resolve_config
from plelab.diagnostics.verdict import SHIPPED
from plelab.errors import ConfigError, PlelabError
from plelab.io import atomic_write, check_name, ensure_dir, write_json
from plelab.provenance import git_commit
from plelab.runs import prepare_data
from plelab.sweeps.analysis_plan import declare, design_of, now, require_clean
from plelab.sweeps.runner import run_sweep, study_estimate
from plelab.sweeps.spec import Arm, SweepSpec, load_spec, save_spec

PLAN_FILE, PLAN_DOC = "plan.json", "PLAN.md"
KINDS = ("LEARNED", "USED", "BENEFIT")
#: the rungs: a size the benchmark never saw (H 192, 4 layers, 1,024 rows, ≥ 1,000 tokens per row at the end) and
#: a control inside the benchmark's span (its h64 scale and 320 steps)
RUNGS = {
    "h192": {"overrides": ["model.hidden_size=192", "model.num_hidden_layers=4", "model.intermediate_size=512",
                           "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=1024"],
             "steps": 2048},
    "h64": {"overrides": ["model.hidden_size=64", "model.num_hidden_layers=2", "model.intermediate_size=176"],
            "steps": 320},
}
CLASSES = ("real", "near0", "iid", "zero", "gate0", "none")
POINTS = (0.25, 0.5, 1.0)  # the decision points the criteria judge (declared; the others are reported)
CRITERIA = {
    "unit": "a configuration (one arm of one rung on one corpus), its seeds' calls counted once by majority",
    "transfers": "at every judged decision point (0.25, 0.5, 1.0 of the run): no decided configuration wrong and "
                 "at least half of the configurations with a known truth decided",
    "does not transfer": "at any judged decision point: 2 or more decided configurations wrong, or an i.i.d.-id "
                         "configuration called positive",
    "inconclusive": "everything else (e.g. 1 wrong, or coverage under half), reported with its counts",
    "apart": "weak positives (near0's LEARNED) are reported apart, never scored",
}


@dataclass
class ValidationDesign:
    """What a validation trains: ``rungs`` × ``corpora`` regimes, each with ``classes`` at dP ``dim`` (``none`` at
    dP 0), ``seeds`` per arm, batch × sequence as the benchmark's."""

    corpora: dict[str, str]  # name -> text file or folder
    rungs: dict[str, dict] = field(default_factory=lambda: json.loads(json.dumps(RUNGS)))
    classes: tuple[str, ...] = CLASSES
    dim: int = 16
    seeds: list[int] = field(default_factory=lambda: list(range(100, 108)))
    batch_size: int = 8
    seq_len: int = 64

    def validate(self) -> None:
        if len(self.corpora) < 1:
            raise ConfigError("a validation needs at least one corpus: --corpus NAME=PATH (text nobody developed on)")
        for name, path in self.corpora.items():
            check_name(name, "corpus name")
            if not Path(path).exists():
                raise ConfigError(f"--corpus {name}={path}: no such file or folder")
        for name, rung in self.rungs.items():
            check_name(name, "rung name")
            if rung["steps"] < DECISIONS or rung["steps"] % DECISIONS:
                raise ConfigError(f"rung {name}: steps must be a multiple of {DECISIONS}, got {rung['steps']}")
        unknown = [c for c in self.classes if c not in CLASS_OVERRIDES]
        if unknown or not {"zero", "none"} <= set(self.classes):
            raise ConfigError(f"validation classes {list(self.classes)}: known classes only, with zero and none "
                              "(BENEFIT's references)")
        if len(self.seeds) < 3 or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"a validation needs >= 3 distinct seeds (a call's truth is read off the others), got "
                              f"{self.seeds}")

    def spec(self, rung: str, corpus: str) -> SweepSpec:
        r = self.rungs[rung]
        arms = [Arm("none-dp0", ["ple.dim=0"], "none", 0, description="no PLE (dP 0)")] if "none" in self.classes \
            else []
        arms += [Arm(f"{c}-dp{self.dim}", [f"ple.dim={self.dim}", *CLASS_OVERRIDES[c]], c, self.dim,
                     reference=f"zero-dp{self.dim}" if c != "zero" else None, description=f"{c} at dP={self.dim}")
                 for c in self.classes if c != "none"]
        overrides = [*r["overrides"], f"data.path={Path(self.corpora[corpus]).resolve()}",
                     *regime_overrides(r["steps"], self.batch_size, self.seq_len)]
        return SweepSpec(preset=PRESET, overrides=overrides, arms=arms, seeds=list(self.seeds), steps=r["steps"],
                         kind="calibrate", baseline=f"zero-dp{self.dim}")

    def regimes(self) -> list[tuple[str, str, str]]:
        return [(f"{rung}-{corpus}", rung, corpus) for rung in self.rungs for corpus in self.corpora]


def _sha(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _frozen_thresholds(calibration: Path) -> dict:
    try:
        raw = calibration.read_bytes()
        cal = json.loads(raw)
        rule = cal.get("threshold_rule") or {}
        cal["thresholds"]
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as err:
        raise PlelabError(f"--calibration {calibration}: not a readable calibration.json ({type(err).__name__}); give "
                          "the file plelab calibrate wrote (OUT/calibration.json) or the shipped one") from None
    if rule.get("unit") != "configuration":
        raise PlelabError(f"{calibration} counted calls (fitted before rates were counted by configuration): refit it "
                          "first (plelab calibrate … --write-thresholds), then preregister the validation against it")
    return {"file": str(calibration), "sha256": hashlib.sha256(raw).hexdigest(), "rule": rule,
            "rows": cal["thresholds"], "benchmark": _benchmark_by_corpus(cal)}


def _benchmark_by_corpus(cal: dict) -> dict:
    """Per call kind and decision point, the benchmark's held-out-by-corpus counts summed over its regimes (what
    users are shown), to set the validation beside."""
    out: dict = {}
    for kind, regimes in (cal.get("reliability") or {}).items():
        sums: dict[float, list[int]] = {}
        for reg in regimes.values():
            for row in (reg.get("schemes") or {}).get("corpus", []):
                s = sums.setdefault(row["fraction"], [0, 0, 0])
                s[0] += row["wrong"]
                s[1] += row["decided"]
                s[2] += row["configurations"]
        out[kind] = [{"fraction": f, "wrong": w, "decided": d, "configurations": n,
                      "wrong_upper": upper_bound(w, d)} for f, (w, d, n) in sorted(sums.items())]
    return out


def load_plan(out: Path) -> dict:
    """``OUT/plan.json``, verified against its hash (an edited plan is refused)."""
    path = Path(out) / PLAN_FILE
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        raise PlelabError(f"{path} is missing or unreadable: preregister first (plelab validate {out} --preregister "
                          "--corpus NAME=PATH …)") from None
    if not isinstance(plan, dict) or plan.get("sha256") != _sha({k: v for k, v in plan.items() if k != "sha256"}):
        raise PlelabError(f"{path} does not match its sha256: it was edited after it was declared; restore it (git) "
                          "or preregister a new validation in another folder")
    return plan


def _design(plan: dict) -> ValidationDesign:
    d = plan["design"]
    return ValidationDesign(corpora={k: v["path"] for k, v in plan["corpora"].items()}, rungs=d["rungs"],
                  classes=tuple(d["classes"]), dim=d["dim"], seeds=d["seeds"], batch_size=d["batch_size"],
                  seq_len=d["seq_len"])


def preregister_validation(out: str | Path, design: ValidationDesign, calibration: str | Path = SHIPPED, jobs: int = 2,
                           log=print) -> dict:
    """Freeze ``design`` against ``calibration``'s thresholds in the new folder ``out``; run nothing; return the plan."""
    design.validate()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise PlelabError(f"{out} is not empty: a validation is preregistered in a new, empty folder")
    commit = require_clean(git_commit(), "a preregistered validation")
    thresholds = _frozen_thresholds(Path(calibration))
    corpora, specs = {}, []
    for name, rung, corpus in design.regimes():
        spec = design.spec(rung, corpus)
        data = prepare_data(resolve_config(spec.preset, spec.overrides, steps=spec.steps), progress=False)
        corpora[corpus] = {"path": str(Path(design.corpora[corpus]).resolve()), "sha256": data.corpus_fingerprint}
        specs.append((out / name, spec))
    budget = study_estimate(specs, jobs, log)
    body = {"kind": "plelab validation", "version": 1, "declared": now(), "commit": commit,
            "thresholds": thresholds, "corpora": corpora,
            "design": {k: v for k, v in asdict(design).items() if k != "corpora"} | {"decisions": DECISIONS},
            "truths": TRUTHS, "points": list(POINTS), "criteria": CRITERIA, "budget": budget, "jobs": jobs}
    body["design"]["classes"] = list(design.classes)
    plan = body | {"sha256": _sha(body)}
    ensure_dir(out)
    write_json(out / PLAN_FILE, plan)
    for folder, spec in specs:
        frozen = design_of(spec) | {"commit": commit, "corpus": corpora[folder.name.partition("-")[2]]["sha256"],
                                    "validation": plan["sha256"], "budget": budget, "jobs": jobs}
        save_spec(folder, dataclasses.replace(spec, plan=declare(spec, design=frozen)))
    atomic_write(out / PLAN_DOC, lambda p: p.write_text(plan_text(plan, out)))
    return plan


def plan_text(plan: dict, out: Path) -> str:
    d, th = plan["design"], plan["thresholds"]
    rungs = "\n".join(f"| {n} | {r['steps']} | {' '.join(r['overrides'])} |" for n, r in d["rungs"].items())
    corpora = "\n".join(f"- `{n}`: {c['path']} (sha256 of its text as read `{c['sha256']}`)"
                        for n, c in plan["corpora"].items())
    truths = "\n".join(f"- {k}: {v}" for k, v in plan["truths"].items())
    criteria = "\n".join(f"- **{k}**: {v}" for k, v in plan["criteria"].items())
    return f"""# Preregistered validation of the verdict — {out.name}

Declared {plan['declared']} (UTC) at code commit `{plan['commit']}`; plan sha256 `{plan['sha256']}`. Every run of every
regime folder records it before it starts; the analysis refuses a plan edited after it was declared, and the runs
refuse another commit.

## Frozen thresholds
`{th['file']}` sha256 `{th['sha256']}` (rule: {th['rule'].get('rule')}, target {th['rule'].get('target')} per side,
counted by {th['rule'].get('unit')}); its rows are copied into `plan.json` and only they score the calls.

## ValidationDesign
Classes {', '.join(d['classes'])} at dP {d['dim']} (`none`: dP 0); seeds {d['seeds']}; batch {d['batch_size']} ×
{d['seq_len']} tokens; {d['decisions']} decision points per run.

| rung | steps | overrides |
|---|---|---|
{rungs}

Corpora (never used in plelab's development):
{corpora}

Runtime stated before any run: {plan['budget']} ({plan['jobs']} workers).

## Truths (what scores each call)
{truths}

## Analysis and success criteria
Calls decided with the frozen thresholds at their decision point; judged points {', '.join(map(str, plan['points']))}.
{criteria}

The result is published whatever it is, beside the benchmark's held-out-by-corpus rates (in `plan.json`). If the
thresholds do not transfer, the calibrated range is narrowed; a refit is made only on a new benchmark that does not
include these runs.

Run: `plelab validate {out} --jobs {plan['jobs']}` from commit `{plan['commit'][:12]}`.
"""


def run_validation(out: str | Path, jobs: int = 1, progress: bool = True, log=print) -> list[Path]:
    """Run what is left of the preregistered validation in ``out`` (only from the plan's commit)."""
    out = Path(out)
    plan = load_plan(out)
    commit = git_commit()
    if commit != plan["commit"]:
        raise PlelabError(f"{out}'s plan runs at commit {plan['commit'][:12]}, this checkout is at "
                          f"{(commit or 'no git checkout')[:12]}: run it from a worktree of that commit "
                          f"(git worktree add DIR {plan['commit'][:12]}), or read what has run with --no-run")
    folders = []
    for name, _, _ in _design(plan).regimes():
        spec = _regime(out / name, plan)
        run_sweep(out / name, spec, jobs=jobs, progress=progress, log=log)
        folders.append(out / name)
    return folders


def _regime(folder: Path, plan: dict) -> SweepSpec:
    spec = load_spec(folder)
    if spec is None or spec.plan is None or (spec.plan.get("design") or {}).get("validation") != plan["sha256"]:
        raise PlelabError(f"{folder} is not a regime of the validation plan {plan['sha256'][:12]}… (restore it from "
                          "the preregistered folder)")
    return spec


def score(calls: list[Call], rows: dict[str, list[dict]]) -> list[tuple[Call, bool | None]]:
    """Each call decided at the frozen thresholds of its decision point (exact fraction; none: undecided)."""
    out = []
    for c in calls:
        row = next((r for r in rows.get(c.call, []) if math.isclose(r["fraction"], c.fraction)), None)
        th = None if row is None else (-math.inf if row["lo"] is None else row["lo"],
                                       math.inf if row["hi"] is None else row["hi"])
        out.append((c, decide(c.score, th)))
    return out
