"""What the CPU step changes bought: the heap allocator and the chunked LM-head loss, each against its absence.

The allocator setting is process-wide and cannot be undone, so each repeat launches two fresh worker processes
one after the other (the order alternates): one with ``PLELAB_MALLOC=system`` and one with plelab's default heap
setting. Inside each worker two real trainers on the same config alternate blocks of ``--block`` steps: the
trainer's chunked loss (``return_logits=False``) and the plain one (full ``[B·T, V]`` logits, then CE). Reported:
median step per arm, and per-repeat ratios with 95% t-intervals.

    python bench/step_changes.py --preset cpu-sweep --dp 32 --threads 1 --repeats 10
    python bench/step_changes.py --preset cpu-small --dp 64 --threads 2 --repeats 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import fmt_ci, machine

from plelab.config import resolve_config
from plelab.data.pipeline import prepare_data
from plelab.runs import make_trainer
from plelab.runtime import allocator
from plelab.training.text_task import TextTask


def worker(preset: str, dp: int, threads: int, block: int, warmup: int) -> dict:
    sets = ["train.checkpoint_every=0", "train.eval_every=1000000", "train.diag_every=0", f"train.threads={threads}"]
    cfg = resolve_config(preset, sets, dp=dp, steps=100)  # the preset's schedule shape; only a few steps run
    data = prepare_data(cfg, progress=False)
    chunked = make_trainer(cfg, data, None, progress=False, log=lambda *a: None)
    plain = make_trainer(cfg, data, None, progress=False, log=lambda *a: None)

    def plain_loss(forward, batch):  # the path before the chunked loss: full logits, then CE
        return forward(batch.inputs["input_ids"], targets=batch.inputs["targets"],
                       table_ids=batch.inputs["table_ids"]).loss
    assert isinstance(plain.task, TextTask)
    plain.task.loss = plain_loss
    for tr in (chunked, plain):
        for _ in range(warmup):
            tr.train_step()
    out = {}
    for name, tr in (("chunked", chunked), ("plain", plain)):
        times = []
        for _ in range(block):
            t0 = time.perf_counter()
            tr.train_step()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    out["allocator"] = allocator()
    out["machine"] = machine()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-sweep")
    ap.add_argument("--dp", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.preset, args.dp, args.threads, args.block, args.warmup)))
        return
    runs: dict[str, list[dict]] = {"system": [], "heap": []}
    for r in range(args.repeats):
        for alloc in (["system", "heap"] if r % 2 == 0 else ["heap", "system"]):
            env = {**os.environ, "PLELAB_MALLOC": alloc}
            cmd = [sys.executable, __file__, "--worker", "--preset", args.preset, "--dp", str(args.dp),
                   "--threads", str(args.threads), "--block", str(args.block), "--warmup", str(args.warmup)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[alloc].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr)
    print(f"{args.preset} dP={args.dp}, {args.threads} thread(s); {runs['heap'][0]['machine']}")
    print(f"{args.repeats} repeats; each: a worker per allocator (order alternating), inside it the chunked and "
          f"the plain loss, {args.block} steps each after {args.warmup} warm-up steps")
    print("| allocator | loss | median step |")
    print("|---|---|---|")
    for alloc in ("system", "heap"):
        for loss in ("plain", "chunked"):
            med = statistics.median(w[loss] for w in runs[alloc])
            print(f"| {alloc} | {loss} | {med * 1e3:.1f} ms |")

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> list[float]:
        return [x[a[1]] / y[b[1]] for x, y in zip(runs[a[0]], runs[b[0]])]
    print("speed-ups (slower arm's step / faster arm's step, per repeat, mean [95% CI]):")
    print(f"- chunked loss, system allocator: {fmt_ci(ratio(('system', 'plain'), ('system', 'chunked')))}")
    print(f"- chunked loss, heap allocator: {fmt_ci(ratio(('heap', 'plain'), ('heap', 'chunked')))}")
    print(f"- heap allocator, plain loss: {fmt_ci(ratio(('system', 'plain'), ('heap', 'plain')))}")
    print(f"- heap allocator, chunked loss: {fmt_ci(ratio(('system', 'chunked'), ('heap', 'chunked')))}")
    print(f"- both (system+plain → heap+chunked): {fmt_ci(ratio(('system', 'plain'), ('heap', 'chunked')))}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
