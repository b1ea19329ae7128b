"""``plelab eval RUN``: the validation loss of a trained text model, its per-layer table memory-mapped.

The model comes from :func:`plelab.model.loading.load_for_eval` (trunk on ``--device``, table mapped
from ``model.safetensors`` on the host unless ``--table-in-memory``); the windows are the run's own
validation windows from its corpus: by default exactly those the trainer evaluated on
(``train.eval_batches × train.batch_size`` windows of ``train.seq_len``, in the run's micro-batches and
precision), so that the final checkpoint reproduces the run's last validation loss (bf16 follows the
device eval runs on, as in training: a GPU run evaluated on CPU is evaluated in fp32). A corpus that no
longer matches the run's fingerprint is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch

from plelab.errors import ConfigError, PlelabError


def cmd_eval(args: argparse.Namespace) -> int:
    from plelab.data.pipeline import prepare_data
    from plelab.data.tokens import val_windows
    from plelab.model.losses import window_losses
    from plelab.model.loading import checkpoint_of, load_for_eval
    from plelab.model.ple import IIDTableIds
    from plelab.runtime import resolve_device, setup_torch, uses_bf16
    from plelab.train.checkpoint import read_state

    if (args.windows is not None and args.windows < 1) or (args.batch is not None and args.batch < 1):
        raise ConfigError("--windows and --batch must be integers >= 1")
    setup_torch(0)
    device = resolve_device(args.device)
    ckpt = checkpoint_of(args.path)
    t0 = time.perf_counter()
    model, cfg = load_for_eval(ckpt, device=device, mmap_table=not args.table_in_memory)
    load_s = time.perf_counter() - t0
    data = prepare_data(cfg, progress=not args.no_progress)
    state = read_state(ckpt, for_resume=False)
    trained_on = state.get("corpus_fingerprint")
    if trained_on is not None and trained_on != data.corpus_fingerprint:
        raise PlelabError(f"{ckpt} was trained on another corpus (sha256 {trained_on[:12]}…, the run's data.path "
                          f"now gives {data.corpus_fingerprint[:12]}…); restore the run's corpus")
    iid = None
    if cfg.ple.enabled and cfg.ple.ids == "iid":
        vp = cfg.ple.resolved_vocab_size(cfg.model)
        iid = IIDTableIds(torch.from_numpy(data.train_counts(vp)).to(device))
    n = args.windows if args.windows is not None else cfg.train.eval_batches * cfg.train.batch_size
    windows = val_windows(data.val, cfg.train.seq_len, n)
    # as the trainer evaluates: its micro-batch (the i.i.d. null's draws are seeded per chunk) and precision
    batch = args.batch or max(1, cfg.train.batch_size // (cfg.train.grad_accum * state.get("world_size", 1)))
    bf16 = uses_bf16(cfg.train.precision, device)
    with torch.no_grad(), (torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()):
        losses = window_losses(model, windows, batch, device, iid)
    table = model.model.embed_tokens_per_layer.weight if cfg.ple.enabled else None
    out = {"checkpoint": str(ckpt), "val_loss": float(losses.mean()), "windows": len(windows),
           "device": str(device), "table_device": str(table.device) if table is not None else None,
           "table_memory_mapped": bool(cfg.ple.enabled and not args.table_in_memory), "load_seconds": load_s}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        where = ("memory-mapped on the host" if out["table_memory_mapped"] else f"in memory on {out['table_device']}"
                 ) if table is not None else "no PLE table"
        print(f"{ckpt}: validation loss {out['val_loss']:.4f} nats over {out['windows']} windows "
              f"(trunk on {device}, table {where}; loaded in {load_s:.2f} s)")
    return 0


def add_eval_parser(sub) -> None:
    p = sub.add_parser("eval", help="validation loss of a trained text model (per-layer table memory-mapped)")
    p.add_argument("path", help="a run folder (its latest checkpoint) or a checkpoints/step-N folder")
    p.add_argument("--device", default="auto", help="where the trunk runs: auto | cpu | cuda | cuda:N")
    p.add_argument("--windows", type=int, help="validation windows (default: the run's own, as in training)")
    p.add_argument("--batch", type=int, help="windows per forward pass (default: the run's micro-batch)")
    p.add_argument("--table-in-memory", action="store_true",
                   help="read the table into memory on --device instead of memory-mapping it")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_eval)
