"""Where a training step's time goes: matmuls versus everything else, plelab and HF Gemma 4 at one shape.

Profiles ``--steps`` steps of each model (the step of ``bench/hf_gemma4.py``: forward, backward, clipping,
AdamW) with ``torch.profiler`` and prints the self time of ``aten::mm`` / ``aten::addmm`` / ``aten::bmm``, of
attention and of the rest, and the top operators; then the fraction of the measured GEMM peak that
plelab's matmuls reach, and the largest speed-up over HF that removing all of plelab's non-matmul,
non-attention time could give.

    python bench/profile_step.py --preset cpu-small --dp 64
"""

from __future__ import annotations

import argparse

import torch
from common import matmul_peak
from hf_gemma4 import hf_model, step_fn
from torch.profiler import ProfilerActivity, profile

from plelab.config import resolve_config
from plelab.model import build_model
from plelab.model.accounting import matmul_params
from plelab.runtime import setup_torch

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm")


def profiled(fn, steps: int) -> tuple[float, dict[str, float], list]:
    for _ in range(2):
        fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e3 / steps
    parts = {"matmul": sum(e.self_cpu_time_total for e in events if e.key in MATMUL) / 1e3 / steps,
             "attention": sum(e.self_cpu_time_total for e in events if "attention" in e.key) / 1e3 / steps}
    parts["other"] = total - parts["matmul"] - parts["attention"]
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    return total, parts, [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in top]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    setup_torch(0)
    cfg = resolve_config(args.preset, [], dp=args.dp)
    B, T, V = cfg.train.batch_size, cfg.train.seq_len, cfg.model.vocab_size
    batch = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(0))
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
    results = {"plelab": profiled(step_fn(build_model(cfg.model, cfg.ple, seed=0).train(), x, y, False), args.steps),
               "hf": profiled(step_fn(hf_model(cfg), x, y, True), args.steps)}
    for name, (total, parts, top) in results.items():
        shares = ", ".join(f"{k} {v:.0f} ms ({100 * v / total:.0f}%)" for k, v in parts.items())
        print(f"{name}: {total:.0f} ms per step (profiled): {shares}")
        print("   top: " + "; ".join(f"{k} {v:.0f} ms" for k, v in top))
    mm_flops = B * T * 6 * matmul_params(cfg.model, cfg.ple)  # the aten::mm work of a step (attention is in SDPA)
    peak = matmul_peak()
    print(f"plelab's matmuls: {mm_flops / 1e9:.1f} GFLOP per step in {results['plelab'][1]['matmul']:.0f} ms = "
          f"{100 * mm_flops / (results['plelab'][1]['matmul'] / 1e3) / peak:.0f}% of the GEMM peak measured now "
          f"({peak / 1e9:.0f} GFLOP/s)")
    floor = results["plelab"][1]["matmul"] + results["plelab"][1]["attention"]
    print(f"ceiling of plelab ÷ HF tokens/s at this shape, both profiled, if plelab spent nothing beyond its "
          f"matmuls and attention: {results['hf'][0] / floor:.2f}× (the profiler inflates the many small ops of "
          f"'other' more than the matmuls, so the real ceiling is lower)")


if __name__ == "__main__":
    main()
