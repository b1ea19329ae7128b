"""A sweep's runtime, stated before it starts, refined as runs finish, and checked against the wall clock after.

Each run's cost is its model FLOPs: training ``flops_per_token × steps × batch × seq_len``
(:func:`plelab.model.accounting.flops_per_token`) plus its evaluations' forward passes (a third of that per token).
The rate that turns FLOPs into seconds is kept per *shape* (:func:`shape_key`: model, PLE, batch
shape, precision — a step's FLOP/s depend on them; on the long study they span 2×). A run is priced at the
rate *measured* on finished runs of its shape — total FLOPs over total seconds (for runs this sweep watched, the
seconds their worker took less the start-up priced apart; for runs finished before, their ``summary.json`` wall
time: the training loop with its evaluations, diagnostics, checkpoints and visual parts) — else the rate
*probed* on its shape, else the rate measured on every finished run, else the median rate probed on other shapes
(for runs a probe could stand for), else the *assumed* rate. A CPU sweep whose
unmeasured shapes owe over :data:`PROBE_ABOVE_S` probes up to :data:`PROBE_SHAPES` of them first (costliest
first; :func:`probe_rate`: a few training steps on random ids, as one worker would run them — the assumption,
measured on tiny runs, erred 2× long on the long study); runs the probe cannot stand for (visual runs, bf16)
keep :data:`ASSUMED_CORE_FLOPS` per thread, never more threads than cores (BENCHMARKS.md, "Sweep runtime
estimates"). Runs in parallel workers share the wall clock, so the remaining time is the sum of each run's owed
FLOPs over its rate, plus :data:`RUN_OVERHEAD_S` of start-up per run (what dominates tiny runs), over the
workers; a run resumed from a checkpoint owes only its steps after it.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from plelab.config import RunConfig
from plelab.errors import PlelabError
from plelab.model.accounting import flops_per_token
from plelab.model.init import build_model
from plelab.model.tables import table_view
from plelab.runtime import available_cores
from plelab.sweeps.records import read_record
from plelab.training.checkpoint import list_checkpoints
from plelab.training.optim import build_optimizer
from plelab.training.rows import iid_slots
from plelab.training.task import task_kind

# Model FLOP/s one CPU thread sustains on the CPU-scale presets: the median 1-thread worker of the visual studies'
# cpu-tiny runs on a 2-core AMD EPYC measured 26.6 GFLOP/s (123 runs; bench/sweep_rates.py; BENCHMARKS.md, "Sweep
# runtime estimates").
ASSUMED_CORE_FLOPS = 27e9
# A worker's start-up per run — interpreter, imports, the prepared data from the cache — which FLOPs do not
# price: ≈ 4 s on the 2-core machines measured here (BENCHMARKS.md, "Sweep workers").
RUN_OVERHEAD_S = 4.0
# A sweep the assumed rate puts over this many seconds probes its rate first: the probe's training steps, after
# PROBE_WARMUP warm-up steps (their median is the step time). On the long study's dP 0 shape the second step ran
# 16% below the later median, and single steps after it spread 48–68 GFLOP/s (BENCHMARKS.md, "Sweep runtime
# estimates").
PROBE_ABOVE_S = 600.0
PROBE_WARMUP = 2
PROBE_STEPS = 5
# at most this many shapes probed per clock (the costliest first; the rest priced at the probed shapes' median):
# the long study holds 23 shapes, probed in 48 s on a 2-core Intel Xeon
PROBE_SHAPES = 32


def probe_table_ids(cfg: RunConfig, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Rows for the ``iid`` control of PLE (``ple.ids``) or of another kind (``aux.ids``), drawn uniformly apart
    from the tokens (the same lookups, so the same FLOPs; the run draws them by frequency): ``[B,T]``, or
    ``[B,T,S]`` buckets for the n-gram table; None for a table keyed by its real ids."""
    slots = iid_slots(cfg)
    if slots is None:
        return None
    rows = table_view(cfg.model, cfg.ple, cfg.aux).rows
    return torch.randint(0, rows, (*ids.shape, slots) if slots > 1 else ids.shape, generator=gen)


