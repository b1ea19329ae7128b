"""Report blocks for the visual study's ``fix`` and ``ablation`` designs (issue 8): the 2×2 of visual
table on/off × L_visual on/off per tokenizer and λ, and the redundancy ablation (features withheld:
per-layer table vs a layer-0 ID embedding), each with paired CIs, family-adjusted across the tokenizers."""

from __future__ import annotations

import math

from plelab.reports.tables import ci_cell, fmt
from plelab import stats


def _by_arm(analysis: dict, metric: str) -> dict[str, dict]:
    return {c["b"]: c for comps in analysis.get("references", {}).get(metric, {}).values() for c in comps}


def _lambdas(analysis: dict) -> list[str]:
    fams = analysis.get("references", {}).get("caption", {})
    return sorted({f.split("λ=")[1] for f in fams if f.startswith("fix: table on")}, key=float)


def fix_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    """Per tokenizer and λ: what L_visual does to the caption with the table on (vs λ = 0) and off (vs none)."""
    cap, con = _by_arm(analysis, "caption"), _by_arm(analysis, "content")
    rows_by = {r["method"]: r for r in analysis["rows"]}
    verdicts = {t["method"]: t for t in analysis["tables"] if t["table"] == "visual"}
    head = ["tokenizer", "λ", "Δ caption, table on (λ vs 0)", "Δ content, table on (λ vs 0)",
            "Δ caption, table off (vs none)", "Δ content, table off (vs none)", "L_visual held-out (on / off)",
            "visual table USE at λ=0 → λ"]
    rows = []
    for m in (r["method"] for r in analysis["rows"] if "." not in r["method"] and r["method"] != "none"):
        for lam in _lambdas(analysis):
            on, off = f"{m}.lv{lam}", f"{m}.notable.lv{lam}"
            if on not in rows_by and off not in rows_by:
                continue
            lv = [fmt((rows_by.get(a) or {}).get("visual_loss", (math.nan,))[0], ".3f") for a in (on, off)]
            use = " → ".join((verdicts.get(a) or {}).get("use", "—") for a in (m, on))
            rows.append([m, lam, *(ci_cell(d.get(a)) for a in (on, off) for d in (cap, con)), " / ".join(lv), use])
    return head, rows


def interaction_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    """Per tokenizer and λ: the fix's interaction (table on − table off, each λ vs 0) on caption and content."""
    inter = analysis.get("interactions", {})
    head = ["tokenizer", "λ", "interaction, caption", "interaction, content"]
    rows = []
    for lam in _lambdas(analysis):
        by = {metric: {c["b"].split(".lv")[0]: c for c in inter.get(metric, {}).get(lam, [])}
              for metric in ("caption", "content")}
        for m in dict.fromkeys([*by["caption"], *by["content"]]):
            rows.append([m, lam, ci_cell(by["caption"].get(m)), ci_cell(by["content"].get(m))])
    return head, rows


def ablation_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    """Features withheld: the per-layer table vs none, and the layer-0 embedding of the same IDs vs it."""
    cap, con = _by_arm(analysis, "caption"), _by_arm(analysis, "content")
    vs_none = {c["b"]: c for c in analysis["content_vs_none"]}
    head = ["tokenizer", "Δ content, per-layer table vs none", "Δ caption, layer-0 − per-layer",
            "Δ content, layer-0 − per-layer"]
    rows = [[m.removesuffix(".layer0"), ci_cell(vs_none.get(m.removesuffix(".layer0"))), ci_cell(cap.get(m)),
             ci_cell(con.get(m))] for m in (r["method"] for r in analysis["rows"]) if m.endswith(".layer0")]
    return head, rows


