"""The study's conclusions from :class:`~plelab.sweeps.results.SweepResults`: per-arm rows in the
seed's format, the Holm-corrected comparison families, the confound checks, and whether the
early verdict predicted the final result.

Families (Holm within each):

- ``vs_baseline``: every main-curve arm against ``dp0`` (the seed's ΔLoss column); the control
  and variant arms against ``dp0`` form a family of their own;
- ``consecutive``: each main-curve step dP_i → dP_{i+1} (where dead zones and transitions live);
- ``controls``: every control/variant arm against its reference arm at the same dP;
- ``{family}_consecutive``: the same steps along each control curve (frozen, zero, matched...).

A main-curve transition whose label changes under a confound curve is reported as a possible
artefact of that confound; a gain vs baseline that a frozen or zeroed table also gets is not
credited to the learned table.
"""

from __future__ import annotations

import math

from plelab.diagnostics.verdict import verdict
from plelab.sweeps import stats
from plelab.sweeps.results import SweepResults


def _compare(res: SweepResults, a: str, b: str, m: int = 1) -> stats.Comparison | None:
    seeds = res.seeds_of(a, b)
    if not seeds:
        return None
    diffs = [res.runs[b][s].loss - res.runs[a][s].loss for s in seeds]
    return stats.paired(a, b, diffs, res.spec.delta, res.spec.alpha, m=m)


def _family(res: SweepResults, pairs: list[tuple[str, str]], steps: bool = True) -> list[stats.Comparison]:
    return stats.family([c for a, b in pairs if (c := _compare(res, a, b, m=len(pairs))) is not None], steps)


def _curve(res: SweepResults, family: str) -> list[str]:
    """Arms of a curve ordered by dP, starting at the baseline (a control curve falls back to the
    main arm at a dP it lacks only through an alias)."""
    arms = sorted((a for a in res.spec.arms if a.family == family), key=lambda a: a.x)
    return [res.spec.baseline] + [a.name for a in arms if a.x > 0]


def verdict_counts(values: list[str]) -> str:
    if not values:
        return "—"
    uniq = sorted(set(values), key=values.index)
    return ", ".join(f"{v} {values.count(v)}/{len(values)}" for v in uniq)


def _run_verdict(run, when: str) -> tuple[str, str] | None:
    diag = run.early_diag if when == "early" else run.final_diag
    cs = run.structure.get(when, {})
    if not diag and not cs:
        return None
    v = verdict(cs.get("cka"), cs.get("null_mean"), cs.get("null_sd"), delta=diag.get("delta"), se=diag.get("se"))
    return v.structure, ("not tested" if "skipped" in diag else v.use)


def arm_rows(res: SweepResults, vs_base: dict[str, stats.Comparison]) -> list[dict]:
    """One row per arm in the seed's format plus the diagnostics."""
    rows = []
    base_name = res.spec.baseline
    for arm in res.spec.arms:
        runs = res.runs.get(arm.name, {})
        if not runs:
            continue
        acc = res.accounting[arm.name]
        mean, sd = stats.mean_sd([r.loss for r in runs.values()])
        cmp = vs_base.get(arm.alias_of or arm.name) if arm.name != base_name else None
        verdicts = [v for r in runs.values() if (v := _run_verdict(r, "final"))]
        snr = [r.signal.get("snr") for r in runs.values() if r.signal.get("snr") is not None]
        occ = [r.occurrences.get("median") for r in runs.values() if r.occurrences]
        rows.append({
            "arm": arm.name, "family": arm.family, "dP": int(arm.x), "description": arm.description,
            "added_params": acc["added"], "added_pct": acc["added_pct_of_base"], "n": len(runs),
            "loss_mean": mean, "loss_sd": sd, "losses": {s: r.loss for s, r in runs.items()},
            "vs_baseline": cmp.to_dict() if cmp else None,
            "structure": verdict_counts([v[0] for v in verdicts]),
            "use": verdict_counts([v[1] for v in verdicts]),
            "snr": sum(snr) / len(snr) if snr else None,
            "occurrences_median": sum(occ) / len(occ) if occ else None,
            "tokens_per_second": sum(r.tokens_per_second for r in runs.values()) / len(runs),
        })
    return rows


