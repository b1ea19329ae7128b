"""Reading a sweep's runs back: losses, curves, live signal metrics, checkpoint diagnostics and
the cross-seed structure test, per run and per arm.

A run's loss is the mean of its last ``last_k`` validation evaluations (less noisy than the last
one; every arm is evaluated on the same validation windows, so the mean is paired too).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plelab.data.pipeline import prepare_token_data
from plelab.diagnostics.agreement import cka_against_null
from plelab.diagnostics.diagnose import RunTable
from plelab.diagnostics.tables import find_table
from plelab.errors import PlelabError
from plelab.integrations.hosts import host_accounting
from plelab.model.accounting import account
from plelab.sweeps.records import (checkpoint_row_counts, median_step_seconds, read_checkpoint_diagnostics,
                                   read_jsonl, read_record, record_path)
from plelab.sweeps.runner import RunJob, data_key, folder_done, jobs_of, run_config, run_state
from plelab.sweeps.spec import SweepSpec, load_spec
from plelab.training.task import load_kind

SEED_TOKENS = 400e9  # the seed's training budget (400B tokens, V = 100,096)
SEED_VOCAB = 100_096
SEED_HIDDEN = 2560


@dataclass
class RunResult:
    arm: str
    seed: int
    loss: float
    val_history: list[tuple[int, float]]
    train_curve: list[tuple[int, float]]
    tokens_seen: int
    wall_seconds: float
    tokens_per_second: float
    signal: dict = field(default_factory=dict)  # last live diag row: mean snr / table_to_proj over layers
    gate_history: list[tuple[int, float]] = field(default_factory=list)  # (step, gate activity) of every diag row
    early_signal: dict = field(default_factory=dict)
    final_diag: dict = field(default_factory=dict)  # use test at the final checkpoint
    early_diag: dict = field(default_factory=dict)
    early_step: int = 0
    steps: int = 0  # the run's planned length (train.steps; 0: unknown)
    occurrences: dict = field(default_factory=dict)
    structure: dict = field(default_factory=dict)  # {"early": {...}, "final": {...}} cross-seed CKA vs null
    visual: dict = field(default_factory=dict)  # a visual run's caption report and ID metrics (summary.json)
    ood_loss: float | None = None  # the mean of the last last_k data.ood evaluations (None: the run had no data.ood)
    ood_history: list[tuple[int, float]] = field(default_factory=list)
    step_seconds: float | None = None  # the median training step's wall time (records.median_step_seconds)


def _mean_layers(values) -> float | None:
    vals = [v for v in (values or []) if v is not None]
    return float(np.mean(vals)) if vals else None


def _signal(row: dict | None) -> dict:
    if not row:
        return {}
    d = row["diag"]
    return {"step": row["step"], "snr": _mean_layers(d.get("snr")),
            "table_to_proj": _mean_layers(d.get("table_to_proj")),
            "gate": _mean_layers(d.get("gate")), "grad_table": _mean_layers(d.get("grad_table")),
            "grad_gate": _mean_layers(d.get("grad_gate")),
            "rows_touched": d.get("rows_touched"),
            **{k: _mean_layers(d[k]) for k in ("grad_row_text", "grad_row_visual") if k in d},
            **{f"{k}_layers": d[k] for k in ("grad_row_text", "grad_row_visual") if k in d}}


def checkpoint_path(path: Path, step: int) -> Path:
    """The folder of run ``path``'s checkpoint at ``step``."""
    return path / "checkpoints" / f"step-{step:06d}"


def _use(diag: dict | None) -> dict:
    """The use test of a checkpoint's ``diagnostics.json`` (``diag``)."""
    if diag is None:
        return {}
    perm = (diag.get("use") or {}).get("permute")
    if not perm:
        return {"skipped": diag.get("skipped", "use test off")}
    return {"delta": perm["delta"], "se": perm["se"], "use_verdict": diag.get("use_verdict")}


def _occurrences(counts) -> dict:
    """How many tokens each table row saw (a checkpoint's ``diag.row_counts``), summarised."""
    if counts is None:
        return {}
    counts = np.asarray(counts)
    used = counts[counts > 0]
    return {"rows": int(len(counts)), "rows_used": int(len(used)),
            "median": float(np.median(used)) if len(used) else 0.0,
            "mean": float(used.mean()) if len(used) else 0.0}


class _FolderRun:
    """What :func:`read_run` reads, from a finished run's folder."""

    def __init__(self, path: Path):
        self.path = path
        self.fix = f"delete that run folder and its record {record_path(path)} and rerun the sweep to redo it"
        self.rows = read_jsonl(path / "metrics.jsonl")
        self.step_seconds = median_step_seconds(self.rows)
        try:
            self.summary = json.loads((path / "summary.json").read_text())
        except (OSError, ValueError):
            self.summary = None

    def checkpoint(self, step: int) -> tuple[dict | None, object]:
        ckpt = checkpoint_path(self.path, step)
        return read_checkpoint_diagnostics(ckpt), checkpoint_row_counts(ckpt)


