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
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
x = torch.randn(512, 256)
opt = torch.optim.AdamW(model.parameters())
steps = int(sys.argv[2])
start = time.perf_counter()
for _ in range(steps):
    model(x).square().mean().backward(); opt.step(); opt.zero_grad()
print(time.perf_counter() - start)
"""


def loop_seconds(threads: int, steps: int, env: dict | None = None) -> float:
    out = subprocess.run([sys.executable, "-c", LOOP, str(threads), str(steps)], env=env, capture_output=True,
                         text=True, check=True)
    return float(out.stdout.strip())


def beside(threads: int, steps: int, env: dict | None, nice: int) -> float:
    """The loop's seconds while a one-thread copy runs (started first, with more steps; stopped after)."""
    neighbour = subprocess.Popen([sys.executable, "-c", LOOP, "1", str(steps * 4)], stdout=subprocess.DEVNULL,
                                 preexec_fn=(lambda: os.nice(nice)) if nice else None)
    time.sleep(1.0)  # past its imports: busy
    try:
        return loop_seconds(threads, steps, env)
    finally:
        neighbour.kill()
        neighbour.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        sys.exit("needs at least two cores")
    passive = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    arms = {
        "alone": lambda: loop_seconds(2, args.steps),
        "beside a 1-thread process": lambda: beside(2, args.steps, None, 0),
        "PASSIVE, alone": lambda: loop_seconds(2, args.steps, passive),
        "PASSIVE, beside a 1-thread process": lambda: beside(2, args.steps, passive, 0),
        "beside a 1-thread process at nice 19": lambda: beside(2, args.steps, None, 19),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.repeats):
        names = list(arms)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            times[name].append(arms[name]())
    from plelab.precision import cpu_model

    print(f"{cpu_model()}, {os.cpu_count()} CPUs; a 2-thread loop of {args.steps} steps, medians of {args.repeats}")
    base = statistics.median(times["alone"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:40s} {med:6.2f} s  ({med / base:.2f}x alone)")


if __name__ == "__main__":
    main()
