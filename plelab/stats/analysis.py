"""The study's conclusions from :class:`~plelab.sweeps.results.SweepResults`: per-arm rows in the
seed's format, the Holm-corrected comparison families, the confound checks, and whether the
early verdict predicted the final result.

Families, each analysed as a randomised complete block design — the seeds are blocks across the family's
arms, one pooled error (:mod:`plelab.stats.blocked`) — or, where that design does not hold (incomplete
blocks, unequal variances), by paired t per comparison; the report names the method of each family:

- ``vs_baseline``: every main-curve arm against ``dp0`` (the seed's ΔLoss column), Dunnett-adjusted
  (many-to-one); the control and variant arms against ``dp0`` form a family of their own;
- ``consecutive``: each main-curve step dP_i → dP_{i+1} (where dead zones and transitions live), Holm;
- ``controls``: every control/variant arm against its reference arm at the same dP;
- ``{family}_consecutive``: the same steps along each control curve (frozen, zero, matched...).

A main-curve transition whose label changes under a confound curve is reported as a possible
artefact of that confound; a gain vs baseline that a frozen or zeroed table also gets is not
credited to the learned table.
"""

from __future__ import annotations

from plelab.config import RunConfig
from plelab.diagnostics.verdict import range_status, verdict
from plelab.model.tables import table_view
from plelab import stats
from plelab.stats import blocked
from plelab.stats.budget import token_budget
from plelab.stats.wallclock import ood_vs_baseline, wallclock
from plelab.sweeps.results import SweepResults
from plelab.sweeps.spec import BUDGET, CURVE_CONTROLS


def _family(res: SweepResults, pairs: list[tuple[str, str]], steps: bool = True, many_to_one: bool = False,
            methods: dict | None = None, name: str = "") -> list[stats.Comparison]:
    """One family of comparisons, analysed by :func:`blocked.analyse_family`; how it was analysed goes into
    ``methods[name]``."""
    losses = {arm: {s: r.loss for s, r in by_seed.items()} for arm, by_seed in res.runs.items()}
    comps, how = blocked.analyse_family(losses, pairs, res.spec.delta, res.spec.alpha, steps, many_to_one)
    if methods is not None and comps:
        methods[name] = how
    return comps


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
    fraction = (run.early_step / run.steps if run.steps else None) if when == "early" else 1.0
    v = verdict(cs.get("cka"), cs.get("null_mean"), cs.get("null_sd"), delta=diag.get("delta"), se=diag.get("se"),
                fraction=fraction)
    return v.structure, ("not tested" if "skipped" in diag else v.use)


def calibrated_range(res: SweepResults, arm: str, fraction: float = 1.0) -> dict | None:
    """Whether the verdicts of ``arm``'s runs at ``fraction`` of the run sit inside the benchmark's measured span
    on every axis (:func:`plelab.diagnostics.verdict.range_status`); None for an arm without a table."""
    cfg, runs = res.configs[arm], res.runs.get(arm, {})
    model = cfg["model"]
    parsed = RunConfig.from_dict(cfg)
    view = table_view(parsed.model, parsed.ple, parsed.aux)
    if view is None or not runs:
        return None
    tokens = fraction * sum(r.tokens_seen for r in runs.values()) / len(runs)
    windows = cfg["train"].get("diag_windows") or None
    return range_status(hidden_size=model["hidden_size"], layers=model["num_hidden_layers"], rows=view.rows,
                        dim=view.dim, tokens_per_row=tokens / view.rows, windows=windows, fraction=fraction,
                        trunk=_trunk(model), kind=view.kind).to_dict()


