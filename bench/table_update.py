"""Cost of one update of the per-layer table: dense AdamW versus the row-sparse update, time and memory.

One table ``[V, L·dP]`` (default V=262,144, L=8, dP=256: 537M fp32 entries, 2 GiB) is updated from a batch
of ``B×T`` token ids drawn from a Zipf(1.1) law over V (text-like: many repeats, a few thousand distinct
rows). A timed update is: the lookup's backward into the table (dense: a ``[V, L·dP]`` gradient; sparse:
the rows of the batch), ``optimizer.step()`` (``torch.optim.AdamW(foreach=False)`` vs
:class:`plelab.training.sparse.RowSparseAdamW`), ``zero_grad``. The two optimizers share the table tensor
and keep their own moments; the arms alternate for ``--repeats`` repeats. Memory is what each update
holds beyond the table: the gradient plus the optimizer state (both keep dense moments: the saving is the
gradient), and with ``--rss`` the peak resident memory of a fresh process doing 3 updates of one kind.

    python bench/table_update.py --repeats 10 --rss
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from common import fmt_ci, machine, rotated

from plelab.runtime import setup_torch
from plelab.training.sparse import RowSparseAdamW, coalesce_sparse_grads


def zipf_ids(V: int, n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, V + 1, dtype=torch.float64) ** 1.1
    return torch.multinomial(p / p.sum(), n, replacement=True, generator=gen)


def held_bytes(p: torch.Tensor, opt: torch.optim.Optimizer) -> int:
    def size(t):
        if t.is_sparse:
            return size(t._indices()) + size(t._values())
        return t.numel() * t.element_size()
    state = sum(size(v) for v in opt.state[p].values() if torch.is_tensor(v))
    return state + (size(p.grad) if p.grad is not None else 0)


def make_update(table: torch.nn.Parameter, ids: torch.Tensor, probe: torch.Tensor, sparse: bool):
    cls = RowSparseAdamW if sparse else torch.optim.AdamW
    opt = cls([{"params": [table], "row_sparse": sparse}], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=False,
              weight_decay=0.0)
    info = {}

    def update():
        z = F.embedding(ids, table, sparse=sparse)
        (z * probe).sum().backward()
        if sparse:
            coalesce_sparse_grads([table])
        info["bytes"] = held_bytes(table, opt)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return update, info


def rss_child(kind: str, V: int, D: int, n: int) -> None:
    setup_torch(0)
    table = torch.nn.Parameter(torch.zeros(V, D))
    ids = zipf_ids(V, n)
    probe = torch.randn(n, D)
    update, _ = make_update(table, ids, probe, kind == "sparse")
    for _ in range(3):
        update()
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork + exec
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"peak_rss": int(hwm.split()[1]) * 1024}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dp", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=8 * 512, help="B×T ids per step")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rss", action="store_true", help="also measure peak RSS in a fresh process per kind")
    ap.add_argument("--child", choices=("dense", "sparse"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    V, D = args.vocab, args.layers * args.dp
    if args.child:
        rss_child(args.child, V, D, args.tokens)
        return
    setup_torch(0)
    table = torch.nn.Parameter(torch.randn(V, D) * 0.02)
    ids = zipf_ids(V, args.tokens)
    probe = torch.randn(args.tokens, D)
    arms = {k: make_update(table, ids, probe, k == "sparse") for k in ("dense", "sparse")}
    for fn, _ in arms.values():  # warm-up: allocates the moments
        fn()
    times = {k: [] for k in arms}
    for r in range(args.repeats):
        for k in rotated(list(arms), r):
            t0 = time.perf_counter()
            arms[k][0]()
            times[k].append(time.perf_counter() - t0)
    print(f"table [{V:,} × {args.layers}·{args.dp}] fp32 = {V * D * 4 / 2**30:.2f} GiB; {args.tokens} ids per step, "
          f"{ids.unique().numel():,} distinct rows; {machine()}")
    for k in arms:
        print(f"{k}: median update {statistics.median(times[k]) * 1e3:.1f} ms; gradient + optimizer state "
              f"{arms[k][1]['bytes'] / 2**30:.3f} GiB")
    ratio = [d / s for d, s in zip(times["dense"], times["sparse"])]
    print(f"dense time ÷ row-sparse time (per repeat): {fmt_ci(ratio, 1, 1)}× (target ≥ 10×)")
    if args.rss:
        del arms, table  # free this process's 10 GiB before the fresh processes run
        for k in ("dense", "sparse"):
            out = subprocess.run([sys.executable, __file__, "--child", k, "--vocab", str(V), "--layers",
                                  str(args.layers), "--dp", str(args.dp), "--tokens", str(args.tokens)],
                                 capture_output=True, text=True, check=True)
            peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss"]
            print(f"{k}: peak RSS of a fresh process doing 3 updates {peak / 2**30:.2f} GiB "
                  f"(table alone {V * D * 4 / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
