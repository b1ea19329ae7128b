"""A sweep's runtime, stated before it starts, refined as runs finish, and checked against the wall clock after.

Each run's cost is its model FLOPs: training ``flops_per_token × steps × batch × seq_len``
(:func:`plelab.model.accounting.flops_per_token`) plus its evaluations' forward passes (a third of that per token).
The rate that turns FLOPs into seconds is *measured* — total FLOPs over total seconds of the sweep's
finished runs (for the runs this sweep watched, the seconds each run's worker took less the start-up priced apart;
for runs finished before, their ``summary.json`` wall time: the training loop with its evaluations,
diagnostics, checkpoints and visual parts) — or, before any run has finished on
a CPU, *probed* or *assumed*. A sweep the assumption puts over :data:`PROBE_ABOVE_S` times a few training steps of
its costliest text arm first (:func:`probe_rate`: seconds, on random ids, as one worker would run them) — the
FLOP/s of a step depend on its shapes, and the assumption, measured on tiny runs, erred 2× long on the long study;
smaller sweeps, and runs the probe cannot stand for (visual runs, bf16), keep :data:`ASSUMED_CORE_FLOPS` per
thread, never more threads than cores (BENCHMARKS.md, "Sweep runtime estimates"). Runs in parallel workers
share the wall clock, so the remaining time is the remaining FLOPs over ``workers × rate``, plus
:data:`RUN_OVERHEAD_S` of start-up per run left (what dominates tiny runs); a run resumed from a checkpoint owes
only its steps after it.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from plelab.config import RunConfig
from plelab.errors import PlelabError
from plelab.model.accounting import flops_per_token
from plelab.model.init import build_model
from plelab.runtime import available_cores
from plelab.sweeps.records import read_record
from plelab.training.checkpoint import list_checkpoints
from plelab.training.optim import build_optimizer

# Model FLOP/s one CPU thread sustains on the CPU-scale presets: the median 1-thread worker of the visual studies'
# cpu-tiny runs on a 2-core AMD EPYC measured 26.6 GFLOP/s (123 runs; bench/sweep_rates.py; BENCHMARKS.md, "Sweep
# runtime estimates").
ASSUMED_CORE_FLOPS = 27e9
# A worker's start-up per run — interpreter, imports, the prepared data from the cache — which FLOPs do not
# price: ≈ 4 s on the 2-core machines measured here (BENCHMARKS.md, "Sweep workers").
RUN_OVERHEAD_S = 4.0
# A sweep the assumed rate puts over this many seconds probes its rate first; the probe's training steps, after
# one warm-up step (their median is the step time).
PROBE_ABOVE_S = 600.0
PROBE_STEPS = 3


def probe_rate(cfg: RunConfig, threads: int, steps: int = PROBE_STEPS) -> float:
    """Model FLOP/s of one worker training ``cfg`` on ``threads`` CPU threads: the median of ``steps`` training
    steps (forward, backward over ``train.grad_accum`` micro-batches, AdamW), after a warm-up step, of its model
    on random ids of its batch shape. Evaluations and checkpoints are left out (a few % of a run)."""
    t, mc = cfg.train, cfg.model
    rows = (torch.arange(mc.vocab_size) % cfg.ple.resolved_vocab_size(mc)
            if cfg.ple.enabled and cfg.ple.vocab_remap == "frequency" else None)
    before = torch.get_num_threads()
    torch.set_flush_denormal(True)  # as every CPU worker trains (plelab.runtime.setup_torch)
    torch.set_num_threads(threads)
    try:
        model = build_model(mc, cfg.ple, seed=0, token_rows=rows)
        opt = build_optimizer(model, t)
        ids = torch.randint(0, mc.vocab_size, (t.batch_size // t.grad_accum, t.seq_len),
                            generator=torch.Generator().manual_seed(0))
        times = []
        for _ in range(steps + 1):
            start = time.perf_counter()
            for _ in range(t.grad_accum):
                model(ids, labels=ids, return_logits=False).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    flops = flops_per_token(mc, cfg.ple, t.seq_len) * t.batch_size * t.seq_len
    return flops / statistics.median(times[1:])


def run_flops(cfg: RunConfig) -> float:
    """Model FLOPs of one run: its training steps (forward + backward) and its evaluations (forward only)."""
    t = cfg.train
    per_token = flops_per_token(cfg.model, cfg.ple, t.seq_len)
    train = per_token * t.steps * t.batch_size * t.seq_len
    evals = -(-t.steps // t.eval_every)  # every eval_every steps and at the last (the trainer never evaluates step 0)
    return train + per_token / 3 * evals * t.eval_batches * t.batch_size * t.seq_len


def steps_done(path: Path) -> int:
    """The step of a run folder's newest complete checkpoint (what a resume starts from); 0 without one."""
    found = list_checkpoints(path)
    return int(found[-1].name.removeprefix("step-")) if found else 0


