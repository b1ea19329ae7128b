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

import torch

from plelab.calibration.benchmark import DECISIONS, LEARNED_BY_CLASS, mechanism_of
from plelab.calibration.truth import NO_BENEFIT, NOT_USED, REFERENCES, WEAK, benefit_truth, used_truth
from plelab.data.tokens import disjoint_val_windows
from plelab.diagnostics.agreement import cka_against_null
from plelab.diagnostics.diagnose import RunTable
from plelab.diagnostics.tables import find_table
from plelab.diagnostics.usage import ablation_losses
from plelab.diagnostics.verdict import structure_z, use_z
from plelab.errors import PlelabError
from plelab.model.init import build_model
from plelab.model.tables import model_table, table_view
from plelab.runs import prepare_data
from plelab.training.checkpoint import load_model_weights
from plelab.training.rows import null_ids
from plelab.sweeps.results import checkpoint_path
from plelab.sweeps.runner import RunJob, folder_done, jobs_of, run_state
from plelab.sweeps.spec import load_spec

LAST_K = 3  # a run's final loss: the mean of its last 3 evaluations (the sweeps' rule)
STRATA = ("frequent", "rare")  # the rows above / at or below the median count of the rows both seeds used
MIN_STRATUM_ROWS = 8


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
    rows = [json.loads(line) for line in (job.path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    history = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    val = dict(history)
    missing = [s for s in steps if s not in val]
    if missing:
        raise PlelabError(f"{job.path}: no evaluation at step {missing[0]} in metrics.jsonl; delete that run folder "
                          "and rerun plelab calibrate to redo it")
    use = {}
    if job.cfg.ple.table == "zero" or (job.cfg.ple.dim == 0 and not job.cfg.aux.extra):
        return _Run(job, use, val, history, float(np.mean([v for _, v in history[-LAST_K:]])))
    for step in steps:
        path = checkpoint_path(job.path, step) / "diagnostics.json"
        try:
            diag = json.loads(path.read_text())
        except (OSError, ValueError):
            raise PlelabError(f"{path} is missing or unreadable; delete {job.path} and rerun plelab calibrate to "
                              "redo that run") from None
        perm = (diag.get("use") or {}).get("permute")
        if perm is not None:
            use[step] = (float(perm["delta"]), float(perm["se"]))
    return _Run(job, use, val, history, float(np.mean([v for _, v in history[-LAST_K:]])))


def _slope(history: list[tuple[int, float]], step: int) -> float:
    """Least-squares slope (nats per 1,000 steps) of the validation loss over evaluations in (step/2, step]."""
    pts = [(s, v) for s, v in history if step / 2 < s <= step]
    if len(pts) < 2:
        return 0.0
    s, v = np.array(pts, dtype=np.float64).T
    return float(np.polyfit(s / 1000, v, 1)[0])


def _cka_z(da, db, counts: np.ndarray, seed: int) -> float:
    res = cka_against_null(da.flatten(1), db.flatten(1), counts, seed=seed)
    return structure_z(res["cka"], res["null_mean"], res["null_sd"])


def _ablation(job: RunJob, step: int, data, windows: torch.Tensor) -> np.ndarray:
    """USED's truth for one run: the per-window loss change ``[n_w]`` at ``step`` when every row is replaced by
    its frequency bin's mean (:func:`ablation_losses`), on ``windows`` (disjoint from the use test's)."""
    ckpt = checkpoint_path(job.path, step)
    table = RunTable(find_table(ckpt), data)
    model = build_model(table.cfg.model, table.cfg.ple, seed=table.cfg.seed, ac=table.cfg.aux)
    load_model_weights(model, ckpt)
    iid = null_ids(table.cfg, data)
    return ablation_losses(model, windows, table.counts, batch=16, device=torch.device("cpu"), iid=iid,
                           table=model_table(model)).numpy()


def _structure(runs: list[_Run], step: int, data) -> list[tuple[int, int, float, dict[str, float]]]:
    """``(seed_a, seed_b, z, {stratum: z})`` for cyclic seed pairs of one configuration at ``step``; the strata
    (:data:`STRATA`) split the rows both seeds used at their median count, each with its own null."""
    seeds = [r.job.seed for r in runs]
    pairs = [(seeds[i], seeds[(i + 1) % len(seeds)]) for i in range(len(seeds))]
    tables = {r.job.seed: RunTable(find_table(checkpoint_path(r.job.path, step)), data) for r in runs}
    out = []
    for a, b in pairs:
        ta, tb = tables[a], tables[b]
        both = (ta.counts > 0) & (tb.counts > 0)
        da, db, counts = ta.delta[both], tb.delta[both], ta.counts[both]
        frequent = counts > np.median(counts)
        strata = {name: _cka_z(da[rows], db[rows], counts[rows], a)
                  for name, rows in zip(STRATA, (frequent, ~frequent)) if rows.sum() >= MIN_STRATUM_ROWS}
        out.append((a, b, _cka_z(da, db, counts, a), strata))
    return out


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
    recorded = [j.name for j in jobs if not folder_done(j)]
    if recorded:
        raise PlelabError(f"{folder}: {len(recorded)} runs are held only as records (e.g. {recorded[0]}), without the "
                          "checkpoints calibration reads at every decision point; calibrate where the run folders are")
    scale, _, corpus = folder.name.partition("-")
    every = spec.steps // DECISIONS
    steps = [every * k for k in range(1, DECISIONS + 1)]
    data = prepare_data(jobs[0].cfg, progress=False)
    by_arm: dict[str, list[_Run]] = {}
    for job in jobs:
        by_arm.setdefault(job.arm.name, []).append(_read_run(job, steps))
    missing = [a for a in REFERENCES.values() if "{" not in a and a not in by_arm]
    if missing:
        raise PlelabError(f"{folder} has no {missing[0]} arm (BENEFIT's no-PLE reference; a folder made before it "
                          "was added): rerun plelab calibrate with the same --out to train it")
    cfg = jobs[0].cfg
    windows = disjoint_val_windows(data.val, cfg.train.seq_len, cfg.train.diag_windows,
                                   avoid=cfg.train.eval_batches * cfg.train.batch_size)
    per_step = cfg.train.batch_size * cfg.train.seq_len
    calls: list[Call] = []
    bar = tqdm(total=len(by_arm) * len(steps), desc=f"calls {folder.name}", disable=not progress, leave=False)
    for arm_name, runs in by_arm.items():
        arm = runs[0].job.arm
        if arm.family in ("zero", "none"):
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
        ablation = ({} if arm.family in NOT_USED else
                    {s: _ablation(r.job, spec.steps, data, windows) for s, r in finals.items()})
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
            for a, b, z, strata in _structure(runs, step, data):
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