class _RecordedRun:
    """What :func:`read_run` reads, from a run's record (:mod:`plelab.sweeps.records`)."""

    def __init__(self, record: dict, path: Path):
        self.fix = f"delete the record {record_path(path)} and rerun the sweep to redo the run"
        self.rows, self.summary, self.ckpts = record.get("metrics", []), record.get("summary"), record["checkpoints"]
        self.step_seconds = record.get("step_seconds")

    def checkpoint(self, step: int) -> tuple[dict | None, object]:
        found = self.ckpts.get(str(step)) or {}
        return found.get("diagnostics"), found.get("row_counts")


def read_run(job: RunJob, last_k: int) -> RunResult:
    """A finished run's results, from its folder or, when the folder is gone, from its record."""
    source = (_FolderRun(job.path) if folder_done(job)
              else _RecordedRun(read_record(job.path) or {"checkpoints": {}}, job.path))
    rows = source.rows
    vals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if not vals:
        raise PlelabError(f"run {job.path} is marked done but its metrics are missing or hold no validation loss; "
                          + source.fix)
    try:
        summary = source.summary
        tokens, wall, tps = (summary[k] for k in ("tokens_seen", "wall_seconds", "tokens_per_second"))
    except (ValueError, TypeError, KeyError):
        raise PlelabError(f"run {job.path} has a damaged summary; {source.fix}") from None
    diag_rows = [r for r in rows if "diag" in r]
    tc = job.cfg.train
    early = tc.early_checkpoint
    result = RunResult(
        arm=job.arm.name, seed=job.seed, loss=float(np.mean([v for _, v in vals[-last_k:]])), val_history=vals,
        train_curve=[(r["step"], r["loss"]) for r in rows if "loss" in r], tokens_seen=tokens,
        wall_seconds=wall, tokens_per_second=tps,
        signal=_signal(diag_rows[-1] if diag_rows else None), early_step=early, steps=tc.steps,
        gate_history=[(r["step"], g) for r in diag_rows if (g := _mean_layers(r["diag"].get("gate"))) is not None],
        visual=summary.get("visual", {}), step_seconds=source.step_seconds)
    oods = [(r["step"], r["ood_loss"]) for r in rows if "ood_loss" in r]
    if oods:
        result.ood_history, result.ood_loss = oods, float(np.mean([v for _, v in oods[-last_k:]]))
    if job.cfg.ple.enabled:
        diag, counts = source.checkpoint(tc.steps)
        result.final_diag = _use(diag)
        result.occurrences = _occurrences(counts)
        if early:
            result.early_diag = _use(source.checkpoint(early)[0])
            result.early_signal = _signal(next((r for r in reversed(diag_rows) if r["step"] <= early), None))
    return result


def cross_seed_structure(jobs: list[RunJob], step: int, data_cache: dict) -> dict[int, dict]:
    """Per seed: CKA of this run's Δ with the next seed's (cyclic) against the permutation null; ``independent``
    marks the disjoint pairs (seeds 0–1, 2–3, … in the jobs' order), the only ones a count may add up."""
    if len(jobs) < 2 or jobs[0].cfg.ple.table != "learned" or not jobs[0].cfg.ple.enabled:
        return {}
    tables = {}
    for job in jobs:
        ckpt = checkpoint_path(job.path, step)
        if not ckpt.exists():
            return {}
        key = data_key(job.cfg)
        if key not in data_cache:
            data_cache[key] = prepare_token_data(job.cfg, progress=False)
        tables[job.seed] = RunTable(find_table(ckpt), data_cache[key])
    out = {}
    seeds = [j.seed for j in jobs]
    for i, s in enumerate(seeds):
        a, b = tables[s], tables[seeds[(i + 1) % len(seeds)]]
        both = (a.counts > 0) & (b.counts > 0)
        res = cka_against_null(a.delta[both].flatten(1), b.delta[both].flatten(1), a.counts[both], seed=s)
        out[s] = {**{k: res[k] for k in ("cka", "null_mean", "null_sd")},
                  "independent": i % 2 == 0 and i + 1 < len(seeds)}
    return out


# How a sweep of one kind reads the cross-seed structure of an arm's runs: (the arm's finished jobs, a cache of
# prepared data shared by the arms) -> {seed: {"early" / "final": structure}}.
StructureReader = Callable[[list[RunJob], dict], dict[int, dict]]
_STRUCTURE_READERS: dict[str, StructureReader] = {}


