"""The calibration's numbers as text: the benchmark's size, each call's held-out error rates with bounds and
coverage over the decision points — every count over configurations, the unit
(:mod:`plelab.calibration.evaluate`) —, the two threshold rules side by side, the baselines BENEFIT must beat, and
whether it beats them."""

from __future__ import annotations


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _row(p: dict) -> list[str]:
    auc = "—" if p["auroc"] is None else f"{p['auroc']:.3f}"
    return [f"{p['fraction']:.3f}", f"{p['tokens']:,}", f"{p['tokens_per_row']:.0f}",
            f"{p['configurations']} ({p['calls']})", f"{p['decided']} ({_pct(p['coverage'])})",
            f"{p['false_positives']}/{p['negatives']} (≤{_pct(p['fp_upper'])})",
            f"{p['false_negatives']}/{p['positives']} (≤{_pct(p['fn_upper'])})",
            f"{p['wrong']}/{p['decided']} (≤{_pct(p['wrong_upper'])})", f"{p['truth_undecided']}", auc]


HEAD = ["fraction", "tokens", "tokens/row", "configs (calls)", "decided (coverage)", "false pos. (95% ub)",
        "false neg. (95% ub)", "wrong of decided (95% ub)", "truth open", "AUROC"]
UNIT = ("Every count below is of configurations (a regime's arm at one decision point; its seeds' calls counted once, "
        "by majority, ties against the verdict); calls in brackets are for information, never a denominator.")


def _table(points: list[dict], markdown: bool) -> list[str]:
    rows = [HEAD, *(_row(p) for p in points)]
    if markdown:
        return ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(HEAD),
                *("| " + " | ".join(r) + " |" for r in rows[1:])]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    return ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _beats(result: dict) -> list[str]:
    """Does the verdict's BENEFIT call beat each baseline, decision point by decision point (held out by
    configuration)? Better = fewer wrong configurations at no less coverage, or more coverage at no more wrong."""
    mine = result["curves"]["BENEFIT"].get("configuration", [])
    out = []
    for name, curves in result["baselines"].items():
        base = curves.get("configuration", [])
        wins = losses = 0
        for a, b in zip(mine, base):
            if (a["wrong"] <= b["wrong"] and a["decided"] >= b["decided"]) and (a["wrong"], -a["decided"]) != (
                    b["wrong"], -b["decided"]):
                wins += 1
            elif (b["wrong"] <= a["wrong"] and b["decided"] >= a["decided"]) and (b["wrong"], -b["decided"]) != (
                    a["wrong"], -a["decided"]):
                losses += 1
        auc_v = [p["auroc"] for p in mine if p["auroc"] is not None]
        auc_b = [p["auroc"] for p in base if p["auroc"] is not None]
        neither = len(mine) - wins - losses
        verdict = ("not compared: no BENEFIT call has a truth the finished runs decide" if not auc_v else
                   "the verdict beats it" if wins > 0 and losses == 0 and neither == 0 else
                   "the verdict beats it where one dominates, and neither dominates elsewhere" if wins and not losses
                   else "the verdict does NOT beat it" if losses >= wins else "mixed")
        out.append(f"BENEFIT vs baseline '{name}': better at {wins}, worse at {losses}, neither dominates at "
                   f"{neither} of {len(mine)} decision points (mean AUROC {_mean(auc_v):.3f} vs "
                   f"{_mean(auc_b):.3f}): {verdict}")
    return out


def _earliest(what: str, level: str, p: dict | None, looks: int) -> str:
    bound = {"goal": "10%", "stretch": "5%"}[level]
    head = (f"{what}: earliest decision point with ≤ {bound} wrong configurations (95% upper bound, held out by "
            f"configuration) deciding ≥ 50% of them: ")
    if p is None:
        return head + f"none of the {looks} decision points"
    return head + (f"{p['fraction']:.3f} of the run ({p['tokens']:,} tokens, {p['tokens_per_row']:.0f} per table row), "
                   f"coverage {_pct(p['coverage'])}; found at look {p['looks']} of {p['of']} at the same runs (the "
                   "first that qualifies; no correction for the looks)")


def _rules(result: dict, markdown: bool) -> list[str]:
    """The shipped threshold rule beside the old min/max rule, on the same folds (held out by configuration)."""
    rule = result.get("threshold_rule") or {}
    out = [("## " if markdown else "") + f"Threshold rules on the same folds (held out by configuration): quantile "
           f"(target {_pct(rule.get('target'))} per side) vs the old min/max", ""]
    for kind, rows in (result.get("rules") or {}).items():
        cells = [f"{r['fraction']:.3f}: " + ", ".join(
            f"{name} {r[name]['wrong']}/{r[name]['decided']} wrong of {r[name]['configurations']}"
            for name in ("quantile", "minmax")) for r in rows]
        out.append(f"{kind} — " + "; ".join(cells))
    return [*out, ""]


