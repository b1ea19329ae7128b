"""A finished run without its weights: one small record per run, so that a study can move between machines.

A long study runs in pieces, and the machine of one piece need not keep its disk for the next one (a CPU box that
is reset, a cluster whose scratch is purged, a laptop that only analyses). A run folder is mostly weights; what a
sweep's report reads from it is small. A record keeps exactly that::

    SWEEP/records/{arm}/seed-{k}.json.gz
    {"format": "plelab-run-record", "version": 1,
     "summary": summary.json,
     "metrics": the metrics.jsonl rows as the report reads them: {step, val_loss}, {step, ood_loss}, {step, loss},
                {step, diag},
     "step_seconds": the median training step's wall time (records written before it: absent),
     "checkpoints": {step: {"diagnostics": diagnostics.json or null, "row_counts": [...] or null}},
     "plan": the run's plan.json (the sweep's analysis plan hash, when it was declared and the run prepared) or null}

for the checkpoints the report reads (the early one and the final one; every periodic checkpoint of a calibrate
regime's run, whose calls read each decision point's use test). The runner writes a run's record as soon
as the run finishes; :func:`pack` writes the missing ones of a sweep (or of every sweep under a folder) and copies
``sweep.json`` and the records to another folder — a few tens of kB per run, small enough to commit.

A sweep folder holding a run's record counts that run as finished (the runner never redoes it) and reads its
results from the record when its folder is gone. What a record cannot carry is the table itself: the cross-seed
structure test compares the seeds' tables, so it is read only on runs whose checkpoints are present (a calibrate
regime's finished arms carry what their calls need from the tables as ``evidence/``:
:mod:`plelab.calibration.evidence`).
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from safetensors import safe_open

from plelab.errors import PlelabError
from plelab.io import atomic_write, json_safe

FORMAT, VERSION = "plelab-run-record", 1
SUFFIX = ".json.gz"
RUN_PLAN = "plan.json"  # the analysis plan's stamp in a run folder (plelab.sweeps.analysis_plan)


def record_path(run: Path) -> Path:
    """``SWEEP/records/{arm}/seed-{k}.json.gz`` of the run folder ``SWEEP/runs/{arm}/seed-{k}``."""
    run = Path(run)
    return run.parent.parent.parent / "records" / run.parent.name / (run.name + SUFFIX)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file; none if it is missing or unreadable (a run deleted halfway)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash
    return rows


def read_checkpoint_diagnostics(ckpt: Path) -> dict | None:
    """A checkpoint's ``diagnostics.json`` (the use test), or None."""
    try:
        return json.loads((ckpt / "diagnostics.json").read_text())
    except (OSError, ValueError):
        return None


def checkpoint_row_counts(ckpt: Path) -> np.ndarray | None:
    """The per-row token counts the trainer keeps in a checkpoint's optimizer file (``diag.row_counts``), or None."""
    try:
        with safe_open(str(ckpt / "optimizer.safetensors"), framework="pt") as f:
            if "diag.row_counts" not in f.keys():
                return None
            return f.get_tensor("diag.row_counts").numpy()
    except Exception:  # a damaged or foreign file: the count is simply not reported
        return None


def _report_rows(rows: list[dict]) -> list[dict]:
    """The metrics rows with only the keys a report reads."""
    out = []
    for r in rows:
        if "step" not in r:
            continue
        for key in ("val_loss", "ood_loss", "loss", "diag"):
            if key in r:
                out.append({"step": r["step"], key: r[key]})
    return out


def median_step_seconds(rows: list[dict], skip: int = 5) -> float | None:
    """The median training step's wall time (s) from the metrics rows (each step's tokens over its tokens/s; the
    first ``skip`` steps, warming up, left out): the step time the wall-clock comparison reads, without the
    evaluations and checkpoint diagnostics a run also spends time on. None when the rows do not say."""
    times = [r["tokens"] / r["step"] / r["tokens_per_second"] for r in rows
             if r.get("step", 0) > skip and r.get("tokens") and r.get("tokens_per_second")]
    return float(np.median(times)) if times else None


