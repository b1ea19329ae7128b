"""The visual study's report (``SWEEP/report/``): the seed-style table — method, ID semantics (NMI),
ID utilisation and perplexity, caption loss and content-word loss against the no-table baseline
with paired CIs, family-adjusted tests and the equivalence test — plus template-word loss and the loss with the image
removed, ID stability, and each method's visual table diagnosed next to its text table (both verdict
axes), as Markdown, self-contained HTML, CSV and JSON, with figures."""

from __future__ import annotations

import math
from pathlib import Path

from plelab.diagnostics.verdict import LEARNED, USED
from plelab.io import atomic_write, write_json
from plelab.reports.sweep import delta_origin, run_plan_status, sensitivity_table, to_html, to_markdown
from plelab.reports.tables import ci_cell, csv_text, fmt
from plelab import stats
from plelab.sweeps.results import collect
from plelab.visual.report_fix import design_blocks
from plelab.visual.report_plots import visual_plots
from plelab.visual.study import MODES, visual_analysis


def _ms(pair) -> str:
    m, sd = pair
    return "—" if not math.isfinite(m) else f"{m:.4f}" + (f" ± {sd:.4f}" if math.isfinite(sd) else "")


def visual_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    cap = {c["b"]: c for c in analysis["caption_vs_none"]}
    con = {c["b"]: c for c in analysis["content_vs_none"]}
    head = ["method", "NMI (ID semantics)", "ID flips (chance)", "utilisation", "perplexity", "caption loss",
            "Δ caption vs none",
            "content-word loss", "Δ content vs none", "template-word loss", "caption loss, image removed"]
    rows = [[r["method"], fmt(r["nmi"], ".3f"), _vs_null(r["flip_rate"], r["flip_chance"], ".3f"),
             fmt(r["utilisation"], ".3f"), fmt(r["perplexity"], ".1f"),
             _ms(r["caption"]), ci_cell(cap.get(r["method"])), _ms(r["content"]), ci_cell(con.get(r["method"])),
             _ms(r["template"]), _ms(r["no_image_caption"])] for r in analysis["rows"]]
    return head, rows


def _vs_null(value, null, spec: str) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:{spec}} ({null:{spec}})"


def diagnostics_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    """Both tables of every method at the final step, each metric next to its random baseline."""
    head = ["method", "table", "rows used", "mean cos W_t (null)", "erank W_t / dP (null)", "PC1 W_t (null)",
            "cross-seed CKA of Δ (null)", "STRUCTURE", "permute Δ caption", "permute Δ content", "reset Δ caption",
            "USE", "grad / used row"]
    rows = []
    for r in analysis["tables"]:
        d = r["dim"]
        rows.append([r["method"], r["table"], f"{r['rows_used']:.0f} / {r['rows']}",
                     _vs_null(r["mean_cos"], r["mean_cos_null"], "+.3f"),
                     f"{r['erank_centred']:.2f} / {d} ({r['erank_centred_null']:.2f})",
                     _vs_null(r["pc1"], r["pc1_null"], ".3f"), _vs_null(r["cka"], r["cka_null"], ".3f"),
                     r["structure"], _ms(r["permute_caption"]), _ms(r["permute_content"]), _ms(r["reset_caption"]),
                     r["use"], fmt(r["grad_row"], ".2e")])
    return head, rows


def gradient_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    """Per method and layer: gradient norm per used row reaching the visual table, the text table, and their ratio."""
    by = {(t["method"], t["table"]): t for t in analysis["tables"]}
    methods = [m for m, table in by if table == "visual"]
    layers = max((len(t["grad_row_layers"]) for t in analysis["tables"]), default=0)
    head = ["method", *[f"layer {i}: visual / text" for i in range(layers)]]
    rows = []
    for m in methods:
        vis, txt = by[(m, "visual")]["grad_row_layers"], (by.get((m, "text")) or {}).get("grad_row_layers") or []
        cells = []
        for i in range(layers):
            v, t = (vis[i] if i < len(vis) else None), (txt[i] if i < len(txt) else None)
            ratio = v / t if v is not None and t and math.isfinite(v) and math.isfinite(t) else None
            cells.append("—" if v is None or not math.isfinite(v) else
                         f"{v:.1e} / {fmt(t, '.1e')}" + (f" (×{ratio:.2f})" if ratio is not None else ""))
        rows.append([m, *cells])
    return head, rows


