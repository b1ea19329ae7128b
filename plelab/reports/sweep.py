"""``plelab report SWEEP``: the study's report as Markdown, a self-contained HTML page (plots
inlined as base64 PNG, no external resources), CSV and JSON, in ``SWEEP/report/``.

The page is built from one list of blocks (headings, paragraphs, lists, tables, figures) so that
the Markdown and the HTML always say the same thing.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import time
from pathlib import Path

from plelab.config.paths import absolute
from plelab.errors import ConfigError
from plelab.io import atomic_write, check_folder_target, write_json
from plelab.reports.sweep_comparison import comparison_blocks
from plelab.reports.sweep_findings import findings, required_seeds
from plelab.reports.sweep_plots import all_plots
from plelab.reports.tables import comparison_cells, csv_text, fmt
from plelab.stats.analysis import analyse
from plelab.sweeps.analysis_plan import plan_status
from plelab.stats.mechanism import gate_mechanism
from plelab.sweeps.results import SweepResults, collect, regime
from plelab.sweeps.spec import DEFAULT_DELTA, DP_DELTA, run_dir, sweep_command


def _decide(c: dict) -> str:
    """Seeds that would decide an inconclusive comparison: ``detect δ / show ±δ`` (— where decided or unknown)."""
    need = c.get("seeds_to_decide") or {}
    if c["label"] != "inconclusive" or not need:
        return "—"
    return f"{need.get('difference') or '>1000'} / {need.get('equivalence') or '>1000'}"


def delta_origin(spec, plan: dict, declared: float) -> str:
    """Where δ came from, as far as the runs' plan stamps show (``plan``: :func:`plan_status`); ``declared``: the
    plan's δ (another ``spec.delta`` is a post-hoc sensitivity analysis)."""
    if spec.delta != declared:
        return (f"a post-hoc sensitivity analysis: this margin was chosen after the runs; the study's analysis plan "
                f"has δ = {declared:g} and its labels are in report/ — the labels here are exploratory")
    if spec.kind != "dp":
        what = "plelab's default for this study" if spec.delta == DEFAULT_DELTA else "given with --delta"
    elif spec.delta == DP_DELTA:
        what = ("plelab's default for a dP study: below the seed's dP 0 → 64 gain (0.006) and its 128 → 256 step "
                "(0.017), so an equivalence could call neither \"no change\"")
    elif spec.delta == DEFAULT_DELTA:
        what = ("plelab's earlier default for a dP study, about the seed's dP=256 gain of 0.023 nats — wider than "
                "the seed's 128 → 256 step, so an equivalence here could not tell that step from no change")
    else:
        what = "given with --delta"
    if plan["before_runs"]:
        return f"{what}; fixed in the analysis plan before the runs"
    return f"{what}; not shown to be fixed before the runs (see the analysis plan below)"


def run_plan_status(res: SweepResults) -> dict:
    """:func:`plan_status` of the sweep's finished runs (aliases once)."""
    return plan_status(res.spec, [run_dir(res.root, a.name, s) for a in res.spec.runnable()
                                  for s in res.runs.get(a.name, {})])


def ci_note(analysis: dict) -> str:
    """What the intervals are: simultaneous (Dunnett) where a family got them, per comparison elsewhere."""
    kinds = {c.get("ci_kind") or "" for fam in ("vs_baseline", "controls_vs_baseline") for c in analysis.get(fam, [])}
    if any(k.startswith("simultaneous") for k in kinds):
        return ("Intervals against the baseline are 95% simultaneous over their family (Dunnett) where the family "
                "was blocked; all others are 95% per comparison (unadjusted); each CI column says which. ")
    return "Intervals are 95% per comparison (unadjusted). "


METHOD_NAMES = {"vs_baseline": "each dP against the baseline", "consecutive": "consecutive dP steps",
                "controls": "controls against their reference arm", "controls_vs_baseline": "controls against the "
                "baseline", "ood_vs_baseline": "each table arm against the baseline on the out-of-distribution loss"}


