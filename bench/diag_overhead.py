"""Cost of the live PLE diagnostics in training, measured side by side in one process.

Two trainers on the same config, one with train.diag_every=N and one with diagnostics off,
run alternately in blocks; reports median step times and the overhead ratio. Also times one
at-checkpoint diagnostics pass (structure + table-level use test) against a training step.

    python bench/diag_overhead.py --preset cpu-small --steps 200 --every 50
    python bench/diag_overhead.py --preset cpu-sweep --steps 100 --windows 32,64 --repeats 7

``--windows A,B``: the at-checkpoint pass at each use-test window count, interleaved ``--repeats`` times
(medians), against a training step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from plelab.config import resolve_config
from plelab.data.tokens import data_val_windows
from plelab.diagnostics.diagnose import weight_decay_shrink
from plelab.diagnostics.live import checkpoint_diagnostics
from plelab.runs import make_trainer, prepare_data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--block", type=int, default=25)
    ap.add_argument("--windows", help="comma-separated use-test window counts to time the checkpoint pass at")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    base = resolve_config(args.preset, ["train.checkpoint_every=0", "train.eval_every=100000"], steps=args.steps)
    data = prepare_data(base, progress=False)
    trainers = {}
    for name, every in (("off", 0), ("on", args.every)):
        cfg = resolve_config(args.preset, ["train.checkpoint_every=0", "train.eval_every=100000",
                                           f"train.diag_every={every}"], steps=args.steps)
        trainers[name] = make_trainer(cfg, data, None, progress=False, log=lambda *a: None)
    times = {"off": [], "on": [], "on_diag_steps": []}
    for _ in range(0, args.steps, args.block):
        for name, tr in trainers.items():
            for _ in range(args.block):
                t0 = time.perf_counter()
                row = tr.train_step()
                dt = time.perf_counter() - t0
                (times["on_diag_steps"] if "diag" in row else times[name]).append(dt)
    off, on = sum(times["off"]), sum(times["on"]) + sum(times["on_diag_steps"])
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"preset {args.preset}, {args.steps} steps per trainer, diag_every={args.every}, blocks of {args.block}")
    print(f"median step: off {med['off'] * 1e3:.1f} ms, on (plain steps) {med['on'] * 1e3:.1f} ms, "
          f"diag steps {med['on_diag_steps'] * 1e3:.1f} ms")
    extra = (med["on_diag_steps"] - med["on"]) / (args.every * med["on"])
    print(f"live-diagnostics overhead: {100 * extra:.2f}% of training time (per-diag-step extra / steps between); "
          f"total-time ratio on/off {on / off:.3f}")
    tr = trainers["on"]
    counts = tr.rows["text"].counts.cpu().numpy()
    windows = tr.task.diag_windows()
    t0 = time.perf_counter()
    checkpoint_diagnostics(tr.model, tr.cfg, counts, weight_decay_shrink(tr.cfg, tr.step), windows, tr.device)
    ck = time.perf_counter() - t0
    print(f"at-checkpoint diagnostics: {ck:.2f} s = {ck / med['on']:.1f} training steps")
    if args.windows:
        counts_n = [int(x) for x in args.windows.split(",")]
        wins = {n: data_val_windows(data, tr.cfg.train.seq_len, n) for n in counts_n}
        took: dict[int, list[float]] = {n: [] for n in counts_n}
        shrink = weight_decay_shrink(tr.cfg, tr.step)
        for _ in range(args.repeats):
            for n in counts_n:
                t0 = time.perf_counter()
                checkpoint_diagnostics(tr.model, tr.cfg, counts, shrink, wins[n], tr.device)
                took[n].append(time.perf_counter() - t0)
        for n in counts_n:
            m = statistics.median(took[n])
            print(f"at-checkpoint diagnostics, {len(wins[n])} windows: median {m:.2f} s over {args.repeats} "
                  f"(= {m / med['on']:.1f} training steps)")


if __name__ == "__main__":
    main()
