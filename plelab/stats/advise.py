"""``plelab advise SWEEP``: a dP recommendation that never goes beyond what the sweep measured.

Rule (non-inferiority, Wellek 2010): find the measured dP with the lowest mean loss (the baseline dP = 0
included), then test every cheaper dP against it one-sidedly, H0: loss(cheaper) − loss(best) ≥ δ, paired by
seed (on the blocked design's pooled error where it holds), Holm over the cheaper ones. The advice is the
cheapest dP shown to be within δ of the best — provided every dP cheaper still is shown worse than the best;
where a cheaper one is neither (too few seeds), plelab says it cannot choose yet and how many seeds would
decide, instead of reading a failure to find a difference as no difference.

A configuration that differs from the sweep's (model, PLE settings, token budget, data) or a dP that was not
measured is refused with the reason: dP effects do not transfer across model size, token budget or data (the
seed's dead zone sits at 3B parameters and 400B tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from plelab.config import RunConfig, keys_tagged, resolve_config
from plelab.errors import PlelabError
from plelab import stats
from plelab.stats import blocked, power
from plelab.stats.analysis import analyse
from plelab.sweeps.results import collect
from plelab.sweeps.spec import load_spec


def _differences(measured: dict, target: dict) -> list[str]:
    """What must match for the sweep's measurements to apply: the keys tagged ``advise`` in the config schema
    (every other key is bookkeeping); a tagged section is compared key by key."""
    out = []
    for tagged in keys_tagged("advise"):
        if not isinstance(measured.get(tagged, {}), dict):  # a top-level key (the kind of run)
            if measured.get(tagged) != target.get(tagged):
                out.append(f"{tagged} {target.get(tagged)!r} (measured: {measured.get(tagged)!r})")
            continue
        section, _, name = tagged.partition(".")
        for key in [name] if name else measured[section]:
            if measured[section].get(key) != target[section].get(key):
                out.append(f"{section}.{key} {target[section].get(key)!r} (measured: {measured[section].get(key)!r})")
    return out


@dataclass
class Advice:
    """What ``plelab advise`` answers, structured: ``status`` is "recommended" (``recommendation`` holds the dP),
    "cannot choose yet" (``undecided``: the cheaper dPs neither shown within δ of the best nor shown worse, each with
    the seeds that would decide its non-inferiority question) or "asked" (``dp`` was given: its numbers only).
    ``arms``: per measured dP, its added parameters and its Δ vs the baseline; ``comparisons``: each cheaper dP
    against the best; ``controls``: the chosen dP's controls. ``lines``: the text, as printed."""

    sweep: str
    status: str
    measured: list[int]
    seeds: int
    steps: int
    delta: float
    best: int | None = None
    recommendation: int | None = None
    undecided: list[int] = field(default_factory=list)
    arms: dict[int, dict] = field(default_factory=dict)
    comparisons: list[dict] = field(default_factory=list)
    controls: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(self.lines)

    def __str__(self) -> str:
        return self.text()

    def to_dict(self) -> dict:
        return asdict(self)


def advise(sweep: str | Path, *, dp: int | None = None, preset: str | None = None,
           overrides: list[str] | tuple[str, ...] = ()) -> Advice:
    """``plelab advise``: the advice for the sweep's own configuration, that configuration with ``overrides``
    (``section.key=value``), or another ``preset`` (with ``overrides``) — refused where it differs from what the
    sweep measured. ``str(advice)`` is the printed text."""
    root, target = Path(sweep), None
    if preset or overrides:
        spec = load_spec(root)
        if spec is None:
            raise PlelabError(f"{root} is not a plelab sweep (no sweep.json); give a sweep folder")
        if preset:  # another configuration: compared as given
            target = resolve_config(preset, list(overrides))
        else:  # the sweep's own configuration with changes
            target = resolve_config(spec.preset, [*spec.overrides, *overrides], steps=spec.steps)
    return _advise(root, target=target, dp=dp, target_name=preset or "that configuration")


