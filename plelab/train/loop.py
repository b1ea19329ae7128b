"""The training loop: one run of one config on one token stream (single process).

Data flow of a step: ``train_batch(seed, step)`` -> ``model(inputs, labels)`` (embeddings,
per-layer inputs [B,T,L,dP], L decoder layers with the PLE update, tied LM head, CE) ->
``backward`` -> clip -> AdamW (3 groups, LR from warmup+cosine) -> metrics line.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from plelab.config.schema import RunConfig
from plelab.data.tokens import TokenData, epochs_seen, train_batch, val_windows
from plelab.errors import PlelabError
from plelab.io import write_json
from plelab.model.init import build_model
from plelab.model.transformer import PLECausalLM
from plelab.provenance import provenance
from plelab.runtime import resolve_device, seed_everything, setup_torch
from plelab.train.optim import build_optimizer, lr_multiplier, set_lr


@dataclass
class TrainResult:
    train_losses: list[float] = field(default_factory=list)
    val_history: list[tuple[int, float]] = field(default_factory=list)
    tokens_seen: int = 0
    wall_seconds: float = 0.0
    model: PLECausalLM | None = None

    @property
    def final_val_loss(self) -> float:
        return self.val_history[-1][1]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_seen / max(self.wall_seconds, 1e-9)


@torch.no_grad()
def evaluate(model: PLECausalLM, windows: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Mean next-token CE (nats) over fixed validation windows ``[N, T+1]``."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size].to(device)
        loss = model(chunk[:, :-1], labels=chunk[:, 1:]).loss
        total += loss.item() * chunk.shape[0]
        count += chunk.shape[0]
    model.train(was_training)
    return total / count


def train(cfg: RunConfig, data: TokenData, out_dir: str | Path | None = None, progress: bool = True,
          log=print) -> TrainResult:
    """Train ``cfg`` on ``data``; with ``out_dir`` write config.json, metrics.jsonl and summary.json."""
    tc = cfg.train
    setup_torch(tc.threads)
    seed_everything(cfg.seed)
    device = resolve_device(tc.device)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "config.json", cfg.to_dict())
        except OSError as err:
            raise PlelabError(f"cannot write to output folder {out}: {err.strerror or err}") from None
        metrics = (out / "metrics.jsonl").open("w")
    model = build_model(cfg.model, cfg.ple, seed=cfg.seed, device=device)
    model.train()
    opt = build_optimizer(model, tc)
    windows = val_windows(data.val, tc.seq_len, tc.eval_batches * tc.batch_size)
    result = TrainResult(model=model)
    tokens_per_step = tc.batch_size * tc.seq_len
    bar = tqdm(range(tc.steps), desc=f"train dP={cfg.ple.dim}", disable=not progress, leave=False)
    start = time.perf_counter()

    def record(row: dict) -> None:
        if out is not None:
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()

    for step in bar:
        mult = lr_multiplier(step, tc)
        set_lr(opt, mult)
        x, y = train_batch(data.train, tc.batch_size, tc.seq_len, cfg.seed, step)
        loss = model(x.to(device), labels=y.to(device)).loss
        if not math.isfinite(loss.item()):
            raise PlelabError(f"loss became {loss.item()} at step {step}; lower train.lr or check the data")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip if tc.grad_clip > 0 else math.inf)
        opt.step()
        result.train_losses.append(loss.item())
        result.tokens_seen += tokens_per_step
        row = {"step": step + 1, "loss": loss.item(), "lr_mult": mult, "grad_norm": grad_norm.item(),
               "tokens": result.tokens_seen, "epoch": epochs_seen(result.tokens_seen, len(data.train))}
        if (step + 1) % tc.eval_every == 0 or step + 1 == tc.steps:
            row["val_loss"] = evaluate(model, windows, tc.batch_size, device)
            result.val_history.append((step + 1, row["val_loss"]))
            row["train_val_gap"] = row["val_loss"] - sum(result.train_losses[-tc.eval_every:]) / min(
                tc.eval_every, len(result.train_losses))
        bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{result.val_history[-1][1]:.3f}" if result.val_history else "-")
        record(row)
    result.wall_seconds = time.perf_counter() - start
    if out is not None:
        metrics.close()
        write_json(out / "summary.json", {
            "final_train_loss": result.train_losses[-1], "final_val_loss": result.final_val_loss,
            "tokens_seen": result.tokens_seen, "epochs": epochs_seen(result.tokens_seen, len(data.train)),
            "wall_seconds": result.wall_seconds, "tokens_per_second": result.tokens_per_second,
            **provenance(cfg, data.corpus_fingerprint),
        })
    return result