def probe_rate(cfg: RunConfig, threads: int, steps: int = PROBE_STEPS) -> float:
    """Model FLOP/s of one worker training ``cfg`` on ``threads`` CPU threads: the median of ``steps`` training
    steps (forward, backward over ``train.grad_accum`` micro-batches, AdamW), after :data:`PROBE_WARMUP` warm-up
    steps, of its model on random ids of its batch shape (and random table rows for the ``iid`` control).
    Evaluations and checkpoints are left out (a few % of a run)."""
    t, mc = cfg.train, cfg.model
    rows = (torch.arange(mc.vocab_size) % cfg.ple.resolved_vocab_size(mc)
            if cfg.ple.enabled and cfg.ple.vocab_remap == "frequency" else None)
    before = torch.get_num_threads()
    torch.set_flush_denormal(True)  # as every CPU worker trains (plelab.runtime.setup_torch)
    torch.set_num_threads(threads)
    try:
        model = build_model(mc, cfg.ple, seed=0, token_rows=rows, ac=cfg.aux)
        opt = build_optimizer(model, t)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, mc.vocab_size, (t.batch_size // t.grad_accum, t.seq_len), generator=gen)
        table_ids = probe_table_ids(cfg, ids, gen)
        times = []
        for _ in range(PROBE_WARMUP + steps):
            start = time.perf_counter()
            for _ in range(t.grad_accum):
                model(ids, labels=ids, table_ids=table_ids, return_logits=False).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    flops = flops_per_token(mc, cfg.ple, t.seq_len, cfg.aux) * t.batch_size * t.seq_len
    return flops / statistics.median(times[PROBE_WARMUP:])


def run_flops(cfg: RunConfig) -> float:
    """Model FLOPs of one run: its training steps (forward + backward) and its evaluations (forward only)."""
    t = cfg.train
    per_token = flops_per_token(cfg.model, cfg.ple, t.seq_len, cfg.aux)
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


def shape_key(cfg: RunConfig) -> str:
    """What one worker's FLOP/s depend on: the run's model and PLE configs, batch shape and precision — not its
    seed, steps, schedule or data. Runs of one key share a measured or probed rate."""
    t = cfg.train
    return json.dumps([asdict(cfg.model), asdict(cfg.ple), t.batch_size, t.grad_accum, t.seq_len, t.precision],
                      sort_keys=True, default=str)


# (shape_key, threads) -> probed FLOP/s: a study's estimate and each of its sweeps' probe a shape once per process
_PROBED: dict[tuple[str, int], float] = {}


def _span(rates: Sequence[float]) -> str:
    lo, hi = min(rates) / 1e9, max(rates) / 1e9
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}–{hi:.1f}"


