"""A roofline that fits the shape: the model's own GEMM list, timed in this process, against its training step.

The GEMM list is every matmul of one training step at the run's real shapes (each ``nn.Linear`` and the LM head on
micro-batch × seq_len rows: forward, input gradient, weight gradient; ``plelab.precision.step_gemms``). Each repeat
times one pass over that list in fp32 and in bf16, the 4096² GEMM peak in both, and a block of real training steps
(``plelab.runs.make_trainer``, diagnostics, evaluation and checkpoints off) at the run's precision, in rotated
order. Reported: step efficiency = (fp32 or bf16) GEMM-list time / step time — the share of the step that the
matmuls alone would take at the speed this CPU runs these shapes — and the 4096² peaks beside it.

    python bench/roofline.py --preset cpu-sweep --dp 32 --threads 1 --repeats 10
    python bench/roofline.py --preset cpu-small --dp 64 --threads 2 --repeats 10 --set train.precision=bf16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import TIMING_ONLY, fmt_ci, machine, matmul_peak, rotated

from plelab.config import resolve_config
from plelab.precision import cpu_bf16_flags, time_gemms
from plelab.runs import make_trainer, prepare_data
from plelab.runtime import setup_torch
from plelab.training.run_precision import run_gemms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-sweep")
    ap.add_argument("--dp", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--block", type=int, default=3, help="training steps per repeat")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--bf16", action="store_true", help="time bf16 even without bf16 matrix flags")
    args = ap.parse_args()
    setup_torch(args.threads)
    sets = [*TIMING_ONLY, f"train.threads={args.threads}", *args.overrides]
    cfg = resolve_config(args.preset, sets, dp=args.dp)  # the preset's schedule; only a few of its steps run
    trainer = make_trainer(cfg, prepare_data(cfg, progress=False), None, progress=False, log=lambda *a: None)
    gemms = run_gemms(cfg, trainer.micro_batch) * cfg.train.grad_accum
    flops = sum(2 * m * k * n for m, k, n in gemms)
    for _ in range(2):
        trainer.train_step()

    def steps() -> float:
        times = []
        for _ in range(args.block):
            t0 = time.perf_counter()
            trainer.train_step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    parts = {"fp32 GEMMs": lambda: time_gemms(gemms, torch.float32), "fp32 peak": lambda: matmul_peak(reps=3),
             "step": steps}
    bf16 = bool(cpu_bf16_flags()) or args.bf16
    if bf16:  # without bf16 units torch emulates bf16 GEMMs through fp32, ~10x slower: nothing to learn
        parts |= {"bf16 GEMMs": lambda: time_gemms(gemms, torch.bfloat16),
                  "bf16 peak": lambda: matmul_peak(reps=3, dtype=torch.bfloat16)}
    got: dict[str, list[float]] = {k: [] for k in parts}
    for r in range(args.repeats):
        for k in rotated(list(parts), r):
            got[k].append(parts[k]())
    print(f"{args.preset} dP={args.dp}, precision {trainer.precision.resolved} ({trainer.precision.reason}); "
          f"{machine()}")
    print(f"{len(gemms)} GEMMs per step, {flops / 1e9:.2f} GFLOP; {args.repeats} repeats, rotated order")
    print("| quantity | median | GFLOP/s |")
    print("|---|---|---|")
    dtypes = ("fp32", "bf16") if bf16 else ("fp32",)
    for k in (*(f"{d} GEMMs" for d in dtypes), "step"):
        med = statistics.median(got[k])
        print(f"| {k} | {med * 1e3:.1f} ms | {flops / med / 1e9:.1f} |")
    for d in dtypes:
        print(f"| 4096² GEMM, {d} | | {statistics.median(got[f'{d} peak']) / 1e9:.1f} |")
        shape = [flops / g / p for g, p in zip(got[f"{d} GEMMs"], got[f"{d} peak"])]
        print(f"{d}: these shapes run at {fmt_ci(shape, 100, 1, '%')} of the 4096² peak")
    for d in dtypes:
        eff = [g / s for g, s in zip(got[f"{d} GEMMs"], got["step"])]
        print(f"step efficiency vs the {d} shape-matched roofline: {fmt_ci(eff, 100, 1, '%')}")
    if bf16:
        ratio = [a / b for a, b in zip(got["fp32 GEMMs"], got["bf16 GEMMs"])]
        print(f"bf16 over fp32 on these shapes: {fmt_ci(ratio, 1, 2, '×')} (the precision probe needs ≥ 1.25×)")
    else:
        print("bf16: not timed — this CPU has no bf16 matrix flags (--bf16 times torch's emulation anyway)")


if __name__ == "__main__":
    main()