def quantizer_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    """Online vs frozen per quantizer: the flips, and what training on moving IDs cost (online − frozen)."""
    rows_by = {r["method"]: r for r in analysis["rows"]}
    cmp = {m: {c["b"]: c for c in comps} for m, comps in analysis.get("online_vs_frozen", {}).items()}
    head = ["quantizer", "flip rate online (chance)", "of which restart flips", "codes restarted", "flip rate frozen",
            "NMI online / frozen", "Δ caption online − frozen", "Δ content online − frozen"]
    rows = []
    for q in ("vq", "lfq", "bsq"):
        on, fr = rows_by.get(f"{q}-online"), rows_by.get(f"{q}-frozen")
        if not on or not fr:
            continue
        rows.append([q, _vs_null(on["flip_rate"], on["flip_chance"], ".3f"), fmt(on["restart_flip_rate"], ".3f"),
                     fmt(on["codes_restarted"], ",.0f"), fmt(fr["flip_rate"], ".3f"),
                     f"{fmt(on['nmi'], '.3f')} / {fmt(fr['nmi'], '.3f')}",
                     *(ci_cell(cmp.get(m, {}).get(f"{q}-online")) for m in ("caption", "content"))])
    return head, rows


def flip_findings(analysis: dict) -> list[str]:
    """The seed's ID-flip claim against the online − frozen comparison (Holm over the quantizers)."""
    comps = analysis.get("online_vs_frozen", {}).get("content", [])
    if not comps:
        return []
    rows_by = {r["method"]: r for r in analysis["rows"]}
    rates = ", ".join(f"{MODES[c['b']][0]} {rows_by[c['b']]['flip_rate']:.2f} (chance "
                      f"{rows_by[c['b']]['flip_chance']:.2f})" for c in comps if c["b"] in rows_by)
    hurt = [MODES[c["b"]][0] for c in comps if c["label"] in (stats.RISE, stats.SMALL_RISE)]
    same = [MODES[c["b"]][0] for c in comps if c["label"] == stats.EQUIVALENT]
    out = [f"ID flips: the online quantizers flip {rates} of the probe patches between evaluations. The seed's "
           "claim that flips waste what the table learned predicts online > frozen on content words: significant "
           f"for {', '.join(hurt) or 'none'}" + (f", equivalent within ±δ for {', '.join(same)}" if same else "")
           + f" (Holm over {len(comps)} quantizers; the rest inconclusive at this n)."]
    tables = {t["method"]: t for t in analysis["tables"] if t["table"] == "visual"}
    parts = []
    for c in comps:
        q = MODES[c["b"]][0]
        on, fr = tables.get(f"{q}-online"), tables.get(f"{q}-frozen")
        if on and fr:
            parts.append(f"{q} permute Δ content {on['permute_content'][0]:+.4f} online vs "
                         f"{fr['permute_content'][0]:+.4f} frozen, gradient per used row {fmt(on['grad_row'], '.1e')} "
                         f"vs {fmt(fr['grad_row'], '.1e')}")
    if parts:
        out.append("On the diagnostics axis: " + "; ".join(parts) + " — how much the model reads each table, and how "
                   "much gradient its rows get.")
    return out