def _strata(result: dict, markdown: bool) -> list[str]:
    """LEARNED with thresholds fitted per frequency stratum, next to the pooled call."""
    out = []
    for name, st in (result.get("strata") or {}).items():
        out += [("## " if markdown else "") + f"LEARNED on the {name} half of the rows only (its own null and "
                "thresholds; held out by configuration)", "", *_table(st["curve"], markdown), "",
                _earliest(f"LEARNED ({name} rows)", "goal", st["goal"], len(st["curve"])),
                _earliest(f"LEARNED ({name} rows)", "stretch", st["stretch"], len(st["curve"])), ""]
    return out


def _planted(result: dict) -> list[str]:
    p = result.get("planted")
    if not p:
        return []
    return [f"Planted corpus (real ids benefit by construction): the finished runs' BENEFIT truth says BENEFIT in "
            f"{p['benefit']} of {p['calls']} real-id calls at the run's end, NO BENEFIT in {p['no_benefit']}, open in "
            f"{p['open']}.", ""]


def _truths(result: dict, markdown: bool) -> list[str]:
    """What each call claims and what scores it; the calls reported apart and how the thresholds call them."""
    out = [("## " if markdown else "") + "What each call claims, and what scores it", ""]
    out += [f"- {kind}: {text}" for kind, text in (result.get("truths") or {}).items()]
    for a in result.get("apart") or []:
        pts = "; ".join(f"{p['fraction']:.3f} {p['positive']}/{p['negative']}/{p['undecided']}" for p in a["points"])
        out.append(f"- apart: {a['call']} {a['cls']} ({a['why']}), {a['configurations']} configurations — called "
                   f"positive/negative/undecided by the fitted thresholds at each decision point: {pts}")
    return [*out, ""]


def _mechanisms(result: dict, markdown: bool) -> list[str]:
    """Held out by mechanism: PLE's thresholds on each other kind of table, by decision point."""
    out = []
    for kind, by in (result.get("by_mechanism") or {}).items():
        for mech, points in by.items():
            out += [("## " if markdown else "") + f"{kind}: held out by mechanism — {mech} (thresholds fitted on PLE "
                    "only)", "", *_table(points, markdown), ""]
    return out


def calibration_text(result: dict, markdown: bool = False) -> str:
    b = result["benchmark"]
    lines = [("# " if markdown else "") + ("Calibration (quick pipeline check)" if b["quick"] else "Calibration"),
             "",
             f"{b['runs']} runs in {len(b['regimes'])} regimes ({', '.join(b['regimes'])}), {b['configurations']} "
             f"called configurations, {b['seeds']} seeds, {b['steps']} steps each; calls: "
             + ", ".join(f"{k} {v}" for k, v in b["calls"].items())
             + ("; reported apart: " + ", ".join(f"{k} {v}" for k, v in b["calls_apart"].items() if v)
                if any((b.get("calls_apart") or {}).values()) else "")
             + f"; this invocation {b['seconds']:.0f} s ({b['train_seconds']:.0f} s of it training) on "
             f"{b['versions'].get('cpu', '?')}.",
             f"Training the runs took {b['run_seconds'] / 60:.1f} minutes of run wall time in all (summed over runs).",
             f"Command: `{b['command']}`",
             "Scored calls have a truth the finished runs decide; 'truth open' calls (the held-out seeds' finals "
             "decide neither way) are counted and never scored.", ""]
    lines += [UNIT, "", *_truths(result, markdown)]
    if b["quick"]:
        lines += ["A pipeline check on a tiny benchmark: its rates are not the verdict's reliability.", ""]
    for kind, schemes in result["curves"].items():
        for scheme, points in schemes.items():
            lines += [("## " if markdown else "") + f"{kind}: held out by {scheme}", "", *_table(points, markdown), ""]
        if kind in result["earliest"]:
            looks = result.get("looks", {}).get(kind, 0)
            lines += [_earliest(kind, level, p, looks) for level, p in result["earliest"][kind].items()]
        lines.append("")
    for name, schemes in result["baselines"].items():
        if "configuration" in schemes:
            lines += [("## " if markdown else "") + f"Baseline for BENEFIT: {name} (held out by configuration)", "",
                      *_table(schemes["configuration"], markdown), ""]
    lines += [*_mechanisms(result, markdown), *_rules(result, markdown), *_strata(result, markdown),
              *_planted(result)]
    lines += _beats(result)
    iid = []
    for kind, schemes in result["curves"].items():
        pts = schemes.get("configuration", [])
        hits = sum(p["positive_by_class"].get("iid", [0, 0])[0] for p in pts)
        total = sum(p["positive_by_class"].get("iid", [0, 0])[1] for p in pts)
        iid.append(f"{kind} {hits} of {total}")
    lines.append("i.i.d.-id configurations called positive (held out by configuration, all decision points): "
                 + ", ".join(iid))
    lines += ["", *result["notes"]]
    return "\n".join(lines).rstrip() + "\n"
