"""``plelab eval RUN``: the validation loss of a trained text model, its per-layer table memory-mapped.

The model comes from :func:`plelab.training.loading.load_for_eval` (trunk on ``--device``, table mapped
from ``model.safetensors`` on the host unless ``--table-in-memory``); the windows are the run's own
validation windows from its corpus: by default exactly those the trainer evaluated on
(``train.eval_batches × train.batch_size`` windows of ``train.seq_len``, in the run's micro-batches and
precision), so that the final checkpoint reproduces the run's last validation loss (in the precision the run
recorded, except that a bf16 run evaluated on a CPU without bf16 matrix instructions is evaluated in fp32). A
corpus that no longer matches the run's fingerprint is refused.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from plelab.data.pipeline import prepare_token_data
from plelab.data.tokens import data_val_windows
from plelab.errors import ConfigError, PlelabError
from plelab.model.losses import window_losses
from plelab.model.ple import PLEModules
from plelab.runtime import resolve_device, setup_torch
from plelab.training.checkpoint import read_state
from plelab.training.loading import checkpoint_of, load_for_eval
from plelab.training.rows import null_ids
from plelab.training.run_precision import eval_precision


def evaluate(path: str | Path, *, device: str = "auto", windows: int | None = None, batch: int | None = None,
             table_in_memory: bool = False, progress: bool = True) -> dict:
    """The validation loss of the run or checkpoint at ``path`` on ``windows`` validation windows (default: the
    run's own, as in training), ``batch`` windows per forward pass (default: the run's micro-batch), the trunk on
    ``device`` and the table memory-mapped (``table_in_memory``: read in). Returns ``{"checkpoint", "val_loss",
    "windows", "device", "table_device", "table_memory_mapped", "load_seconds"}``."""
    if (windows is not None and windows < 1) or (batch is not None and batch < 1):
        raise ConfigError("--windows and --batch must be integers >= 1")
    setup_torch(0)
    device = resolve_device(device)
    ckpt = checkpoint_of(path)
    t0 = time.perf_counter()
    model, cfg = load_for_eval(ckpt, device=device, mmap_table=not table_in_memory)
    load_s = time.perf_counter() - t0
    data = prepare_token_data(cfg, progress=progress)
    state = read_state(ckpt, for_resume=False)
    trained_on = state.get("corpus_fingerprint")
    if trained_on is not None and trained_on != data.corpus_fingerprint:
        raise PlelabError(f"{ckpt} was trained on another corpus (sha256 {trained_on[:12]}…, the run's data.path "
                          f"now gives {data.corpus_fingerprint[:12]}…); restore the run's corpus")
    iid = null_ids(cfg, data, device)
    n = windows if windows is not None else cfg.train.eval_batches * cfg.train.batch_size
    chosen = data_val_windows(data, cfg.train.seq_len, n)
    # as the trainer evaluates: its micro-batch (the i.i.d. null's draws are seeded per chunk) and precision
    batch = batch or max(1, cfg.train.batch_size // (cfg.train.grad_accum * state.get("world_size", 1)))
    bf16 = eval_precision(cfg, device) == "bf16"
    with torch.no_grad(), (torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()):
        losses = window_losses(model, chosen, batch, device, iid)
    table = PLEModules(model).table if cfg.ple.enabled else None
    return {"checkpoint": str(ckpt), "val_loss": float(losses.mean()), "windows": len(chosen),
            "device": str(device), "table_device": str(table.device) if table is not None else None,
            "table_memory_mapped": bool(cfg.ple.enabled and not table_in_memory), "load_seconds": load_s}
