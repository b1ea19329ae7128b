"""``plelab advise SWEEP``: a dP recommendation that never goes beyond what the sweep measured.

Rule: among the measured dP values whose paired gain over the baseline is significant (Holm),
take the smallest one that the best-measured dP does not beat significantly (paired, Holm over
the candidates) — the cheapest dP with the best gain the data can tell apart. If no dP beats the
baseline, the advice is dP = 0, with the minimum detectable effect, so that "no gain" and "not
enough seeds" are not confused. A configuration that differs from the sweep's (model, PLE
settings, token budget, data) or a dP that was not measured is refused with the reason: dP
effects do not transfer across model size, token budget or data (the seed's dead zone sits at
3B parameters and 400B tokens).
"""

from __future__ import annotations

from pathlib import Path

from plelab.config import RunConfig, keys_tagged, resolve_config
from plelab.errors import PlelabError
from plelab.sweeps import stats
from plelab.sweeps.analysis import analyse
from plelab.sweeps.results import collect
from plelab.sweeps.spec import load_spec


def _differences(measured: dict, target: dict) -> list[str]:
    """What must match for the sweep's measurements to apply: the keys tagged ``advise`` in the config schema
    (every other key is bookkeeping); a tagged section is compared key by key."""
    out = []
    for tagged in keys_tagged("advise"):
        section, _, name = tagged.partition(".")
        for key in [name] if name else measured[section]:
            if measured[section].get(key) != target[section].get(key):
                out.append(f"{section}.{key} {target[section].get(key)!r} (measured: {measured[section].get(key)!r})")
    return out


def recommend(sweep: str | Path, *, dp: int | None = None, preset: str | None = None,
              overrides: list[str] | tuple[str, ...] = ()) -> str:
    """``plelab advise``: :func:`advise` for the sweep's own configuration, that configuration with ``overrides``
    (``section.key=value``), or another ``preset`` (with ``overrides``) — refused where it differs from what the
    sweep measured."""
    root, target = Path(sweep), None
    if preset or overrides:
        spec = load_spec(root)
        if spec is None:
            raise PlelabError(f"{root} is not a plelab sweep (no sweep.json); give a sweep folder")
        if preset:  # another configuration: compared as given
            target = resolve_config(preset, list(overrides))
        else:  # the sweep's own configuration with changes
            target = resolve_config(spec.preset, [*spec.overrides, *overrides], steps=spec.steps)
    return advise(root, target=target, dp=dp, target_name=preset or "that configuration")


def advise(root: Path, target: RunConfig | None = None, dp: int | None = None, target_name: str | None = None) -> str:
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

    def describe(d: int) -> str:
        c, a = vs.get(name[d]), acc[name[d]]
        if c is None:
            return f"dP={d}: the baseline"
        per_m = -c["mean"] / (a["added"] / 1e6) if a["added"] else 0.0
        ci = f"[{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]" if c["ci_low"] is not None else "(no CI)"
        return (f"dP={d}: +{a['added']:,} parameters (+{a['added_pct_of_base']:.2f}% of base), Δ vs baseline "
                f"{c['mean']:+.4f} {ci}, '{c['label']}', {per_m:+.4f} nats per added M parameters")

    if dp is not None:
        return "\n".join([*lines, describe(dp)])
    gains = [d for d in measured if d > 0 and vs.get(name[d], {}).get("label") in (stats.DROP, stats.SMALL_DROP)
             and vs[name[d]]["mean"] < 0]
    if not gains:
        lines.append("Recommendation: dP = 0. No measured dP lowered the validation loss significantly against the "
                     "baseline after Holm correction:")
        lines += [f"  {describe(d)}" for d in measured if d > 0]
        mdes = [vs[name[d]]["mde"] for d in measured if d > 0 and vs.get(name[d], {}).get("mde") is not None]
        if mdes:
            lines.append(f"  With {len(spec.seeds)} seeds the smallest detectable gain is ≈{min(mdes):.4f} nats; a "
                         "smaller real gain would be missed — grow the sweep with more seeds before concluding.")
        return "\n".join(lines)
    best = min(gains, key=lambda d: vs[name[d]]["mean"])
    cands = [d for d in gains if d < best]
    seeds_ok = {d: res.seeds_of(name[d], name[best]) for d in cands}
    loss = {d: res.runs[name[d]] for d in [*cands, best]}
    comps = stats.family([stats.paired(name[d], name[best],
                                       [loss[best][s].loss - loss[d][s].loss for s in seeds_ok[d]],
                                       spec.delta, spec.alpha) for d in cands], steps=False)
    # the cheapest candidate that the best dP does not beat by more than δ
    choice = next((d for d, c in zip(cands, comps) if c.label != stats.DROP), best)
    lines.append(f"Recommendation: dP = {choice}.")
    lines.append(f"  {describe(choice)}")
    if choice != best:
        c = comps[cands.index(choice)]
        lines.append(f"  The best-measured dP={best} is not significantly better than dP={choice} (paired Δ "
                     f"{c.mean:+.4f}, '{c.label}'), and costs "
                     f"+{acc[name[best]]['added'] - acc[name[choice]]['added']:,} more parameters.")
    for kind in ("zero", "frozen"):
        control = spec.at(kind, choice)
        c = next((c for c in analysis["controls"] if c["b"] == control), None) if control else None
        if c is not None and c["ci_low"] is not None:
            what = "zeroed (only the per-layer matrices left)" if kind == "zero" else "frozen at its random init"
            rest = vs[name[choice]]["mean"] + c["mean"]
            lines.append(f"  With the table {what}, the loss at dP={choice} is {c['mean']:+.4f} [{c['ci_low']:+.4f}, "
                         f"{c['ci_high']:+.4f}] higher ('{c['label']}'): the learned table's own share; {rest:+.4f} "
                         "of the gain comes without it.")
    for d in measured:
        if d not in (0, choice):
            lines.append(f"  {describe(d)}")
    lines.append("Valid only for this configuration (model, PLE settings, token budget and data as measured).")
    return "\n".join(lines)
