"""A sweep's analysis plan: fixed when the sweep is created, hashed, carried by every run, never rewritten.

A study's labels depend on choices that must not be made after its losses are seen: the margin δ, the level α,
the outcome (a run's loss = the mean of its last ``last_k`` evaluations), the baseline, and which tests the families
get. :func:`declare` writes them into ``sweep.json`` when the sweep is first saved, as ``plan``::

    {"delta", "alpha", "last_k", "baseline", "rules": RULES, "declared": ISO-8601 UTC, "sha256": hex}

``sha256`` is the hash of the canonical JSON of everything else in ``plan``. Each run gets ``RUN/plan.json``
(``{"sha256", "declared", "prepared"}``, written before it can start, kept in its record), so a report can show
from the runs themselves whether the plan came first (:func:`plan_status`). A rerun that asks for another δ, α
or ``last_k`` is refused (:func:`changed`), and a ``sweep.json`` whose fields no longer match its plan's hash is
refused as edited (:func:`verify`). Another margin after the runs is a post-hoc sensitivity analysis
(``plelab report SWEEP --delta X``), written apart and labelled so, never "declared".

Sweeps made before plelab fixed plans have none; they get one, dated, on their next run, and the report says
which runs ran before it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from plelab.errors import PlelabError
from plelab.io import write_json
from plelab.sweeps.records import RUN_PLAN, read_record

PLAN_FIELDS = ("delta", "alpha", "last_k", "baseline")
# The analysis the code runs, as the plan declares it; a change here is a new rules version.
RULES = {
    "version": 2,
    "outcome": "a run's loss is the mean of its last last_k validation evaluations",
    "design": "seeds are blocks; every comparison B − A is paired by seed",
    "families": {
        "vs_baseline": "each main-curve arm − baseline: Dunnett many-to-one p-values and simultaneous intervals",
        "consecutive": "each step along the main dP curve: Holm",
        "controls": "each control or variant arm − its reference arm: Holm",
        "controls_vs_baseline": "each control or variant arm − baseline: Dunnett",
        "{family}_consecutive": "each step along a control curve: Holm",
    },
    "error": "pooled (randomised complete block) and each pair's own error (paired t); a label stands only where "
             "both analyses give it, otherwise inconclusive; pairs only where the blocks are incomplete or Bartlett "
             "rejects equal variances",
    "equivalence": "TOST within ±delta, Holm-adjusted in each family",
}


def _sha(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def require_clean(commit: str | None, what: str) -> str:
    """``commit`` (:func:`plelab.provenance.git_commit`), refused unless it names the code exactly: a preregistered
    ``what`` records the commit that will run it."""
    if commit is None or commit.endswith("+dirty"):
        raise PlelabError(f"{what} records the code commit that will run it: "
                          + ("plelab is not running from a git checkout" if commit is None else
                             "commit (or stash) the checkout's changes first"))
    return commit


def design_of(spec) -> dict:
    """The design a preregistered plan freezes, as the spec holds it: preset, overrides, steps, seeds, arms."""
    return {"preset": spec.preset, "overrides": list(spec.overrides), "steps": spec.steps, "seeds": list(spec.seeds),
            "arms": [{"name": a.name, "overrides": list(a.overrides)} for a in spec.arms]}


def declare(spec, when: str | None = None, design: dict | None = None) -> dict:
    """The plan of ``spec`` (a :class:`~plelab.sweeps.spec.SweepSpec`) declared at ``when`` (default now);
    ``design``: a preregistered study's frozen design (:mod:`plelab.sweeps.preregister`), hashed with the rest."""
    body = {k: getattr(spec, k) for k in PLAN_FIELDS} | {"rules": RULES, "declared": when or now()}
    if design is not None:
        body["design"] = design
    return body | {"sha256": _sha(body)}


def frozen(spec) -> bool:
    """Whether ``spec``'s plan is a preregistration (its arms and seeds are fixed too)."""
    return bool(spec.plan and spec.plan.get("design"))


def verify(spec, where: Path) -> None:
    """Refuse a spec whose plan was edited: its hash must match its body, its fields the spec's."""
    plan = spec.plan
    if plan is None:
        return
    if not isinstance(plan, dict) or plan.get("sha256") != _sha({k: v for k, v in plan.items() if k != "sha256"}):
        raise PlelabError(f"{where}'s analysis plan does not match its sha256: it was edited after it was declared; "
                          "restore the file (git, or the copy it came from) or start a new study folder")
    edited = [k for k in PLAN_FIELDS if plan.get(k) != getattr(spec, k)]
    if frozen(spec):
        mine = design_of(spec)
        edited += [k for k in mine if json.loads(json.dumps(mine[k])) != plan["design"].get(k)]
    if edited:
        k = edited[0]
        raise PlelabError(f"{where} has another {k} than its analysis plan declared (the file was edited after the "
                          "plan); restore it, or start a new study folder for another value")