def confounds(res: SweepResults, consecutive: list[stats.Comparison], curves: dict[str, list[stats.Comparison]],
              vs_base: dict[str, stats.Comparison], controls: list[stats.Comparison]) -> list[str]:
    """Plain-language findings on artefacts (empty when no confound arm was run).

    Scale-matched curve: a main-curve step that moves ("drop") where the matched curve is shown flat
    ("equivalent"), or the reverse, depends on Gemma's √dP multiplier — a possible artefact. Frozen /
    zeroed tables: a gain vs baseline counts as the learned table's only if the learned table beats the
    control at the same dP (the control arms against their reference).
    """
    notes = []
    x = {a.name: int(a.x) for a in res.spec.arms}
    moved, flat = {stats.DROP, stats.DIMINISHING}, {stats.EQUIVALENT}
    matched = {(x[c.a], x[c.b]): c for c in curves.get("matched", [])}
    for c in consecutive:
        other = matched.get((x[c.a], x[c.b]))
        if other is None or c.label == stats.INCONCLUSIVE or other.label == stats.INCONCLUSIVE:
            continue
        step = f"dP {x[c.a]}→{x[c.b]}: '{c.label}' on the main curve, '{other.label}' with the table scale held fixed"
        if (c.label in moved and other.label in flat) or (c.label in flat and other.label in moved):
            notes.append(f"{step} ({other.mean:+.4f}) — the step depends on the √dP multiplier: possibly an artefact")
        else:
            notes.append(f"{step} — not an artefact of the √dP multiplier")
    ctrl = {c.b: c for c in controls}
    for arm in res.spec.arms:
        if arm.family not in ("frozen", "zero") or arm.reference not in vs_base:
            continue
        main, against = vs_base[arm.reference], ctrl.get(arm.name)
        if main.label not in (stats.DROP, stats.SMALL_DROP) or against is None:
            continue
        what = "frozen at its random init" if arm.family == "frozen" else "zeroed"
        # against = control − learned: a significant rise means the learned table beats the control
        if against.label in (stats.RISE, stats.SMALL_RISE):
            notes.append(f"dP={int(arm.x)}: the gain vs baseline ({main.mean:+.4f}) needs the learned table: with the "
                         f"table {what} the loss is {against.mean:+.4f} [{against.ci_low:+.4f}, "
                         f"{against.ci_high:+.4f}] higher")
        elif against.label == stats.INCONCLUSIVE:
            notes.append(f"dP={int(arm.x)}: cannot tell whether the gain vs baseline ({main.mean:+.4f}) needs the "
                         f"learned table: {arm.name} − {arm.reference} = {against.mean:+.4f} (inconclusive)")
        else:
            notes.append(f"dP={int(arm.x)}: the gain vs baseline ({main.mean:+.4f}) is not credited to the learned "
                         f"table: with the table {what}, {arm.name} − {arm.reference} = {against.mean:+.4f} "
                         f"('{against.label}')")
    return notes


