"""``plelab calibrate``: train the benchmark, read every call, measure the verdict's held-out error rates.

Writes ``DIR/calls.jsonl`` (one call a line), ``DIR/calibration.json`` (everything below) and ``DIR/report.md``.
``write_thresholds`` refits the thresholds the verdict ships with (:data:`plelab.diagnostics.verdict.SHIPPED`);
the quick benchmark never does.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

from plelab.calibration.benchmark import DECISIONS, QUICK, SCALES, USE_WINDOWS, Benchmark, run_benchmark
from plelab.calibration.evaluate import (
    COVERAGE_FLOOR,
    GOAL,
    SCHEMES,
    STRETCH,
    TARGET,
    apart_summary,
    earliest,
    fractions,
    held_out,
    majority,
    mechanism_rates,
    rule_comparison,
    shipped_thresholds,
    time_curve,
)
from plelab.calibration.evidence import STRATA
from plelab.calibration.features import Call, benchmark_calls
from plelab.calibration.planted import PLANTED_VOCAB, write_planted
from plelab.calibration.report import calibration_text
from plelab.calibration.truth import TRUTHS
from plelab.config import resolve_config
from plelab.diagnostics.verdict import SHIPPED
from plelab.errors import ConfigError
from plelab.io import atomic_write, ensure_dir, write_json
from plelab.provenance import git_commit, versions
from plelab.sweeps.spec import load_spec

KINDS = ("LEARNED", "USED", "BENEFIT")
RELIABILITY_KEYS = ("configurations", "calls", "decided", "wrong", "wrong_upper", "coverage", "truth_undecided")
# how the thresholds were fitted and every rate counted (the verdict quotes it; an older calibration.json lacks it)
THRESHOLD_RULE = {"rule": "quantile", "target": TARGET, "unit": "configuration", "coverage_floor": COVERAGE_FLOOR}
BASELINES = ("early paired Δ", "early loss slope")


def _run_seconds(folder: Path) -> float:
    """The wall time of every finished run of a regime, summed (each run's summary.json)."""
    total = 0.0
    for summary in folder.glob("runs/*/seed-*/summary.json"):
        total += float(json.loads(summary.read_text()).get("wall_seconds", 0.0))
    return total


def _regime_facts(folder: Path) -> dict:
    spec = load_spec(folder)
    cfg = resolve_config(spec.preset, spec.overrides, steps=spec.steps)
    scale, _, corpus = folder.name.partition("-")
    per_step, rows = cfg.train.batch_size * cfg.train.seq_len, cfg.ple.resolved_vocab_size(cfg.model)
    return {"name": folder.name, "scale": scale, "corpus": corpus, "hidden_size": cfg.model.hidden_size,
            "layers": cfg.model.num_hidden_layers, "rows": rows,
            "dims": sorted({int(a.x) for a in spec.arms if a.x > 0}),  # dP 0: a reference or another kind
            "steps": spec.steps, "seeds": len(spec.seeds),
            "tokens_per_step": per_step, "runs": len(spec.arms) * len(spec.seeds),
            "tokens_per_row": [spec.steps // DECISIONS * per_step / rows, spec.steps * per_step / rows]}


def analyse(calls: list[Call], regimes: list[dict]) -> dict:
    """Held-out rates, time curves, baselines, the earliest decision points, per-regime reliability under every
    held-out scheme the benchmark can measure (the verdict quotes held out by corpus, or the worst, saying which)
    and the two threshold rules on the same folds; every count is over configurations
    (:mod:`plelab.calibration.evaluate`)."""
    curves: dict = {}
    notes = []
    for kind in KINDS:
        curves[kind] = {}
        for scheme in SCHEMES:
            groups = {SCHEMES[scheme](c) for c in calls if c.call == kind}
            if len(groups) < 2:
                notes.append(f"{kind}: leave-one-{scheme}-out needs >= 2 {scheme}s (the benchmark has "
                             f"{len(groups)})")
                continue
            curves[kind][scheme] = time_curve(calls, kind, scheme)
    baselines = {name: {s: time_curve(calls, "BENEFIT", s, lambda c, n=name: c.baselines[n], floor=None)
                        for s in curves["BENEFIT"]} for name in BASELINES}
    first = {kind: {"goal": earliest(curves[kind].get("configuration", []), GOAL),
                    "stretch": earliest(curves[kind].get("configuration", []), STRETCH)} for kind in KINDS}
    looks = {kind: len(curves[kind].get("configuration", [])) for kind in KINDS}
    reliability: dict = {}
    for kind in KINDS:
        mine = [c for c in calls if c.call == kind]
        for reg in regimes:
            schemes = {}
            for scheme in curves[kind]:
                rows = []
                for f in fractions(mine):
                    at = [c for c in mine if c.fraction == f]
                    r = held_out(at, scheme, where=lambda c, n=reg["name"]: c.regime == n).to_dict()
                    rows.append({"fraction": f, **{k: r[k] for k in RELIABILITY_KEYS}})
                schemes[scheme] = rows
            reliability.setdefault(kind, {})[reg["name"]] = {"unit": "configuration", "schemes": schemes}
    strata = {}
    for name in STRATA:
        mine = [c for c in calls if c.call == "LEARNED" and name in c.strata]
        if len({c.config for c in mine}) > 1:
            curve = time_curve(mine, "LEARNED", "configuration", lambda c, n=name: c.strata[n])
            strata[name] = {"curve": curve, "goal": earliest(curve, GOAL), "stretch": earliest(curve, STRETCH)}
    thresholds = shipped_thresholds(calls)
    notes += _unfitted(calls, thresholds)
    return {"curves": curves, "baselines": baselines, "earliest": first, "looks": looks, "reliability": reliability,
            "thresholds": thresholds, "threshold_rule": THRESHOLD_RULE,
            "rules": {kind: rule_comparison(calls, kind) for kind in KINDS}, "strata": strata,
            "planted": planted_check(calls), "notes": notes}


def _unfitted(calls: list[Call], thresholds: dict) -> list[str]:
    """Why a call kind has no threshold at any decision point: too few configurations of a truth for the rule."""
    out = []
    for kind in KINDS:
        if thresholds[kind]:
            continue
        truths: dict[tuple, list[bool]] = {}
        for c in calls:
            if c.call == kind and c.truth is not None and c.fraction == 1.0:
                truths.setdefault((c.regime, c.config), []).append(c.truth)
        units = [majority(t) for t in truths.values()]
        out.append(f"{kind}: no threshold at any decision point: the quantile rule at a {TARGET:.0%} target per side "
                   f"needs >= {math.ceil(1 / TARGET) - 1} configurations of a truth to call it (this benchmark has "
                   f"{units.count(False)} negative and {units.count(True)} positive at the run's end)")
    return out


def planted_check(calls: list[Call]) -> dict | None:
    """On the planted corpus, real ids (with either gate) benefit by construction: how often the finished runs'
    BENEFIT truth (read off the other seeds) agrees — a check of the truth itself. None without that corpus."""
    mine = [c for c in calls if c.call == "BENEFIT" and c.corpus == "planted" and c.cls in ("real", "scalar")
            and c.fraction == 1.0]
    if not mine:
        return None
    return {"calls": len(mine), "benefit": sum(c.truth is True for c in mine),
            "no_benefit": sum(c.truth is False for c in mine), "open": sum(c.truth is None for c in mine),
            "configurations": sorted({c.regime + "/" + c.config for c in mine})}


def shipped_is_source() -> bool:
    """Whether the shipped ``calibration.json`` is a file git tracks in a plelab source checkout (where a refit is a
    change to review and commit), not a copy inside an installed package."""
    root = SHIPPED.resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "--error-unmatch",
                              str(SHIPPED.resolve().relative_to(root))], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError, ValueError):
        return False
    return out.returncode == 0


def calibrate(out: str | Path, *, quick: bool = False, jobs: int = 1, corpora: dict[str, str] | None = None,
              planted: bool = False, scales: list[str] | None = None, seeds: int | None = None,
              steps: int | None = None, dims: list[int] | None = None, kinds: list[str] | None = None,
              write_thresholds: bool = False, progress: bool = True) -> dict:
    """Run (or resume) the benchmark in ``out`` and measure the verdict on it; return ``calibration.json``'s
    content. ``corpora``: extra corpora, name -> text file or folder (the embedded corpus is always one);
    ``planted``: also the planted corpus (:mod:`plelab.calibration.planted`, written to ``out/corpora``); ``kinds``:
    the table family's other mechanisms to measure held out by mechanism (the quick benchmark has all three)."""
    if quick and write_thresholds:
        raise ConfigError("--quick is a pipeline check on a tiny benchmark: it never rewrites the shipped "
                          "thresholds; drop --write-thresholds (or --quick)")
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if write_thresholds and not shipped_is_source():
        raise ConfigError(f"--write-thresholds rewrites {SHIPPED}, which is not a file of a plelab source checkout "
                          "(an installed package): run it from a git clone of plelab, or drop it and read "
                          "OUT/calibration.json")
    bench = Benchmark(**QUICK.to_dict()) if quick else Benchmark()
    if scales:
        bench.scales = list(scales)
    if seeds is not None:
        bench.seeds = seeds
    if steps is not None:
        bench.steps = steps
    if dims:
        bench.dims = list(dims)
    if kinds is not None:
        bench.kinds = list(kinds)
    for name, path in (corpora or {}).items():
        if name in ("embedded", "planted"):
            raise ConfigError(f"corpus name {name!r} is a built-in corpus; give yours another name")
        if not Path(path).exists():
            raise ConfigError(f"--corpus {name}={path}: no such file or folder; make it first "
                              "(docs/verdict-calibration.md)")
        bench.corpora[name] = [f"data.path={Path(path).resolve()}"]
    bench.validate()
    root = ensure_dir(out)
    if planted:
        path = write_planted(root / "corpora" / f"planted-{PLANTED_VOCAB}.npy", vocab=PLANTED_VOCAB)
        bench.corpora["planted"] = [f"data.path={path.resolve()}", f"model.vocab_size={PLANTED_VOCAB}"]
    start = time.perf_counter()
    folders = run_benchmark(root, bench, jobs=jobs, progress=progress)
    train_s = time.perf_counter() - start
    calls = benchmark_calls(folders, progress=progress)
    scored = [c for c in calls if not c.apart and c.mechanism == "ple"]  # only PLE's calls fit and rate the verdict
    others = [c for c in calls if not c.apart and c.mechanism != "ple"]
    atomic_write(root / "calls.jsonl", lambda p: p.write_text("".join(json.dumps(c.to_dict()) + "\n"
                                                                      for c in calls)))
    regimes = [_regime_facts(f) for f in folders]
    result = {"benchmark": {**bench.to_dict(), "quick": quick, "windows": USE_WINDOWS,
                            "regimes": [r["name"] for r in regimes],
                            "runs": sum(r["runs"] for r in regimes),
                            "configurations": len({(c.regime, c.config) for c in calls}),
                            "calls": {k: sum(c.call == k for c in scored) for k in KINDS},
                            "calls_other_kinds": {k: sum(c.call == k for c in others) for k in KINDS},
                            "calls_apart": {k: sum(c.call == k for c in calls if c.apart) for k in KINDS},
                            "seconds": round(time.perf_counter() - start, 1), "train_seconds": round(train_s, 1),
                            "run_seconds": round(sum(_run_seconds(f) for f in folders), 1),
                            "versions": versions(), "git_commit": git_commit(),
                            "command": calibrate_command(quick, corpora, planted, scales, seeds, steps, dims, jobs,
                                                         out, kinds)},
              "regimes": regimes, "truths": TRUTHS, **analyse(scored, regimes)}
    result["apart"] = apart_summary([c for c in calls if c.apart], result["thresholds"])
    result["by_mechanism"] = {k: mechanism_rates([c for c in scored + others if c.call == k]) for k in KINDS
                              } if others else {}
    write_json(root / "calibration.json", result)
    atomic_write(root / "report.md", lambda p: p.write_text(calibration_text(result, markdown=True)))
    if write_thresholds:
        write_json(SHIPPED, {k: result[k] for k in ("benchmark", "regimes", "thresholds", "threshold_rule",
                                                     "reliability")})
    return result


def calibrate_command(quick, corpora, planted, scales, seeds, steps, dims, jobs, out, kinds=None) -> str:
    parts = ["plelab", "calibrate", "--out", str(out)] + (["--quick"] if quick else [])
    parts += [x for n, p in (corpora or {}).items() for x in ("--corpus", f"{n}={p}")]
    parts += ["--planted"] if planted else []
    parts += ["--scales", ",".join(scales)] if scales else []
    parts += ["--seeds", str(seeds)] if seeds is not None else []
    parts += ["--steps", str(steps)] if steps is not None else []
    parts += ["--dims", ",".join(map(str, dims))] if dims else []
    parts += ["--kinds", ",".join(kinds) if kinds else "none"] if kinds is not None else []
    return " ".join(parts + (["--jobs", str(jobs)] if jobs > 1 else []))


__all__ = ["SCALES", "calibrate", "analyse"]
