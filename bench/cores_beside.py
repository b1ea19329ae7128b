"""A two-thread torch training loop alone and beside a busy one-thread process: at equal priority, with the
loop's OpenMP threads sleeping instead of spinning (``OMP_WAIT_POLICY=PASSIVE``), and with the neighbour at
``nice`` 19 — the measurement behind ``tests/background.py`` (BENCHMARKS.md "Test suite").

Each arm is a fresh process (OpenMP reads its wait policy once, when torch loads it); arms alternate over
``--repeats`` rounds and the medians are printed. Run it on a quiet machine with at least two cores:

    python bench/cores_beside.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

LOOP = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
width = int(sys.argv[3])
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
x = torch.randn(512, width)
opt = torch.optim.AdamW(model.parameters())
steps = int(sys.argv[2])
start = time.perf_counter()
for _ in range(steps):
    model(x).square().mean().backward(); opt.step(); opt.zero_grad()
print(time.perf_counter() - start)
"""


def loop_seconds(threads: int, steps: int, width: int, env: dict | None = None) -> float:
    out = subprocess.run([sys.executable, "-c", LOOP, str(threads), str(steps), str(width)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _lower(how: str):
    if how == "nice19":
        return lambda: os.nice(19)
    if how == "idle":
        return lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return None


def beside(threads: int, steps: int, width: int, env: dict | None, how: str = "") -> float:
    """The loop's seconds while a one-thread copy runs (started first, with more steps; stopped after), at normal
    priority, at ``nice`` 19 (``how="nice19"``) or under ``SCHED_IDLE`` (``how="idle"``)."""
    neighbour = subprocess.Popen([sys.executable, "-c", LOOP, "1", str(steps * 20), str(width)],
                                 stdout=subprocess.DEVNULL, preexec_fn=_lower(how))
    time.sleep(1.5)  # past its imports: busy
    try:
        return loop_seconds(threads, steps, width, env)
    finally:
        neighbour.kill()
        neighbour.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--width", type=int, default=256, help="the linear layers' width (64: a tiny model's many "
                    "short parallel regions)")
    args = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        sys.exit("needs at least two cores")
    passive = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    n, w = args.steps, args.width
    arms = {
        "alone": lambda: loop_seconds(2, n, w),
        "beside a 1-thread process": lambda: beside(2, n, w, None),
        "PASSIVE, alone": lambda: loop_seconds(2, n, w, passive),
        "PASSIVE, beside a 1-thread process": lambda: beside(2, n, w, passive),
        "beside a 1-thread process at nice 19": lambda: beside(2, n, w, None, "nice19"),
        "beside a 1-thread process, SCHED_IDLE": lambda: beside(2, n, w, None, "idle"),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.repeats):
        names = list(arms)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            times[name].append(arms[name]())
    from plelab.precision import cpu_model

    print(f"{cpu_model()}, {os.cpu_count()} CPUs; a 2-thread loop of {n} steps at width {w}, medians of "
          f"{args.repeats}")
    base = statistics.median(times["alone"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:40s} {med:6.2f} s  ({med / base:.2f}x alone)")


if __name__ == "__main__":
    main()