def changed(old, new) -> str | None:
    """The first plan field ``new`` asks to change in ``old``'s sweep, or None."""
    return next((k for k in PLAN_FIELDS if getattr(old, k) != getattr(new, k)), None)


def refusal(root: Path, old, key: str, new_value) -> PlelabError:
    """The one-line refusal of a rerun that asks for another ``key``."""
    when = f" on {old.plan['declared']}" if old.plan else ""
    option = {"delta": "--delta", "last_k": "--last-k", "alpha": "alpha", "baseline": "the baseline"}[key]
    way = (f"; or read this sweep at another margin with `plelab report {root} --delta {new_value:g}` (a post-hoc "
           "sensitivity analysis, labelled so)" if key == "delta" else "")
    return PlelabError(f"{root}'s analysis plan fixed {key}={getattr(old, key)!r}{when}, before its runs; {option} "
                       f"{new_value!r} cannot change it now — rerun without {option} to continue, or start a new "
                       f"study folder (another --out) for {key}={new_value!r}{way}")


def refuse_growth(root: Path, old, new) -> None:
    """A preregistered study's arms and seeds are its plan's: a rerun may not add any."""
    if not frozen(old):
        return
    arms = [a.name for a in new.arms if a.name not in {b.name for b in old.arms}]
    seeds = [s for s in new.seeds if s not in old.seeds]
    if arms or seeds:
        what = f"arm {arms[0]}" if arms else f"seed {seeds[0]}"
        raise PlelabError(f"{root} is a preregistered study (plan {old.plan['sha256'][:12]}…): its arms and seeds are "
                          f"fixed, so {what} cannot be added; a deviation is a new study — another --out")


def stamp_run(run: Path, plan: dict) -> None:
    """Write ``RUN/plan.json`` for a run about to be prepared (kept if it is already there)."""
    path = Path(run) / RUN_PLAN
    if not path.exists():
        write_json(path, {"sha256": plan["sha256"], "declared": plan["declared"], "prepared": now()})


def run_plan(run: Path) -> dict | None:
    """A run's plan stamp: its folder's ``plan.json``, else the one its record carries, else None."""
    try:
        stamp = json.loads((Path(run) / RUN_PLAN).read_text())
        return stamp if isinstance(stamp, dict) else None
    except (OSError, ValueError):
        pass
    record = read_record(run)
    stamp = record.get("plan") if record else None
    return stamp if isinstance(stamp, dict) else None


def plan_status(spec, runs: list[Path]) -> dict:
    """Was the plan declared before the runs? From the stamps of the finished ``runs``.

    ``{"declared", "sha256", "runs", "stamped", "first_prepared", "before_runs", "text"}``; ``before_runs`` is
    True only when every run carries the plan's hash and the plan is dated no later than the first of them."""
    plan = spec.plan
    out = {"declared": None, "sha256": None, "runs": len(runs), "stamped": 0, "first_prepared": None,
           "before_runs": False}
    if not plan:
        out["text"] = ("No analysis plan was recorded when this sweep was created (made before plelab fixed plans): "
                       "δ, α and the outcome are not shown to be declared before its runs; read its labels as "
                       "exploratory.")
        return out
    stamps = [s for s in (run_plan(r) for r in runs) if s and s.get("sha256") == plan["sha256"]]
    first = min((s.get("prepared", "") for s in stamps), default=None) or None
    before = bool(runs) and len(stamps) == len(runs) and first is not None and plan["declared"] <= first
    out.update(declared=plan["declared"], sha256=plan["sha256"], stamped=len(stamps), first_prepared=first,
               before_runs=before)
    head = f"Analysis plan sha256 {plan['sha256'][:12]}… (δ, α, outcome, families, tests) declared {plan['declared']}"
    if before:
        out["text"] = (f"{head}, before any of its runs: all {len(runs)} record its hash, the first was prepared "
                       f"{first}.")
    elif stamps:
        out["text"] = (f"{head}; {len(stamps)} of {len(runs)} runs record its hash — the other "
                       f"{len(runs) - len(stamps)} ran before it was declared, so the plan is not preregistered for "
                       "them.")
    else:
        out["text"] = (f"{head}, after its runs: none of its {len(runs)} runs records the plan's hash (they ran "
                       "before plelab fixed plans); read its labels as exploratory.")
    return out


__all__ = ["PLAN_FIELDS", "RULES", "RUN_PLAN", "changed", "declare", "design_of", "frozen", "plan_status",
           "refusal", "refuse_growth", "require_clean", "run_plan", "stamp_run", "verify"]