def fix_findings(analysis: dict) -> list[str]:
    """What the fix did, in words, for the table-on arms (significance family-adjusted across tokenizers)."""
    con = _by_arm(analysis, "content")
    out = []
    for lam in _lambdas(analysis):
        on = [c for c in con.values() if c["b"].endswith(f".lv{lam}") and ".notable." not in c["b"]]
        helped = [c["b"].split(".lv")[0] for c in on if c["label"] in (stats.DROP, stats.SMALL_DROP)]
        hurt = [c["b"].split(".lv")[0] for c in on if c["label"] in (stats.RISE, stats.SMALL_RISE)]
        if on:
            n = f"{len(on)} tokenizer{'s' if len(on) != 1 else ''}"
            out.append(f"λ = {lam}: adding L_visual with the table on lowers the content-word loss significantly "
                       f"(adjusted over {n}) for {', '.join(helped) or 'none'}; raises it for "
                       f"{', '.join(hurt) or 'none'}.")
    for lam, comps in analysis.get("interactions", {}).get("content", {}).items():
        by_label: dict[str, list[str]] = {}
        for c in comps:
            by_label.setdefault(c["label"], []).append(c["b"].split(".lv")[0])
        if comps:
            out.append(f"λ = {lam}, content words, the fix as an interaction (table on − table off): "
                       + "; ".join(f"{lab}: {', '.join(ms)}" for lab, ms in by_label.items()) + ".")
    tables = {t["method"]: t for t in analysis["tables"] if t["table"] == "visual"}
    fixed_arms = [m for m in tables if ".lv" in m and ".notable." not in m]
    refs = {m.split(".lv")[0] for m in fixed_arms}  # the same tokenizers at λ = 0
    base = [u for m in refs if m in tables for _, u in tables[m]["verdicts"]]
    fixed = [u for m in fixed_arms for _, u in tables[m]["verdicts"]]
    if base and fixed:
        out.append(f"The seeds' fix makes the IDs prediction targets so that the visual table comes alive: USED in "
                   f"{fixed.count('USED')}/{len(fixed)} runs with L_visual against {base.count('USED')}/{len(base)} "
                   "for the same tokenizers without. Whether that helps the text is the question above; a live "
                   "table alone is not evidence.")
    return out


def ablation_findings(analysis: dict) -> list[str]:
    """The seed's redundancy claim, with the features withheld: per-layer table vs none and vs layer-0."""
    con = _by_arm(analysis, "content")
    vs_none = {c["b"]: c for c in analysis["content_vs_none"]}
    out = []
    for name, c in con.items():
        if not name.endswith(".layer0"):
            continue
        m = name.removesuffix(".layer0")
        per_layer = vs_none.get(m)
        if c["label"] in (stats.RISE, stats.SMALL_RISE):  # layer-0 − per-layer > 0: per-layer wins
            verdict = "per-layer injection matters beyond having the IDs."
        elif c["label"] in (stats.DROP, stats.SMALL_DROP):
            verdict = "the layer-0 embedding does better: per-layer injection is not what helps."
        else:
            verdict = "no evidence here that per-layer injection matters beyond having the IDs."
        out.append(f"{m}: with the features withheld the per-layer table changes content-word loss by "
                   f"{ci_cell(per_layer)} vs none; a layer-0 embedding of the same IDs differs from it by "
                   f"{ci_cell(c)} — "
                   + verdict)
    return out


def design_blocks(analysis: dict) -> list[tuple]:
    """The fix's and the ablation's report blocks (empty when the study has neither)."""
    out: list[tuple] = []
    head, rows = fix_table(analysis)
    if rows:
        out += [("h2", "The visual next-token fix: L = L_text + λ·L_visual (2×2 per tokenizer)"), ("table", head, rows),
                ("ul", fix_findings(analysis)),
                ("p", "Table on: the tokenizer's arm with L_visual against the same arm without it (is text "
                      "prediction better once the IDs are targets?). Table off: the IDs are only prediction targets "
                      "(a head over the K IDs), against no visual table — what the auxiliary task alone does. Same "
                      "caption tokens in every arm; labels family-adjusted across the tokenizers at each λ (Dunnett "
                      "on the blocked design where the arms share a reference, else Holm). A visual "
                      "table that becomes USED under L_visual is expected and not, by itself, a benefit. The LM's "
                      "attention is causal over the image prefix; with the continuous features on, the frozen ViT's "
                      "bidirectional features still carry some of the next patch's content, so L_visual is partly "
                      "solvable from the input (`--no-features` removes that path).")]
    head, rows = interaction_table(analysis)
    if rows:
        out += [("h3", "The fix as an interaction"), ("table", head, rows),
                ("p", "Per seed: [(table on, λ) − (table on, 0)] − [(table off, λ) − (no table)] — what L_visual does "
                      "with the visual table minus what the auxiliary task does without it. Negative: the fix helps "
                      "the table-on model more than the loss alone explains. Paired by seed over the seeds all four "
                      "arms ran; Holm across the tokenizers at each λ; labels by the same rules as every paired "
                      "difference (equivalence only from the TOST at δ).")]
    head, rows = ablation_table(analysis)
    if rows:
        out += [("h2", "Redundancy ablation: continuous features withheld"), ("table", head, rows),
                ("ul", ablation_findings(analysis)),
                ("p", "Every arm here sees the image only through its IDs (one learned constant at image positions); "
                      "labels family-adjusted across this family's methods. "
                      "Per-layer table: the IDs through each layer's gate; layer-0: one ID embedding added to the "
                      "input of the image positions. If the per-layer table beats the layer-0 embedding, per-layer "
                      "injection matters beyond having the IDs at all.")]
    return out
