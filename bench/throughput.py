"""Training throughput over dP at one preset, CPU MFU against the fp32 matmul peak measured in this process.

One trainer per dP (with ``--row-sparse`` also per dP > 0 with the row-sparse table update) — the real
:class:`plelab.training.trainer.Trainer` (built by ``plelab.runs.make_trainer``), live diagnostics off, no
checkpoints — on the embedded corpus.
Each repeat runs ``--block`` steps of every trainer in rotated order and measures the GEMM peak once.
Reports per arm: median step time, tokens/s, MFU (model FLOPs per token × tokens/s / peak; FLOPs =
6·N_matmul + attention, the per-layer table excluded as a lookup) and the PLE overhead (step time vs
dP=0) against its matmul-FLOP overhead, each as a mean over repeats with a 95% t-interval.

    python bench/throughput.py --preset cpu-small --dp 0,32,64,128 --repeats 10 --block 4 --row-sparse
"""

from __future__ import annotations

import argparse
import json
import statistics

from common import TIMING_ONLY, block_medians, fmt_ci, machine, matmul_peak, mean_ci

from plelab.config import resolve_config
from plelab.model.accounting import flops_per_token
from plelab.runs import make_trainer, prepare_data
from plelab.runtime import setup_torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--dp", default="0,32,64,128")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--block", type=int, default=4, help="timed steps per trainer per repeat")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--row-sparse", action="store_true", help="also every dP > 0 with train.table_optimizer=row-sparse")
    ap.add_argument("--json", help="also write the raw numbers here")
    args = ap.parse_args()
    setup_torch(0)  # flush denormals, all cores
    dims = [int(x) for x in args.dp.split(",")]
    sets = [*TIMING_ONLY, *args.overrides]
    total = args.warmup + args.repeats * args.block
    arms = {f"{d}": resolve_config(args.preset, sets, dp=d, steps=total + 1) for d in dims}
    if args.row_sparse:  # the same dP values with the row-sparse table update, side by side
        arms.update({f"{d} row-sparse": resolve_config(args.preset, [*sets, "train.table_optimizer=row-sparse"], dp=d,
                                                       steps=total + 1) for d in dims if d > 0})
    names = list(arms)
    data = prepare_data(arms[names[0]], progress=False)
    trainers = {k: make_trainer(c, data, None, progress=False, log=lambda *a: None) for k, c in arms.items()}
    peaks = []  # per repeat, measured before its blocks
    step_t = block_medians({k: trainers[k].train_step for k in names}, args.repeats, args.block, args.warmup,
                           before_repeat=lambda: peaks.append(matmul_peak()))  # per repeat: median step time
    c0 = arms[names[0]]
    tokens = c0.train.batch_size * c0.train.seq_len
    flops = {k: flops_per_token(c.model, c.ple, c.train.seq_len) for k, c in arms.items()}
    print(f"{args.preset}: H={c0.model.hidden_size} L={c0.model.num_hidden_layers} V={c0.model.vocab_size} "
          f"B={c0.train.batch_size} T={c0.train.seq_len}; {machine()}")
    print(f"fp32 matmul peak (4096² GEMM, measured each repeat): median {statistics.median(peaks) / 1e9:.1f} GFLOP/s")
    print(f"{args.repeats} repeats × {args.block} steps per arm, rotated order, {args.warmup} warm-up steps")
    print("| dP | median step | tokens/s | MFU vs measured peak | step-time overhead vs dP=0 | FLOP overhead |")
    print("|---|---|---|---|---|---|")
    raw = {"preset": args.preset, "peaks": peaks, "step_times": step_t, "flops_per_token": flops,
           "tokens_per_step": tokens}
    base = names[0]
    for k in names:
        mfu = [tokens / t * flops[k] / p for t, p in zip(step_t[k], peaks)]
        over = [t / b - 1 for t, b in zip(step_t[k], step_t[base])]
        fl = flops[k] / flops[base] - 1
        print(f"| {k} | {statistics.median(step_t[k]) * 1e3:.1f} ms | {tokens / statistics.median(step_t[k]):,.0f} | "
              f"{fmt_ci(mfu, 100, 1, '%')} | {fmt_ci(over, 100, 1, '%') if k != base else '—'} | "
              f"{100 * fl:.1f}% |")
        raw.setdefault("mfu", {})[k] = mean_ci(mfu)
        raw.setdefault("overhead_minus_flops", {})[k] = mean_ci([o - fl for o in over]) if k != base else None
    for k in names[1:]:
        m, lo, hi = raw["overhead_minus_flops"][k]
        print(f"dP={k}: step overhead − FLOP overhead = {100 * m:+.1f}% [{100 * lo:+.1f}, {100 * hi:+.1f}] "
              f"(target ≤ +5%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1, default=str)


if __name__ == "__main__":
    main()
