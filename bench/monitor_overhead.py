"""Cost of plelab.Monitor in a plain PyTorch loop over an attached HF Llama, side by side in one process.

Three copies of the same model (same init, same batches) train in alternating blocks: no monitor, a Monitor with
``every=E1`` and one with ``every=E2`` (no checkpoints in the timed steps). Reports median step times, the overhead
of the diag steps as a share of training time ((median diag step − median plain step) / (every · plain step)),
the plain steps against the no-monitor arm (the row-count hook), the total-time ratio, and one at-checkpoint pass
(structure + use test on 32 windows) in training steps. Arms rotate their order every block.

    python bench/monitor_overhead.py --steps 200 --every 10,50
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import transformers
from common import machine, rotated

import plelab


def host(args) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                   num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4)
    torch.manual_seed(0)
    return plelab.attach(transformers.AutoModelForCausalLM.from_config(cfg), args.dp)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", default="10,50")
    ap.add_argument("--block", type=int, default=25)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    everies = [int(x) for x in args.every.split(",")]
    tmp = tempfile.mkdtemp()
    arms = {"off": (host(args), None)}
    for e in everies:
        model = host(args)
        arms[f"every={e}"] = (model, plelab.Monitor(model, f"{tmp}/e{e}", every=e))
    opts = {k: plelab.adamw(plelab.param_groups(m, lr=1e-3)) for k, (m, _) in arms.items()}
    shape = (args.steps, args.batch, args.seq + 1)
    data = torch.randint(0, args.vocab, shape, generator=torch.Generator().manual_seed(1))
    plain = {k: [] for k in arms}
    diag = {k: [] for k in arms}
    total = {k: 0.0 for k in arms}
    step = {k: 0 for k in arms}
    for repeat, _ in enumerate(range(0, args.steps, args.block)):
        for name in rotated(list(arms), repeat):  # each arm first as often as the others
            model, monitor = arms[name]
            for _ in range(args.block):
                s = step[name]
                ids = data[s % args.steps]
                t0 = time.perf_counter()
                model(ids, labels=ids).loss.backward()
                row = monitor.step(s) if monitor is not None else {}
                opts[name].step()
                opts[name].zero_grad()
                dt = time.perf_counter() - t0
                (diag if row else plain)[name].append(dt)
                total[name] += dt
                step[name] += 1
    print(f"machine: {machine()}")
    print(f"attached Llama H={args.hidden} L={args.layers} V={args.vocab} dP={args.dp}, batch {args.batch}×{args.seq}, "
          f"{args.steps} steps per arm in blocks of {args.block}")
    base = statistics.median(plain["off"])
    print(f"median step, no monitor: {base * 1e3:.1f} ms")
    for e in everies:
        name = f"every={e}"
        p, d = statistics.median(plain[name]), statistics.median(diag[name])
        share = (d - p) / (e * p)
        print(f"{name}: plain step {p * 1e3:.1f} ms ({100 * (p / base - 1):+.2f}% vs none: the row-count hook), "
              f"diag step {d * 1e3:.1f} ms; diag steps cost {100 * share:.2f}% of training time; "
              f"total-time ratio {total[name] / total['off']:.3f}")
    model, monitor = arms[f"every={everies[-1]}"]
    t0 = time.perf_counter()
    monitor.checkpoint(args.steps, val_windows=data[:4].reshape(-1, args.seq + 1)[:32])
    ck = time.perf_counter() - t0
    print(f"at-checkpoint diagnostics (structure + use test on 32 windows): {ck:.2f} s = {ck / base:.1f} "
          "training steps")
    for _, m in arms.values():
        if m is not None:
            m.close()


if __name__ == "__main__":
    main()
