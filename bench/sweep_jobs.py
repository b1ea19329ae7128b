"""Sweep throughput: one 2-thread process vs two 1-thread worker processes, side by side.

    python bench/sweep_jobs.py [--repeats 3] [--steps 40] [--precision auto|fp32|bf16]

Each repeat runs the same two-run sweep (cpu-sweep, dP 0 and 32, one seed) with ``--jobs 1``
(in process, all cores) and ``--jobs 2`` (two workers, cores/2 threads each), in alternating
order, and reports the median wall time of each mode and their ratio. Wall time includes the
workers' start-up (import, cached data), as a user would see it. ``--precision`` is the sweep's
``train.precision`` (default ``auto``: the study rule; each mode's resolved precision is printed).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time


def sweep_seconds(jobs: int, steps: int, precision: str = "auto", extra: tuple[str, ...] = ()) -> tuple[float, str]:
    """Wall seconds of the two-run sweep with ``jobs``, and the precision line it printed."""
    with tempfile.TemporaryDirectory() as root:
        cmd = [sys.executable, "-m", "plelab", "sweep", "--preset", "cpu-sweep", "--dp", "0,32", "--seeds", "1",
               "--steps", str(steps), "--out", f"{root}/s", "--jobs", str(jobs), "--no-report", "--no-progress",
               "--set", f"train.precision={precision}", *extra]
        start = time.perf_counter()
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("precision ")), "precision ?")
        return seconds, line.split(" (", 1)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    args = ap.parse_args()
    from plelab.precision import cpu_model

    print(f"CPU: {cpu_model()}; train.precision={args.precision}", flush=True)
    for jobs in (1, 2):  # warm the tokenizer / token caches in both modes
        sweep_seconds(jobs, 2, args.precision, ("--set", "train.early_checkpoint=0"))
    times: dict[int, list[float]] = {1: [], 2: []}
    for r in range(args.repeats):
        for jobs in ((1, 2) if r % 2 == 0 else (2, 1)):
            seconds, line = sweep_seconds(jobs, args.steps, args.precision)
            times[jobs].append(seconds)
            print(f"repeat {r}: jobs={jobs} {seconds:.1f} s ({line})", flush=True)
    m1, m2 = statistics.median(times[1]), statistics.median(times[2])
    print(f"median wall time: --jobs 1 {m1:.1f} s, --jobs 2 {m2:.1f} s; jobs 2 is {m1 / m2:.2f}× faster")


if __name__ == "__main__":
    main()
