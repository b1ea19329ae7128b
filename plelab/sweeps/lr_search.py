"""A per-arm learning-rate search on seeds kept apart, so that "arm A loses to the baseline" is not "arm A's
learning rate was wrong".

One learning rate for every arm favours the arms it happens to suit. Before a confirmatory dP study, each **group**
of its arms — the baseline (no PLE), the main curve (Gemma's gate), and each control or variant family — gets its
own rate: one representative arm per group (the baseline; every other group at ``at_dp``, default the middle dP)
is trained at ``train.lr × m`` for each multiplier ``m`` on seeds the study never uses, with the study's preset,
overrides, steps and outcome (the mean of the last ``last_k`` evaluations). The chosen rate of a group is the
multiplier with the lowest mean loss over those seeds; one at the edge of the grid is flagged (extend the grid
before trusting it). This is tuning, not a test: no p-value is attached to it, and its seeds must not be the
confirmatory study's (:func:`check_apart`). The choice (``lr.json``) goes into the confirmatory sweep's arm
definitions (``plelab sweep --lr-from LRSEARCH``) and so into its analysis plan.

The search is an ordinary sweep of kind ``lr`` (resumable, records, workers): arms ``{arm}-lr{m}``, family = the
group, ``x`` = the multiplier.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from plelab.config import resolve_config
from plelab.errors import ConfigError, PlelabError
from plelab.io import atomic_write, write_json
from plelab.sweeps.spec import BUDGET, Arm, SweepSpec

DEFAULT_MULTS = (0.5, 1.0, 2.0)
DEFAULT_SEEDS = (1000,)
CHOICE_FILE = "lr.json"


def groups(study: SweepSpec, at_dp: int | None = None) -> dict[str, Arm]:
    """Each group's representative arm: ``baseline`` -> the baseline arm; the main curve ``dP`` and every other
    family -> its arm at ``at_dp`` (default the study's control dP, else its middle dP), or its first arm."""
    positive = sorted({int(a.x) for a in study.arms if a.family == "dP" and a.x > 0})
    if not positive:
        raise ConfigError("the study has no dP > 0 to search a learning rate for")
    at = at_dp if at_dp is not None else (study.control_dp if study.control_dp in positive
                                          else positive[len(positive) // 2])
    if at not in positive:
        raise ConfigError(f"--at-dp {at} is not one of the study's dP values {positive}")
    out = {"baseline": study.arm(study.baseline)}
    for fam in dict.fromkeys(a.family for a in study.runnable() if a.family != BUDGET):  # budgets: the baseline's
        arms = [a for a in study.runnable() if a.family == fam and a.name != study.baseline]
        if arms:
            out[fam] = next((a for a in arms if int(a.x) == at), arms[0])
    return out


def lr_spec(study: SweepSpec, mults: Sequence[float] = DEFAULT_MULTS, seeds: Sequence[int] = DEFAULT_SEEDS,
            at_dp: int | None = None) -> SweepSpec:
    """The search's own sweep (kind ``lr``) for the study ``study``; nothing is written."""
    mults = sorted({float(m) for m in mults})
    if len(mults) < 2 or any(not m > 0 for m in mults):
        raise ConfigError(f"--lr-mults needs two or more multipliers > 0, got {mults}")
    if 1.0 not in mults:
        raise ConfigError("--lr-mults must include 1 (the study's own learning rate), e.g. 0.5,1,2")
    check_apart(seeds, study.seeds)
    base_lr = resolve_config(study.preset, study.overrides, steps=study.steps).train.lr
    arms = []
    for group, rep in groups(study, at_dp).items():
        for m in mults:
            extra = [o for o in rep.overrides if not o.startswith("train.lr=")]
            arms.append(Arm(f"{rep.name}-lr{m:g}", [*extra, f"train.lr={base_lr * m:.6g}"], group, m,
                            description=f"{group} ({rep.name}) at learning rate {base_lr * m:.6g} ({m:g}×)"))
    return SweepSpec(preset=study.preset, overrides=list(study.overrides), arms=arms, seeds=list(seeds),
                     steps=study.steps, kind="lr", last_k=study.last_k, delta=study.delta, alpha=study.alpha,
                     baseline=f"{study.baseline}-lr1", control_dp=study.control_dp)


def check_apart(search_seeds: Sequence[int], study_seeds: Sequence[int]) -> None:
    """Refuse a search that shares a seed with the study it tunes."""
    shared = sorted(set(search_seeds) & set(study_seeds))
    if shared:
        raise ConfigError(f"the learning-rate search uses seed(s) {shared} of the study it tunes; give it seeds the "
                          f"study never runs (--seed-list, e.g. {max(study_seeds) + 1000})")


def choose(res) -> dict:
    """The chosen rate per group from the finished search ``res`` (a :class:`~plelab.sweeps.results.SweepResults`):
    ``{"groups": {group: {"arm", "losses": {m: mean}, "lrs": {m: lr}, "best", "lr", "edge", "seeds"}}, ...}``."""
    out: dict = {"seeds": res.spec.seeds, "last_k": res.spec.last_k, "groups": {}}
    for group in dict.fromkeys(a.family for a in res.spec.arms):
        arms = [a for a in res.spec.arms if a.family == group]
        done = {a.x: res.runs[a.name] for a in arms if res.runs.get(a.name)}
        if len(done) < len(arms):
            raise PlelabError(f"the search's {group} group has {len(arms) - len(done)} multiplier(s) without a "
                              f"finished run; rerun the search to finish them")
        means = {m: float(np.mean([r.loss for r in runs.values()])) for m, runs in done.items()}
        best = min(means, key=means.get)
        lr = {a.x: float(next(o for o in a.overrides if o.startswith("train.lr=")).split("=")[1]) for a in arms}
        rep = arms[0].name.rsplit("-lr", 1)[0]
        out["groups"][group] = {"arm": rep, "losses": {f"{m:g}": v for m, v in means.items()},
                                "lrs": {f"{m:g}": v for m, v in lr.items()}, "best": best, "lr": lr[best],
                                "edge": best in (min(means), max(means)), "seeds": len(next(iter(done.values())))}
    return out


def choice_text(choice: dict) -> str:
    lines = [f"Learning rate per group (lowest mean loss of the last {choice['last_k']} evaluations over seeds "
             f"{choice['seeds']}; tuning, not a test):"]
    for group, g in choice["groups"].items():
        grid = ", ".join(f"{m}× {g['losses'][m]:.4f}" for m in g["losses"])
        lines.append(f"  {group} ({g['arm']}): lr {g['lr']:.6g} ({g['best']:g}×) — {grid}"
                     + ("  [at the grid's edge: extend --lr-mults before trusting it]" if g["edge"] else ""))
    return "\n".join(lines)


def write_choice(root: Path, choice: dict) -> list[Path]:
    """``lr.json`` (the choice) and ``lr.md`` (its table) in the search folder."""
    root = Path(root)
    return [write_json(root / CHOICE_FILE, choice),
            atomic_write(root / "lr.md", lambda p: p.write_text(f"```\n{choice_text(choice)}\n```\n"))]


def read_choice(folder: str | Path) -> dict[str, float]:
    """``{group: lr}`` from a finished search's ``lr.json``."""
    path = Path(folder) / CHOICE_FILE
    try:
        choice = json.loads(path.read_text())
        lrs = {g: float(v["lr"]) for g, v in choice["groups"].items()}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PlelabError(f"{path} is not a finished learning-rate search ({err}); run plelab lr-search with --out "
                          f"{folder} first") from None
    if not all(math.isfinite(v) and v > 0 for v in lrs.values()):
        raise PlelabError(f"{path} holds a learning rate that is not a positive number; rerun the search")
    return lrs


def chosen_lrs(spec: SweepSpec) -> dict[str, float] | None:
    """``{group: lr}`` of a sweep made with ``--lr-from`` (every runnable arm carries its own ``train.lr``), else
    None — a variant that sets ``train.lr`` on its own arms is not a chosen rate."""
    lrs = {}
    for a in spec.runnable():
        rate = next((o.split("=", 1)[1] for o in a.overrides if o.startswith("train.lr=")), None)
        if rate is None:
            return None
        lrs["baseline" if a.name == spec.baseline else a.family] = float(rate)
    return lrs or None


def with_lrs(arms: list[Arm], baseline: str, lrs: dict[str, float]) -> list[Arm]:
    """The study's arms with each group's chosen ``train.lr`` (the baseline arm's group is ``baseline``); a group
    the choice lacks is refused (its arms would silently keep the default rate)."""
    family = {a.name: a.family for a in arms}
    out = []
    for a in arms:
        name = a.alias_of or a.name  # an alias keeps its target's rate: it stands for the same config
        group = "baseline" if name == baseline or a.family == BUDGET else family.get(name, a.family)
        if a.alias_of is None and group not in lrs:
            raise ConfigError(f"the learning-rate choice has no rate for the {group} arms ({a.name}); rerun "
                              "plelab lr-search for this study's arms")
        extra = [o for o in a.overrides if not o.startswith("train.lr=")]
        out.append(dataclasses.replace(a, overrides=[*extra, f"train.lr={lrs[group]:.6g}"]) if group in lrs else a)
    return out


__all__ = ["CHOICE_FILE", "DEFAULT_MULTS", "DEFAULT_SEEDS", "check_apart", "choice_text", "choose", "chosen_lrs", "groups",
           "lr_spec", "read_choice", "with_lrs", "write_choice"]