def finished_wall(path: Path) -> float | None:
    """A finished run's training seconds (``summary.json``, or its record's when the folder is gone), or None."""
    try:
        return float(json.loads((path / "summary.json").read_text())["wall_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        record = read_record(path)
        return None if record is None else float(record["summary"]["wall_seconds"])
    except (PlelabError, KeyError, TypeError, ValueError):
        return None


def duration(seconds: float) -> str:
    """``45 s`` | ``12 min`` | ``3 h 05 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class SweepClock:
    """The running estimate of one sweep, or of several (a study in pieces). ``jobs``: their
    :class:`~plelab.sweeps.runner.RunJob` lists (``.path``, ``.cfg``), each run known by its folder; ``done``:
    the folders already finished; ``workers`` run at once with ``threads`` each on ``device`` (``cpu`` |
    ``cuda``)."""

    def __init__(self, jobs: Sequence, done: set[Path], workers: int, threads: int, device: str,
                 cores: int | None = None, overhead: float = RUN_OVERHEAD_S) -> None:
        self.flops = {j.path: run_flops(j.cfg) for j in jobs}
        # what each unfinished run still owes: the steps after its newest checkpoint
        self.owed = {j.path: self.flops[j.path] * max(0.0, 1 - steps_done(j.path) / max(1, j.cfg.train.steps))
                     for j in jobs if j.path not in done}
        self.left = set(self.flops) - set(done)
        self.workers, self.threads, self.device = max(1, workers), max(1, threads), device
        self.cores, self.overhead = cores or available_cores(), overhead
        self.measured_flops = self.measured_seconds = 0.0
        self.measured_runs = 0
        self.probed: tuple[float, str] | None = None
        self.configs = {j.path: j.cfg for j in jobs}
        for j in jobs:
            if j.path in done:
                self.finished(j)

    def finished(self, job, elapsed: float | None = None) -> None:
        """Record a finished run: ``elapsed``, the seconds its worker took as this sweep watched it (less the
        start-up, priced apart), or else its summary's training wall time joins the measured rate."""
        self.left.discard(job.path)
        wall = finished_wall(job.path) if elapsed is None else max(0.1 * elapsed, elapsed - self.overhead)
        if wall and wall > 0:  # a run watched from a resume did only what it owed
            self.measured_flops += self.owed.get(job.path, self.flops[job.path]) if elapsed else self.flops[job.path]
            self.measured_seconds += wall
            self.measured_runs += 1

    def probe(self, log=None, above: float = PROBE_ABOVE_S) -> bool:
        """Before any run has finished, on a CPU, when the assumed rate puts what is left over ``above`` seconds:
        measure the rate on the unfinished text run that owes the most FLOPs (:func:`probe_rate`), saying so
        through ``log``. Returns whether it probed."""
        if self.measured_runs or self.device != "cpu" or not self.left or (self.remaining() or 0) <= above:
            return False
        probeable = [p for p in self.left if not self.configs[p].visual.enabled
                     and self.configs[p].train.precision in ("fp32", "auto")]
        if not probeable:
            return False
        path = max(probeable, key=lambda p: self.owed.get(p, 0.0))
        threads = max(1, int(min(self.threads, self.cores / self.workers)))
        name = f"{path.parent.name}/{path.name}" if path.parent.name else path.name
        if log:
            log(f"probing the rate: {PROBE_STEPS} training steps of {name} on {threads} thread(s)")
        rate = probe_rate(self.configs[path], threads)
        self.probed = rate, f"{rate / 1e9:.1f} GFLOP/s per worker probed ({PROBE_STEPS} training steps of {name})"
        return True

    def rate(self) -> tuple[float | None, str]:
        """FLOP/s of one worker and where the number comes from."""
        if self.measured_runs:
            r = self.measured_flops / self.measured_seconds
            return r, f"{r / 1e9:.1f} GFLOP/s per worker, measured on {self.measured_runs} finished run(s)"
        if self.probed is not None:
            return self.probed[0], self.probed[1] + "; refined as runs finish"
        if self.device == "cpu":
            threads = min(self.threads, self.cores / self.workers)  # workers beyond the cores share them
            r = ASSUMED_CORE_FLOPS * threads
            return r, f"{r / 1e9:.0f} GFLOP/s per worker assumed ({threads:g} thread(s)); refined as runs finish"
        return None, "no estimate on a GPU before its first run finishes"

    def remaining(self, groups: Sequence[Sequence[Path]] | None = None, workers: Sequence[int] | None = None
                  ) -> float | None:
        """Seconds left: the owed FLOPs over ``workers × rate``; with ``groups`` (sweeps run one after another),
        the sum over them, each with its own number of busy ``workers``."""
        r, _ = self.rate()
        if r is None:
            return None
        if groups is None:
            groups, workers = [list(self.left)], [self.workers]
        return sum((sum(self.owed.get(p, 0.0) for p in group if p in self.left) / r
                    + self.overhead * sum(p in self.left for p in group)) / w for group, w in zip(groups, workers))

    def estimate_line(self, groups: Sequence[Sequence[Path]] | None = None,
                      workers: Sequence[int] | None = None) -> str:
        """Before the sweep (or the ``groups`` of sweeps, see :meth:`remaining`): its remaining runtime, or why
        none is given."""
        if not self.left:
            return "nothing left to run"
        r, why = self.rate()
        left = self.remaining(groups, workers)
        if left is None:
            return f"runtime: {why}"
        flops = sum(self.owed.get(p, 0.0) for p in self.left)
        most = self.workers if workers is None else max(workers)
        return (f"estimated runtime {duration(left)}: {len(self.left)} run(s), {flops:.3g} model FLOPs over "
                f"{most} worker(s) at {why}")

    def left_line(self) -> str:
        """After a run finishes: what is left, e.g. ``57 left, ≈ 1 h 26 min``."""
        left = self.remaining()
        if not self.left:
            return "none left"
        return f"{len(self.left)} left" + ("" if left is None else f", ≈ {duration(left)}")
