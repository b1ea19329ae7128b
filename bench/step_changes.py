"""What the chunked LM-head loss bought: the trainer's step with it and without it, side by side in one process.

Two real trainers (``plelab.runs.make_trainer``; diagnostics, evaluation and checkpoints off) on the same config
and data: one with the trainer's loss (``return_logits=False``: ``F.linear_cross_entropy`` in row chunks), one
with the plain path it replaced (full ``[B·T, V]`` logits, then CE). Each repeat runs ``--block`` steps of each
in rotated order. Reported: median step per arm and the per-repeat ratio with a 95% t-interval.

    python bench/step_changes.py --preset cpu-sweep --dp 32 --threads 1 --repeats 10
    python bench/step_changes.py --preset cpu-small --dp 64 --threads 2 --repeats 10
"""

from __future__ import annotations

import argparse
import statistics

from common import TIMING_ONLY, block_medians, fmt_ci, machine

from plelab.config import resolve_config
from plelab.runs import make_trainer, prepare_data
from plelab.runtime import setup_torch
from plelab.training.text_task import TextTask


def plain_loss(forward, batch):
    """The loss before the chunked head: full logits, then CE."""
    return forward(batch.inputs["input_ids"], targets=batch.inputs["targets"],
                   table_ids=batch.inputs["table_ids"]).loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-sweep")
    ap.add_argument("--dp", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--block", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    setup_torch(args.threads)
    sets = [*TIMING_ONLY, f"train.threads={args.threads}"]
    cfg = resolve_config(args.preset, sets, dp=args.dp)  # the preset's schedule; only a few of its steps run
    data = prepare_data(cfg, progress=False)
    arms = {name: make_trainer(cfg, data, None, progress=False, log=lambda *a: None) for name in ("chunked", "plain")}
    assert isinstance(arms["plain"].task, TextTask)
    arms["plain"].task.loss = plain_loss
    times = block_medians({k: tr.train_step for k, tr in arms.items()}, args.repeats, args.block, args.warmup)
    print(f"{args.preset} dP={args.dp}; {machine()}")
    print(f"{args.repeats} repeats × {args.block} steps per arm, rotated order, {args.warmup} warm-up steps")
    for k in arms:
        print(f"- {k}: median step {statistics.median(times[k]) * 1e3:.1f} ms")
    ratio = [p / c for p, c in zip(times["plain"], times["chunked"])]
    print(f"plain ÷ chunked step time: {fmt_ci(ratio, 1, 3, '×')}")


if __name__ == "__main__":
    main()