def method_lines(analysis: dict) -> list[str]:
    """One line per comparison family: the design it was analysed under, its error and its adjustment."""
    out = []
    for name, how in analysis.get("methods", {}).items():
        what = METHOD_NAMES.get(name, name.replace("_", " "))
        if how["method"] == "blocked":
            eq = how["equal_variance_p"]
            out.append(f"{what}: randomised complete block design, seeds as blocks across {how['arms']} arms × "
                       f"{how['seeds']} seeds; pooled residual sd {how['sigma']:.4f} on ν = {how['df']} df "
                       f"(sphericity: Bartlett p = {fmt(eq, '.3g')} across the pairwise differences); "
                       f"{how['adjustment']}"
                       + (" (many-to-one, multivariate t; simultaneous intervals)" if how["adjustment"] == "Dunnett"
                          else "; intervals per comparison")
                       + f" over {how['comparisons']} comparisons. Each label stands only where the pair's own "
                         f"error (paired t, Holm) gives it too: {how.get('own_error_disagreements', 0)} of "
                         f"{how['comparisons']} disagreed and are inconclusive.")
        else:
            out.append(f"{what}: paired t per comparison, Holm over {how['comparisons']} — {how.get('fallback')}.")
    return out


def sensitivity_table(analysis: dict, spec) -> tuple[list[str], list[list[str]]]:
    margins = [f"{d:g}" for d in (spec.delta / 2, spec.delta, 2 * spec.delta)]
    head = ["family", "comparison", *[f"label at δ = {m}" for m in margins]]
    rows = [[METHOD_NAMES.get(fam, fam), f"{r['b']} − {r['a']}", *[r["labels"][m] for m in margins]]
            for fam, items in analysis["sensitivity"].items() for r in items]
    return head, rows


def results_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    head = ["arm", "dP", "added params", "% of base", "val loss (mean ± sd, n)", "Δ vs baseline", "95% CI", "label",
            "structure (final; disjoint seed pairs)", "use (final; runs)", "SNR", "occurrences / used row (median)"]
    rows = []
    for r in analysis["rows"]:
        outside = (r.get("calibrated_range") or {}).get("inside") is False and r["use"] != "—"
        rows.append([r["arm"], str(r["dP"]), f"{r['added_params']:,}", f"{r['added_pct']:.2f}%",
                     f"{r['loss_mean']:.4f} ± {fmt(r['loss_sd'])} ({r['n']})", *comparison_cells(r["vs_baseline"]),
                     r["structure"] + (" †" if outside else ""), r["use"] + (" †" if outside else ""),
                     fmt(r["snr"], ".2f"), fmt(r["occurrences_median"], ",.0f")])
    return head, rows


def range_blocks(analysis: dict) -> list[tuple]:
    """The verdict columns' calibrated range: which arms' final calls sit outside the benchmark's measured span (†),
    and on which axes — a call outside is not covered by any measured error rate."""
    lines: dict[str, list[str]] = {}
    for r in analysis["rows"]:
        rng = r.get("calibrated_range")
        if rng and not rng["inside"]:
            lines.setdefault(rng["line"], []).append(r["arm"])
    if not lines:
        inside = [r["arm"] for r in analysis["rows"] if r.get("calibrated_range")]
        return [("p", f"The structure and use verdicts of {', '.join(inside)} are inside the calibrated range on "
                      "every axis the benchmark measured.")] if inside else []
    return [("p", "† The structure and use verdicts marked † are **outside the calibrated range**: no measured error "
                  "rate covers them (read them as uncalibrated readings)."),
            ("ul", [f"{', '.join(arms)}: {line}" for line, arms in lines.items()])]


