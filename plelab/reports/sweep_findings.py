"""The report's findings in plain language, every claim with its numbers — including when the
honest answer is "inconclusive" and how many seeds would settle it.

Every finding is a :class:`Finding`: its text and the analysis entries it was generated from (a comparison
row of a family, the regime, the early-verdict check, a confound check), so a test can map each sentence back to
the row and the test that produced it (``tests/test_sweep_stats.py``).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from plelab.config.paths import absolute
from plelab import stats
from plelab.sweeps.results import SweepResults
from plelab.sweeps.spec import sweep_command


class Finding(str):
    """A finding's text (it is a ``str``) with ``sources``: ``(family, a, b)`` for a comparison row of
    ``analysis[family]``, or ``(section, key)`` for ``analysis[section][key]`` / the regime / the spec."""

    sources: tuple

    def __new__(cls, text: str, *sources: tuple) -> Finding:
        obj = super().__new__(cls, text)
        obj.sources = sources
        return obj


def _rows(family: str, comps: list[dict]) -> list[tuple]:
    return [(family, c["a"], c["b"]) for c in comps]


SEED_FIRST_STEP = "dP 64→128 (+8.98% → +17.96% of base parameters), loss 2.149 → 2.149"
SEED_HIDDEN = 2560
SEED_FIRST_RATIOS = (64 / SEED_HIDDEN, 128 / SEED_HIDDEN)  # dP/H 0.025 → 0.05


def baseline_standing(step: dict, vs_baseline: list[dict]) -> tuple[str, tuple]:
    """How a consecutive step's arms stand against the baseline: ``"; against the baseline: dp4 +0.0317
    (significant rise), …"`` and, when neither arm beats it, that the plateau is one of arms worse than no table
    (the seed's dead-zone arms, dP 64 and 128, sat 0.006 below its baseline). Returns the text and its sources."""
    rows = [r for arm in (step["a"], step["b"]) for r in vs_baseline if r["b"] == arm]
    if not rows:
        return "", ()
    text = "; against the baseline: " + ", ".join(f"{r['b']} {r['mean']:+.4f} ({r['label']})" for r in rows)
    if all(r["label"] in (stats.RISE, stats.SMALL_RISE) for r in rows):
        text += (" — every arm of the step is worse than the baseline, so this is a plateau of arms that lose to "
                 "having no table, not the seed's plateau after a gain (its dP 64 and 128 sat 0.006 below its "
                 "baseline)")
    elif not any(r["label"] in (stats.DROP, stats.SMALL_DROP) for r in rows):
        text += " — no arm of the step is shown below the baseline"
    return text, tuple(("vs_baseline", r["a"], r["b"]) for r in rows)


def seed_step_finding(cons: list[dict], spec, hidden: int, vs_baseline: list[dict] = ()) -> Finding | None:
    """The seed's dead-zone step at the same dP/H ratios (0.025 → 0.05), if this sweep has it, with its arms'
    standing against the baseline (:func:`baseline_standing`); otherwise says that the sweep's first step is a
    different ratio, not the seed's step."""
    positive = sorted({a.x for a in spec.arms if a.family == "dP" and a.x > 0})
    if len(positive) < 2:
        return None
    ratios = ", ".join(f"{d / hidden:.4g}" for d in positive)
    seed = f"The seed's dead zone was its first step, {SEED_FIRST_STEP}, at dP/H 0.025 → 0.05 (H = {SEED_HIDDEN:,})"
    same = next((c for c in cons if all(math.isclose(spec.arm(c[k]).x / hidden, r)
                                        for k, r in zip(("a", "b"), SEED_FIRST_RATIOS))), None)
    if same is not None:
        standing, sources = baseline_standing(same, vs_baseline)
        return Finding(f"{seed}. The same dP/H step here (H = {hidden}), {_step(same, spec)}, "
                       f"{'is' if same['label'] == stats.EQUIVALENT else 'is not'} a measured equivalence{standing}.",
                       ("consecutive", same["a"], same["b"]), *sources)
    first = next((c for c in cons if c["a"] == spec.at("dP", positive[0])), None)
    if first is None:
        return None
    return Finding(f"{seed}. This sweep does not sample that step: its dP/H are {ratios} (H = {hidden}), so its first "
                   f"step, {_step(first, spec)}, is a different regime, not the seed's (`plelab demo --study` sweeps "
                   "the seed's ratios at H = 160: dP 4/8/16/32).", ("consecutive", first["a"], first["b"]))


def required_seeds(analysis: dict, alpha: float, power: float = 0.8) -> dict[str, int | None]:
    """Seeds per arm that decide every comparison of each main question — ``consecutive`` (the steps: dead zones,
    transitions) and ``vs_baseline`` — at the spreads measured here (:func:`stats.family_seeds`: the same number
    ``plelab plan`` prints for that family; None: beyond reach or unknown)."""
    return {fam: stats.family_seeds(analysis[fam], alpha, power) for fam in ("consecutive", "vs_baseline")
            if analysis.get(fam)}


def _step(c: dict, spec) -> str:
    a, b = (f"{spec.arm(c[k]).x:g}" for k in ("a", "b"))
    if c["ci_low"] is None:
        return f"dP {a}→{b}: {c['label']} (Δ {c['mean']:+.4f}, n={c['n']})"
    return (f"dP {a}→{b}: **{c['label']}** (Δ {c['mean']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}], "
            f"p_{c['adjustment']} {c['p_adj']:.3g}, p_TOST,Holm {c['p_tost_adj']:.3g})")


def findings(res: SweepResults, analysis: dict, reg: dict) -> list[Finding]:
    spec = res.spec
    out = []
    cons = analysis["consecutive"]
    if cons:
        out.append(Finding("Main curve, consecutive steps: " + "; ".join(_step(c, spec) for c in cons) + ".",
                           *_rows("consecutive", cons)))
    vs = [c for c in analysis["vs_baseline"] if c["ci_low"] is not None]
    if vs:
        best = min(vs, key=lambda c: c["mean"])
        if best["mean"] < 0:
            out.append(Finding(f"Largest mean gain vs baseline: {best['b']} {best['mean']:+.4f} nats "
                               f"[{best['ci_low']:+.4f}, {best['ci_high']:+.4f}], labelled '{best['label']}'.",
                               ("vs_baseline", best["a"], best["b"])))
        else:
            out.append(Finding(f"No dP lowered the mean loss below the baseline (smallest Δ: {best['b']} "
                               f"{best['mean']:+.4f}, '{best['label']}').", ("vs_baseline", best["a"], best["b"])))
    dead = [c for c in cons if c["label"] == stats.EQUIVALENT]
    if dead:
        standings = [baseline_standing(c, analysis["vs_baseline"]) for c in dead]
        steps = "; ".join(_step(c, spec) + text for c, (text, _) in zip(dead, standings))
        out.append(Finding(f"Dead zone measured (the loss change shown to lie within ±{spec.delta} nats): {steps}.",
                           *_rows("consecutive", dead), *(src for _, ss in standings for src in ss)))
    else:
        out.append(Finding(f"No dead zone is established: no consecutive step is shown equivalent within ±{spec.delta} "
                           "nats (an unchanged mean is not evidence of no effect).", *_rows("consecutive", cons)))
    unclear = [c for c in cons if c["label"] == stats.INCONCLUSIVE]
    if unclear:
        mdes = [c["mde"] for c in unclear if c["mde"] is not None]
        need = required_seeds(analysis, spec.alpha).get("consecutive")
        n = min(c["n"] for c in unclear)
        msg = (f"{len(unclear)} of {len(cons)} steps are inconclusive with {n} paired seeds — the usual "
               "outcome at this scale")
        if mdes:
            msg += (f"; the median minimum detectable effect is {statistics.median(mdes):.4f} nats at 80% power "
                    "after Holm")
        if need:
            msg += (f"; about {need} seeds per arm would decide every step at δ={spec.delta} (detect a true step of δ, "
                    "or show ±δ when there is none, on the pooled and on each pair's own error — the number plelab "
                    f"plan gives for this question; grow this sweep: `{sweep_command(spec, Path(absolute(str(res.root))), seeds=need)}`)")
        out.append(Finding(msg + ".", *_rows("consecutive", unclear)))
    seed_step = seed_step_finding(cons, spec, res.configs[spec.baseline]["model"]["hidden_size"],
                                  analysis["vs_baseline"])
    if seed_step is not None:
        out.append(seed_step)
    budget = analysis.get("token_budget") or {}
    decided = {arm: e for arm, e in budget.items() if "change" in e}
    if decided:
        parts = [f"{arm}: {e['label']} ({e['reason']})" for arm, e in decided.items()]
        iso = [(arm, e["curve"][-1]["iso_ratio_median"]) for arm, e in decided.items()]
        iso_text = "; ".join(f"{a} {r:.2f}×" if r is not None else f"{a} > 1× (the baseline never got there)"
                             for a, r in iso)
        out.append(Finding("Token budget, each arm against the baseline (Δ = L_arm − L_base, negative: the arm ahead) "
                           "from half-way to the end of training: "
                           + "; ".join(parts) + f". Baseline steps per arm step to the arm's final loss (median over "
                           f"seeds): {iso_text}. Within one cosine schedule, so a closing gain is a speed-up within "
                           "this schedule; longer budgets are other runs (plelab plan --target).",
                           *(("token_budget", arm) for arm in decided)))
    out.append(Finding(f"Regime: {reg['tokens_per_row']:,.0f} training tokens per table row here vs ≈"
                       f"{reg['seed_tokens_per_row']:,.0f} in the seed, and {reg['base_params'] / 1e6:.2f}M vs 2,458M "
                       "base parameters; a result here is evidence about this regime, not a reproduction of the seed's "
                       "phenomenon.", ("regime", "tokens_per_row"), ("regime", "base_params")))
    out += [Finding(note, ("confounds", i)) for i, note in enumerate(analysis["confounds"])]
    ev = analysis["early_vs_final"]
    if ev.get("rows"):
        step = ev["rows"][0]["early_step"]
        u, nu = ev["used"], ev["unused"]
        line = (f"Early verdict at step {step} of {res.configs[spec.baseline]['train']['steps']}: USED in {u['runs']} "
                f"run(s), {u['gain_ge_delta']} of them ended ≥ δ below the baseline; UNUSED in {nu['runs']}, "
                f"{nu['gain_ge_delta']} of them ended ≥ δ below it")
        w = ev["within_arm_use_delta"]
        if math.isfinite(w["rho"]):
            line += (f"; within arms (the arm's own effect held fixed), mean Spearman ρ(early permute Δ, final gain) "
                     f"= {w['rho']:+.2f}, permutation p {w['p']:.3g} over {w['groups']} arms × {w['runs']} runs"
                     + (f", {min(w['leave_one_out']):+.2f} to {max(w['leave_one_out']):+.2f} with one arm left out"
                        if w.get("leave_one_out") else ""))
        else:
            line += "; too few runs per arm (≥ 3 needed) to test prediction within arms"
        out.append(Finding(line + " (learned tables only; runs of different arms are not pooled into one "
                                  "correlation, since the arm alone predicts much of the final ΔLoss).",
                           ("early_vs_final", "used"), ("early_vs_final", "unused"),
                           ("early_vs_final", "within_arm_use_delta")))
        wz = ev["within_arm_use_vs_zero"]
        if math.isfinite(wz["rho"]):
            out.append(Finding(f"Against the table's own share (each run vs the zeroed table at its dP and seed), "
                               f"within arms: mean ρ = {wz['rho']:+.2f}, permutation p {wz['p']:.3g} "
                               f"({wz['runs']} runs).",
                               ("early_vs_final", "within_arm_use_vs_zero")))
        if nu["gain_ge_delta"]:
            out.append(Finding(f"{nu['gain_ge_delta']} run(s) judged UNUSED early still ended ≥ δ below the baseline: "
                               "part of the gain vs baseline does not go through the table (the zero-table control "
                               "measures it).", ("early_vs_final", "unused")))
    return out