def _advise(root: Path, target: RunConfig | None = None, dp: int | None = None,
            target_name: str | None = None) -> Advice:
    res = collect(root, structure=False)
    spec, base = res.spec, res.configs[res.spec.baseline]
    if target is not None:
        diff = _differences(base, target.to_dict())
        if diff:
            shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
            raise PlelabError(f"refusing to extrapolate: {target_name or 'that configuration'} differs from what "
                              f"{root} measured in {shown}. dP effects do not transfer across model size, token "
                              "budget or data; run plelab sweep with that configuration")
    analysis = analyse(res)
    measured = sorted(int(a.x) for a in spec.arms if a.family == "dP" and a.name in res.runs)
    if len(measured) < 2:
        raise PlelabError(f"{root} has no finished dP > 0 arm yet; rerun the sweep to finish its runs")
    if dp is not None and dp not in measured:
        where = "beyond" if dp > max(measured) or dp < min(measured) else "between"
        verb = "extrapolate" if where == "beyond" else "interpolate"
        raise PlelabError(f"dP={dp} was not measured (measured: {measured}); refusing to {verb} "
                          f"{where} the measured values — add it: plelab sweep --out {root} --dp "
                          f"{','.join(map(str, sorted({*measured, dp})))} with the sweep's other arguments")
    vs = {c["b"]: c for c in analysis["vs_baseline"]}
    acc = res.accounting
    lines = [f"Sweep {root}: preset {spec.preset}, measured dP {measured}, {len(spec.seeds)} seeds, "
             f"{base['train']['steps']} steps; δ = {spec.delta} nats."]
    name = {d: spec.at("dP", d) for d in measured}
    arms = {}
    for d in measured:
        c, a = vs.get(name[d]), acc[name[d]]
        arms[d] = {"arm": name[d], "added": a["added"], "added_pct_of_base": a["added_pct_of_base"]}
        if c is not None:
            arms[d] |= {"delta_vs_baseline": c["mean"], "ci": [c["ci_low"], c["ci_high"]], "label": c["label"],
                        "nats_per_added_million": -c["mean"] / (a["added"] / 1e6) if a["added"] else 0.0}
    advice = Advice(str(root), "asked", measured, len(spec.seeds), base["train"]["steps"], spec.delta, arms=arms,
                    lines=lines)

    def describe(d: int) -> str:
        a = arms[d]
        if "label" not in a:
            return f"dP={d}: the baseline"
        lo, hi = a["ci"]
        ci = f"[{lo:+.4f}, {hi:+.4f}]" if lo is not None else "(no CI)"
        return (f"dP={d}: +{a['added']:,} parameters (+{a['added_pct_of_base']:.2f}% of base), Δ vs baseline "
                f"{a['delta_vs_baseline']:+.4f} {ci}, '{a['label']}', {a['nats_per_added_million']:+.4f} nats per "
                "added M parameters")

    if dp is not None:
        lines.append(describe(dp))
        return advice
    losses = {name[d]: {s_: r.loss for s_, r in res.runs[name[d]].items()} for d in measured}
    best = min(measured, key=lambda d: sum(losses[name[d]].values()) / len(losses[name[d]]))
    cheaper = [d for d in measured if d < best]
    comps, _ = blocked.analyse_family(losses, [(name[best], name[d]) for d in cheaper], spec.delta, spec.alpha,
                                      steps=False)
    by_arm = {c.b: c for c in comps}
    cheaper = [d for d in cheaper if name[d] in by_arm]  # arms sharing seeds with the best
    comps = [by_arm[name[d]] for d in cheaper]
    p_ni = stats.holm([stats.noninferiority_p(c, spec.delta) for c in comps])
    status = {}
    for d, c, p in zip(cheaper, comps, p_ni):
        if p < spec.alpha:
            status[d] = ("within δ", c, p)
        elif c.p_adj < spec.alpha and c.mean > 0:
            status[d] = ("worse", c, p)
        else:
            status[d] = ("undecided", c, p)
    within = [d for d in cheaper if status[d][0] == "within δ"]
    choice = within[0] if within else best
    undecided = [d for d in cheaper if d < choice and status[d][0] == "undecided"]
    advice.best = best
    lines.append(f"Lowest mean loss: dP={best}. Each cheaper dP against it, one-sided: is it worse by less than "
                 f"δ = {spec.delta}? (non-inferiority, paired by seed, Holm over {len(cheaper)})")
    for d in cheaper:
        what, c, p = status[d]
        need = power.seeds_to_decide("noninferior", c.sd, spec.delta, spec.alpha / max(1, len(cheaper)))
        advice.comparisons.append({"dp": d, "against": best, "mean": c.mean, "ci": [c.ci_low, c.ci_high],
                                   "p_noninferior_holm": p, "status": what,
                                   "seeds_to_decide_noninferiority": need if what == "undecided" else None})
        lines.append(f"  dP={d}: {d} − best = {c.mean:+.4f} [{c.ci_low:+.4f}, {c.ci_high:+.4f}], p_NI,Holm {p:.3g} "
                     f"→ {what}" + (f" (≈{need} seeds would decide this non-inferiority question, if the true "
                                    "difference is 0)"
                                    if what == "undecided" and need else ""))
    if undecided:
        lines.append(f"Cannot choose yet: dP={choice} is the cheapest shown within δ of the best, but "
                     f"{', '.join(f'dP={d}' for d in undecided)} might be too and is neither shown within δ nor "
                     "shown worse. Grow the sweep with the seeds above before choosing.")
        advice.status, advice.undecided = "cannot choose yet", undecided
        return advice
    advice.status, advice.recommendation = "recommended", choice
    lines.append(f"Recommendation: dP = {choice}.")
    lines.append(f"  {describe(choice)}")
    if choice != best:
        lines.append(f"  The best-measured dP={best} costs +{acc[name[best]]['added'] - acc[name[choice]]['added']:,} "
                     f"more parameters; dP={choice} is shown to be worse than it by less than δ.")
    for kind in ("zero", "frozen", "iid"):
        control = spec.at(kind, choice)
        c = next((c for c in analysis["controls"] if c["b"] == control), None) if control else None
        if c is not None and c["ci_low"] is not None and name[choice] in vs:
            what = {"zero": "zeroed (the main embedding re-injected into every layer)", "frozen": "frozen at its "
                    "random init", "iid": "looked up by i.i.d. ids (no token information)"}[kind]
            rest = vs[name[choice]]["mean"] + c["mean"]
            advice.controls.append({"control": kind, "arm": control, "mean": c["mean"],
                                    "ci": [c["ci_low"], c["ci_high"]], "label": c["label"], "gain_without": rest})
            lines.append(f"  With the table {what}, the loss at dP={choice} is {c['mean']:+.4f} [{c['ci_low']:+.4f}, "
                         f"{c['ci_high']:+.4f}] higher ('{c['label']}'): the learned table's own share; {rest:+.4f} "
                         "of the gain comes without it.")
    for d in measured:
        if d not in (0, choice):
            lines.append(f"  {describe(d)}")
    lines.append("Valid only for this configuration (model, PLE settings, token budget and data as measured).")
    return advice