def _trunk(model: dict) -> str:
    """The range check's trunk of an arm's ``model`` config section."""
    if model.get("hf_config"):
        return f"the HF trunk {model['hf_config']}"
    return f"your model {model['factory']}" if model.get("factory") else "plelab"


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
        judged = [(r, v) for r in runs.values() if (v := _run_verdict(r, "final"))]
        verdicts = [v for _, v in judged]
        # STRUCTURE pairs each run with the next seed's: only the disjoint pairs are independent evidence
        pairs = [v[0] for r, v in judged if r.structure.get("final", {}).get("independent", True)]
        snr = [r.signal.get("snr") for r in runs.values() if r.signal.get("snr") is not None]
        occ = [r.occurrences.get("median") for r in runs.values() if r.occurrences]
        rows.append({
            "arm": arm.name, "family": arm.family, "dP": int(arm.x), "description": arm.description,
            "added_params": acc["added"], "added_pct": acc["added_pct_of_base"], "n": len(runs),
            "loss_mean": mean, "loss_sd": sd, "losses": {s: r.loss for s, r in runs.items()},
            "vs_baseline": cmp.to_dict() if cmp else None,
            "structure": verdict_counts(pairs),
            "use": verdict_counts([v[1] for v in verdicts]),
            "calibrated_range": calibrated_range(res, arm.name),
            "snr": sum(snr) / len(snr) if snr else None,
            "occurrences_median": sum(occ) / len(occ) if occ else None,
            "tokens_per_second": sum(r.tokens_per_second for r in runs.values()) / len(runs),
        })
    return rows


def confounds(res: SweepResults, consecutive: list[stats.Comparison], curves: dict[str, list[stats.Comparison]],
              vs_base: dict[str, stats.Comparison], controls: list[stats.Comparison]) -> list[str]:
    """Plain-language findings on artefacts (empty when no confound arm was run).

    Scale-matched curve: the difference between a main-curve step and the same step with the table scale held
    fixed, tested directly as a contrast paired by seed (not by comparing the two steps' labels: a difference of
    significance is not a significant difference). A significant contrast means the step depends on Gemma's √dP
    multiplier — a possible artefact; a contrast within ±δ rules that out. Frozen /
    zeroed tables: a gain vs baseline counts as the learned table's only if the learned table beats the
    control at the same dP (the control arms against their reference).
    """
    notes = []
    x = {a.name: int(a.x) for a in res.spec.arms}
    matched = {(x[c.a], x[c.b]): c for c in curves.get("matched", [])}
    contrasts = []
    for c in consecutive:
        other = matched.get((x[c.a], x[c.b]))
        seeds = sorted(set(res.seeds_of(c.a, c.b)) & set(res.seeds_of(other.a, other.b))) if other else []
        if len(seeds) < 2:
            continue
        run = res.runs  # the two steps' difference, paired by seed: (b − a) on the main curve − (b − a) matched
        diffs = [(run[c.b][s].loss - run[c.a][s].loss) - (run[other.b][s].loss - run[other.a][s].loss) for s in seeds]
        contrasts.append((c, other, stats.paired(f"{other.a}→{other.b}", f"{c.a}→{c.b}", diffs, res.spec.delta,
                                                 res.spec.alpha)))
    stats.family([k for _, _, k in contrasts], steps=False)
    for c, other, k in contrasts:
        step = (f"dP {x[c.a]}→{x[c.b]}: main-curve step {c.mean:+.4f}, with the table scale held fixed "
                f"{other.mean:+.4f}; their difference {k.mean:+.4f} [{k.ci_low:+.4f}, {k.ci_high:+.4f}] "
                f"(paired by seed, Holm over {len(contrasts)} steps)")
        if k.label in (stats.DROP, stats.RISE, stats.SMALL_DROP, stats.SMALL_RISE):
            notes.append(f"{step} is significant: the step depends on the √dP multiplier — possibly an artefact")
        elif k.label == stats.EQUIVALENT:
            notes.append(f"{step} lies within ±{res.spec.delta}: not an artefact of the √dP multiplier")
        else:
            need = (k.seeds_to_decide or {}).get("difference")
            notes.append(f"{step}: cannot tell whether the step depends on the √dP multiplier"
                         + (f" (≈{need} seeds would detect a difference of δ)" if need else ""))
    ctrl = {c.b: c for c in controls}
    for arm in res.spec.arms:
        if arm.family not in CONTROL_WHAT or arm.reference not in vs_base:
            continue
        main, against = vs_base[arm.reference], ctrl.get(arm.name)
        if main.label not in (stats.DROP, stats.SMALL_DROP) or against is None:
            continue
        what = CONTROL_WHAT[arm.family]
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


