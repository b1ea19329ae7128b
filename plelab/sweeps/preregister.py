"""A confirmatory study preregistered: its whole design and analysis frozen, hashed and written down before any run.

``plelab sweep … --preregister`` (:func:`preregister`) creates the study's folder and runs nothing. Its
``sweep.json`` carries an analysis plan (:mod:`plelab.sweeps.analysis_plan`) whose hashed body also holds the
**design**: preset, overrides, every arm's definition, the seeds, the step budget, the code commit, the corpus
fingerprint and the runtime stated for it by plelab's clock. ``PLAN.md`` says the same in words: the questions,
the families and their tests, the label rule, what counts as the seed's dead zone reproducing, and the budget.
Commit both, then rerun the same command without ``--preregister`` to run it: every run records the plan's hash
before it starts, a rerun may not add arms or seeds (a deviation is a new study), and an edited ``sweep.json`` is
refused. Only a clean checkout can preregister (the commit must name the code that will run).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plelab.config import resolve_config
from plelab.errors import PlelabError
from plelab.io import atomic_write
from plelab.provenance import git_commit
from plelab.runs import prepare_data
from plelab.sweeps.analysis_plan import RULES, declare, design_of, require_clean
from plelab.sweeps.runner import study_estimate
from plelab.sweeps.spec import SPEC_FILE, SweepSpec, save_spec, sweep_command

PLAN_DOC = "PLAN.md"
SEED_DEAD_ZONE = (0.025, 0.05)  # the seed's dead-zone step in dP/H (dP 64 → 128 at H = 2,560)


def dead_zone_step(spec: SweepSpec, hidden: int) -> tuple[str, str] | None:
    """The main-curve arms at the seed's dead-zone ratios (dP/H 0.025 → 0.05), if the study has both."""
    at = {round(a.x / hidden, 6): a.name for a in spec.arms if a.family == "dP" and a.x > 0}
    a, b = (at.get(r) for r in SEED_DEAD_ZONE)
    return (a, b) if a and b else None


def plan_text(spec: SweepSpec, root: Path, hidden: int, steps: int | None = None) -> str:
    """PLAN.md: the preregistered study in words (from the frozen plan); ``steps``: a run's steps as resolved (the
    preset's, when the spec sets none)."""
    plan, design = spec.plan, spec.plan["design"]
    steps_text = (f"{design['steps']:,} steps" if design["steps"] is not None
                  else f"the preset's {steps:,} steps" if steps is not None else "the preset's steps")
    step = dead_zone_step(spec, hidden)
    families = "\n".join(f"- `{name}`: {rule}" for name, rule in RULES["families"].items())
    arms = "\n".join(f"| {a.name} | {a.family} | {a.x:g} | {' '.join(a.overrides)} |" for a in spec.arms)
    dead = (f"The seed's dead-zone step is dP/H 0.025 → 0.05, here **{step[0]} → {step[1]}** (H = {hidden}). It "
            f"**reproduces** if that step is equivalent within ±δ = {plan['delta']:g} nats (TOST, Holm over the main "
            "curve's steps) on both the pooled and the pair's own error, and the arms are not worse than the "
            "baseline; it **does not reproduce** if the step is a significant difference; otherwise the answer is "
            "**inconclusive**, reported with the seeds that would decide it." if step else
            "The study does not have both arms of the seed's dead-zone step (dP/H 0.025 and 0.05); it answers only the "
            "families below.")
    return f"""# Preregistered plan — {root.name}

Declared {plan['declared']} (UTC) at code commit `{design['commit']}`; plan sha256 `{plan['sha256']}` (every run
records it; `sweep.json` holds the plan, this page says it in words). Nothing below may change after the first run
starts: a rerun with another δ, α, outcome, arm or seed is refused; another margin afterwards is a labelled post-hoc
analysis (`plelab report {root} --delta X`).

## Design
- Preset `{design['preset']}` with `{' '.join(design['overrides']) or '(no overrides)'}`, {steps_text} per run;
  corpus sha256 `{design['corpus']}`.
- Seeds {design['seeds']} (blocks: every arm of a seed shares data order and initial trunk).
- Runtime stated before the first run: {design['budget']}.

| arm | family | dP | overrides |
|---|---|---|---|
{arms}

## Outcome and analysis
- Outcome: {RULES['outcome']} (last_k = {plan['last_k']}).
- δ = {plan['delta']:g} nats, α = {plan['alpha']:g} family-wise; baseline `{plan['baseline']}`.
- {RULES['design']}; {RULES['error']}; {RULES['equivalence']}.

Families:
{families}

## Questions and what answers them
- **Does the seed's dead zone reproduce?** {dead}
- **Does each dP beat the baseline?** The `vs_baseline` family (Dunnett, simultaneous intervals).
- **Does the table's content matter?** Each control against its arm at the same dP (`controls`, Holm).
- **The seed's mechanism**: does a gate started near closed open, when, and does that depend on dP? Read from each
  learned gate's trajectory against its own noise (`plelab.stats.mechanism`): it shows only where a dP stays shut in
  every run below one that opens in every run.

Reproduce: `{sweep_command(spec, root)}`
"""


def preregister(root: str | Path, spec: SweepSpec, jobs: int = 1, log=print) -> list[Path]:
    """Freeze ``spec``'s design and analysis in a new folder ``root`` (``sweep.json`` + ``PLAN.md``); run nothing."""
    root = Path(root)
    if (root / SPEC_FILE).exists() or (root / "runs").exists():
        raise PlelabError(f"{root} already holds a sweep; a study is preregistered in a new, empty folder")
    commit = require_clean(git_commit(), "a preregistered plan")
    cfg = resolve_config(spec.preset, spec.overrides, steps=spec.steps)
    data = prepare_data(cfg)
    corpus = getattr(data, "corpus_fingerprint", None)
    budget = study_estimate([(root, spec)], jobs, log)
    design = design_of(spec) | {"commit": commit, "corpus": corpus, "budget": budget, "jobs": jobs}
    spec = save_spec(root, dataclasses.replace(spec, plan=declare(spec, design=design)))
    doc = atomic_write(root / PLAN_DOC, lambda p: p.write_text(plan_text(spec, root, cfg.model.hidden_size,
                                                                         cfg.train.steps)))
    return [root / SPEC_FILE, doc]


__all__ = ["PLAN_DOC", "dead_zone_step", "plan_text", "preregister"]