def findings(analysis: dict, regime: str = "", features: bool = True) -> list[str]:
    """Plain-language lines: which methods help captions, and what the diagnostics say of each table."""
    out = []
    con = {c["b"]: c for c in analysis["content_vs_none"]}
    for r in analysis["rows"]:
        c = con.get(r["method"])
        if c is None:
            continue
        tables = {t["table"]: t for t in analysis["tables"] if t["method"] == r["method"]}
        vis, txt = tables.get("visual"), tables.get("text")
        line = f"**{r['method']}** (NMI {fmt(r['nmi'], '.3f')}): content-word loss {ci_cell(c)} vs no visual table"
        if vis:
            line += (f"; visual table USE {vis['use']}, STRUCTURE {vis['structure']}, erank "
                     f"{vis['erank_centred']:.2f}/{vis['dim']} (random {vis['erank_centred_null']:.2f})")
        grads = [t["grad_row"] for t in (vis, txt) if t]
        if len(grads) == 2 and all(g is not None and math.isfinite(g) and g > 0 for g in grads):
            line += (f"; gradient per used row {vis['grad_row']:.1e} vs the text table's {txt['grad_row']:.1e} "
                     f"(visual/text {vis['grad_row'] / txt['grad_row']:.2f}; one step, before clipping, rows "
                     "looked up more often get more)")
        out.append(line)
        all_used = vis is not None and vis["verdicts"] and all(u == "USED" for _, u in vis["verdicts"])
        if all_used and c["ci_low"] is not None and c["ci_high"] > 0:
            why = ("the continuous features may carry the same facts; part 3's ablation withholds them"
                   if features else "the features are withheld here, so the IDs are the image's only view")
            out.append(f"**{r['method']}**: the model reads its visual table in every seed (scrambling the rows "
                       f"costs {vis['permute_content'][0]:.3f} nats on content words) but having the table does not "
                       f"measurably lower the content-word loss against no table: reliance is not benefit ({why})")
    real = [t for t in analysis["tables"]  # the tokenizers under the text-only loss (no fix or ablation arms)
            if t["table"] == "visual" and t["method"] not in ("random", "oracle") and "." not in t["method"]]
    gate = analysis.get("gate") or {"status": "ungated"}
    if real:
        pairs = [s for t in real for s in t.get("structure_pairs", [])]
        verdicts = [v for t in real for v in t["verdicts"]]
        cap = {c["b"]: c for c in analysis["caption_vs_none"]}
        significant = [m for m in (t["method"] for t in real)
                       if cap.get(m, {}).get("label") in (stats.DROP, stats.SMALL_DROP)]
        use = {c["b"]: c for c in analysis.get("table_use", [])}
        names = [t["method"] for t in real]
        dead = [m for m in names if use.get(m, {}).get("label") == stats.EQUIVALENT]
        alive = [m for m in names if use.get(m, {}).get("label") in (stats.RISE, stats.SMALL_RISE)]
        if alive:
            outcome = f"does not reproduce for {', '.join(alive)} (the table is read, across seeds)"
        elif gate["status"] == "uninformative":
            outcome = "cannot be judged here (the study is uninformative: see its positive control)"
        elif len(dead) == len(names):
            outcome = "reproduces (every table shown unread within ±δ_use across seeds)"
        else:
            outcome = "is inconclusive at this number of seeds"
        improves = (", ".join(significant) if significant else "none of them") if gate["status"] != "uninformative" \
            else "none of them, which says nothing here: the oracle does not beat random IDs either"
        out.append(f"The seed's finding for every tokenizer — a visual table indistinguishable from random (cos ≈ 0, "
                   f"erank 255.1/256, PC1 ≈ random) and a text loss that moves in the third decimal — "
                   f"{outcome} for the dead-table part, judged by each table's permute-rows test across seeds "
                   f"(Holm over {len(names)} tokenizer{'s' if len(names) != 1 else ''}: "
                   + "; ".join(f"{m} {ci_cell(use.get(m))}" for m in names)
                   + f"). Counted over independent runs, the visual table is USED in "
                   f"{sum(u == USED for _, u in verdicts)}/{len(verdicts)} runs and LEARNED in "
                   f"{sum(s == LEARNED for s in pairs)}/{len(pairs)} disjoint seed pairs; the caption loss improves "
                   f"significantly (family-adjusted) for {improves}. Regime: {regime}.")
    return [*gate_findings(gate), *out]


def gate_findings(gate: dict) -> list[str]:
    """The positive control's line, first in the findings: whether this study could have found a useful table."""
    c = gate.get("comparison")
    if gate["status"] == "ungated":
        return ["**Ungated**: this study has no positive control (the oracle and random arms), so a table that does "
                "not help cannot be told from a task with no room to help; add `--methods …,random,oracle`."]
    if gate["status"] == "informative":
        return [f"**Positive control passed**: the oracle (the scenes' own patch labels) beats random IDs on "
                f"content words by {ci_cell(c)} — this study can detect a table that carries the image's facts."]
    return [f"**UNINFORMATIVE**: the positive control fails — the oracle (the scenes' own patch labels) against "
            f"random IDs on content words: {ci_cell(c)}. A table that knows the answer does not measurably help by "
            "more than δ, so no tokenizer's failure to help is evidence about the tokenizer; run more seeds (the "
            "oracle's gain varies from seed to seed), or give the task more room (`--set visual.feature_noise=σ`, "
            "`--no-features`)."]


