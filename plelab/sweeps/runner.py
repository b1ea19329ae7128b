"""Running a sweep: resumable, in-process or as parallel worker processes, or as cluster scripts.

Each run is a folder ``SWEEP/runs/{arm}/seed-{k}`` whose ``config.json`` is written before it
starts, so every way of running it is the same command: ``plelab train --out RUN --resume``
(which reads the saved config). A run is *done* when its ``summary.json`` reports the full step
count, or when the sweep holds its record instead (:mod:`plelab.sweeps.records`, written as each run finishes: a
study carried to another machine without its weights); a run with checkpoints resumes from the newest; a finished
run is never redone.

- ``jobs=1``: runs one after another in this process (the tokenised corpus is loaded once);
- ``jobs=N``: N worker processes with ``cores // N`` threads each (on 2 cores, a two-run
  ``cpu-sweep`` sweep finishes 1.13× sooner with two 1-thread workers: ``bench/sweep_jobs.py``);
- ``emit="torchrun"`` / ``"slurm"``: write the per-run commands / a Slurm array script instead
  (:mod:`plelab.sweeps.cluster`).

A lock file keeps two sweep processes out of the same folder, and each run's own lock (:mod:`plelab.locks`) keeps
two trainers out of one run folder. A worker gets the sweep's PID (:data:`plelab.locks.PARENT_ENV`) and stops at its
next step once the sweep is gone, even by ``kill -9``, which leaves no chance to stop it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from plelab.config import RunConfig
from plelab.errors import PlelabError
from plelab.io import ensure_dir, write_json
from plelab.locks import PARENT_ENV, FolderLock
from plelab.precision import PrecisionChoice, study_precision
from plelab.runs import make_trainer, prepare_data, warm_caches
from plelab.runtime import available_cores, resolve_device
from plelab.sweeps.analysis_plan import stamp_run
from plelab.sweeps.configs import base_config, run_config, sweep_precision
from plelab.sweeps.eta import SweepClock, duration
from plelab.sweeps.records import read_record, record_path, write_record
from plelab.sweeps.spec import Arm, SweepSpec, run_dir, save_spec
from plelab.training.run_precision import legacy_precision, recorded_precision, with_precision
from plelab.training.task import task_kind


@dataclass
class RunJob:
    arm: Arm
    seed: int
    path: Path
    cfg: RunConfig
    every_checkpoint: bool = False  # its record keeps every periodic checkpoint (a calibrate regime's decision points)

    @property
    def name(self) -> str:
        return f"{self.arm.name}/seed-{self.seed}"


def _saved_or_resolved(spec: SweepSpec, arm: Arm, seed: int, path: Path, study: str | None) -> RunConfig:
    """A started run's own ``config.json`` (what it was trained with, even if a preset changed since), else the one
    its record holds (:mod:`plelab.sweeps.records`: a finished run carried without its folder)."""
    saved = path / "config.json"
    if not saved.exists():
        record = read_record(path)
        if record is None:
            return run_config(spec, arm, seed, study)
        try:
            return RunConfig.from_dict(record["summary"]["config"])
        except (KeyError, TypeError, PlelabError) as err:
            raise PlelabError(f"{record_path(path)} holds no valid config ({err}); delete it to rerun that run"
                              ) from None
    try:
        return RunConfig.from_dict(json.loads(saved.read_text()))
    except (OSError, ValueError, PlelabError) as err:
        raise PlelabError(f"{saved} is unreadable ({err}); delete that run folder and rerun the sweep") from None


def jobs_of(root: Path, spec: SweepSpec, study: str | None = None) -> list[RunJob]:
    """Every run of the sweep (seeds outer, so that the first finished seed pairs every arm); an unstarted run in
    the study precision ``study`` (see :func:`run_config`). A calibrate regime runs arm by arm instead (seeds
    inner): its calls need every seed of an arm, and a finished arm can be carried to another machine
    (:mod:`plelab.calibration.evidence`) while the others are still to run."""
    by_arm = spec.kind == "calibrate"
    order = ([(seed, arm) for arm in spec.runnable() for seed in spec.seeds] if by_arm else
             [(seed, arm) for seed in spec.seeds for arm in spec.runnable()])
    jobs = []
    for seed, arm in order:
        path = run_dir(root, arm.name, seed)
        jobs.append(RunJob(arm, seed, path, _saved_or_resolved(spec, arm, seed, path, study), by_arm))
    return jobs


def data_key(cfg: RunConfig) -> str:
    """Runs with equal keys share one prepared data set (tokenised corpus, or visual data and IDs)."""
    kind = task_kind(cfg)
    return json.dumps([cfg.kind, cfg.data.__dict__, cfg.model.vocab_size if kind.text_model else None,
                       kind.data_key(cfg)], sort_keys=True, default=str)


def folder_done(job: RunJob) -> bool:
    """Whether the run's folder holds the finished run (its ``summary.json`` reports the full step count)."""
    try:
        return json.loads((job.path / "summary.json").read_text()).get("steps", 0) >= job.cfg.train.steps
    except (OSError, ValueError, AttributeError):
        return False


