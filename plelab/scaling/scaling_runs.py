"""``plelab fit RUNS…``: the scaling fits of :mod:`plelab.scaling.laws` on finished runs, and their text.

Every folder under the paths given that holds a ``summary.json`` (a finished ``plelab train`` run, or one run of
a sweep), and every run a sweep there holds only as its record (:mod:`plelab.sweeps.records`), is a point: ``N``
its trunk's parameters from the exact accounting (PLE never counted; with or without the embeddings), ``D`` its
``tokens_seen``, the loss its final validation loss. Runs with ``ple.dim = 0`` — including the trunk-matched
controls, plain trunks of another shape — are the baseline; a PLE run's arm is its
``dP/H`` (a ladder holds it across sizes) with every non-default PLE setting (gate, ids, table, …) in the name.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from plelab.config.schema import PLEConfig, RunConfig
from plelab.errors import PlelabError
from plelab.model.accounting import account
from plelab.scaling.laws import BOOTSTRAPS, EXTRAPOLATION_LIMIT, Point, fit_study
from plelab.sweeps.records import SUFFIX, read_record
from plelab.training.task import task_kind

BASELINE = "baseline"
_NOT_ARM = ("dim", "vocab_size")  # a ladder scales these with the rung


def arm_name(cfg: RunConfig) -> str:
    """``baseline`` for a plain trunk; ``dP/H=0.05`` (plus each non-default PLE setting) for a PLE run."""
    pc = cfg.ple
    if not pc.enabled:
        return BASELINE
    default = PLEConfig()
    extra = [f"{f.name}={getattr(pc, f.name)}" for f in dataclasses.fields(pc)
             if f.name not in _NOT_ARM and getattr(pc, f.name) != getattr(default, f.name)]
    return " ".join([f"dP/H={pc.dim / cfg.model.hidden_size:.4g}", *extra])


def _summaries(paths: Iterable[str | Path]) -> dict[Path, Callable[[], dict]]:
    """Each finished run under ``paths`` (its folder) -> how to read its summary: the folder's ``summary.json``, or
    the sweep's record of the run when the folder is gone (:mod:`plelab.sweeps.records`)."""
    found: dict[Path, Callable[[], dict]] = {}
    records: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise PlelabError(f"{path} does not exist; give run or sweep folders (plelab train / plelab sweep --out)")
        files = [path / "summary.json"] if (path / "summary.json").is_file() else sorted(path.rglob("summary.json"))
        found.update((f.parent.resolve(), lambda f=f: json.loads(f.read_text())) for f in files)
        records += sorted(path.rglob(f"records/*/seed-*{SUFFIX}"))
    for rec in records:
        run = (rec.parent.parent.parent / "runs" / rec.parent.name / rec.name.removesuffix(SUFFIX)).resolve()
        if run not in found:
            found[run] = lambda run=run: (read_record(run) or {})["summary"]
    return found


def points_from_runs(paths: Sequence[str | Path], count: str = "non-embedding") -> tuple[list[Point], list[str]]:
    """The finished runs under ``paths`` as points, and notes on what was skipped or mixed."""
    if count not in ("total", "non-embedding"):
        raise PlelabError(f"--count must be total or non-embedding, got {count!r}")
    points, notes, corpora, settings = [], [], set(), {}
    for run, read in _summaries(paths).items():
        try:
            summary = read()
            cfg = RunConfig.from_dict(summary["config"])
            loss, tokens = float(summary["final_val_loss"]), float(summary["tokens_seen"])
        except (OSError, ValueError, KeyError, TypeError, PlelabError) as err:
            notes.append(f"skipped {run}: its summary is not a finished plelab run ({err})")
            continue
        if not (math.isfinite(loss) and math.isfinite(tokens)):  # a "NaN" string parses as a float
            notes.append(f"skipped {run}: its final loss {loss} or tokens_seen {tokens} is not a finite number")
            continue
        if not task_kind(cfg).text_model:
            notes.append(f"skipped {run}: a {cfg.kind} run (the fit reads text runs)")
            continue
        acc = account(cfg.model, cfg.ple, cfg.train.seq_len, cfg.aux)
        n = acc.base - (acc.groups["embed_tokens"] + acc.groups.get("lm_head", 0) if count == "non-embedding" else 0)
        points.append(Point(arm_name(cfg), float(n), tokens, loss, int(cfg.seed), str(run)))
        corpora.add(summary.get("corpus_fingerprint"))
        for key in ("lr", "batch_size", "seq_len", "precision"):
            settings.setdefault(key, set()).add(getattr(cfg.train, key))
    if len(corpora) > 1:
        raise PlelabError(f"the runs were trained on {len(corpora)} different corpora (fingerprints differ): a law "
                          "holds for one data distribution — give the runs of one corpus")
    notes += [f"the runs differ in train.{k} ({', '.join(map(str, sorted(v, key=str)))}): the law mixes them"
              for k, v in settings.items() if len(v) > 1]
    if not points:
        raise PlelabError(f"no finished run (summary.json) under {', '.join(map(str, paths))}; train the ladder "
                          "first (plelab plan --target … prints its commands)")
    return points, notes


