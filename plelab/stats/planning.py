"""``plelab plan PILOT``: size a confirmatory sweep by power, from a pilot sweep on other seeds.

The pilot gives the noise, never the answer. It supplies the paired spread of each comparison (the blocked
design's pooled error, or the pair's own spread where that design does not hold), measured for several ways
of defining a run's loss — the mean of its last k evaluations, a variance reduction that costs nothing — and,
to show where the noise comes from, by run length (the evaluations along the runs) and by validation tokens
(``eval_windows``: final checkpoints re-evaluated). δ is
declared, by ``--delta`` or the pilot's own declared δ, and is never computed from the pilot's losses. For
each comparison the plan gives the seeds at which the exact tests of :mod:`plelab.stats.power` reach the
target power: to detect a true Δ of δ (at α/m, Holm's first threshold), and to show equivalence within ±δ if
the true Δ is 0 (TOST at α/m). The families sized are the main curve's (consecutive steps, every dP against the
baseline) and the controls' (every control arm against its reference at the same dP, as the report tests them);
``families`` chooses. The confirmatory command uses seeds the pilot did not use, so the test seeds never see the
δ or the k they are tested with chosen on them; it reruns every arm of the pilot.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from plelab.errors import PlelabError
from plelab import stats
from plelab.stats import blocked, power
from plelab.sweeps.results import collect
from plelab.sweeps.spec import sweep_command
from plelab.training.evaluate import evaluate

LAST_K = (1, 2, 3, 5)
RUN_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
FAMILIES = ("all", "main", "controls")


def _main_curve(spec) -> list[str]:
    arms = sorted((a for a in spec.arms if a.family == "dP"), key=lambda a: a.x)
    return [a.name for a in arms]


def _families(res, pilot, which: str) -> dict[str, list[tuple[str, str]]]:
    """The comparisons to size, by family: ``main`` (consecutive, vs_baseline), ``controls`` or ``all``."""
    out: dict[str, list[tuple[str, str]]] = {}
    if which in ("all", "main"):
        main = [a for a in _main_curve(res.spec) if a in res.runs]
        if len(main) < 2:
            raise PlelabError(f"{pilot} has fewer than two finished dP arms; finish the pilot (rerun its plelab sweep)"
                              "; or size its controls alone with --families controls")
        out = {"consecutive": list(zip(main, main[1:])), "vs_baseline": [(main[0], b) for b in main[1:]]}
    controls = [(a.reference, a.name) for a in res.spec.arms
                if a.reference and a.alias_of is None and a.name in res.runs and a.reference in res.runs]
    if controls and which in ("all", "controls"):
        out["controls"] = controls
    elif which == "controls":
        raise PlelabError(f"{pilot} has no finished control arm next to its reference arm; size its main curve "
                          "with --families main")
    return out


def _median_sd(losses: dict, families: dict, delta: float, alpha: float) -> float:
    sds = [c.sd for name, pairs in families.items()
           for c in blocked.analyse_family(losses, pairs, delta, alpha, many_to_one=name == "vs_baseline")[0]
           if c.sd > 0]
    return sorted(sds)[len(sds) // 2] if sds else math.nan


def _at_fraction(history: list[tuple[int, float]], step: float) -> float:
    """The evaluation at the last step ≤ ``step`` (the first evaluation if none is that early)."""
    before = [v for s, v in history if s <= step]
    return before[-1] if before else history[0][1]


def noise_sources(res, families: dict, delta: float, eval_windows: int | None = None,
                  progress: bool = False) -> dict:
    """How the paired spread changes with run length (the evaluations at ¼, ½, ¾ and all of the steps, from the
    runs' histories) and, with ``eval_windows``, with more validation tokens (every run's final checkpoint
    re-evaluated on its own windows and on ``eval_windows``)."""
    alpha = res.spec.alpha
    last = max(s for by_seed in res.runs.values() for r in by_seed.values() for s, _ in r.val_history)
    out: dict = {"by_run_length": [
        {"fraction": f, "median_sd": _median_sd(
            {arm: {s: _at_fraction(r.val_history, f * last) for s, r in by_seed.items()}
             for arm, by_seed in res.runs.items()}, families, delta, alpha)} for f in RUN_FRACTIONS]}
    if eval_windows:
        arms = sorted({a for pairs in families.values() for pair in pairs for a in pair})
        rows = []
        for windows in (None, eval_windows):
            losses, used = {}, None
            for arm in arms:
                for seed in res.runs.get(arm, {}):
                    got = evaluate(res.root / "runs" / arm / f"seed-{seed}", device="cpu", windows=windows,
                                   progress=progress)
                    losses.setdefault(arm, {})[seed] = got["val_loss"]
                    used = got["windows"]
            rows.append({"windows": used, "median_sd": _median_sd(losses, families, delta, alpha)})
        out["by_eval_windows"] = rows
    return out


def _delta_from_pilot(res, fraction: float) -> tuple[float, str]:
    """δ = ``fraction`` × the pilot's largest mean gain of a dP arm over the baseline (its own runs, its seeds)."""
    base = res.runs.get(res.spec.baseline, {})
    gains = []
    for arm in _main_curve(res.spec)[1:]:
        seeds = sorted(set(base) & set(res.runs.get(arm, {})))
        if seeds:
            gains.append((sum(base[s].loss - res.runs[arm][s].loss for s in seeds) / len(seeds), arm))
    if not gains or max(gains)[0] <= 0:
        raise PlelabError("the pilot shows no mean gain over the baseline to take a fraction of: declare --delta")
    gain, arm = max(gains)
    return fraction * gain, (f"{fraction:g} × the pilot's largest mean gain ({arm}: {gain:.4f} nats), on seeds the "
                             "confirmatory sweep does not use")


