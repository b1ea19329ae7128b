"""The report's findings in plain language, every claim with its numbers — including when the
honest answer is "inconclusive" and how many seeds would settle it."""

from __future__ import annotations

import math
import statistics

from plelab.sweeps import stats
from plelab.sweeps.results import SweepResults
from plelab.sweeps.spec import sweep_command

SEED_FIRST_STEP = "dP 64→128 (+8.98% → +17.96% of base parameters), loss 2.149 → 2.149"


def required_seeds(analysis: dict, delta: float, alpha: float, power: float = 0.8) -> int | None:
    """Seeds per arm for which the minimum detectable effect of a consecutive step (after Holm over
    the steps) reaches δ, at the median spread of the paired differences measured here
    (None: no spread measured, or more than 200)."""
    sds = [c["sd"] for c in analysis["consecutive"] if c.get("sd")]
    if not sds:
        return None
    sd, m = statistics.median(sds), len(analysis["consecutive"])
    return next((n for n in range(2, 201) if stats.mde(sd, n, alpha, power, m) <= delta), None)


def _step(c: dict, spec) -> str:
    a, b = (f"{spec.arm(c[k]).x:g}" for k in ("a", "b"))
    if c["ci_low"] is None:
        return f"dP {a}→{b}: {c['label']} (Δ {c['mean']:+.4f}, n={c['n']})"
    return (f"dP {a}→{b}: **{c['label']}** (Δ {c['mean']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}], "
            f"p_Holm {c['p_holm']:.3g}, p_TOST,Holm {c['p_tost_holm']:.3g})")


def findings(res: SweepResults, analysis: dict, reg: dict) -> list[str]:
    spec = res.spec
    out = []
    cons = analysis["consecutive"]
    if cons:
        out.append("Main curve, consecutive steps: " + "; ".join(_step(c, spec) for c in cons) + ".")
    vs = [c for c in analysis["vs_baseline"] if c["ci_low"] is not None]
    if vs:
        best = min(vs, key=lambda c: c["mean"])
        if best["mean"] < 0:
            out.append(f"Largest mean gain vs baseline: {best['b']} {best['mean']:+.4f} nats "
                       f"[{best['ci_low']:+.4f}, {best['ci_high']:+.4f}], labelled '{best['label']}'.")
        else:
            out.append(f"No dP lowered the mean loss below the baseline (smallest Δ: {best['b']} {best['mean']:+.4f}).")
    dead = [c for c in cons if c["label"] == stats.EQUIVALENT]
    if dead:
        out.append("Dead zone measured: " + "; ".join(_step(c, spec) for c in dead)
                   + f" — the loss change is shown to lie within ±{spec.delta} nats.")
    else:
        out.append(f"No dead zone is established: no consecutive step is shown equivalent within ±{spec.delta} nats "
                   "(an unchanged mean is not evidence of no effect).")
    unclear = [c for c in cons if c["label"] == stats.INCONCLUSIVE]
    if unclear:
        mdes = [c["mde"] for c in unclear if c["mde"] is not None]
        need = required_seeds(analysis, spec.delta, spec.alpha)
        n = min(c["n"] for c in unclear)
        msg = (f"{len(unclear)} of {len(cons)} steps are inconclusive with {n} paired seeds — the usual "
               "outcome at this scale")
        if mdes:
            msg += (f"; the median minimum detectable effect is {statistics.median(mdes):.4f} nats at 80% power "
                    "after Holm")
        if need:
            msg += (f"; about {need} seeds per arm would detect a true step of δ={spec.delta} at the spread measured "
                    f"here (grow this sweep: `{sweep_command(spec, res.root, seeds=need)}`)")
        out.append(msg + ".")
    positive = sorted({int(a.x) for a in spec.arms if a.family == "dP" and a.x > 0})
    first = next((c for c in cons if c["a"] == spec.at("dP", positive[0])), None) if len(positive) > 1 else None
    if first is not None:
        out.append(f"The seed's dead zone was its first step, {SEED_FIRST_STEP}. The analogous step here (between the "
                   f"two smallest dP > 0), "
                   f"{_step(first, spec)}, does {'' if first['label'] == stats.EQUIVALENT else 'not '}reproduce it "
                   "as a measured equivalence.")
    out.append(f"Regime: {reg['tokens_per_row']:,.0f} training tokens per table row here vs ≈"
               f"{reg['seed_tokens_per_row']:,.0f} in the seed, and {reg['base_params'] / 1e6:.2f}M vs 2,458M base "
               "parameters; a result here is evidence about this regime, not a reproduction of the seed's phenomenon.")
    out += analysis["confounds"]
    ev = analysis["early_vs_final"]
    if ev.get("rows"):
        step = ev["rows"][0]["early_step"]
        u, nu = ev["used"], ev["unused"]
        rho, p = ev["spearman_use_delta"]
        line = (f"Early verdict at step {step} of {res.configs[spec.baseline]['train']['steps']}: USED in {u['runs']} "
                f"run(s), {u['gain_ge_delta']} of them ended ≥ δ below the baseline; UNUSED in {nu['runs']}, "
                f"{nu['gain_ge_delta']} of them ended ≥ δ below it")
        if math.isfinite(rho):
            line += f"; Spearman ρ(early permute Δ, final gain) = {rho:+.2f} (p {p:.3g}, {ev['n']} runs)"
        out.append(line + " (learned tables only).")
        rho_z, p_z = ev["spearman_use_vs_zero"]
        if math.isfinite(rho_z):
            out.append(f"Against the table's own share (each run vs the zeroed table at its dP and seed): Spearman "
                       f"ρ(early permute Δ, final gain over the zeroed table) = {rho_z:+.2f} (p {p_z:.3g}, "
                       f"{ev['n_vs_zero']} runs).")
        if nu["gain_ge_delta"]:
            out.append(f"{nu['gain_ge_delta']} run(s) judged UNUSED early still ended ≥ δ below the baseline: part of "
                       "the gain vs baseline does not go through the table (the zero-table control measures it).")
    return out