CONTROL_WHAT = {"frozen": "frozen at its random init", "zero": "zeroed (the main embedding re-injected)",
                "iid": "looked up by i.i.d. ids (no token information)"}


def early_vs_final(res: SweepResults) -> dict:
    """Does the early verdict predict the final paired ΔLoss? Per run (arm × seed) with a learned table
    (a frozen or zeroed table is UNUSED by construction; its arms measure the other paths). The correlations are
    within arms (:func:`stats.within_group_spearman`): runs of different arms are not independent evidence
    about prediction, since the arm alone predicts much of the final ΔLoss."""
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

        def within(key, target) -> dict:
            groups: dict[str, tuple[list, list]] = {}
            for r, g in zip(rows, target):
                if r[key] is not None and g is not None:
                    groups.setdefault(r["arm"], ([], []))[0].append(r[key])
                    groups[r["arm"]][1].append(g)
            return stats.within_group_spearman(list(groups.values()))
        # within arms: pooling the arms' runs would credit what the arm (dP) alone predicts
        out["within_arm_use_delta"] = within("early_use_delta", gains)
        out["within_arm_cka"] = within("early_cka", gains)
        own = [-r["vs_zero"] if r["vs_zero"] is not None else None for r in rows]
        out["within_arm_use_vs_zero"] = within("early_use_delta", own)
        out["n_vs_zero"] = sum(v is not None for v in own)
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
    methods: dict = {}
    vs_base = {c.b: c for c in _family(res, [(spec.baseline, a) for a in main[1:]], steps=False, many_to_one=True,
                                       methods=methods, name="vs_baseline")}
    consecutive = _family(res, list(zip(main, main[1:])), methods=methods, name="consecutive")
    controls = _family(res, [(a.reference, a.name) for a in spec.arms if a.reference and a.alias_of is None],
                       steps=False, methods=methods, name="controls")
    curve_families = sorted({a.family for a in spec.arms if a.family in CURVE_CONTROLS})
    curves = {}
    for fam in curve_families:
        names = _curve(res, fam)
        curves[fam] = _family(res, list(zip(names, names[1:])), methods=methods, name=f"{fam}_consecutive")
    others = [a.name for a in spec.arms if a.family not in ("dP", BUDGET) and a.alias_of is None]
    vs_base.update({c.b: c for c in _family(res, [(spec.baseline, a) for a in others], steps=False, many_to_one=True,
                                            methods=methods, name="controls_vs_baseline")})
    rows = arm_rows(res, vs_base)
    added = {a.name: res.accounting[a.name]["added"] for a in spec.arms}
    per_m = {}
    for c in consecutive:
        extra = (added[c.b] - added[c.a]) / 1e6
        per_m[(c.a, c.b)] = -c.mean / extra if extra > 0 else None
        c.reason += f"; gain per added M params {per_m[(c.a, c.b)]:+.4f} nats" if extra > 0 else ""
    ood, how = ood_vs_baseline(res)
    if ood:
        methods["ood_vs_baseline"] = how
    sensitivity = {}
    for name, comps, steps in (("vs_baseline", [vs_base[a] for a in main[1:] if a in vs_base], False),
                               ("consecutive", consecutive, True)):
        if comps:
            sensitivity[name] = stats.sensitivity(comps, spec.delta, steps)
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
        "methods": methods,
        "sensitivity": sensitivity,
        "token_budget": token_budget(res),
        "wallclock": wallclock(res),
        "ood_vs_baseline": ood,
    }
