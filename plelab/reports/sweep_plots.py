"""Matplotlib figures of a sweep (PNG, written atomically): loss vs dP and vs added parameters
with 95% CIs over seeds, paired Δ vs baseline with CIs, diagnostics and SNR vs dP, validation
curves, and the early verdict against the final result."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from plelab.reports.figures import finish_axes, pyplot, save_figure
from plelab.reports.sweep_comparison import plot_time_axes
from plelab.sweeps.results import SweepResults
from plelab.sweeps.spec import CURVE_CONTROLS
from plelab.stats import t_quantile

_FAMILY_STYLE = {"dP": ("C0", "o", "main (Gemma)"), "frozen": ("C1", "s", "table frozen"),
                 "zero": ("C2", "^", "table zeroed"), "matched": ("C3", "D", "scale-matched"),
                 "iid": ("C4", "v", "i.i.d. ids"), "gate-scalar": ("C5", "<", "seed's scalar gate"),
                 "gate-vector": ("C6", ">", "seed's vector gate")}


def _ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t interval (0 with one value)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float(v.mean()), 0.0
    return float(v.mean()), t_quantile(0.975, len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))


def _curves(res: SweepResults) -> dict[str, list]:
    """family -> [(x, added params, arm name)] with the baseline first."""
    base = res.spec.baseline
    out = {}
    for fam in ("dP", *CURVE_CONTROLS):  # the curves: families with an arm at every dP
        arms = sorted((a for a in res.spec.arms if a.family == fam and a.x > 0 and a.name in res.runs),
                      key=lambda a: a.x)
        if arms:
            out[fam] = [(0, 0, base)] + [(a.x, res.accounting[a.name]["added"], a.name) for a in arms]
    return out


def plot_loss(res: SweepResults, out: Path) -> list[Path]:
    plt = pyplot()
    written = []
    for name, xkey, xlabel in (("loss_vs_dp.png", 0, "dP"), ("loss_vs_params.png", 1, "added parameters (M)")):
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for fam, pts in _curves(res).items():
            color, marker, label = _FAMILY_STYLE[fam]
            xs = [p[xkey] / (1e6 if xkey else 1) for p in pts]
            stats = [_ci(res.losses(p[2])) for p in pts]
            ax.errorbar(xs, [m for m, _ in stats], yerr=[h for _, h in stats], color=color, marker=marker,
                        capsize=3, label=label)
            for x, p in zip(xs, pts):
                ax.scatter([x] * len(res.losses(p[2])), res.losses(p[2]), color=color, alpha=0.25, s=10)
        finish_axes(ax, xlabel, f"validation loss (mean of last {res.spec.last_k} evals)",
                    "loss vs " + xlabel.split(" (")[0] + " — mean ± 95% CI over seeds")
        written.append(save_figure(fig, out / name))
    return written


def plot_paired(res: SweepResults, analysis: dict, out: Path) -> Path:
    plt = pyplot()
    comps = analysis["vs_baseline"] + [c for c in analysis["controls"]]
    fig, ax = plt.subplots(figsize=(6.4, max(2.4, 0.9 + 0.4 * len(comps))))
    for i, c in enumerate(comps):
        if c["ci_low"] is None:
            ax.plot([c["mean"]], [i], "x", color="gray")
            continue
        color = "C0" if c["a"] == res.spec.baseline else "C1"
        ax.errorbar([c["mean"]], [i], xerr=[[c["mean"] - c["ci_low"]], [c["ci_high"] - c["mean"]]], fmt="o",
                    color=color, capsize=3)
    ax.axvline(0, color="black", lw=0.8)
    for s in (-1, 1):
        ax.axvline(s * res.spec.delta, color="gray", ls=":", lw=0.8)
    ax.set_yticks(range(len(comps)), [f"{c['b']} − {c['a']}" for c in comps], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("paired Δ loss (nats), 95% CI; dotted: ±δ")
    ax.set_title("paired differences (negative = lower loss)")
    return save_figure(fig, out / "paired_delta.png")


def plot_sweep_diagnostics(res: SweepResults, out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for fam, pts in _curves(res).items():
        color, marker, label = _FAMILY_STYLE[fam]
        pts = [p for p in pts if p[0] > 0]
        xs = [p[0] for p in pts]
        runs = [list(res.runs[p[2]].values()) for p in pts]
        cka = [np.mean([r.structure.get("final", {}).get("cka", np.nan) for r in rs]) for rs in runs]
        null = [np.mean([r.structure.get("final", {}).get("null_mean", np.nan) for r in rs]) for rs in runs]
        use = [np.mean([r.final_diag.get("delta", np.nan) for r in rs]) for rs in runs]
        snr = [np.mean([r.signal.get("snr") or np.nan for r in rs]) for rs in runs]
        axes[0].plot(xs, cka, marker=marker, color=color, label=label)
        axes[0].plot(xs, null, ls=":", color=color)
        axes[1].plot(xs, use, marker=marker, color=color, label=label)
        axes[2].plot(xs, snr, marker=marker, color=color, label=label)
    axes[0].set_title("cross-seed CKA of Δ (dotted: null)")
    axes[1].set_title("use: loss rise when rows are permuted")
    axes[1].axhline(0.005, color="gray", ls=":", lw=0.8)
    axes[2].set_title("injection SNR (branch / hidden RMS)")
    for ax in axes:
        ax.set_xlabel("dP")
    axes[0].legend(fontsize=7)
    return save_figure(fig, out / "diagnostics_vs_dp.png")


def plot_curves(res: SweepResults, out: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    pts = _curves(res).get("dP", [(0, 0, res.spec.baseline)])
    for i, (x, _, name) in enumerate(pts):
        hist = [r.val_history for r in res.runs[name].values()]
        steps = [s for s, _ in hist[0]]
        n = min(len(h) for h in hist)
        mean = np.mean([[v for _, v in h[:n]] for h in hist], axis=0)
        ax.plot(steps[:n], mean, color=f"C{i}", label=f"dP={int(x)}")
    finish_axes(ax, "step", "validation loss (mean over seeds)", "validation curves, main arms")
    return save_figure(fig, out / "loss_curves.png")


def plot_early(analysis: dict, out: Path) -> Path | None:
    rows = analysis["early_vs_final"]["rows"]
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4))
    colors = {"USED": "C2", "UNUSED": "C3", "UNDECIDED": "C7"}
    for verdict, color in colors.items():
        sel = [r for r in rows if r["early_use"] == verdict]
        ax.scatter([r["early_use_delta"] for r in sel], [-r["final_delta"] for r in sel], color=color,
                   label=f"early {verdict} ({len(sel)})")
    ax.axhline(0, color="black", lw=0.8)
    finish_axes(ax, f"use test at step {rows[0]['early_step']}: permute Δ (nats)",
                "final paired gain vs baseline (nats)", "does the early verdict predict the result?")
    return save_figure(fig, out / "early_vs_final.png")


def plot_budget(res: SweepResults, analysis: dict, out: Path) -> Path | None:
    """The paired Δ vs the baseline along training (mean ± 95% CI over seeds) and the iso-loss step ratio."""
    budget = {a: e for a, e in (analysis.get("token_budget") or {}).items() if len(e["curve"]) >= 2}
    if not budget:
        return None
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    tokens = res.configs[res.spec.baseline]["train"]["batch_size"] * res.configs[res.spec.baseline]["train"]["seq_len"]
    for i, (arm, e) in enumerate(budget.items()):
        xs = [r["step"] * tokens / 1e6 for r in e["curve"]]
        left.plot(xs, [r["delta"] for r in e["curve"]], color=f"C{i}", marker="o", ms=3, label=arm)
        low = [r["ci_low"] if r["ci_low"] is not None else r["delta"] for r in e["curve"]]
        high = [r["ci_high"] if r["ci_high"] is not None else r["delta"] for r in e["curve"]]
        left.fill_between(xs, low, high, color=f"C{i}", alpha=0.2)
        iso = [(x, r["iso_ratio_median"]) for x, r in zip(xs, e["curve"]) if r["iso_ratio_median"] is not None]
        if iso:
            right.plot(*zip(*iso), color=f"C{i}", marker="o", ms=3, label=arm)
    left.axhline(0, color="k", lw=0.8)
    right.axhline(1, color="k", lw=0.8)
    finish_axes(left, "training tokens (M)", f"Δ loss vs {res.spec.baseline} (nats)",
                "paired gain along training, 95% CI")
    finish_axes(right, "training tokens (M)", "baseline steps / arm steps", "iso-loss step ratio (median)")
    return save_figure(fig, out / "token_budget.png")


def all_plots(res: SweepResults, analysis: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = plot_loss(res, out) + [plot_paired(res, analysis, out), plot_sweep_diagnostics(res, out),
                                   plot_curves(res, out)]
    extra = [plot_early(analysis, out), plot_budget(res, analysis, out), plot_time_axes(res, out)]
    return paths + [p for p in extra if p]
