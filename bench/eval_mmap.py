"""``plelab eval`` with the per-layer table memory-mapped versus read into memory: peak RSS and time.

Writes a checkpoint of ``--preset`` with a Gemma-sized per-layer vocabulary (``ple.vocab_size``, default
262,144 rows, ``--dp`` wide per layer; never trained — the weights are the seeded init) and evaluates it
in fresh processes, alternating the two modes for ``--repeats`` repeats: peak resident memory (VmHWM)
and wall time of ``plelab eval`` (model load + validation windows). The text vocabulary of the preset
looks up only its own rows, so a mapped table brings in only those pages.

    python bench/eval_mmap.py --dir /tmp/plelab-bench-eval --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import machine

from plelab.config import resolve_config
from plelab.model import build_model
from plelab.runs import prepare_data
from plelab.training import checkpoint as ckpt

CHILD = ("import json, sys; from plelab.cli import main; code = main(sys.argv[1:]); "
         "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')); "
         "print(json.dumps({'code': code, 'hwm': int(hwm.split()[1]) * 1024}))")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/plelab-bench-eval")
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--rows", type=int, default=262_144)
    ap.add_argument("--dp", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    run = Path(args.dir) / "run"
    cfg = resolve_config(args.preset, [f"ple.vocab_size={args.rows}"], dp=args.dp)
    if not ckpt.list_checkpoints(run):
        data = prepare_data(cfg, progress=False)
        model = build_model(cfg.model, cfg.ple, seed=0)
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
        (run).mkdir(parents=True, exist_ok=True)
        ckpt.save_checkpoint(run, 0, tensors, {}, {"tokens_seen": 0, "val_history": [], "config": cfg.to_dict(),
                                                  "recent_train_losses": [], "wall_seconds": 0.0,
                                                  "corpus_fingerprint": data.corpus_fingerprint}, keep=1)
        del model, tensors
    table = args.rows * cfg.model.num_hidden_layers * args.dp * 4
    results = {"mmap": [], "in-memory": []}
    for r in range(args.repeats):
        for mode in (["mmap", "in-memory"] if r % 2 == 0 else ["in-memory", "mmap"]):
            extra = [] if mode == "mmap" else ["--table-in-memory"]
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, "eval", str(run), "--json", "--no-progress",
                                  "--device", "cpu", *extra], capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t0
            lines = out.stdout.strip().splitlines()
            report = json.loads("\n".join(lines[:-1]))
            results[mode].append((json.loads(lines[-1])["hwm"], wall, report["val_loss"]))
    print(f"{args.preset} with a per-layer table of {args.rows:,} rows × {cfg.model.num_hidden_layers}·{args.dp} "
          f"fp32 = {table / 2**30:.2f} GiB; {machine()}")
    for mode, rows in results.items():
        print(f"{mode}: peak RSS {statistics.median(r[0] for r in rows) / 2**30:.2f} GiB, wall "
              f"{statistics.median(r[1] for r in rows):.1f} s (median of {len(rows)}); val loss {rows[0][2]:.6f}")


if __name__ == "__main__":
    main()
