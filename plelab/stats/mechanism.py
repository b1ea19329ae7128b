"""The seed's proposed mechanism for its dead zone, read off a sweep's live diagnostics: below some dP the learned
gate never opens ("gate 不开，信号更弱，梯度更小" — the gate stays shut, the signal is weaker, the gradient smaller),
so the table never gets through.

Per arm with a per-layer table, from each run's live diagnostics rows (means over layers,
:mod:`plelab.diagnostics.signal`): the gate's activity (Gemma: mean ``|gelu(W_g h)|``; the seed's scalar or
vector gate: mean ``|g|``), the gradient norm reaching the gate and the table slice, and the injection SNR
(branch RMS over hidden RMS), from the last row; and for a learned gate (``scalar`` / ``vector`` with
``ple.gate_learn``) its whole trajectory, judged by :func:`movement` against its own noise, not a fixed fraction:

- its step-to-step noise ``σ = 1.4826 · MAD(Δ²g) / √2`` (the robust sd of the changes between successive
  readings, taken from the second differences so that a steady trend, or a bend from flat to rising, is not
  counted as noise; fewer than 3 readings: unread);
- **opened** at step t when ``|g_t| − |g_0|`` exceeds ``Z·σ·√k`` (``k`` readings after the start, ``g_0`` the
  init; the band a driftless random walk of that noise stays inside) and stays above it to the end of the run;
- **closed** likewise below ``|g_0| − Z·σ·√k``; **stayed** otherwise; a run without readings is unread.

The seed's loop starts from a shut gate: the ``gate-scalar-small`` (init 0.01) and ``gate-scalar-0`` (init 0)
controls test it — does the gate open, at which step, and does that depend on dP? Gates started open
(``gate-scalar``, init 1) test the reverse, closing. The mechanism **shows** in a family when at some dP the gate
never opens (or closes) in any run while at a larger dP it opens (stays open) in every run; a family with a run
unread gets no verdict. Runs are counted per arm (each seed one independent run). Gemma's gate cannot silence the
branch this way — ``post_per_layer_input_norm`` restores its RMS whatever the gate does — so there the SNR is the
reading.
"""

from __future__ import annotations

import numpy as np

Z = 3.0  # the band's width in noise sds (a driftless walk leaves ±3σ√k at a rate ≈ 0.3% per reading)


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _sustained(above: np.ndarray, steps: np.ndarray) -> int | None:
    """The first step from which ``above`` holds to the end, or None."""
    if not above.any() or not above[-1]:
        return None
    last_false = np.flatnonzero(~above)
    return int(steps[last_false[-1] + 1 if len(last_false) else 0])


def movement(history: list[tuple[int, float]], init: float) -> dict:
    """Did a learned gate leave its init, and when? ``history``: ``(step, mean |g|)`` readings; ``init``: its
    ``ple.gate_init``. Returns ``{"state": opened | closed | stayed | unread, "step", "noise", "readings"}``."""
    if len(history) < 3:
        return {"state": "unread", "step": None, "noise": None, "readings": len(history)}
    steps = np.array([0] + [s for s, _ in history], dtype=np.int64)
    g = np.array([abs(init)] + [v for _, v in history], dtype=np.float64)
    d2 = np.diff(g, 2)
    noise = 1.4826 * float(np.median(np.abs(d2 - np.median(d2)))) / np.sqrt(2)
    k = np.arange(1, len(g))
    band = Z * max(noise, 1e-12) * np.sqrt(k)
    dev = g[1:] - g[0]
    opened, closed = _sustained(dev > band, steps[1:]), _sustained(dev < -band, steps[1:])
    state = "opened" if opened is not None else "closed" if closed is not None else "stayed"
    return {"state": state, "step": opened if opened is not None else closed, "noise": noise,
            "readings": len(history)}


