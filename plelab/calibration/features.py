"""What each call reads at each decision point, and what is true of it (from the finished runs).

One :class:`Call` is one verdict a user would get: LEARNED from a pair of seeds' tables, USED and BENEFIT from
one run, at one checkpoint. Its ``score`` is the verdict's statistic in units of its own null:

- LEARNED: z = (CKA − null mean) / null sd of the two seeds' Δ = W_t − W_0 (:func:`cka_against_null`: rows of
  similar frequency shuffled), computed for every class through the functions ``plelab diagnose`` calls (a table
  that never moved — frozen, gate held at 0 — comes out z = 0 there, not by assignment here). The same z
  of each frequency stratum (the rows above and below the median count, each against its own null) is kept in
  ``strata``, so the report can say whether thresholds per stratum decide differently;
- USED and BENEFIT: z = Δ_permute / se, the paired validation-loss cost of shuffling the rows among rows of
  similar frequency, over the checkpoint's validation windows (the trainer's use test); Δ = se = 0 gives 0.

BENEFIT's baselines (``baselines``), the obvious competitors from the same checkpoints: the early paired loss Δ
against BENEFIT's references of the same seed (the no-PLE baseline and the zero table: the worse of the two,
negated: higher = better), and the early loss slope difference over the second half of the run so far (likewise).

What scores each call (:mod:`.truth`): LEARNED's truth is the class's construction; USED's and BENEFIT's are
by construction where it holds, else read from the *other* seeds' final checkpoints — USED's through a different
intervention on other windows — so that a call and its truth share no run and no statistic. A call scored apart
(``apart``: LEARNED's weak positives) is written to ``calls.jsonl`` but never fits a threshold or enters a rate.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from plelab.calibration import evidence
from plelab.calibration.benchmark import LEARNED_BY_CLASS, decision_steps, mechanism_of
from plelab.calibration.truth import NO_BENEFIT, NOT_USED, REFERENCES, WEAK, benefit_truth, used_truth
from plelab.diagnostics.verdict import use_z
from plelab.errors import PlelabError
from plelab.model.tables import table_view
from plelab.runs import prepare_data
from plelab.sweeps.records import read_jsonl, read_record
from plelab.sweeps.results import checkpoint_path
from plelab.sweeps.runner import RunJob, folder_done, jobs_of, run_state
from plelab.sweeps.spec import load_spec

LAST_K = 3  # a run's final loss: the mean of its last 3 evaluations (the sweeps' rule)


@dataclass
class Call:
    call: str  # LEARNED | USED | BENEFIT
    regime: str
    scale: str
    corpus: str
    config: str  # the arm: class-dp{d}
    cls: str
    dim: int
    seeds: list[int]
    step: int
    fraction: float
    tokens: int
    tokens_per_row: float
    score: float
    truth: bool | None  # None: the finished runs do not decide it (counted, never scored)
    truth_reason: str = ""
    baselines: dict[str, float] = field(default_factory=dict)
    strata: dict[str, float] = field(default_factory=dict)  # LEARNED: the z of each frequency stratum's rows
    apart: str = ""  # why the call is reported apart, never fitted or scored ("": scored)
    mechanism: str = "ple"  # the table kind (aux.kind): only PLE's calls fit thresholds

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Run:
    job: RunJob
    use: dict[int, tuple[float, float]]  # step -> (Δ_permute, se)
    val: dict[int, float]  # step -> validation loss (the same windows for every arm of a seed: paired)
    history: list[tuple[int, float]]
    final: float


def _read_run(job: RunJob, steps: list[int]) -> _Run:
    """The run from its folder, else from its record (:mod:`plelab.sweeps.records`; a calibrate run's record keeps
    every decision point's use test)."""
    in_folder = folder_done(job)
    if in_folder:
        rows, recorded = read_jsonl(job.path / "metrics.jsonl"), {}
    else:
        record = read_record(job.path) or {}
        rows = record.get("metrics") or []
        recorded = {int(step): c.get("diagnostics") for step, c in (record.get("checkpoints") or {}).items()}
    history = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    val = dict(history)
    missing = [s for s in steps if s not in val]
    if missing:
        raise PlelabError(f"{job.path}: no evaluation at step {missing[0]} in its metrics; delete that run (its "
                          "folder and record) and rerun plelab calibrate to redo it")
    use = {}
    final = float(np.mean([v for _, v in history[-LAST_K:]]))
    if job.cfg.ple.table == "zero" or (job.cfg.ple.dim == 0 and not job.cfg.aux.extra):
        return _Run(job, use, val, history, final)
    for step in steps:
        if in_folder:
            path = checkpoint_path(job.path, step) / "diagnostics.json"
            try:
                diag = json.loads(path.read_text())
            except (OSError, ValueError):
                raise PlelabError(f"{path} is missing or unreadable; delete {job.path} and rerun plelab calibrate "
                                  "to redo that run") from None
        else:
            diag = recorded.get(step)
            if diag is None:
                raise PlelabError(f"{job.path}'s record has no use test at step {step} (a record written before "
                                  "calibrate runs kept every decision point): retrain that run")
        perm = (diag.get("use") or {}).get("permute")
        if perm is not None:
            use[step] = (float(perm["delta"]), float(perm["se"]))
    return _Run(job, use, val, history, final)


def _slope(history: list[tuple[int, float]], step: int) -> float:
    """Least-squares slope (nats per 1,000 steps) of the validation loss over evaluations in (step/2, step]."""
    pts = [(s, v) for s, v in history if step / 2 < s <= step]
    if len(pts) < 2:
        return 0.0
    s, v = np.array(pts, dtype=np.float64).T
    return float(np.polyfit(s / 1000, v, 1)[0])


def _evidence(folder: Path, runs: list[_Run], steps: list[int], data, windows) -> dict:
    """The arm's evidence (:mod:`.evidence`): its file where it was written, else computed from the run folders."""
    jobs = [r.job for r in runs]
    found = evidence.read(folder, jobs[0].arm.name, [j.seed for j in jobs], steps)
    if found is not None:
        return found
    held = [j.name for j in jobs if not folder_done(j)]
    if held:
        raise PlelabError(f"{folder}: {len(held)} runs of arm {jobs[0].arm.name} are held only as records (e.g. "
                          f"{held[0]}) and the arm has no evidence file (evidence/{jobs[0].arm.name}.json, written by "
                          "plelab pack while the run folders were there): retrain them where the folders are")
    return evidence.compute(jobs, steps, data, windows)


def regime_calls(folder: Path, progress: bool = False) -> list[Call]:
    """Every call of one regime folder (``plelab calibrate``'s ``{scale}-{corpus}``) at every decision point."""
    spec = load_spec(folder)
    if spec is None or spec.kind != "calibrate":
        raise PlelabError(f"{folder} is not a plelab calibrate regime (no sweep.json of kind 'calibrate')")
    jobs = jobs_of(folder, spec)
    unfinished = [j.name for j in jobs if run_state(j) != "done"]
    if unfinished:
        raise PlelabError(f"{folder}: {len(unfinished)} runs are not finished (e.g. {unfinished[0]}); rerun plelab "
                          "calibrate with the same --out to finish them")
    scale, _, corpus = folder.name.partition("-")
    steps = decision_steps(spec.steps)
    data = prepare_data(jobs[0].cfg, progress=False)
    by_arm: dict[str, list[_Run]] = {}
    for job in jobs:
        by_arm.setdefault(job.arm.name, []).append(_read_run(job, steps))
    missing = [a for a in REFERENCES.values() if "{" not in a and a not in by_arm]
    if missing:
        raise PlelabError(f"{folder} has no {missing[0]} arm (BENEFIT's no-PLE reference; a folder made before it "
                          "was added): rerun plelab calibrate with the same --out to train it")
    cfg = jobs[0].cfg
    windows = evidence.truth_windows(cfg, data)
    per_step = cfg.train.batch_size * cfg.train.seq_len
    calls: list[Call] = []
    bar = tqdm(total=len(by_arm) * len(steps), desc=f"calls {folder.name}", disable=not progress, leave=False)
    for arm_name, runs in by_arm.items():
        arm = runs[0].job.arm
        if arm.family in evidence.UNCALLED:
            bar.update(len(steps))
            continue
        d, mechanism = int(arm.x), mechanism_of(arm)
        # BENEFIT's references: the no-PLE trunk and, for PLE, the zero table at the same dP
        refs = {r: {x.job.seed: x for x in by_arm[name.format(d=d)]} for r, name in REFERENCES.items()
                if mechanism == "ple" or "{d}" not in name}
        rows = table_view(runs[0].job.cfg.model, runs[0].job.cfg.ple, runs[0].job.cfg.aux).rows

        def call(kind: str, seeds: list[int], step: int, score: float, truth, reason: str, base=None,
                 strata=None, apart: str = "") -> Call:
            return Call(kind, folder.name, scale, corpus, arm_name, arm.family, d, seeds, step, step / spec.steps,
                        step * per_step, step * per_step / rows, float(score), truth, reason, base or {},
                        strata or {}, apart, mechanism)

        finals = {r.job.seed: r for r in runs}
        found = _evidence(folder, runs, steps, data, windows)
        ablation = {int(s): np.asarray(v, dtype=np.float64) for s, v in found["ablation"].items()}
        truths = {}  # seed -> the USED and BENEFIT truths: by construction, or read off the other seeds' finals
        for s in finals:
            others = [x for x in finals if x != s]
            used = ((False, NOT_USED[arm.family]) if arm.family in NOT_USED
                    else used_truth([ablation[o] for o in others]))
            benefit = ((False, NO_BENEFIT[arm.family]) if arm.family in NO_BENEFIT
                       else benefit_truth([finals[o].final for o in others],
                                          {k: [refs[k][o].final for o in others] for k in refs}))
            truths[s] = used, benefit
        weak = "weak positive: labelled by its construction only" if arm.family in WEAK else ""
        for step in steps:
            for a, b, z, strata in found["structure"][str(step)]:
                calls.append(call("LEARNED", [a, b], step, z, LEARNED_BY_CLASS[arm.family], "by construction",
                                  strata=strata, apart=weak))
            for r in runs:
                s = r.job.seed
                z = use_z(*r.use.get(step, (0.0, 0.0)))
                (truth, why), benefit = truths[s]
                calls.append(call("USED", [s], step, z, truth, why))
                truth, why = benefit
                early = max(r.val[step] - refs[k][s].val[step] for k in refs)
                slope = max(_slope(r.history, step) - _slope(refs[k][s].history, step) for k in refs)
                calls.append(call("BENEFIT", [s], step, z, truth, why,
                                  {"early paired Δ": -early, "early loss slope": -slope}))
            bar.update(1)
    bar.close()
    return calls


def benchmark_calls(folders: list[Path], progress: bool = True) -> list[Call]:
    return [c for f in folders for c in regime_calls(Path(f), progress)]