def comparison_table(comps: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["comparison", "n", "Δ (B − A)", "95% CI", "p (adjusted)", "p TOST (Holm)", "MDE", "seeds to decide",
            "gain / added M params", "own error: 95% CI, label", "label"]
    rows = [[f"{c['b']} − {c['a']}", str(c["n"]), fmt(c["mean"], "+.4f"),
             f"[{fmt(c['ci_low'], '+.4f')}, {fmt(c['ci_high'], '+.4f')}] ({c.get('ci_kind') or 'per comparison'})",
             f"{fmt(c['p_adj'], '.3g')} ({c['adjustment']})", fmt(c["p_tost_adj"], ".3g"), fmt(c["mde"]),
             _decide(c), fmt(c.get("gain_per_m_params"), "+.4f"), _own(c), c["label"]] for c in comps]
    return head, rows


def _own(c: dict) -> str:
    """The pair's own-error reading beside a pooled-error comparison (— where the comparison is the pair's own)."""
    o = c.get("own_error")
    if not o:
        return "—"
    return f"[{fmt(o['ci_low'], '+.4f')}, {fmt(o['ci_high'], '+.4f')}], {o['label']}"


def early_table(early: dict) -> tuple[list[str], list[list[str]]]:
    head = ["run", "step", "structure", "use", "permute Δ", "CKA", "SNR", "final Δ vs baseline",
            "final Δ vs zeroed table"]
    rows = [[f"{r['arm']}/seed-{r['seed']}", str(r["early_step"]), r["early_structure"], r["early_use"],
             fmt(r["early_use_delta"], "+.4f"), fmt(r["early_cka"], ".3f"), fmt(r["early_snr"], ".2f"),
             fmt(r["final_delta"], "+.4f"), fmt(r.get("vs_zero"), "+.4f")] for r in early["rows"]]
    return head, rows


def budget_table(budget: dict) -> tuple[list[str], list[list[str]]]:
    def gain(g):
        return "—" if not g or g["ci_low"] is None else f"{g['mean']:+.4f} [{g['ci_low']:+.4f}, {g['ci_high']:+.4f}]"

    rows = []
    for arm, e in budget.items():
        last = e["curve"][-1] if e["curve"] else None
        iso = "—"
        if last is not None:
            iso = (f"{last['iso_ratio_median']:.2f}" if last["iso_ratio_median"] is not None
                   else "> 1 (the baseline never got there)")
        rows.append([f"{arm} vs {e['baseline']}", str(e.get("half_step", "—")), gain(e.get("gain_half")),
                     str(e.get("final_step", "—")), gain(e.get("gain_final")), gain(e.get("change")), iso,
                     e["label"]])
    return (["comparison", "half-way step", "Δ there", "final step", "final Δ", "change in Δ", "iso-loss ratio",
             "verdict"], rows)


def mechanism_table(mech: dict) -> tuple[list[str], list[list[str]]]:
    def f(x, fmt="{:.3g}"):
        return "—" if x is None else fmt.format(x)

    def runs(r, key):
        return "—" if r[key] is None else f"{r[key]} of {r['runs']}"

    rows = [[r["arm"], r["gate"], f(r["init"], "{:g}"), f(r["gate_activity"]), f(r["gate_ratio"], "{:.2f}×"),
             f(r["grad_gate"]), f(r["grad_table"]), f(r["snr"]), runs(r, "opened"), f(r["open_step"], "{:g}"),
             runs(r, "closed")] for r in mech["rows"]]
    return (["arm", "gate", "init", "gate activity", "|g| / init", "gate grad", "table grad", "SNR", "opened runs",
             "median opening step", "closed runs"], rows)


def blocks(res: SweepResults, analysis: dict, reg: dict, plots: list[Path], plan: dict,
           declared_delta: float) -> list[tuple]:
    spec = res.spec
    base_cfg = res.configs[spec.baseline]
    m, t = base_cfg["model"], base_cfg["train"]
    out: list[tuple] = [("h1", f"plelab dP study — {res.root.name}")]
    trunk = (f", the HF trunk {m['hf_config']}" if m.get("hf_config") else f", your model {m['factory']}"
             if m.get("factory") else "")
    out.append(("p", f"Preset {spec.preset}{trunk} (H={m['hidden_size']}, L={m['num_hidden_layers']}, "
                     f"V={m['vocab_size']}, {reg['base_params']:,} base parameters), {t['steps']} steps × "
                     f"{t['batch_size']} × {t['seq_len']} tokens per run ({reg['tokens']:,} tokens), seeds "
                     f"{spec.seeds}, paired: every arm of a seed has the same data order and initial trunk. A run's loss is the mean of its last "
                     f"{spec.last_k} validation evaluations; δ = {spec.delta} nats "
                     f"({delta_origin(spec, plan, declared_delta)}); α = {spec.alpha} family-wise. {ci_note(analysis)}"
                     "The labels use family-adjusted p-values (see Design and methods), so a per-comparison CI that "
                     "just excludes 0 can still be labelled inconclusive; the equivalence test (TOST) at α corresponds "
                     "to the 90% CI lying inside ±δ. A label stands only where the pooled-error and the pair's "
                     "own-error analyses agree. \"Equivalent\" and \"dead zone\" come only from TOST; anything else "
                     "undecided is \"inconclusive\", with the seeds that would decide it."))
    out.append(("p", f"**Analysis plan.** {plan['text']}"))
    if spec.kind == "dp":
        out.append(("p", f"Reproduce or resume: `{sweep_command(spec, Path(absolute(str(res.root))))}`"))
    if res.missing:
        out.append(("p", f"**{len(res.missing)} run(s) unfinished** and left out: {', '.join(res.missing[:8])}"
                         + (" …" if len(res.missing) > 8 else "") + f". Rerun `plelab sweep --out {res.root}`."))
    out += [("h2", "Findings"), ("ul", findings(res, analysis, reg))]
    out += [("h2", "Design and methods"), ("ul", method_lines(analysis))]
    if analysis.get("sensitivity"):
        out += [("h3", "Labels at other margins (δ-sensitivity)"), ("table", *sensitivity_table(analysis, spec))]
    out += [("h2", "Results in the seed's format"), ("table", *results_table(analysis))]
    out += range_blocks(analysis)
    out += [("h2", "Consecutive dP steps (dead zones and transitions)"),
            ("table", *comparison_table(analysis["consecutive"]))]
    if analysis["controls"]:
        out += [("h2", "Controls against their reference arm"), ("table", *comparison_table(analysis["controls"]))]
    for fam, comps in analysis["curves"].items():
        out += [("h3", f"Consecutive steps with the {fam} arms"), ("table", *comparison_table(comps))]
    ev = analysis["early_vs_final"]
    out.append(("h2", "Does the early verdict predict the result?"))
    if ev["rows"]:
        out.append(("table", *early_table(ev)))
    else:
        out.append(("p", "No early checkpoint with a use test was found (set train.early_checkpoint)."))
    budget = analysis.get("token_budget") or {}
    if budget:
        out += [("h2", "Token budget: a speed-up or added capacity?"),
                ("p", "Each arm against the baseline along training (paired by seed): Δ = L_arm − L_base "
                      "(negative: the arm ahead) at the evaluation nearest half-way and at the end, the change in Δ "
                      "(positive: the arm's lead shrank or its deficit grew; Holm and TOST at "
                      "±δ over the arms), and the iso-loss step ratio, the baseline steps needed for the arm's final "
                      "loss per arm step (median over seeds; '>' where the baseline never reached it). Inside one "
                      "cosine schedule the tokens seen and the schedule's position move together."),
                ("table", *budget_table(budget))]
    out += comparison_blocks(res, analysis)
    mech = gate_mechanism(res)
    if mech["rows"]:
        out += [("h2", "The seed's mechanism: does the gate stay shut below some dP?"),
                ("p", "Each arm's last live diagnostics (mean over layers and seeds): gate activity (Gemma: mean "
                      "|gelu(W_g h)|; the seed's learned gate: mean |g|, also as a multiple of its init), the gradient "
                      "norms at the gate and the table slice, and the injection SNR. A learned gate's whole trajectory "
                      "is judged against its own noise: it opened (closed) at the first step from which |g| stays "
                      f"above (below) its init by more than {mech['z']:g}σ√k, σ the robust sd of its step-to-step "
                      "changes and k the readings since the start. Gemma's post-norm restores the branch's RMS "
                      "whatever its gate does, so there the SNR is the reading."),
                ("table", *mechanism_table(mech))]
        if mech["families"]:
            out.append(("ul", list(mech["families"].values())))
    out += [("h2", "How this grid maps onto the seed's"), ("ul", [
        "dP/H here: " + ", ".join(f"{d}/{reg['hidden_size']} = {r:.3f}" for d, r in reg["dp_over_h"]) + "; "
        f"the seed's 64…512 at H=2560 span {reg['seed_dp_over_h'][0]:.3f}…{reg['seed_dp_over_h'][1]:.3f}.",
        "added parameters here: " + ", ".join(f"dP={d}: {p:.1f}%" for d, p in reg["added_fraction"])
        + "; the seed's: 8.98%, 17.96%, 35.92%, 71.83%.",
        f"tokens per table row: {reg['tokens_per_row']:,.0f} here vs ≈{reg['seed_tokens_per_row']:,.0f} in the seed "
        f"(400B tokens over V=100,096)"
        + (f" — {reg['seed_tokens_per_row'] / reg['tokens_per_row']:,.0f}× fewer updates per row here."
           if reg["tokens_per_row"] < reg["seed_tokens_per_row"] / 10 else "."),
        f"model: {reg['base_params'] / 1e6:.2f}M base parameters here vs 2,458M in the seed."])]
    out.append(("h2", "Figures"))
    out += [("img", p) for p in plots]
    every = list({id(r): r for by_seed in res.runs.values() for r in by_seed.values()}.values())  # aliases once
    tps = sum(r.tokens_per_second for r in every) / len(every)
    out.append(("p", f"Written {time.strftime('%Y-%m-%d %H:%M')} by plelab from {res.root} "
                     f"(per-run provenance — seed, config, corpus fingerprint, versions, git commit — in each "
                     f"run's summary.json); {len(every)} runs, mean {tps:,.0f} tokens/s per run, "
                     f"{sum(r.wall_seconds for r in every) / 60:.1f} run-minutes in all."))
    return out


def _md_table(head, rows) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def to_markdown(blocks_: list[tuple], rel: Path) -> str:
    parts = []
    for b in blocks_:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            parts.append("#" * int(kind[1]) + " " + b[1])
        elif kind == "p":
            parts.append(b[1])
        elif kind == "ul":
            parts.append("\n".join(f"- {x}" for x in b[1]))
        elif kind == "table":
            parts.append(_md_table(b[1], b[2]))
        elif kind == "img":
            parts.append(f"![{b[1].stem}]({b[1].relative_to(rel).as_posix()})")
    return "\n\n".join(parts) + "\n"


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px}"
        "th{background:#eef}img{max-width:100%;margin:0.5em 0;border:1px solid #ddd}li{margin:0.3em 0}")