def write_visual_report(root: str | Path) -> list[Path]:
    root = Path(root)
    res = collect(root)
    analysis = visual_analysis(res)
    plan = run_plan_status(res)
    out = root / "report"
    plots = visual_plots(res, analysis, out / "plots")
    spec, cfg = res.spec, res.configs[res.spec.baseline]
    v, t = cfg["visual"], cfg["train"]
    patches = (v["image_size"] // v["patch"]) ** 2
    regime = (f"each of K={v['k']} IDs is looked up ≈ {t['steps'] * t['batch_size'] * patches / v['k']:,.0f} times "
              f"in training ({t['steps']} steps × {t['batch_size']} images × {patches} patches), with dP="
              f"{cfg['ple']['dim']} and {cfg['model']['num_hidden_layers']} layers")
    with_fix = any("visual.loss_weight" in o for a in spec.arms for o in a.overrides)
    loss = ("the caption loss, plus λ·L_visual in the fix's arms (their reported losses are caption losses)"
            if with_fix else "text-only (caption) loss")
    blocks = [("h1", f"plelab visual study — {root.name}"),
              ("p", f"Preset {spec.preset}, dP={cfg['ple']['dim']}, K={v['k']} visual IDs, "
                    f"{v['scenes']} training scenes ({v['image_size']}² px, {v['patch']}² patches), "
                    f"{t['steps']} steps × {t['batch_size']} captions, seeds {spec.seeds}; {loss}. "
                    f"{'Continuous patch features withheld in every arm. ' if not v['features'] else ''}Every arm "
                    "of a seed "
                    "shares data, encoder, initial LM and batch order: differences are paired, the seeds are blocks. "
                    f"δ = {spec.delta} nats ({delta_origin(spec, plan, spec.delta)}); labels family-adjusted: "
                    "Dunnett against the baseline on the blocked design's pooled error where it holds (simultaneous "
                    "intervals), else Holm over paired t; a pooled-error label stands only where the pair's own "
                    "error gives it too."),
              ("p", f"**Analysis plan.** {plan['text']}"),
              ("h2", "Results"), ("table", *visual_table(analysis)),
              ("p", "NMI is computed on held-out patches against the generator's labels (colour × shape × size); "
                    "ID flips: for quantizers, a fixed probe set's flip rate between evaluations; for the others, "
                    "between two lookups of the same training patches (a fixed tokenizer: 0; random IDs: fresh "
                    "draws, at chance). The caption loss with the image removed "
                    "shows how much the image helps at all."),
              ("h2", "Findings"), ("ul", findings(analysis, regime, v["features"])),
              *([("h3", "Labels at other margins (δ-sensitivity)"), ("table", *sensitivity_table(analysis, spec))]
                if analysis.get("sensitivity") else []),
              *design_blocks(analysis),
              *([("h2", "Online vs frozen quantizers: the cost of ID flips"), ("table", *quantizer_table(analysis)),
                 ("ul", flip_findings(analysis)),
                 ("p", "Each quantizer trains on its own scene stream (data seed) one step per LM step; the frozen arm "
                       "was pretrained for the same steps on the same stream, so both end with the same quantizer "
                       "and the difference is what training the table on moving IDs cost. Flip rate: a fixed probe "
                       "set's IDs between consecutive evaluations, mean over intervals; restart flips involve a "
                       "code re-initialised by a dead-code restart.")] if quantizer_table(analysis)[1] else []),
              ("h2", f"Diagnostics at step {t['steps']}: the visual table next to the text table"),
              ("table", *diagnostics_table(analysis)),
              ("p", "W_t metrics on the used rows, mean over layers and seeds, with a same-shape Gaussian sample in "
                    "brackets. STRUCTURE: cross-seed CKA of Δ = W_t − αW_0 against rows permuted within frequency "
                    "bins (LEARNED needs CKA > null + 4 sd and ≥ 0.10). USE: caption-loss change when the table's "
                    "rows are permuted within frequency bins (USED: Δ − 4 se > 0 and Δ ≥ 0.005 nats); verdicts "
                    "counted over independent runs (USE: every run; STRUCTURE: each seed with the next, but only the "
                    "disjoint pairs 0–1, 2–3, … are counted, since the cyclic pairs share runs). Gradient per used "
                    "row: the last live diagnostics step's, mean over layers."),
              *([("h2", "Gradient reaching each table, per layer (the seed's attenuated path, measured)"),
                 ("table", *gradient_table(analysis)),
                 ("p", "Mean L2 norm of the gradient per row that received one, at the last live diagnostics step "
                       "(before clipping), mean over seeds. Rows looked up more often collect larger gradients. Under "
                       "the text-only loss the last layer's visual slice reaches a caption prediction only through "
                       "the last image position (the only image position scored), so it gets almost none; with "
                       "L_visual every image position is scored.")]
                if any(t["grad_row_layers"] for t in analysis["tables"]) else []),
              *[("img", p) for p in plots]]
    if res.missing:
        blocks.insert(2, ("p", f"**{len(res.missing)} run(s) unfinished**: rerun the study to finish them."))
    head, rows = visual_table(analysis)
    dhead, drows = diagnostics_table(analysis)
    return [atomic_write(out / "diagnostics.csv", lambda p: p.write_text(csv_text(dhead, drows))),
            atomic_write(out / "report.md", lambda p: p.write_text(to_markdown(blocks, out))),
            atomic_write(out / "report.html",
                         lambda p: p.write_text(to_html(blocks, f"plelab visual study {root.name}"))),
            atomic_write(out / "results.csv", lambda p: p.write_text(csv_text(head, rows))),
            write_json(out / "results.json", {"spec": spec.to_dict(), "analysis": analysis})]
