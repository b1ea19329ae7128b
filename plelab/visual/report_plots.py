"""Figures of the visual study (PNG, written atomically): caption loss by word kind, the paired
differences against the no-table baseline with their 95% CIs, the two tables' diagnostics side by
side (the seed's contrast), and the validation curves."""

from __future__ import annotations

import math
from pathlib import Path

from plelab.reports.figures import finish_axes, pyplot, save_figure
from plelab.sweeps.results import SweepResults


def _width(n: int) -> float:
    """Figure width for ``n`` labelled positions (many arms: wider, so the labels fit)."""
    return max(6.4, 0.32 * n + 1.5)


def _ticks(ax, labels: list[str]) -> None:
    many = len(labels) > 6
    ax.set_xticks(range(len(labels)), labels, fontsize=6 if many else 8, rotation=60 if many else 0,
                  ha="right" if many else "center")


def plot_losses(analysis: dict, out: Path) -> Path:
    plt = pyplot()
    rows = analysis["rows"]
    fig, ax = plt.subplots(figsize=(_width(len(rows)), 3.6))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["content"][0] for r in rows], 0.4, label="content words")
    ax.bar([x + 0.2 for x in xs], [r["template"][0] for r in rows], 0.4, label="template words")
    _ticks(ax, [r["method"] for r in rows])
    ax.set_ylabel("caption loss (nats / word)")
    ax.set_title("caption loss by visual-ID method (mean over seeds)")
    ax.legend(fontsize=8)
    return save_figure(fig, out / "visual_losses.png")


def plot_deltas(analysis: dict, out: Path) -> Path:
    """Paired Δ (method − none) with 95% CIs, on all caption words and on content words."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(_width(len(analysis["caption_vs_none"])), 3.6))
    for offset, key, label in ((-0.15, "caption_vs_none", "caption"), (0.15, "content_vs_none", "content words")):
        comps = analysis[key]
        for i, c in enumerate(comps):
            lo, hi = c["ci_low"], c["ci_high"]
            err = [[c["mean"] - lo], [hi - c["mean"]]] if lo is not None else None
            ax.errorbar(i + offset, c["mean"], yerr=err, fmt="o", capsize=3, color="C0" if offset < 0 else "C1",
                        label=label if i == 0 else None)
        _ticks(ax, [c["b"] for c in comps])
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylabel("Δ loss vs no visual table (nats)")
    ax.set_title("paired difference with 95% CI (below 0: the method helps)")
    ax.legend(fontsize=8)
    return save_figure(fig, out / "visual_deltas.png")


def plot_contrast(analysis: dict, out: Path) -> Path | None:
    """Text vs visual table per method: the use test (permute rows) and the gradient per used row."""
    rows = analysis["tables"]
    methods = [m for m in dict.fromkeys(r["method"] for r in rows)]
    if not methods:
        return None
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(9.0, 2 * _width(len(methods))), 3.6))
    for j, (table, color) in enumerate((("text", "C0"), ("visual", "C3"))):
        got = {r["method"]: r for r in rows if r["table"] == table}
        xs = [i + (j - 0.5) * 0.35 for i, m in enumerate(methods) if m in got]
        a1.bar(xs, [got[m]["permute_caption"][0] for m in methods if m in got], 0.35, color=color,
               label=f"{table} table")
        a2.bar(xs, [got[m]["grad_row"] for m in methods if m in got], 0.35, color=color, label=f"{table} table")
    for ax in (a1, a2):
        _ticks(ax, methods)
        ax.legend(fontsize=8)
    a1.axhline(0, color="grey", lw=0.8)
    a1.set_ylabel("caption loss change (nats)")
    a1.set_title("use: rows permuted within frequency bins", fontsize=9)
    grads = [r["grad_row"] for r in rows if r["grad_row"] is not None and math.isfinite(r["grad_row"])]
    if any(g > 0 for g in grads):
        a2.set_yscale("log")
    else:
        a2.text(0.5, 0.5, "no live diagnostics\n(train.diag_every=0)", ha="center", va="center",
                transform=a2.transAxes)
    a2.set_ylabel("gradient norm per used row")
    a2.set_title("gradient reaching each table (live, mean over layers)", fontsize=9)
    return save_figure(fig, out / "visual_contrast.png")


def plot_curves(res: SweepResults, out: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, arm in enumerate(a for a in res.spec.arms if a.name in res.runs):
        for j, run in enumerate(res.runs[arm.name].values()):
            steps, vals = zip(*run.val_history) if run.val_history else ((), ())
            ax.plot(steps, vals, color=f"C{i}", alpha=0.7, lw=1, label=arm.name if j == 0 else None)
    finite = [v for arm in res.runs.values() for r in arm.values() for _, v in r.val_history if math.isfinite(v)]
    if finite:
        ax.set_ylim(min(finite) - 0.05, min(finite) + 1.5)
    finish_axes(ax, "step", "validation caption loss", "validation curves (every seed)")
    return save_figure(fig, out / "visual_curves.png")


def visual_plots(res: SweepResults, analysis: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_losses(analysis, out), plot_deltas(analysis, out), plot_contrast(analysis, out),
             plot_curves(res, out)]
    return [p for p in paths if p is not None]