def fit_runs(paths: Sequence[str | Path], count: str = "non-embedding", boots: int = BOOTSTRAPS, seed: int = 0,
             min_sizes: int = 4, min_budgets: int = 3, predict: Sequence[tuple[float, float]] = ()) -> dict:
    """:func:`~plelab.scaling.laws.fit_study` on the runs under ``paths`` (see the module docstring)."""
    if boots < 20:
        raise PlelabError(f"--boots {boots} is too few for a 95% interval; use at least 20 (default {BOOTSTRAPS})")
    points, notes = points_from_runs(paths, count)
    result = fit_study(points, BASELINE, boots, seed, min_sizes, min_budgets, predict)
    result["warnings"] = notes + result["warnings"]
    result["count"] = count
    result["runs"] = len(points)
    return result


def _ci(entry: dict, fmt: str) -> str:
    lo, hi = entry["ci"]
    return f"{format(entry['value'], fmt)} [{format(lo, fmt)}, {format(hi, fmt)}]"


def fit_text(r: dict) -> str:
    """The fit for the terminal: the law, the multipliers, the held-out check, predictions and warnings."""
    law = r["law"]
    emb = "without" if r["count"] == "non-embedding" else "with"
    lines = [f"L(N, D) = E + A/N^α + B/D^β on {r['points']} baseline runs ({len(r['sizes'])} sizes × "
             f"{len(r['budgets'])} budgets; N = trunk parameters {emb} embeddings, PLE not counted). Huber fit in "
             f"log space (Hoffmann et al. 2022, approach 3); 95% intervals from {r['bootstraps']} bootstrap "
             f"replicates, resampling {r['resampling']}.",
             f"  E = {_ci(law['E'], '.4f')}   A = {_ci(law['A'], '.4g')}   α = {_ci(law['alpha'], '.3f')}",
             f"  B = {_ci(law['B'], '.4g')}   β = {_ci(law['beta'], '.3f')}   "
             f"RMS residual {r['rms_residual']:.4f} nats"]
    if r["multipliers"]:
        lines.append("Effective-parameter multiplier m of each arm (L_arm(N, D) = L_base(m·N, D), the law held fixed):")
        lines += [f"  {arm}: m = {m['m']:.3f} [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}] over {m['points']} runs"
                  + (" — no gain established: the interval holds 1" if m["ci"][0] <= 1 <= m["ci"][1] else "")
                  for arm, m in r["multipliers"].items()]
    h = r["holdout"]
    if h is None:
        lines.append("Held-out check: not run (it needs 4 sizes, so that 3 remain to fit)")
    else:
        lines.append(f"Held-out check: fitted on N ≤ {h['fit_sizes'][-1]:,.0f}, predicting N = {h['held_out']:,.0f} "
                     f"({h['extrapolation']:.2g}× beyond): {h['inside']} of {h['of']} budgets inside the 95% "
                     "prediction interval")
        lines += [f"  D = {row['d']:.3g}: measured {row['measured']:.4f} ({row['seeds']} seeds), predicted "
                  f"{row['predicted']:.4f} [{row['pi'][0]:.4f}, {row['pi'][1]:.4f}]"
                  + ("" if row["inside"] else "  OUTSIDE") for row in h["rows"]]
    for p in r["predictions"]:
        lines.append(f"Prediction at N = {p['n']:.3g}, D = {p['d']:.3g}: L = {p['loss']:.4f} [{p['ci'][0]:.4f}, "
                     f"{p['ci'][1]:.4f}] ({p['extrapolation']:,.3g}× the largest fitted N or D)")
    lines += [f"Warning: {w}" for w in r["warnings"]]
    if any(p["extrapolation"] > EXTRAPOLATION_LIMIT for p in r["predictions"]):
        lines.append(f"(predictions beyond {EXTRAPOLATION_LIMIT:g}× are shown, not trusted)")
    return "\n".join(lines)


__all__ = ["BASELINE", "arm_name", "fit_runs", "fit_text", "points_from_runs"]
