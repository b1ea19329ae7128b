"""What a calibrate regime's calls read from its weights, kept so the regime can finish on another machine.

A calibrate regime (the benchmark's ``{scale}-{corpus}`` or a validation's ``{rung}-{corpus}``) is scored only when
every run has finished, and its calls read weights: LEARNED compares two seeds' tables (W_t − W_0) at every decision
point, USED's truth ablates the other seeds' final checkpoints. A regime that takes longer than its machine lives
(a validation rung is hours on 2 cores) loses those weights with the machine. So once every seed of an arm has
finished, the numbers its calls need from the weights are computed once and written beside the run records::

    REGIME/evidence/{arm}.json
    {"format": "plelab-arm-evidence", "version": 1, "arm": name, "seeds": [...], "steps": [...],
     "structure": {step: [[seed_a, seed_b, z, {stratum: z}], ...]},   # LEARNED: cyclic seed pairs
     "ablation": {seed: [per-window loss change]}}                      # USED's truth ({} where it is by construction)

These are exactly what :func:`plelab.calibration.features.regime_calls` computes from the weights (the same
functions), so calls from evidence equal calls from the run folders. With the run records (every decision point's
use test; :mod:`plelab.sweeps.records`) they let ``plelab pack`` carry a half-finished regime: the next machine
trains only the arms that had not finished. Calibrate regimes train arm by arm (seeds inner) for this reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from plelab.calibration.benchmark import decision_steps
from plelab.calibration.truth import NOT_USED
from plelab.data.tokens import disjoint_val_windows
from plelab.diagnostics.agreement import cka_against_null
from plelab.diagnostics.diagnose import RunTable
from plelab.diagnostics.tables import find_table
from plelab.diagnostics.usage import ablation_losses
from plelab.diagnostics.verdict import structure_z
from plelab.errors import PlelabError
from plelab.io import atomic_write, json_safe
from plelab.model.init import build_model
from plelab.model.tables import model_table
from plelab.runs import prepare_data
from plelab.sweeps.records import record_path
from plelab.sweeps.results import checkpoint_path
from plelab.sweeps.runner import RunJob, folder_done, jobs_of
from plelab.sweeps.spec import load_spec
from plelab.training.checkpoint import load_model_weights
from plelab.training.rows import null_ids

FORMAT, VERSION, FOLDER = "plelab-arm-evidence", 1, "evidence"
STRATA = ("frequent", "rare")  # the rows above / at or below the median count of the rows both seeds used
MIN_STRATUM_ROWS = 8
UNCALLED = ("zero", "none")  # BENEFIT's references: read only from metrics, never called


def evidence_path(regime: Path, arm: str) -> Path:
    return Path(regime) / FOLDER / f"{arm}.json"


def _cka_z(da, db, counts: np.ndarray, seed: int) -> float:
    res = cka_against_null(da.flatten(1), db.flatten(1), counts, seed=seed)
    return structure_z(res["cka"], res["null_mean"], res["null_sd"])


def structure(jobs: list[RunJob], step: int, data) -> list[list]:
    """``[seed_a, seed_b, z, {stratum: z}]`` for cyclic seed pairs of one configuration at ``step``; the strata
    (:data:`STRATA`) split the rows both seeds used at their median count, each with its own null."""
    seeds = [j.seed for j in jobs]
    pairs = [(seeds[i], seeds[(i + 1) % len(seeds)]) for i in range(len(seeds))]
    tables = {j.seed: RunTable(find_table(checkpoint_path(j.path, step)), data) for j in jobs}
    out = []
    for a, b in pairs:
        ta, tb = tables[a], tables[b]
        both = (ta.counts > 0) & (tb.counts > 0)
        da, db, counts = ta.delta[both], tb.delta[both], ta.counts[both]
        frequent = counts > np.median(counts)
        strata = {name: _cka_z(da[rows], db[rows], counts[rows], a)
                  for name, rows in zip(STRATA, (frequent, ~frequent)) if rows.sum() >= MIN_STRATUM_ROWS}
        out.append([a, b, _cka_z(da, db, counts, a), strata])
    return out


def ablation(job: RunJob, step: int, data, windows: torch.Tensor) -> np.ndarray:
    """USED's truth for one run: the per-window loss change ``[n_w]`` at ``step`` when every row is replaced by
    its frequency bin's mean (:func:`ablation_losses`), on ``windows`` (disjoint from the use test's)."""
    ckpt = checkpoint_path(job.path, step)
    table = RunTable(find_table(ckpt), data)
    model = build_model(table.cfg.model, table.cfg.ple, seed=table.cfg.seed, ac=table.cfg.aux)
    load_model_weights(model, ckpt)
    return ablation_losses(model, windows, table.counts, batch=16, device=torch.device("cpu"),
                           iid=null_ids(table.cfg, data), table=model_table(model)).numpy()


def truth_windows(cfg, data) -> torch.Tensor:
    """The validation windows USED's truth reads: disjoint from every evaluation and use-test window."""
    return disjoint_val_windows(data.val, cfg.train.seq_len, cfg.train.diag_windows,
                                avoid=cfg.train.eval_batches * cfg.train.batch_size)


