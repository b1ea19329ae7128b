"""The preregistered validation's result: per rung, call and decision point, configurations decided and wrong at the
plan's frozen thresholds, with one-sided 95% bounds, against the benchmark's held-out-by-corpus rates, and the
criteria's verdict (:data:`plelab.calibration.validation.CRITERIA`) — whatever it shows. Regimes whose runs have
not all finished are listed with the command that finishes them, never scored."""

from __future__ import annotations

import math
from pathlib import Path

from plelab.calibration.evaluate import config_key, unit_of, upper_bound
from plelab.calibration.features import Call, regime_calls
from plelab.calibration.validation import KINDS, _design, _regime, load_plan, score
from plelab.io import atomic_write, write_json
from plelab.sweeps.analysis_plan import plan_status
from plelab.sweeps.runner import jobs_of, run_state

RESULT_FILE, REPORT_FILE = "validation.json", "report.md"


def _point(scored: list[tuple[Call, bool | None]]) -> dict:
    """Counts over configurations of one rung, call kind and decision point."""
    groups: dict[tuple, list] = {}
    for c, p in scored:
        groups.setdefault(config_key(c), []).append((c, p))
    units = [unit_of(k, preds[0][0].cls, preds, lambda c: c.score) for k, preds in sorted(groups.items())]
    known = [u for u in units if u.truth is not None]
    neg, pos = [u for u in known if not u.truth], [u for u in known if u.truth]
    decided = sum(u.decided for u in known)
    wrong = sum(u.wrong for u in known)
    fp, fn = sum(u.wrong for u in neg), sum(u.wrong for u in pos)
    return {"configurations": len(units), "known": len(known), "decided": decided, "wrong": wrong,
            "coverage": decided / len(known) if known else 0.0, "wrong_upper": upper_bound(wrong, decided),
            "false_positives": fp, "negatives": len(neg), "fp_upper": upper_bound(fp, len(neg)),
            "false_negatives": fn, "positives": len(pos), "fn_upper": upper_bound(fn, len(pos)),
            "iid_positive": sum(u.positive for u in units if u.cls == "iid"),
            "calls": len(scored), "classes": {u.key[1]: {"truth": u.truth, "decided": u.decided, "wrong": u.wrong,
                                                         "positive": u.positive} for u in units}}


def judge(points: dict[float, dict], judged: list[float]) -> str:
    """The declared criteria over the judged decision points of one rung and call kind."""
    at = [points[f] for f in judged if f in points]
    if len(at) < len(judged):
        return "inconclusive"
    if any(p["wrong"] >= 2 or p["iid_positive"] > 0 for p in at):
        return "does not transfer"
    if all(p["wrong"] == 0 and p["known"] and p["coverage"] >= 0.5 for p in at):
        return "transfers"
    return "inconclusive"


def validation_result(out: str | Path, progress: bool = False) -> dict:
    """Score every finished regime of the validation in ``out`` at the plan's thresholds; write
    ``validation.json`` and ``report.md``; return the result."""
    out = Path(out)
    plan = load_plan(out)
    design = _design(plan)
    calls, unfinished, status = [], [], {}
    for name, rung, _ in design.regimes():
        spec = _regime(out / name, plan)
        jobs = jobs_of(out / name, spec)
        left = [j for j in jobs if run_state(j) != "done"]
        status[name] = plan_status(spec, [j.path for j in jobs if run_state(j) == "done"])
        if left:
            unfinished.append({"regime": name, "runs_left": len(left), "of": len(jobs)})
            continue
        calls += [(rung, c) for c in regime_calls(out / name, progress)]
    rungs: dict = {}
    for rung in design.rungs:
        mine = [c for r, c in calls if r == rung]
        if not mine:
            continue
        kinds = {}
        for kind in KINDS:
            scored = score([c for c in mine if c.call == kind and not c.apart], plan["thresholds"]["rows"])
            fractions = sorted({c.fraction for c, _ in scored})
            points = {f: _point([(c, p) for c, p in scored if c.fraction == f]) for f in fractions}
            kinds[kind] = {"points": [{"fraction": f, **p} for f, p in points.items()],
                           "verdict": judge(points, plan["points"])}
        apart = [c for c in mine if c.apart]
        rungs[rung] = {"kinds": kinds, "apart": _apart(apart, plan)}
    result = {"plan": plan["sha256"], "declared": plan["declared"], "commit": plan["commit"], "rungs": rungs,
              "unfinished": unfinished, "plan_status": {k: v["text"] for k, v in status.items()},
              "benchmark_by_corpus": plan["thresholds"]["benchmark"], "criteria": plan["criteria"]}
    write_json(out / RESULT_FILE, result)
    atomic_write(out / REPORT_FILE, lambda p: p.write_text(validation_text(result, out, plan)))
    return result