def register_structure_reader(kind: str, reader: StructureReader) -> None:
    """How :func:`collect` reads the cross-seed structure of a sweep of ``kind`` (the dP sweep's is below; the
    visual study registers its own when ``plelab.visual`` is imported). A kind without one has none."""
    _STRUCTURE_READERS[kind] = reader


def dp_structure(jobs: list[RunJob], data_cache: dict) -> dict[int, dict]:
    """The dP sweep's structure: :func:`cross_seed_structure` at the early checkpoint (if any) and the final one."""
    cfg, out = jobs[0].cfg, {}
    for when, step in (("early", cfg.train.early_checkpoint), ("final", cfg.train.steps)):
        if step:
            for seed, res in cross_seed_structure(jobs, step, data_cache).items():
                out.setdefault(seed, {})[when] = res
    return out


register_structure_reader("dp", dp_structure)


@dataclass
class SweepResults:
    root: Path
    spec: SweepSpec
    runs: dict[str, dict[int, RunResult]]  # arm -> seed -> result (aliases resolved)
    accounting: dict[str, dict]  # arm -> exact parameter accounting
    configs: dict[str, dict]  # arm -> the seed-0 resolved config
    missing: list[str]

    def seeds_of(self, *arms: str) -> list[int]:
        """Seeds for which every one of ``arms`` has a finished run (the pairs)."""
        common = set(self.spec.seeds)
        for arm in arms:
            common &= set(self.runs.get(arm, {}))
        return sorted(common)

    def losses(self, arm: str, seeds: list[int] | None = None) -> list[float]:
        seeds = seeds if seeds is not None else sorted(self.runs.get(arm, {}))
        return [self.runs[arm][s].loss for s in seeds]


def collect(root: str | Path, structure: bool = True) -> SweepResults:
    """Read every finished run of the sweep in ``root`` (unfinished ones are listed as missing)."""
    root = Path(root)
    spec = load_spec(root)
    if spec is None:
        raise PlelabError(f"{root} is not a plelab sweep (no sweep.json); run plelab sweep --out {root} first")
    runs: dict[str, dict[int, RunResult]] = {}
    missing, by_arm = [], {}
    for job in jobs_of(root, spec):
        if run_state(job) != "done":
            missing.append(job.name)
            continue
        runs.setdefault(job.arm.name, {})[job.seed] = read_run(job, spec.last_k)
        if folder_done(job):  # the structure test reads the tables: a recorded run carries none
            by_arm.setdefault(job.arm.name, []).append(job)
    load_kind(spec.kind)  # a study of another kind of run: its package registers its structure reader
    reader = _STRUCTURE_READERS.get(spec.kind) if structure else None
    if reader is not None:
        cache: dict = {}
        for arm, jobs in by_arm.items():
            for seed, found in reader(jobs, cache).items():
                runs[arm][seed].structure.update(found)
    accounting, configs = {}, {}
    for arm in spec.arms:
        if arm.alias_of is not None and arm.alias_of in runs:
            runs[arm.name] = runs[arm.alias_of]
        cfg = run_config(spec, arm, spec.seeds[0])
        configs[arm.name] = cfg.to_dict()
        accounting[arm.name] = (account(cfg.model, cfg.ple, cfg.train.seq_len, cfg.aux).to_dict() if cfg.model.host == "plelab"
                                else host_accounting(cfg))
    if not runs.get(spec.baseline):
        raise PlelabError(f"{root}: the baseline {spec.baseline} has no finished run yet, and every comparison is "
                          f"paired with it; rerun the sweep to finish its runs ({len(missing)} unfinished)")
    return SweepResults(root, spec, runs, accounting, configs, missing)


def regime(res: SweepResults) -> dict:
    """How the CPU grid maps onto the seed's: dP/H, added-parameter fractions, tokens per table row."""
    base = res.configs[res.spec.baseline]
    H = base["model"]["hidden_size"]
    main = [a for a in res.spec.arms if a.family == "dP" and a.x > 0]
    first = res.runs.get(res.spec.baseline, {})
    tokens = next(iter(first.values())).tokens_seen if first else 0
    vp = base["ple"]["vocab_size"] or base["model"]["vocab_size"]
    return {
        "hidden_size": H, "num_layers": base["model"]["num_hidden_layers"], "vocab_size": base["model"]["vocab_size"],
        "dp_over_h": [(int(a.x), a.x / H) for a in main],
        "added_fraction": [(int(a.x), res.accounting[a.name]["added_pct_of_base"]) for a in main],
        "base_params": res.accounting[res.spec.baseline]["base"], "tokens": tokens,
        "tokens_per_row": tokens / vp if vp else math.nan,
        "seed_tokens_per_row": SEED_TOKENS / SEED_VOCAB,
        "seed_dp_over_h": (64 / SEED_HIDDEN, 512 / SEED_HIDDEN),
    }