def early_vs_final(res: SweepResults) -> dict:
    """Does the early verdict predict the final paired ΔLoss? Per run (arm × seed) with a learned table
    (a frozen or zeroed table is UNUSED by construction; its arms measure the other paths)."""
    rows = []
    base = res.runs.get(res.spec.baseline, {})
    for arm in res.spec.arms:
        if arm.x <= 0 or arm.alias_of is not None or res.configs[arm.name]["ple"]["table"] != "learned":
            continue
        zero = res.runs.get(res.spec.at("zero", arm.x), {})
        for seed, run in sorted(res.runs.get(arm.name, {}).items()):
            if seed not in base or not run.early_diag or "delta" not in run.early_diag:
                continue
            v = _run_verdict(run, "early")
            rows.append({"arm": arm.name, "seed": seed, "early_step": run.early_step,
                         "early_structure": v[0], "early_use": v[1],
                         "early_use_delta": run.early_diag["delta"],
                         "early_cka": run.structure.get("early", {}).get("cka"),
                         "early_snr": run.early_signal.get("snr"),
                         "final_delta": run.loss - base[seed].loss,
                         # the table's own share: this run against the zeroed table at the same dP and seed
                         "vs_zero": run.loss - zero[seed].loss if seed in zero else None})
    out: dict = {"rows": rows, "n": len(rows)}
    if rows:
        gains = [-r["final_delta"] for r in rows]
        out["spearman_use_delta"] = stats.spearman([r["early_use_delta"] for r in rows], gains)
        ckas = [(r["early_cka"], g) for r, g in zip(rows, gains) if r["early_cka"] is not None]
        out["spearman_cka"] = stats.spearman([c for c, _ in ckas], [g for _, g in ckas]) if ckas else (math.nan,) * 2
        credit = [(r["early_use_delta"], -r["vs_zero"]) for r in rows if r["vs_zero"] is not None]
        out["spearman_use_vs_zero"] = (stats.spearman([u for u, _ in credit], [g for _, g in credit])
                                       if credit else (math.nan, math.nan))
        out["n_vs_zero"] = len(credit)
        delta = res.spec.delta
        used = [g for r, g in zip(rows, gains) if r["early_use"] == "USED"]
        unused = [g for r, g in zip(rows, gains) if r["early_use"] == "UNUSED"]
        out["used"] = {"runs": len(used), "gain_ge_delta": sum(g >= delta for g in used),
                       "mean_gain": sum(used) / len(used) if used else None}
        out["unused"] = {"runs": len(unused), "gain_ge_delta": sum(g >= delta for g in unused),
                         "mean_gain": sum(unused) / len(unused) if unused else None}
    return out


def analyse(res: SweepResults) -> dict:
    spec = res.spec
    main = _curve(res, "dP")
    vs_base = {c.b: c for c in _family(res, [(spec.baseline, a) for a in main[1:]], steps=False)}
    consecutive = _family(res, list(zip(main, main[1:])))
    controls = _family(res, [(a.reference, a.name) for a in spec.arms if a.reference and a.alias_of is None],
                       steps=False)
    curve_families = sorted({a.family for a in spec.arms if a.family in ("frozen", "zero", "matched")})
    curves = {}
    for fam in curve_families:
        names = _curve(res, fam)
        curves[fam] = _family(res, list(zip(names, names[1:])))
    others = [a.name for a in spec.arms if a.family != "dP" and a.alias_of is None]
    vs_base.update({c.b: c for c in _family(res, [(spec.baseline, a) for a in others], steps=False)})
    rows = arm_rows(res, vs_base)
    added = {a.name: res.accounting[a.name]["added"] for a in spec.arms}
    per_m = {}
    for c in consecutive:
        extra = (added[c.b] - added[c.a]) / 1e6
        per_m[(c.a, c.b)] = -c.mean / extra if extra > 0 else None
        c.reason += f"; gain per added M params {per_m[(c.a, c.b)]:+.4f} nats" if extra > 0 else ""
    return {
        "rows": rows,
        "vs_baseline": [vs_base[a].to_dict() for a in main[1:] if a in vs_base],
        "controls_vs_baseline": [vs_base[a].to_dict() for a in others if a in vs_base],
        "consecutive": [c.to_dict() | {"gain_per_m_params": per_m[(c.a, c.b)]} for c in consecutive],
        "controls": [c.to_dict() for c in controls],
        "curves": {f: [c.to_dict() for c in cs] for f, cs in curves.items()},
        "confounds": confounds(res, consecutive, curves, vs_base, controls),
        "early_vs_final": early_vs_final(res),
        "missing": res.missing,
    }