def _apart(apart: list[Call], plan: dict) -> list[dict]:
    out = []
    for kind, cls in sorted({(c.call, c.cls) for c in apart}):
        mine = score([c for c in apart if c.call == kind and c.cls == cls], plan["thresholds"]["rows"])
        out.append({"call": kind, "cls": cls, "why": mine[0][0].apart,
                    "positive": sum(p is True for _, p in mine), "negative": sum(p is False for _, p in mine),
                    "calls": len(mine)})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if math.isfinite(x) else "—"


def validation_text(result: dict, out: Path, plan: dict) -> str:
    lines = [f"# Validation of the verdict — {out.name}", "",
             f"Plan sha256 `{result['plan']}` declared {result['declared']} at commit `{result['commit'][:12]}`; "
             f"thresholds frozen from `{plan['thresholds']['file']}` (sha256 `{plan['thresholds']['sha256'][:12]}…`). "
             "Every count is of configurations (a regime's arm, its seeds' calls counted once by majority); bounds "
             "are one-sided 95% Clopper–Pearson.", ""]
    lines += [f"- {name}: {text}" for name, text in result["plan_status"].items()] + [""]
    for rung, r in result["rungs"].items():
        lines += [f"## Rung {rung}", ""]
        for kind, k in r["kinds"].items():
            lines += [f"**{kind}: {k['verdict']}**", "",
                      "| fraction | configs (known truth) | decided (coverage) | wrong of decided (95% ub) | "
                      "false pos. (95% ub) | false neg. (95% ub) | i.i.d. called positive |", "|---|---|---|---|---|---|---|"]
            for p in k["points"]:
                lines.append(f"| {p['fraction']:.3f} | {p['configurations']} ({p['known']}) | {p['decided']} "
                             f"({_pct(p['coverage'])}) | {p['wrong']}/{p['decided']} (≤{_pct(p['wrong_upper'])}) | "
                             f"{p['false_positives']}/{p['negatives']} (≤{_pct(p['fp_upper'])}) | "
                             f"{p['false_negatives']}/{p['positives']} (≤{_pct(p['fn_upper'])}) | {p['iid_positive']} |")
            lines.append("")
        for a in r["apart"]:
            lines.append(f"Apart: {a['call']} {a['cls']} ({a['why']}): {a['positive']} of {a['calls']} calls "
                         f"positive, {a['negative']} negative.")
        lines.append("")
    bench = result["benchmark_by_corpus"]
    if bench:
        lines += ["## The benchmark beside it (held out by corpus, summed over its regimes)", ""]
        for kind, rows in bench.items():
            cells = "; ".join(f"{x['fraction']:.3f} {x['wrong']}/{x['decided']} (≤{_pct(x['wrong_upper'])})"
                              for x in rows)
            lines.append(f"- {kind}: {cells}")
        lines.append("")
    if result["unfinished"]:
        lines += ["## Not finished (not scored)", ""]
        lines += [f"- {u['regime']}: {u['runs_left']} of {u['of']} runs left" for u in result["unfinished"]]
        lines += ["", f"Finish: `plelab validate {out} --jobs {plan['jobs']}` from commit `{plan['commit'][:12]}`.", ""]
    lines += ["## Criteria (declared)", "", *(f"- **{k}**: {v}" for k, v in result["criteria"].items())]
    return "\n".join(lines).rstrip() + "\n"