def run_state(job: RunJob) -> str:
    """``done`` (its folder, or its record without the folder, holds the finished run), ``partial`` (has started:
    resumes) or ``new``."""
    if folder_done(job):
        return "done"
    if (job.path / "checkpoints").exists() or (job.path / "metrics.jsonl").exists():
        return "partial"
    record = read_record(job.path)
    if record is not None and int(record["summary"].get("steps", 0)) >= job.cfg.train.steps:
        return "done"
    return "new"


def record_finished(job: RunJob) -> None:
    """Write the finished run's record (:mod:`plelab.sweeps.records`) with its early and final checkpoints (and
    every periodic one, for a calibrate regime's run)."""
    train = job.cfg.train
    every = range(train.checkpoint_every, train.steps + 1, train.checkpoint_every) if (
        job.every_checkpoint and train.checkpoint_every) else ()
    write_record(job.path, (train.early_checkpoint, *every, train.steps))


@contextmanager
def sweep_lock(root: Path):
    """Hold the sweep folder's lock (``SWEEP/.lock``, :class:`~plelab.locks.FolderLock`: the holder's PID named in a
    refusal, a dead holder never blocking) while the block runs."""
    ensure_dir(root, "sweep folder", "choose another --out")
    lock = FolderLock.acquire(root, name=".lock", what="sweep folder",
                              fix="wait for that sweep or choose another --out")
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def prepare_runs(root: Path, spec: SweepSpec, study: str | None = None) -> list[RunJob]:
    jobs = jobs_of(root, spec, study)  # resolves (and so validates) every run's config before anything is written
    plan = save_spec(root, spec).plan
    for job in jobs:
        state = run_state(job)
        if state == "new":  # the plan's hash goes in before the run can start (a started run keeps what it had)
            stamp_run(job.path, plan)
        cfg_file = job.path / "config.json"
        if not cfg_file.exists() and state != "done":  # a recorded run needs no folder
            write_json(cfg_file, job.cfg.to_dict())
    return jobs


def train_command(job: RunJob, threads: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "plelab", "train", "--out", str(job.path), "--resume", "--no-progress"]
    return cmd + (["--set", f"train.threads={threads}"] if threads else [])


def worker_env() -> dict[str, str]:
    """A worker's environment: this one, with this process's PID in :data:`~plelab.locks.PARENT_ENV`, so that the
    worker stops once this sweep is gone (:class:`~plelab.locks.ParentWatch`)."""
    return {**os.environ, PARENT_ENV: str(os.getpid())}


def say(*args) -> None:
    print(*args, flush=True)  # visible at once in a redirected log of a long sweep


def _device(spec: SweepSpec):
    """The torch.device the sweep's base config trains on."""
    return resolve_device(base_config(spec).train.device)


def _precision_line(choice: PrecisionChoice, jobs: list[RunJob], device) -> str:
    """What the study trains in, once: the study's precision and why, and the arms that differ."""
    # a run started before precision was resolved recorded "auto" (fp32 on CPU, bf16 on CUDA)
    other = sorted({j.arm.name for j in jobs if legacy_precision(j.cfg.train.precision, device) != choice.resolved})
    return (f"precision {choice.resolved} — {choice.reason}" +
            (f"; arms with their own: {', '.join(other)}" if other else ""))