def compute(jobs: list[RunJob], steps: list[int], data, windows: torch.Tensor) -> dict:
    """The evidence of one arm (``jobs``: its runs, finished, with their checkpoints)."""
    family = jobs[0].arm.family
    return {"format": FORMAT, "version": VERSION, "arm": jobs[0].arm.name, "seeds": [j.seed for j in jobs],
            "steps": list(steps),
            "structure": {str(s): structure(jobs, s, data) for s in steps},
            "ablation": {} if family in NOT_USED else
            {str(j.seed): ablation(j, steps[-1], data, windows).tolist() for j in jobs}}


def read(regime: Path, arm: str, seeds: list[int], steps: list[int]) -> dict | None:
    """The arm's evidence, or None if it has none; a file for other seeds or steps is refused in one line."""
    path = evidence_path(regime, arm)
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise PlelabError(f"{path} is not readable arm evidence ({err}); delete it and rerun where the arm's run "
                          "folders are (or retrain the arm)") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("version") != VERSION:
        raise PlelabError(f"{path} is not plelab arm evidence of version {VERSION}; delete it and rerun where the "
                          "arm's run folders are")
    if body.get("seeds") != list(seeds) or body.get("steps") != list(steps):
        raise PlelabError(f"{path} holds seeds {body.get('seeds')} at steps {body.get('steps')}, the regime has "
                          f"seeds {list(seeds)} at steps {list(steps)}: it belongs to another design; delete it")
    return body


def _arms(regime: Path) -> dict[str, list[RunJob]]:
    """The runs of the calibrate regime ``regime`` by arm, for the called arms only (BENEFIT's references need no
    evidence: their metrics are in the records)."""
    spec = load_spec(regime)
    if spec is None or spec.kind != "calibrate":
        raise PlelabError(f"{regime} is not a plelab calibrate regime (no sweep.json of kind 'calibrate')")
    by_arm: dict[str, list[RunJob]] = {}
    for job in jobs_of(regime, spec):
        if job.arm.family not in UNCALLED:
            by_arm.setdefault(job.arm.name, []).append(job)
    return by_arm


def write_evidence(regime: str | Path, arms: dict[str, list[RunJob]] | None = None) -> int:
    """Write the evidence of every called arm of ``regime`` (``arms``: :func:`_arms`, read when not given) whose
    runs have all finished with their folders and that has none yet; the number written. Arms still training (or
    held only as records without evidence) are left."""
    regime = Path(regime)
    arms = _arms(regime) if arms is None else arms
    todo = [jobs for name, jobs in arms.items()
            if all(folder_done(j) for j in jobs) and not evidence_path(regime, name).is_file()]
    if not todo:
        return 0
    cfg = todo[0][0].cfg
    data = prepare_data(cfg, progress=False)
    windows = truth_windows(cfg, data)
    for jobs in todo:
        body = compute(jobs, decision_steps(cfg.train.steps), data, windows)
        atomic_write(evidence_path(regime, jobs[0].arm.name),
                     lambda p, b=body: p.write_text(json.dumps(json_safe(b), separators=(",", ":"))))
    return len(todo)


def carry(regime: Path) -> tuple[int, list[Path]]:
    """``plelab pack``'s hook for a calibrate regime (:data:`plelab.sweeps.commands.CARRY_MODULES`): write the
    evidence of every finished arm, and name the records *not* to carry — those of a called arm that has no
    evidence (some seed unfinished): carried, its finished seeds would count as done elsewhere while their weights,
    which the arm's evidence needs, stay behind; left, they train again with the rest of the arm."""
    arms = _arms(regime)
    written = write_evidence(regime, arms)
    held = [record_path(j.path) for name, jobs in arms.items() if not evidence_path(regime, name).is_file()
            for j in jobs]
    return written, held


__all__ = ["FOLDER", "FORMAT", "UNCALLED", "VERSION", "carry", "compute", "evidence_path", "read", "truth_windows",
           "write_evidence"]
