"""Scale-out costs on CPU: memory per rank of a sharded initialisation, and what activation checkpointing saves.

``init``: resident-memory growth of one process while it builds ``--preset`` (peak RSS after minus before, from
``getrusage``): unsharded in one process, then sharded by FSDP2 on the meta device at each ``--world`` (gloo,
through torchrun; each rank reports its own). ``ac``: one forward + backward of ``--preset`` with and without
``train.activation_checkpointing``, side by side in one process: the bytes autograd keeps from the forward to the
backward (``saved_tensors_hooks``, exact) and the step time ratio over ``--repeats`` interleaved repeats.

    python bench/scale_out.py init --preset gpu-125m --dp 64 --world 2,3
    python bench/scale_out.py ac --preset cpu-small --dp 64 --repeats 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from common import fmt_ci, machine

from plelab.config import resolve_config
from plelab.model.init import build_model
from plelab.runtime import setup_torch
from plelab.training.parallel import fsdp_sharder


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_once(preset: str, dp: int, sharded: bool) -> dict:
    """Build the model here (sharded when under torchrun) and report the peak-RSS growth it caused."""
    cfg = resolve_config(preset, dp=dp)
    if sharded:
        dist.init_process_group("gloo")
    before = _peak_mib()
    model = build_model(cfg.model, cfg.ple, seed=0, shard=fsdp_sharder(bf16=False) if sharded else None)
    grown = _peak_mib() - before
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    out = {"rank": dist.get_rank() if sharded else 0, "grown_mib": grown, "local_params": local,
           "params": sum(p.numel() for p in model.parameters())}
    if sharded:
        dist.destroy_process_group()
    return out


def init_bench(args) -> None:
    here = [sys.executable, __file__, "_build", "--preset", args.preset, "--dp", str(args.dp)]
    rows = {1: [json.loads(subprocess.run(here, capture_output=True, text=True, check=True).stdout.splitlines()[-1])]}
    for world in args.world:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               __file__, "_build", "--sharded", "--preset", args.preset, "--dp", str(args.dp)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        rows[world] = sorted((json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")),
                             key=lambda r: r["rank"])
    full = rows[1][0]
    print(f"{args.preset} dP={args.dp}: {full['params']:,} parameters ({full['params'] * 4 / 2**20:,.0f} MiB fp32); "
          f"{machine()}")
    for world, ranks in rows.items():
        grown = [r["grown_mib"] for r in ranks]
        print(f"- world {world}{' (unsharded, one process)' if world == 1 else ' (FSDP2 on meta)'}: peak RSS growth "
              f"per rank {', '.join(f'{g:,.0f}' for g in grown)} MiB = {max(grown) / full['grown_mib']:.2f}× one "
              f"process; parameters held {max(r['local_params'] for r in ranks) / full['params']:.3f} of the model")


def _saved_bytes(model, ids) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids[:, :-1], targets=ids[:, 1:], return_logits=False).loss.backward()
    return total


def ac_bench(args) -> None:
    setup_torch(args.threads)
    cfg = resolve_config(args.preset, dp=args.dp)
    models = {flag: build_model(cfg.model, cfg.ple, seed=0, activation_checkpointing=flag) for flag in (False, True)}
    ids = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size // cfg.train.grad_accum, cfg.train.seq_len + 1),
                        generator=torch.Generator().manual_seed(0))
    saved = {flag: _saved_bytes(m, ids) for flag, m in models.items()}  # also the warm-up
    times = {False: [], True: []}
    for r in range(args.repeats):
        for flag in ((False, True) if r % 2 == 0 else (True, False)):
            t0 = time.perf_counter()
            models[flag](ids[:, :-1], targets=ids[:, 1:], return_logits=False).loss.backward()
            times[flag].append(time.perf_counter() - t0)
    print(f"{args.preset} dP={args.dp}, micro-batch {ids.shape[0]}×{cfg.train.seq_len}, {args.threads or 'all'} "
          f"thread(s); {machine()}")
    print(f"- kept from forward to backward: {saved[False] / 2**20:,.1f} MiB without, "
          f"{saved[True] / 2**20:,.1f} MiB with activation checkpointing "
          f"({saved[False] / max(saved[True], 1):.1f}× less)")
    ratio = [a / b for a, b in zip(times[True], times[False])]
    print(f"- step time with ÷ without: {fmt_ci(ratio, 1, 3, '×')} ({args.repeats} interleaved repeats)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("init", "ac", "_build"))
    ap.add_argument("--preset", default="gpu-125m")
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--world", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3])
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    if args.what == "_build":
        print(json.dumps(build_once(args.preset, args.dp, args.sharded)))
    elif args.what == "init":
        init_bench(args)
    else:
        ac_bench(args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
