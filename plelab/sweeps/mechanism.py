"""The seed's proposed mechanism for its dead zone, read off a sweep's live diagnostics: below some dP the learned
gate stays closed (``|g| ≈ 0``) and its gradient vanishes, so the table never gets through.

Per arm with a per-layer table, from each run's last live diagnostics row (means over layers,
:mod:`plelab.diagnostics.signal`): the gate's activity (Gemma: mean ``|gelu(W_g h)|``; the seed's scalar or
vector gate: mean ``|g|``), the gradient norm reaching the gate and the table slice, and the injection SNR
(branch RMS over hidden RMS). A learned gate (``scalar`` / ``vector`` with ``ple.gate_learn``, from a non-zero
``ple.gate_init``) counts as **closed** in a run when its final ``|g|`` is below :data:`CLOSED_FRACTION` of its
initial value and **open** otherwise; a run without a gate reading is neither. Runs are counted per arm (each seed
one independent run). The mechanism **shows** when a learned-gate arm is closed in every run while a larger dP of
the same family is open in every run; a family with a run unread gets no verdict. Gemma's gate cannot silence the
branch this way — ``post_per_layer_input_norm`` restores its RMS whatever the gate does — so for it the SNR is the
reading.
"""

from __future__ import annotations

import numpy as np

CLOSED_FRACTION = 0.1  # |g| below a tenth of its init: closed


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def gate_mechanism(res) -> dict:
    """``{"rows": [...], "families": {family: finding}}`` for a :class:`~plelab.sweeps.results.SweepResults`."""
    rows = []
    for arm in res.spec.arms:
        ple = res.configs[arm.name]["ple"]
        runs = list(res.runs.get(arm.name, {}).values())
        if not ple["dim"] or not runs:
            continue
        gate, init = ple["gate"], ple["gate_init"]
        gates = [r.signal.get("gate") for r in runs]
        learned = gate in ("scalar", "vector") and ple["gate_learn"] and init != 0
        read = [g for g in gates if g is not None]
        closed = sum(g < CLOSED_FRACTION * abs(init) for g in read) if learned else None
        activity = _mean(gates)
        rows.append({"arm": arm.name, "family": arm.family, "dp": int(ple["dim"]), "gate": gate,
                     "init": init if learned else None, "runs": len(runs), "read": len(read),
                     "gate_activity": activity,
                     "gate_ratio": activity / abs(init) if learned and activity is not None else None,
                     "grad_gate": _mean(r.signal.get("grad_gate") for r in runs),
                     "grad_table": _mean(r.signal.get("grad_table") for r in runs),
                     "snr": _mean(r.signal.get("snr") for r in runs), "closed": closed,
                     "open": len(read) - closed if learned else None})
    families = {}
    for fam in sorted({r["family"] for r in rows if r["closed"] is not None}):
        arms = sorted((r for r in rows if r["family"] == fam and r["closed"] is not None), key=lambda r: r["dp"])
        families[fam] = _finding(fam, arms)
    return {"rows": rows, "families": families, "closed_fraction": CLOSED_FRACTION}


def _finding(fam: str, arms: list[dict]) -> str:
    unread = [a for a in arms if a["read"] < a["runs"]]
    if unread:
        return (f"{fam}: no verdict — {sum(a['runs'] - a['read'] for a in unread)} run(s) have no gate reading "
                f"(dP {', '.join(str(a['dp']) for a in unread)}; live diagnostics need train.diag_every > 0)")
    shut = [a for a in arms if a["closed"] == a["runs"]]
    opened = [a for a in arms if a["open"] == a["runs"]]
    counts = ", ".join(f"dP {a['dp']}: {a['closed']} of {a['runs']}" for a in arms)
    shows = [(c, o) for c in shut for o in opened if o["dp"] > c["dp"]]
    if shows:
        c, o = max(shows, key=lambda p: p[0]["dp"])
        return (f"{fam}: the mechanism shows — the gate closed (|g| < {CLOSED_FRACTION:g}× its init) in every run "
                f"at dP {c['dp']} and stayed open in every run at dP {o['dp']} (closed runs: {counts})")
    if len(opened) == len(arms):
        ratios = [a["gate_ratio"] for a in arms]
        return (f"{fam}: the mechanism does not show — the gate stayed open in every run at every dP "
                f"(final |g| {min(ratios):.2f}–{max(ratios):.2f}× its init)")
    return f"{fam}: mixed — closed runs: {counts}; no dP closed in every run below one open in every run"