def _inline(text: str) -> str:
    """Escape, then render **bold** and `code` (the only Markdown the blocks use)."""
    out, bold, code = [], False, False
    for i, piece in enumerate(html.escape(text).replace("`", "\x00").split("**")):
        if i:
            out.append("</b>" if bold else "<b>")
            bold = not bold
        segs = piece.split("\x00")
        for j, seg in enumerate(segs):
            if j:
                out.append("</code>" if code else "<code>")
                code = not code
            out.append(seg)
    return "".join(out)


def to_html(blocks_: list[tuple], title: str) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>"]
    for b in blocks_:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            parts.append(f"<{kind}>{_inline(b[1])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{_inline(b[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in b[2])
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        elif kind == "img":
            data = base64.b64encode(b[1].read_bytes()).decode()
            parts.append(f"<figure><img alt='{b[1].stem}' src='data:image/png;base64,{data}'></figure>")
    return "\n".join(parts) + "</body></html>\n"


def write_report(root: str | Path, delta: float | None = None) -> list[Path]:
    """Collect, analyse and write ``report/{report.md, report.html, results.csv, runs.csv, results.json}``.

    ``delta``: another margin than the analysis plan's — a post-hoc sensitivity analysis, written to
    ``report-posthoc-delta-{delta}/`` and labelled so (the plan's report is never overwritten by it)."""
    root = Path(root)
    if delta is not None and not delta > 0:
        raise ConfigError(f"--delta must be > 0 (a margin in nats), got {delta}")
    res = collect(root)
    declared = res.spec.delta
    out = root / "report"
    if delta is not None and delta != declared:
        res = dataclasses.replace(res, spec=dataclasses.replace(res.spec, delta=delta))
        out = root / f"report-posthoc-delta-{delta:g}"
        check_folder_target(out, "report folder", "move it away and rerun plelab report")
    plan = run_plan_status(res)
    analysis = analyse(res)
    reg = regime(res)
    plots = all_plots(res, analysis, out / "plots")
    bl = blocks(res, analysis, reg, plots, plan, declared)
    written = [atomic_write(out / "report.md", lambda p: p.write_text(to_markdown(bl, out))),
               atomic_write(out / "report.html", lambda p: p.write_text(to_html(bl, f"plelab dP study {root.name}")))]
    head, rows = results_table(analysis)
    written.append(atomic_write(out / "results.csv", lambda p: p.write_text(csv_text(head, rows))))
    runs = [[arm, s, f"{r.loss:.6f}", r.tokens_seen, f"{r.wall_seconds:.1f}"]
            for arm, by_seed in res.runs.items() for s, r in sorted(by_seed.items())]
    written.append(atomic_write(out / "runs.csv", lambda p: p.write_text(
        csv_text(["arm", "seed", "loss", "tokens", "wall_seconds"], runs))))
    written.append(write_json(out / "results.json", {
        "spec": res.spec.to_dict(), "regime": reg, "analysis": analysis, "accounting": res.accounting,
        "plan_status": plan, "posthoc_delta": res.spec.delta if res.spec.delta != declared else None,
        "required_seeds_for_delta": required_seeds(analysis, res.spec.alpha)}))
    return written
