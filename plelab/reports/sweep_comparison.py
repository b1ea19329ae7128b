"""The comparison study's sections of a sweep report: the table family side by side (added parameters, FLOPs, step
time, loss against the baseline in and out of distribution), the wall-clock reading against the baseline's budget
ladder, and the loss curves against tokens and against wall-clock seconds (:mod:`plelab.stats.wallclock`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plelab.reports.figures import finish_axes, pyplot, save_figure
from plelab.reports.tables import comparison_cells
from plelab.stats.wallclock import table_arms
from plelab.sweeps.results import SweepResults


def _cmp(c: dict | None) -> str:
    return " ".join(comparison_cells(c)) if c else "—"


def kinds_table(res: SweepResults, analysis: dict) -> tuple[list[str], list[list[str]]]:
    """One row per table arm: kind, added parameters, FLOPs per token vs the baseline, step-time ratio, the
    in-distribution and OOD comparisons with the baseline and the wall-clock one."""
    vs = {c["b"]: c for fam in ("vs_baseline", "controls_vs_baseline") for c in analysis.get(fam, [])}
    ood = {c["b"]: c for c in analysis.get("ood_vs_baseline", [])}
    wall = (analysis.get("wallclock") or {}).get("arms", {})
    base = res.accounting[res.spec.baseline]
    rows = []
    for arm in table_arms(res):
        acc, spec_arm, w = res.accounting[arm], res.spec.arm(arm), wall.get(arm, {})
        flops, base_flops = acc.get("train_flops_per_token"), base.get("train_flops_per_token")
        extra = f"{100 * (flops / base_flops - 1):+.2f}%" if flops and base_flops else "—"
        ratio = f"{w['time_ratio']:.3f}×" if w.get("time_ratio") else "—"
        rows.append([arm, "ple" if spec_arm.family == "dP" else spec_arm.family, f"{acc['added']:,}", extra, ratio,
                     _cmp(vs.get(arm)), _cmp(ood.get(arm)), _cmp(w) if "mean" in w else w.get("label", "—")])
    return (["arm", "kind", "added params", "FLOPs/token vs baseline", "step time vs baseline",
             "Δ loss vs baseline (in distribution)", "Δ OOD loss vs baseline", "Δ vs baseline at equal wall clock"],
            rows)


def worth_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    """The token-budget reading: what each arm is worth in baseline budget, beside what its steps cost."""
    wall = analysis.get("wallclock") or {}
    top = max(wall.get("ladder") or [1.0])
    rows = []
    for arm, e in wall.get("arms", {}).items():
        worth = (f"{e['worth_median']:.3f}×" if e.get("worth_median") is not None
                 else f"outside (< 1× on {e.get('worth_below', 0)}, > {top:g}× on {e.get('worth_above', 0)} seeds)")
        rows.append([arm, worth, f"{e['time_ratio']:.3f}×" if e.get("time_ratio") else "—", e.get("label", "—"),
                     e.get("reason", "")])
    return ["arm", "worth in baseline budget (median over seeds)", "its step time", "equal-time label", "why"], rows


def comparison_blocks(res: SweepResults, analysis: dict) -> list[tuple]:
    """The report blocks of a study with other kinds of table, an OOD set or a budget ladder ([] otherwise)."""
    wall, ood = analysis.get("wallclock") or {}, analysis.get("ood_vs_baseline") or []
    kinds = {res.spec.arm(a).family for a in table_arms(res)}
    if not wall and not ood and len(kinds) < 2:
        return []
    out: list[tuple] = [("h2", "The table family side by side"),
                        ("p", "Every arm with a table against the baseline, paired by seed. In distribution: the "
                              "study's main comparison (Dunnett over the arms). OOD: the same arms on data.ood's "
                              "windows, text from outside the training corpus (a lower loss in distribution that is "
                              "not lower out of it is the 'lower loss, worse evals' pattern). Equal wall clock: the "
                              "arm against the baseline trained for as many seconds (interpolated on its budget "
                              "ladder at the arm's step-time ratio; Holm over the arms)."),
                        ("table", *kinds_table(res, analysis))]
    if wall:
        out += [("h3", "What a table is worth in the baseline's tokens"),
                ("p", f"The baseline's budget ladder: {', '.join(f'{m:g}×' for m in wall['ladder'])} its steps, each "
                      "its own run with its own schedule. An arm's worth is the budget at which the ladder reaches "
                      "its loss (log-linear between points), per seed; a table pays off in wall clock where its worth "
                      "exceeds its step-time ratio."),
                ("table", *worth_table(analysis))]
    return out


def plot_time_axes(res: SweepResults, out: Path) -> Path | None:
    """Validation loss of the baseline and every table arm (mean over seeds) against training tokens and against
    wall-clock seconds (steps × the run's median step time); None where step times are unknown."""
    arms = [res.spec.baseline] + table_arms(res)
    curves = {}
    for arm in arms:
        runs = list(res.runs.get(arm, {}).values())
        if not runs or any(not r.step_seconds for r in runs):
            return None
        steps = sorted(set.intersection(*(set(dict(r.val_history)) for r in runs)))
        loss = [float(np.mean([dict(r.val_history)[s] for r in runs])) for s in steps]
        secs = float(np.median([r.step_seconds for r in runs]))
        curves[arm] = (steps, loss, secs)
    cfg = res.configs[res.spec.baseline]["train"]
    tokens = cfg["batch_size"] * cfg["seq_len"]
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for i, (arm, (steps, loss, secs)) in enumerate(curves.items()):
        style = {"color": "k" if i == 0 else f"C{i - 1}", "lw": 1.6 if i == 0 else 1.0, "label": arm}
        left.plot([s * tokens / 1e6 for s in steps], loss, **style)
        right.plot([s * secs / 60 for s in steps], loss, **style)
    finish_axes(left, "training tokens (M)", "validation loss (mean over seeds)", "against tokens")
    finish_axes(right, "training wall clock (min, median step time × steps)", "", "against wall clock")
    return save_figure(fig, out / "loss_vs_time.png")