def plan(pilot: str | Path, delta: float | None = None, target_power: float = 0.8, out: str | Path | None = None,
         max_seeds: int = power.MAX_SEEDS, eval_windows: int | None = None,
         delta_fraction: float | None = None, families: str = "all") -> dict:
    """The plan as a JSON-ready dict (see the module doc); ``out``: the confirmatory sweep's folder;
    ``eval_windows``: also measure the spread with that many validation windows (re-evaluates every run);
    ``delta_fraction``: δ = that fraction of the pilot's largest mean gain against the baseline — a δ from the
    pilot's seeds, which the confirmatory seeds never see (instead of ``delta``); ``families``: which comparisons
    to size, ``all`` (default), ``main`` (the dP curve) or ``controls`` (each control against its reference)."""
    if families not in FAMILIES:
        raise PlelabError(f"--families must be one of {', '.join(FAMILIES)}, got {families!r}")
    if delta is not None and delta_fraction is not None:
        raise PlelabError("give --delta or --delta-fraction, not both")
    if delta_fraction is not None and not 0 < delta_fraction <= 1:
        raise PlelabError(f"--delta-fraction must be in (0, 1], got {delta_fraction}")
    if eval_windows is not None and eval_windows < 1:
        raise PlelabError(f"--eval-windows must be >= 1, got {eval_windows}")
    res = collect(pilot, structure=False)
    spec = res.spec
    origin = "given with --delta" if delta is not None else "the pilot's declared δ"
    if delta_fraction is not None:
        delta, origin = _delta_from_pilot(res, delta_fraction)
    delta = spec.delta if delta is None else delta
    if not delta > 0:
        raise PlelabError(f"--delta must be > 0 (the smallest effect of interest in nats), got {delta}")
    if not 0 < target_power < 1:
        raise PlelabError(f"--power must be between 0 and 1, got {target_power}")
    comparisons = _families(res, pilot, families)
    if len(spec.seeds) < 2:
        raise PlelabError(f"{pilot} ran {len(spec.seeds)} seed: a pilot needs at least 2 to measure the spread")
    by_k = []
    evals = min(len(r.val_history) for by_seed in res.runs.values() for r in by_seed.values())
    own = min(spec.last_k, evals)  # the outcome the pilot's report used: its last_k, or every evaluation it has
    for k in sorted({k for k in LAST_K if k <= evals} | {own}):
        losses = {arm: {s: sum(v for _, v in r.val_history[-k:]) / k for s, r in by_seed.items()}
                  for arm, by_seed in res.runs.items()}
        entry: dict = {"last_k": k, "families": {}}
        for name, pairs in comparisons.items():
            comps, how = blocked.analyse_family(losses, pairs, delta, spec.alpha, steps=name == "consecutive",
                                                many_to_one=name == "vs_baseline")
            m = max(1, len(comps))
            rows = []
            for c in comps:  # the report's own number for the same question (stats.seeds_to_label)
                need = stats.seeds_to_label(c, spec.alpha / m, target_power)
                rows.append({"a": c.a, "b": c.b, "pilot_mean": c.mean, "sd": c.sd,
                             "own_sd": (c.own_error or {}).get("sd", c.sd),
                             "seeds_difference": need["difference"], "seeds_equivalence": need["equivalence"]})
            entry["families"][name] = {"method": how["method"], "comparisons": rows}
        sds = [r["sd"] for f in entry["families"].values() for r in f["comparisons"] if r["sd"] > 0]
        entry["median_sd"] = sorted(sds)[len(sds) // 2] if sds else math.nan
        by_k.append(entry)
    best = min(by_k, key=lambda e: e["median_sd"] if math.isfinite(e["median_sd"]) else math.inf)
    needs = [r[key] for f in best["families"].values() for r in f["comparisons"]
             for key in ("seeds_difference", "seeds_equivalence")]
    decided = [n for n in needs if n is not None]
    n = min(max(decided), max_seeds) if decided else None
    by_family = {}
    for name, fam in best["families"].items():
        got = [r[key] for r in fam["comparisons"] for key in ("seeds_difference", "seeds_equivalence")]
        by_family[name] = {"seeds": max((g for g in got if g is not None), default=None),
                           "undecidable": sum(g is None for g in got)}
    fresh = list(range(max(spec.seeds) + 1, max(spec.seeds) + 1 + n)) if n else []
    own_k = next((e for e in by_k if e["last_k"] == own), None)  # the outcome the pilot's report uses
    at_pilot = {name: _need(fam["comparisons"]) for name, fam in own_k["families"].items()} if own_k else None
    command = None
    if n:
        confirm = dataclasses.replace(spec, seeds=fresh, delta=delta, last_k=best["last_k"], plan=None)
        command = sweep_command(confirm, Path(out) if out else Path(f"{Path(pilot)}-confirm"))
    noise = noise_sources(res, comparisons, delta, eval_windows)
    return {"pilot": str(pilot), "pilot_seeds": spec.seeds, "delta": delta, "noise": noise,
            "delta_origin": origin, "families": families, "seeds_by_family": by_family,
            "power": target_power, "alpha": spec.alpha, "by_last_k": by_k, "chosen_last_k": best["last_k"],
            "seeds": n, "undecidable": len(needs) - len(decided), "confirmatory_seeds": fresh, "command": command,
            "pilot_last_k": own, "seeds_at_pilot_outcome": at_pilot}


def _need(rows: list[dict]) -> int | None:
    """A family's seeds per arm from its rows (the largest need; None where one is beyond reach): the number
    :func:`plelab.stats.family_seeds` gives the report for the same comparisons and outcome."""
    needs = [r[k] for r in rows for k in ("seeds_difference", "seeds_equivalence")]
    return None if not needs or None in needs else max(needs)


def plan_text(p: dict) -> str:
    """The plan for the terminal."""
    lines = [f"Pilot {p['pilot']} (seeds {p['pilot_seeds']}); δ = {p['delta']:.4g} nats ({p['delta_origin']}"
             + ("" if "pilot's largest" in p["delta_origin"] else ", not fitted on the pilot")
             + f"); power {p['power']:.0%} at α = {p['alpha']} per family."]
    lines.append("Paired spread by how a run's loss is defined (median over comparisons):")
    for e in p["by_last_k"]:
        mark = "  ← chosen" if e["last_k"] == p["chosen_last_k"] else ""
        lines.append(f"  mean of the last {e['last_k']} evaluation(s): sd {e['median_sd']:.4f} nats{mark}")
    lines.append("… by run length (the evaluation at that fraction of the steps; a longer run is a new sweep):")
    lines += [f"  {r['fraction']:.0%} of the steps: sd {r['median_sd']:.4f} nats" for r in p["noise"]["by_run_length"]]
    if "by_eval_windows" in p["noise"]:
        lines.append("… by validation tokens (final checkpoints re-evaluated):")
        lines += [f"  {r['windows']} windows: sd {r['median_sd']:.4f} nats" for r in p["noise"]["by_eval_windows"]]
    chosen = next(e for e in p["by_last_k"] if e["last_k"] == p["chosen_last_k"])
    for name, fam in chosen["families"].items():
        lines.append(f"{name.replace('_', ' ')} ({fam['method']}): seeds to detect a true Δ of δ / to show ±δ if "
                     "the true Δ is 0")
        for r in fam["comparisons"]:
            lines.append(f"  {r['b']} − {r['a']}: sd {r['sd']:.4f} (own {r['own_sd']:.4f}), pilot Δ "
                         f"{r['pilot_mean']:+.4f} (not a test) → "
                         f"{r['seeds_difference'] or '>1000'} / {r['seeds_equivalence'] or '>1000'}")
    names = {"consecutive": "the consecutive steps", "vs_baseline": "each dP against the baseline",
             "controls": "each control against its reference"}
    lines.append("Each need is the larger of the pooled error's and the pair's own error's (a pooled label stands "
                 "only where the own error agrees).")
    lines.append("Seeds per arm by family: " + "; ".join(
        f"{names[k]} {v['seeds'] or '>1000'}" + (f" ({v['undecidable']} decision(s) need >1000)"
                                                   if v["undecidable"] and v["seeds"] else "")
        for k, v in p["seeds_by_family"].items()) + ".")
    if p.get("seeds_at_pilot_outcome"):
        lines.append(f"At the pilot's own outcome (last_k = {p['pilot_last_k']}), the numbers its report gives: " + "; ".join(
            f"{names[k]} {v or '>1000'}" for k, v in p["seeds_at_pilot_outcome"].items()) + ".")
    if p["seeds"]:
        lines.append(f"A confirmatory sweep deciding every comparison above needs {p['seeds']} seeds per arm, on "
                     f"seeds the pilot did not use (it reruns every arm of the pilot):")
        lines.append(f"  {p['command']}")
    else:
        lines.append("No comparison can be decided with 1000 seeds or fewer at this δ: declare a larger δ, or reduce "
                     "the noise (more validation windows, longer runs).")
    if p["undecidable"]:
        lines.append(f"{p['undecidable']} of the decisions need more than 1000 seeds and are left out of that count.")
    return "\n".join(lines)