def write_record(run: Path, steps: tuple[int, ...]) -> Path:
    """Write the record of the finished run folder ``run``, with the checkpoints at ``steps`` that exist."""
    run = Path(run)
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError) as err:
        raise PlelabError(f"{run} has no readable summary.json ({err}); only a finished run has a record") from None
    ckpts = {}
    for step in sorted({s for s in steps if s}):
        ckpt = run / "checkpoints" / f"step-{step:06d}"
        if ckpt.is_dir():
            counts = checkpoint_row_counts(ckpt)
            ckpts[str(step)] = {"diagnostics": read_checkpoint_diagnostics(ckpt),
                                "row_counts": None if counts is None else counts.tolist()}
    try:
        plan = json.loads((run / RUN_PLAN).read_text())
    except (OSError, ValueError):
        plan = None  # a run of a sweep made before plelab fixed analysis plans
    rows = read_jsonl(run / "metrics.jsonl")
    body = {"format": FORMAT, "version": VERSION, "summary": summary, "metrics": _report_rows(rows),
            "step_seconds": median_step_seconds(rows), "checkpoints": ckpts, "plan": plan}
    data = gzip.compress(json.dumps(json_safe(body), separators=(",", ":")).encode(), mtime=0)
    return atomic_write(record_path(run), lambda p: p.write_bytes(data))


def read_record(run: Path) -> dict | None:
    """The record of run folder ``run`` (see the module docstring), or None if it has none."""
    path = record_path(run)
    if not path.is_file():
        return None
    try:
        body = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError) as err:
        raise PlelabError(f"{path} is not a readable run record ({err}); delete it to rerun that run") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise PlelabError(f"{path} is not a plelab run record; delete it to rerun that run")
    if body.get("version") != VERSION:
        raise PlelabError(f"{path} is a run record of version {body.get('version')}, this plelab reads version "
                          f"{VERSION}; upgrade plelab or delete the record to rerun that run")
    return body


def recorded_steps(run: Path) -> int:
    """The step count of the run's record (0: no record)."""
    body = read_record(run)
    return int(body["summary"].get("steps", 0)) if body else 0


def sweep_roots(folder: Path) -> list[Path]:
    """``folder`` and every sweep folder under it (each holds a ``sweep.json``), outermost first."""
    folder = Path(folder)
    return sorted({p.parent for p in folder.rglob("sweep.json")}, key=lambda p: (len(p.parts), str(p)))


CARRIED = ("records/*/*" + SUFFIX, "evidence/*.json")  # what a pack copies besides sweep.json


def copy_records(src: Path, dest: Path, skip: Sequence[Path] = ()) -> int:
    """Copy every sweep's ``sweep.json``, ``records/`` and ``evidence/`` (a calibrate regime's finished arms) under
    ``src`` to the same place under ``dest``, except the records in ``skip``; the number of records copied."""
    src, dest = Path(src), Path(dest)
    count, skipped = 0, {Path(p).resolve() for p in skip}
    for root in sweep_roots(src):
        target = dest / root.relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        atomic_write(target / "sweep.json", lambda p, s=root / "sweep.json": shutil.copyfile(s, p))
        for pattern in CARRIED:
            for rec in sorted(root.glob(pattern)):
                if rec.resolve() in skipped:
                    continue
                out = target / rec.relative_to(root)
                out.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(out, lambda p, s=rec: shutil.copyfile(s, p))
                count += rec.name.endswith(SUFFIX)
    return count


__all__ = ["FORMAT", "RUN_PLAN", "VERSION", "checkpoint_row_counts", "copy_records", "read_checkpoint_diagnostics",
           "read_jsonl", "read_record", "record_path", "recorded_steps", "sweep_roots", "write_record"]