def study_estimate(plans: list[tuple[Path, SweepSpec]], jobs: int, log=None) -> str:
    """The runtime line of a study run as several sweeps, one after another (``(folder, spec)`` each), before any
    of them starts: one :class:`~plelab.sweeps.eta.SweepClock` over all their runs (probing its rate when the
    study is long and nothing has finished, saying so through ``log``)."""
    pieces = [jobs_of(Path(root), spec) for root, spec in plans]
    every = [j for piece in pieces for j in piece]
    done = {j.path for j in every if run_state(j) == "done"}
    clock = SweepClock(every, done, jobs, max(1, available_cores() // jobs), _device(plans[0][1]).type)
    clock.probe(log)
    # the sweeps run one after another: each keeps at most as many workers busy as it has runs left
    busy = [max(1, min(jobs, sum(j.path not in done for j in piece))) for piece in pieces]
    return f"the whole study, {len(plans)} sweep(s): " + clock.estimate_line(
        [[j.path for j in piece] for piece in pieces], busy)


def run_sweep(root: str | Path, spec: SweepSpec, jobs: int = 1, progress: bool = True, log=say) -> list[RunJob]:
    """Run every unfinished run of ``spec`` in ``root``; return all runs. Raises if any run failed. Says the
    estimated runtime before (:class:`~plelab.sweeps.eta.SweepClock`), what is left after each run, and the
    measured wall time at the end."""
    root = Path(root)
    with sweep_lock(root):
        choice = sweep_precision(root, spec)
        all_jobs = prepare_runs(root, spec, choice.resolved)
        todo = [j for j in all_jobs if run_state(j) != "done"]
        done = len(all_jobs) - len(todo)
        log(f"sweep {root}: {len(all_jobs)} runs ({len(spec.runnable())} arms × {len(spec.seeds)} seeds), "
            f"{done} already done, {len(todo)} to run" + (f" in {jobs} worker processes" if jobs > 1 and todo else ""))
        device = _device(spec)
        log(_precision_line(choice, all_jobs, device))
        workers = max(1, min(jobs, len(todo)))
        clock = SweepClock(all_jobs, {j.path for j in all_jobs} - {j.path for j in todo}, workers,
                           max(1, available_cores() // jobs), device.type)  # the threads _run_workers gives each
        if todo:
            clock.probe(log)
        estimate = clock.remaining()
        if todo:
            log(clock.estimate_line())
        bar = tqdm(total=len(all_jobs), initial=done, desc="sweep runs", unit="run", disable=not progress,
                   dynamic_ncols=True)
        started = time.perf_counter()
        try:
            if jobs <= 1:
                _run_in_process(todo, bar, progress, log, clock)
            else:
                _run_workers(todo, jobs, bar, bar.write if progress else log, clock)
        finally:
            bar.close()
        if todo:
            log(f"sweep wall time {duration(time.perf_counter() - started)} for {len(todo)} run(s)"
                + (f" (estimated {duration(estimate)} at the start)" if estimate is not None else ""))
    return all_jobs


def _run_in_process(todo: list[RunJob], bar, progress: bool, log, clock: SweepClock) -> None:
    data_cache: dict[str, object] = {}
    for job in todo:
        key = data_key(job.cfg)
        if key not in data_cache:
            data_cache[key] = prepare_data(job.cfg, progress=progress)
        start = time.perf_counter()
        result = make_trainer(job.cfg, data_cache[key], job.path, resume=True, progress=progress,
                              log=lambda *a: None).fit()
        bar.update(1)
        record_finished(job)
        clock.finished(job, time.perf_counter() - start)
        tail = f"val {result.final_val_loss:.4f}" if result.val_history else "done"
        (bar.write if progress else log)(f"  {job.name}: {tail} ({time.perf_counter() - start:.0f} s; "
                                         f"{clock.left_line()})")


class SweepStopped(PlelabError):
    """The sweep process got SIGTERM or SIGHUP (``kill``, ``scancel``, a closed terminal): its workers are
    stopped before it exits, so no run goes on training without it."""

    exit_code = 143


@contextmanager
def _stop_on_signals():
    """Turn SIGTERM / SIGHUP into :class:`SweepStopped` while the workers run, so the ``finally`` that stops
    them runs too (the default action would end this process and leave them training, orphaned)."""
    def stop(signum, _frame):
        raise SweepStopped(f"stopped by {signal.Signals(signum).name}: the running workers were stopped; rerun the "
                           "same command to resume (finished runs are kept, the others resume from their checkpoints)")
    names = [s for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)]
    before = {n: signal.signal(getattr(signal, n), stop) for n in names}
    try:
        yield
    finally:
        for n, handler in before.items():
            signal.signal(getattr(signal, n), handler)


def _run_workers(todo: list[RunJob], jobs: int, bar, report, clock: SweepClock) -> None:
    guard = _stop_on_signals() if threading.current_thread() is threading.main_thread() else nullcontext()
    with guard:
        _watch_workers(todo, jobs, bar, report, clock)


def _watch_workers(todo: list[RunJob], jobs: int, bar, report, clock: SweepClock) -> None:
    for cfg in {data_key(j.cfg): j.cfg for j in todo}.values():  # fill the caches once here, not in every worker
        warm_caches(cfg)
    threads = max(1, available_cores() // jobs)
    pending, active, failed = list(todo), [], []
    try:
        while pending or active:
            while pending and len(active) < jobs:
                job = pending.pop(0)
                job.path.mkdir(parents=True, exist_ok=True)
                fh = open(job.path / "train.log", "a")
                try:
                    proc = subprocess.Popen(train_command(job, threads), stdout=fh, stderr=subprocess.STDOUT,
                                            env=worker_env())
                except OSError as err:
                    fh.close()
                    raise PlelabError(f"cannot start a worker for {job.name}: {err}") from None
                active.append((job, proc, fh, time.perf_counter()))
            time.sleep(0.2)
            for item in list(active):
                job, proc, fh, start = item
                if proc.poll() is None:
                    continue
                fh.close()
                active.remove(item)
                bar.update(1)
                if proc.returncode != 0:
                    failed.append(job)
                    report(f"  {job.name}: FAILED (exit {proc.returncode}); see {job.path / 'train.log'}")
                else:
                    record_finished(job)
                    clock.finished(job, time.perf_counter() - start)
                    report(f"  {job.name}: done ({time.perf_counter() - start:.0f} s; {clock.left_line()})")
    finally:
        for job, proc, fh, _ in active:  # interrupted: stop the workers; their runs resume next time
            proc.terminate()
            proc.wait()
            fh.close()
    if failed:
        raise PlelabError(f"{len(failed)} run(s) failed, first {failed[0].name}: see {failed[0].path / 'train.log'}; "
                          "fix the cause and rerun the same command (finished runs are kept)")