class SweepClock:
    """The running estimate of one sweep, or of several (a study in pieces). ``jobs``: their
    :class:`~plelab.sweeps.runner.RunJob` lists (``.path``, ``.cfg``), each run known by its folder; ``done``:
    the folders already finished; ``workers`` run at once with ``threads`` each on ``device`` (``cpu`` |
    ``cuda``). Rates are kept per shape (:func:`shape_key`): a run is priced at the rate measured on finished
    runs of its shape, else the rate probed on its shape, else the rate measured on all finished runs, else the
    median rate probed on other shapes (runs a probe can stand for), else the assumed rate."""

    def __init__(self, jobs: Sequence, done: set[Path], workers: int, threads: int, device: str,
                 cores: int | None = None, overhead: float = RUN_OVERHEAD_S) -> None:
        self.flops = {j.path: run_flops(j.cfg) for j in jobs}
        # what each unfinished run still owes: the steps after its newest checkpoint
        self.owed = {j.path: self.flops[j.path] * max(0.0, 1 - steps_done(j.path) / max(1, j.cfg.train.steps))
                     for j in jobs if j.path not in done}
        self.left = set(self.flops) - set(done)
        self.workers, self.threads, self.device = max(1, workers), max(1, threads), device
        self.cores, self.overhead = cores or available_cores(), overhead
        self.configs = {j.path: j.cfg for j in jobs}
        self.shapes = {j.path: shape_key(j.cfg) for j in jobs}
        self.measured: dict[str, list[float]] = {}  # shape -> [FLOPs, seconds, runs]
        self.probed: dict[str, tuple[float, str]] = {}  # shape -> (FLOP/s, the run it was probed on)
        for j in jobs:
            if j.path in done:
                self.finished(j)

    @property
    def measured_runs(self) -> int:
        return int(sum(m[2] for m in self.measured.values()))

    def finished(self, job, elapsed: float | None = None) -> None:
        """Record a finished run: ``elapsed``, the seconds its worker took as this sweep watched it (less the
        start-up, priced apart), or else its summary's training wall time joins its shape's measured rate."""
        self.left.discard(job.path)
        wall = finished_wall(job.path) if elapsed is None else max(0.1 * elapsed, elapsed - self.overhead)
        if wall and wall > 0:  # a run watched from a resume did only what it owed
            m = self.measured.setdefault(self.shapes[job.path], [0.0, 0.0, 0])
            m[0] += self.owed.get(job.path, self.flops[job.path]) if elapsed else self.flops[job.path]
            m[1] += wall
            m[2] += 1

    def _threads(self) -> int:
        return max(1, int(min(self.threads, self.cores / self.workers)))  # workers beyond the cores share them

    def probe(self, log=None, above: float = PROBE_ABOVE_S, most: int = PROBE_SHAPES) -> bool:
        """On a CPU, when the runs of shapes nothing has measured yet owe over ``above`` seconds at the current
        rates: probe the rate of up to ``most`` of those shapes (:func:`probe_rate`, costliest first, each shape
        once per process), saying so through ``log``. Visual and bf16 runs are never probed (the probe cannot
        stand for them). Returns whether any shape was probed."""
        if self.device != "cpu":
            return False
        unmeasured = [p for p in self.left if self.shapes[p] not in self.measured and self.shapes[p] not in
                      self.probed and self._probeable(p)]
        if not unmeasured or sum(self.owed.get(p, 0.0) / self._rate(p)[0] for p in unmeasured) / self.workers <= above:
            return False
        costs: dict[str, float] = {}
        for p in unmeasured:
            costs[self.shapes[p]] = costs.get(self.shapes[p], 0.0) + self.owed.get(p, 0.0)
        shapes = sorted(costs, key=costs.get, reverse=True)[:most]
        threads = self._threads()
        if log:
            log(f"probing the rate: {PROBE_STEPS} training steps of each of {len(shapes)} shape(s) "
                f"on {threads} thread(s)")
        for shape in shapes:
            path = max((p for p in unmeasured if self.shapes[p] == shape), key=lambda p: self.owed.get(p, 0.0))
            if (shape, threads) not in _PROBED:
                _PROBED[shape, threads] = probe_rate(self.configs[path], threads)
            self.probed[shape] = _PROBED[shape, threads], "/".join(path.parts[-3:])
        return True

    def _probeable(self, path: Path) -> bool:
        cfg = self.configs[path]
        return task_kind(cfg).text_model and cfg.train.precision in ("fp32", "auto")

    def _probed_median(self) -> float:
        return statistics.median(v[0] for v in self.probed.values())

    def _rate(self, path: Path) -> tuple[float | None, str]:
        """FLOP/s of one worker on the run ``path`` and its source: ``measured`` | ``probed`` | ``pooled`` |
        ``probed elsewhere`` | ``assumed`` | ``none``."""
        shape = self.shapes[path]
        if shape in self.measured:
            f, s, _ = self.measured[shape]
            return f / s, "measured"
        if shape in self.probed:
            return self.probed[shape][0], "probed"
        if self.measured:
            return sum(m[0] for m in self.measured.values()) / sum(m[1] for m in self.measured.values()), "pooled"
        if self.probed and self._probeable(path):
            return self._probed_median(), "probed elsewhere"
        if self.device == "cpu":
            return ASSUMED_CORE_FLOPS * min(self.threads, self.cores / self.workers), "assumed"
        return None, "none"

    def rate(self, path: Path | None = None) -> tuple[float | None, str]:
        """FLOP/s of one worker — on the run ``path``, or over everything measured (else probed, else assumed)
        — and where the number comes from."""
        if path is not None:
            return self._rate(path)
        if self.measured:
            r = sum(m[0] for m in self.measured.values()) / sum(m[1] for m in self.measured.values())
            return r, f"{r / 1e9:.1f} GFLOP/s per worker, measured on {self.measured_runs} finished run(s)"
        if self.probed:
            r = self._probed_median()
            return r, f"{_span([v[0] for v in self.probed.values()])} GFLOP/s per worker probed"
        if self.device == "cpu":
            threads = min(self.threads, self.cores / self.workers)
            r = ASSUMED_CORE_FLOPS * threads
            return r, f"{r / 1e9:.0f} GFLOP/s per worker assumed ({threads:g} thread(s))"
        return None, "no estimate on a GPU before its first run finishes"

    def _why(self) -> str:
        """Where the rates of the runs left come from, e.g. ``49.2–66.0 GFLOP/s per worker, measured on 20
        finished run(s) of their shapes, for 39 run(s); 19.8 GFLOP/s per worker, probed (…), for 36 run(s)``."""
        by: dict[str, list[float]] = {}
        for p in self.left:
            r, source = self._rate(p)
            by.setdefault(source, []).append(r)
        said = {
            "measured": f"measured on {self.measured_runs} finished run(s) of their shapes",
            "probed": f"probed ({PROBE_STEPS} training steps of each of {len(self.probed)} shape(s): "
                      + ", ".join(sorted(v[1] for v in self.probed.values())) + ")",
            "pooled": f"measured on {self.measured_runs} finished run(s) of other shapes",
            "probed elsewhere": f"the median probed shape's, for shapes not among the {len(self.probed)} probed",
            "assumed": f"assumed ({min(self.threads, self.cores / self.workers):g} thread(s))",
        }
        parts = [f"{_span(by[s])} GFLOP/s per worker, {said[s]}" + (f", for {len(by[s])} run(s)" if len(by) > 1
                 else "") for s in ("measured", "probed", "pooled", "probed elsewhere", "assumed") if s in by]
        return "; ".join(parts) + ("" if set(by) == {"measured"} else "; refined as runs finish")

    def remaining(self, groups: Sequence[Sequence[Path]] | None = None, workers: Sequence[int] | None = None
                  ) -> float | None:
        """Seconds left: each run's owed FLOPs over its rate (:meth:`rate`), shared by ``workers``; with
        ``groups`` (sweeps run one after another), the sum over them, each with its own number of busy
        ``workers``."""
        if self.left and self._rate(next(iter(self.left)))[0] is None:
            return None
        if groups is None:
            groups, workers = [list(self.left)], [self.workers]
        return sum(sum(self.owed.get(p, 0.0) / self._rate(p)[0] + self.overhead for p in group if p in self.left) / w
                   for group, w in zip(groups, workers))

    def estimate_line(self, groups: Sequence[Sequence[Path]] | None = None,
                      workers: Sequence[int] | None = None) -> str:
        """Before the sweep (or the ``groups`` of sweeps, see :meth:`remaining`): its remaining runtime, or why
        none is given."""
        if not self.left:
            return "nothing left to run"
        left = self.remaining(groups, workers)
        if left is None:
            return f"runtime: {self.rate()[1]}"
        flops = sum(self.owed.get(p, 0.0) for p in self.left)
        most = self.workers if workers is None else max(workers)
        return (f"estimated runtime {duration(left)}: {len(self.left)} run(s), {flops:.3g} model FLOPs over "
                f"{most} worker(s) at {self._why()}")

    def left_line(self) -> str:
        """After a run finishes: what is left, e.g. ``57 left, ≈ 1 h 26 min``."""
        left = self.remaining()
        if not self.left:
            return "none left"
        return f"{len(self.left)} left" + ("" if left is None else f", ≈ {duration(left)}")