def gate_mechanism(res) -> dict:
    """``{"rows": [...], "families": {family: finding}, "z": Z}`` for a :class:`~plelab.sweeps.results.SweepResults`."""
    rows = []
    for arm in res.spec.arms:
        ple = res.configs[arm.name]["ple"]
        runs = list(res.runs.get(arm.name, {}).values())
        if not ple["dim"] or not runs:
            continue
        gate, init = ple["gate"], ple["gate_init"]
        learned = gate in ("scalar", "vector") and ple["gate_learn"]
        moves = [movement(r.gate_history, init) for r in runs] if learned else []
        count = {s: sum(m["state"] == s for m in moves) for s in ("opened", "closed", "stayed", "unread")}
        open_steps = [m["step"] for m in moves if m["state"] == "opened"]
        activity = _mean(r.signal.get("gate") for r in runs)
        rows.append({"arm": arm.name, "family": arm.family, "dp": int(ple["dim"]), "gate": gate,
                     "init": init if learned else None, "runs": len(runs), "read": len(runs) - count["unread"]
                     if learned else sum(r.signal.get("gate") is not None for r in runs),
                     "gate_activity": activity,
                     "gate_ratio": activity / abs(init) if learned and init and activity is not None else None,
                     "grad_gate": _mean(r.signal.get("grad_gate") for r in runs),
                     "grad_table": _mean(r.signal.get("grad_table") for r in runs),
                     "snr": _mean(r.signal.get("snr") for r in runs),
                     **({k: count[k] for k in ("opened", "closed", "stayed")} if learned else
                        {"opened": None, "closed": None, "stayed": None}),
                     "open_step": float(np.median(open_steps)) if open_steps else None})
    families = {}
    for fam in sorted({r["family"] for r in rows if r["opened"] is not None}):
        arms = sorted((r for r in rows if r["family"] == fam and r["opened"] is not None), key=lambda r: r["dp"])
        families[fam] = _finding(fam, arms)
    return {"rows": rows, "families": families, "z": Z}


def _finding(fam: str, arms: list[dict]) -> str:
    unread = [a for a in arms if a["read"] < a["runs"]]
    if unread:
        return (f"{fam}: no verdict — {sum(a['runs'] - a['read'] for a in unread)} run(s) have no gate reading "
                f"(dP {', '.join(str(a['dp']) for a in unread)}; live diagnostics need train.diag_every > 0)")
    starts_shut = all(abs(a["init"]) < 0.1 for a in arms)
    counts = ", ".join(f"dP {a['dp']}: opened {a['opened']}, closed {a['closed']}, stayed {a['stayed']} of "
                       f"{a['runs']}" for a in arms)
    shut = [a for a in arms if a["opened"] == 0 and (starts_shut or a["closed"] == a["runs"])]
    through = [a for a in arms if (a["opened"] == a["runs"] if starts_shut else a["closed"] == 0)]
    shows = [(c, o) for c in shut for o in through if o["dp"] > c["dp"]]
    verb = "never opened from its near-closed start" if starts_shut else "closed"
    if shows:
        c, o = max(shows, key=lambda p: p[0]["dp"])
        return (f"{fam}: the mechanism shows — the gate {verb} in every run at dP {c['dp']} and "
                f"{'opened' if starts_shut else 'stayed open'} in every run at dP {o['dp']} ({counts}; the gate's "
                f"own noise band ±{Z:g}σ√k)")
    when = "; ".join(f"dP {a['dp']} median step {a['open_step']:g}" for a in arms if a["open_step"] is not None)
    if starts_shut and all(a["opened"] == a["runs"] for a in arms):
        return (f"{fam}: the mechanism does not show — the gate opened in every run at every dP ({when})")
    if not starts_shut and all(a["closed"] == 0 for a in arms):
        ratios = [a["gate_ratio"] for a in arms if a["gate_ratio"] is not None]
        span = f" (final |g| {min(ratios):.2f}–{max(ratios):.2f}× its init)" if ratios else ""
        return f"{fam}: the mechanism does not show — the gate closed in no run at any dP{span}"
    return (f"{fam}: mixed — {counts}" + (f"; opening steps: {when}" if when else "")
            + "; no dP where the gate stays shut in every run below one where it gets through in every run")
