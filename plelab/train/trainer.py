"""The trainer: one run of one config, single process or under torchrun (DDP / FSDP2).

The kind of run is a handful of hooks (``_build_model``, ``_build_optimizer``, ``_setup_data``,
``_micro_loss``, ``evaluate``, ``_diag_windows``, ``_summary_extra``); this class implements the text
LM, :class:`plelab.visual.trainer.VisualTrainer` the image–caption runs, and everything else — the loop,
checkpoints, resume, metrics, live diagnostics — is shared.

A step: ``sampler.batch(step)`` (this rank's rows of the global batch) -> ``model(inputs,
labels)`` under bf16 autocast on CUDA -> ``(loss / grad_accum).backward()`` per micro-batch
-> mean loss across ranks -> clip -> AdamW (decay / no_decay / ple_table groups, LR from
warmup + cosine) -> metrics row -> every ``eval_every`` steps validation, every
``checkpoint_every`` steps an atomic checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from plelab.config.schema import RunConfig
from plelab.data.tokens import PackedSampler, TokenData, val_windows
from plelab.diagnostics.live import RowCounter, checkpoint_diagnostics, live_row, probe_context
from plelab.diagnostics.usage import window_losses
from plelab.errors import PlelabError
from plelab.faults import maybe_fault
from plelab.io import write_json
from plelab.model.accounting import flops_per_token
from plelab.model.init import build_model, param_seed
from plelab.model.transformer import PLECausalLM
from plelab.provenance import provenance
from plelab.runtime import available_cores, resolve_device, seed_everything, setup_torch, uses_bf16
from plelab.train import checkpoint as ckpt
from plelab.train import sparse
from plelab.train.distributed import (
    DistInfo,
    all_ranks_ok,
    barrier,
    init_distributed,
    mean_across_ranks,
    sum_across_ranks,
    wrap_model,
)
from plelab.train.metrics import MetricSinks, gpu_peak_flops, step_line, truncate_jsonl
from plelab.train.nonfinite import diagnose_step, stop_message
from plelab.train.optim import build_optimizer, lr_multiplier, set_lr

# Config keys that must match for a checkpoint to be resumed (they change what a step computes).
_RESUME_KEYS = ("seed", "model", "ple", "train.batch_size", "train.seq_len", "train.table_optimizer", "visual")


@dataclass
class TrainResult:
    train_losses: list[float] = field(default_factory=list)
    val_history: list[tuple[int, float]] = field(default_factory=list)
    tokens_seen: int = 0
    wall_seconds: float = 0.0
    tokens_per_second: float = 0.0

    @property
    def final_val_loss(self) -> float:
        return self.val_history[-1][1]


class Trainer:
    def __init__(self, cfg: RunConfig, data: TokenData, run_dir: str | Path | None = None, *, resume: bool = False,
                 progress: bool = True, log=print) -> None:
        tc = cfg.train
        self.cfg, self.data, self.log, self.progress = cfg, data, log, progress
        self.run_dir = Path(run_dir) if run_dir is not None else None
        device = resolve_device(tc.device)
        self.dist: DistInfo = init_distributed(device.type)
        self.device = torch.device("cuda", self.dist.local_rank) if device.type == "cuda" else device
        setup_torch(tc.threads or max(1, available_cores() // self.dist.local_world_size))
        seed_everything(cfg.seed)
        per_step = self.dist.world_size * tc.grad_accum
        if tc.batch_size % per_step:
            raise PlelabError(f"train.batch_size={tc.batch_size} must be divisible by world size x grad_accum = "
                              f"{self.dist.world_size} x {tc.grad_accum}; change one of them")
        self.micro_batch = tc.batch_size // per_step
        self.bf16 = uses_bf16(tc.precision, self.device)
        self.model = self._build_model()
        self.lm: PLECausalLM = self.model if isinstance(self.model, PLECausalLM) else self.model.lm
        self.sparse_table = sparse.make_table_sparse(self.lm, cfg, self.dist.enabled)
        self.rows: RowCounter | None = None
        if cfg.ple.enabled:
            vp = cfg.ple.resolved_vocab_size(cfg.model)
            self.rows = RowCounter(vp, self.device)
            if cfg.ple.ids == "iid":
                self.lm.model.set_iid_frequencies(torch.from_numpy(data.train_counts(vp)).to(self.device))
        table_apart = self.sparse_table is not None or (cfg.ple.enabled and tc.table_device == "cpu")
        sparse_names = ["model.embed_tokens_per_layer.weight"] if table_apart else []
        self.wrapped = wrap_model(self.model, tc.parallel, self.dist, self.device, self.bf16, ignore=sparse_names)
        self.opt = self._build_optimizer()
        self.forward = torch.compile(self.wrapped) if tc.compile else self.wrapped
        self.tokens_per_step = tc.batch_size * tc.seq_len
        self._setup_data()
        self.flops_per_token = flops_per_token(cfg.model, cfg.ple, tc.seq_len)
        self.peak_flops = gpu_peak_flops(self.device)
        self.step, self.tokens_seen, self.wall_before = 0, 0, 0.0
        self.val_history: list[tuple[int, float]] = []
        self.recent_losses: list[float] = []  # the last eval_every train losses (for the train–val gap)
        self.table_alpha = 1.0  # Π (1 − lr·wd) of the table group: how much of W_0 is left in W_t
        self.skipped_steps = 0  # steps skipped for a non-finite loss or gradient (train.skip_nonfinite)
        self.replaying = False  # True while _nonfinite re-runs a step's forward to find the culprit
        self.sinks = None
        if self.run_dir is not None:
            self._open_run(resume)

    # ---- what a kind of run defines (text LM here; plelab.visual.trainer overrides them) -------
    def _build_model(self) -> torch.nn.Module:
        return build_model(self.cfg.model, self.cfg.ple, seed=self.cfg.seed, device=self.device,
                           table_device="cpu" if self.cfg.train.table_device == "cpu" else None)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        return build_optimizer(self.model, self.cfg.train)

    def _setup_data(self) -> None:
        tc = self.cfg.train
        self.sampler = PackedSampler(self.data.train, tc.seq_len, self.cfg.seed)
        self.val = val_windows(self.data.val, tc.seq_len, tc.eval_batches * tc.batch_size)

    def _micro_loss(self, step: int, micro: int, rows: slice) -> torch.Tensor:
        """The mean loss of this rank's ``rows`` of the global batch of ``step`` (micro-step ``micro``)."""
        x, y = self.sampler.batch(step, self.cfg.train.batch_size, rows)
        if self.cfg.ple.enabled and self.cfg.ple.ids == "iid":  # distinct, resumable draws per rank/micro-step
            self.lm.model.iid_generator = torch.Generator(device=self.device).manual_seed(
                param_seed(self.cfg.seed, f"iid:{step}:{self.dist.rank}:{micro}"))
        return self.forward(x.to(self.device), labels=y.to(self.device)).loss

    def _diag_windows(self) -> torch.Tensor | None:
        """Validation windows for the checkpoint use test of the text table (None: skip it)."""
        tc = self.cfg.train
        return self.val[:tc.diag_windows] if tc.diag_windows else None

    def _summary_extra(self) -> dict:
        return {}

    def _checkpoint_extra(self) -> dict[str, torch.Tensor]:
        """More tensors to save with a checkpoint (``optimizer.safetensors``; restored by ``_restore_extra``)."""
        return {}

    def _state_extra(self) -> dict:
        """More JSON state to save with a checkpoint (``state.json``, key ``extra``)."""
        return {}

    def _restore_extra(self, saved: dict[str, torch.Tensor], state: dict) -> None:
        """Restore what ``_checkpoint_extra`` (tensors) and ``_state_extra`` (``state["extra"]``) saved."""

    def _live_extra(self) -> dict:
        """More live diagnostics of a diag step (after backward, before the optimizer step)."""
        return {}

    # ---- run folder, resume ------------------------------------------------------------------
    def _open_run(self, resume: bool) -> None:
        """Check everything first (every rank, nothing written), then rank 0 writes."""
        run, main = self.run_dir, self.dist.is_main
        held = [n for n in ("config.json", "metrics.jsonl", "checkpoints") if (run / n).exists()]
        if held and not resume:
            raise PlelabError(f"{run} already holds a run ({held[0]}); pass --resume to continue it, "
                              "or choose another --out")
        found = ckpt.list_checkpoints(run) if resume else []
        latest = found[-1] if found else None
        state = ckpt.read_state(latest) if latest is not None else None
        if state is not None:
            ckpt.check_resumable(run, state, self.cfg, _RESUME_KEYS, self.data.corpus_fingerprint)
            # tensors first: a checkpoint that does not load leaves config.json as it was
            ckpt.load_model_weights(self.model, latest)
            saved_extra = ckpt.load_optimizer_state(self.model, self.opt, latest)
            if self.rows is not None and "diag.row_counts" in saved_extra:
                # this rank continues counting from the global total on rank 0 only, so the sum stays exact
                if self.dist.is_main:
                    self.rows.counts.copy_(saved_extra["diag.row_counts"].to(self.rows.counts.device))
            self._restore_extra(saved_extra, state.get("extra", {}))
            self.step, self.tokens_seen = state["step"], state["tokens_seen"]
            self.val_history = [tuple(v) for v in state["val_history"]]
            self.recent_losses = list(state["recent_train_losses"])
            self.table_alpha = state.get("table_decay_alpha", 1.0)
            self.skipped_steps = state.get("skipped_steps", 0)
            self.wall_before = state["wall_seconds"]
            self.log(f"resumed {run} from {latest.name} (step {self.step})")
        elif resume:
            self.log(f"no checkpoint in {run} yet: starting from step 0")
        MetricSinks.check_available(self.cfg.train)
        barrier(self.dist)  # every rank has checked before rank 0 writes
        ok = True
        if main:
            try:
                run.mkdir(parents=True, exist_ok=True)
                write_json(run / "config.json", self.cfg.to_dict())
            except OSError as err:
                ok, why = False, f"cannot write to output folder {run}: {err.strerror or err}"
        if not all_ranks_ok(ok, self.dist):
            raise PlelabError(why if main else f"rank 0 could not write to {run}")
        if main:
            if state is not None:
                truncate_jsonl(run / "metrics.jsonl", self.step)
            else:
                (run / "metrics.jsonl").unlink(missing_ok=True)
            self.sinks = MetricSinks(run, self.cfg.train.tensorboard, self.cfg.train.wandb_project, self.cfg.to_dict())
        barrier(self.dist)

    def save_checkpoint(self) -> None:
        model_t, opt_t = ckpt.gather_state(self.model, self.opt)  # collective: every rank calls it
        extra, diagnostics = self._checkpoint_extra(), None
        if self.rows is not None:
            counts = sum_across_ranks(self.rows.counts, self.dist)
            extra["diag.row_counts"] = counts.cpu()
            if self.dist.is_main and not (self.dist.enabled and self.cfg.train.parallel == "fsdp"):
                diagnostics = checkpoint_diagnostics(self.lm, self.cfg, counts.cpu().numpy(), self.table_alpha,
                                                     self._diag_windows(), self.device)
        if self.dist.is_main:
            ckpt.save_checkpoint(self.run_dir, self.step, model_t, opt_t, {
                "tokens_seen": self.tokens_seen, "val_history": self.val_history, "config": self.cfg.to_dict(),
                "recent_train_losses": self.recent_losses, "table_decay_alpha": self.table_alpha,
                "skipped_steps": self.skipped_steps,
                "wall_seconds": self.wall_before + self._elapsed(), "corpus_fingerprint": self.data.corpus_fingerprint,
                "world_size": self.dist.world_size, "extra": self._state_extra()},
                keep=self.cfg.train.keep_checkpoints, extra_tensors=extra,
                diagnostics=diagnostics, protect=self.cfg.train.early_checkpoint)
        barrier(self.dist)

    # ---- steps -------------------------------------------------------------------------------
    def _autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self) -> dict:
        tc, step = self.cfg.train, self.step
        set_lr(self.opt, lr_multiplier(step, tc))
        # Probes are off under torch.compile: toggling them would recompile and change the fused graph.
        diag_step = bool(self.rows is not None and tc.diag_every and not tc.compile
                         and (step + 1) % tc.diag_every == 0)
        t0 = time.perf_counter()
        total = torch.zeros((), device=self.device)
        looked_up = []  # table rows of each micro-step, counted once the step is known to be finite
        for m in range(tc.grad_accum):
            first = (self.dist.rank * tc.grad_accum + m) * self.micro_batch
            sync_off = m < tc.grad_accum - 1 and hasattr(self.wrapped, "no_sync")
            with (self.wrapped.no_sync() if sync_off else contextlib.nullcontext()), self._autocast(), \
                    probe_context(self.lm, diag_step and m == 0) as probe:
                loss = self._micro_loss(step, m, slice(first, first + self.micro_batch))
                if m == 0:
                    first_probe = probe
            if self.rows is not None:
                looked_up.append(self.lm.model.last_table_ids)
            (loss / tc.grad_accum).backward()
            total += loss.detach()
        if self.sparse_table is not None and self.sparse_table.grad is not None:
            sparse.coalesce_sparse_grads([self.sparse_table])
            if self.dist.enabled:
                sparse.all_reduce_sparse_grad(self.sparse_table, self.dist.world_size,
                                       self.device if self.device.type == "cuda" else torch.device("cpu"))
        loss = mean_across_ranks(total / tc.grad_accum, self.dist).item()
        if not math.isfinite(loss):
            return self._nonfinite(step, f"the loss became {loss}")
        params = list(self.model.parameters())
        gnorm = sparse.grad_norm(params)  # before any clipping: a non-finite gradient is diagnosed as it is
        gnorm_value = (gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm).item()
        if not math.isfinite(gnorm_value):
            return self._nonfinite(step, f"the gradient norm became {gnorm_value}", loss_finite=True)
        if self.rows is not None:
            for ids in looked_up:
                self.rows.update(ids)
        extra = live_row(first_probe, self.lm, self.rows, self.dist) if diag_step else {}
        if diag_step:
            extra["diag"].update(self._live_extra())
        if tc.grad_clip > 0:
            sparse.clip_with_norm(params, tc.grad_clip, gnorm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for g in self.opt.param_groups:
            if g["name"] == "ple_table":
                self.table_alpha *= 1 - g["lr"] * g["weight_decay"]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        tokens = self.tokens_per_step
        self.tokens_seen += tokens
        self.step += 1
        tps = tokens / dt
        return {"step": self.step, "loss": loss, "lr": self.opt.param_groups[0]["lr"], "grad_norm": gnorm_value,
                "tokens": self.tokens_seen, "epoch": self.sampler.epochs(self.step, tc.batch_size),
                "tokens_per_second": tps,
                "mfu": (tps * self.flops_per_token / (self.peak_flops * self.dist.world_size)
                        if self.peak_flops else None), **extra}

    def _nonfinite(self, step: int, what: str, loss_finite: bool = False) -> dict:
        """A non-finite loss or gradient norm at ``step`` (before any clipping or update): name its origin, then
        skip the step (while ``train.skip_nonfinite`` allows) or stop with a one-line error."""
        tc = self.cfg.train
        detail = diagnose_step(self, step, loss_finite)
        self.opt.zero_grad(set_to_none=True)
        if self.skipped_steps < tc.skip_nonfinite:
            self.skipped_steps += 1
            self.step += 1
            self.tokens_seen += self.tokens_per_step
            return {"step": self.step, "tokens": self.tokens_seen, "lr": self.opt.param_groups[0]["lr"],
                    "skipped": f"{what}; {detail} (skip {self.skipped_steps} of train.skip_nonfinite="
                               f"{tc.skip_nonfinite})"}
        raise PlelabError(stop_message(what, step, detail, self.run_dir))

    def evaluate(self) -> float:
        """Mean next-token CE (nats) over the fixed validation windows (every rank runs all of them)."""
        with self._autocast():
            return float(window_losses(self.model, self.val, self.micro_batch, self.device).mean())

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        tc, main = self.cfg.train, self.dist.is_main
        result = TrainResult(val_history=self.val_history)
        if self.step >= tc.steps:
            self.log(f"the run is already at step {self.step} of train.steps={tc.steps}: nothing to do "
                     "(raise --steps to continue it)")
            if self.sinks is not None:
                self.sinks.close()
            result.tokens_seen, result.wall_seconds = self.tokens_seen, self.wall_before
            result.tokens_per_second = self.tokens_seen / self.wall_before if self.wall_before else 0.0
            if self.run_dir is not None and not (self.run_dir / "summary.json").exists():
                self._write_summary(result)  # killed between its last checkpoint and its summary
            return result
        self._start = time.perf_counter()
        first_step = self.step
        bar = tqdm(total=tc.steps, initial=self.step, desc=f"{self.cfg.preset} dP={self.cfg.ple.dim}",
                   disable=not (self.progress and main), leave=False, dynamic_ncols=True)
        say = bar.write if self.progress and main else self.log
        self.model.train()
        try:
            while self.step < tc.steps:
                row = self.train_step()
                maybe_fault("after_step", self.step)
                if "loss" in row:
                    result.train_losses.append(row["loss"])
                    self.recent_losses = (self.recent_losses + [row["loss"]])[-tc.eval_every:]
                if self.step % tc.eval_every == 0 or self.step == tc.steps:
                    row["val_loss"] = self.evaluate()
                    self.val_history.append((self.step, row["val_loss"]))
                    if self.recent_losses:
                        row["train_val_gap"] = row["val_loss"] - sum(self.recent_losses) / len(self.recent_losses)
                if main:
                    if self.sinks is not None:
                        self.sinks.write(row)
                    if "skipped" in row:
                        say(f"step {row['step']}: skipped — {row['skipped']}")
                    elif self.step % tc.log_every == 0 or "val_loss" in row:
                        say(step_line(row, tc.steps))
                    bar.update(1)
                    if "loss" in row:
                        bar.set_postfix(loss=f"{row['loss']:.3f}")
                if self.run_dir is not None and (
                        (tc.checkpoint_every and self.step % tc.checkpoint_every == 0) or self.step == tc.steps
                        or self.step == tc.early_checkpoint):
                    self.save_checkpoint()
        finally:
            bar.close()
            if self.sinks is not None:
                self.sinks.close()
        elapsed = self._elapsed()
        result.tokens_seen = self.tokens_seen
        result.wall_seconds = self.wall_before + elapsed
        result.tokens_per_second = (self.step - first_step) * self.tokens_per_step / max(elapsed, 1e-9)
        self._write_summary(result)
        return result

    def _write_summary(self, result: TrainResult) -> None:
        if self.run_dir is None or not self.dist.is_main:
            return
        tc = self.cfg.train
        summary = {
            "final_train_loss": (result.train_losses or self.recent_losses or [None])[-1],
            "final_val_loss": self.val_history[-1][1] if self.val_history else None,
            "val_unigram_entropy": self.data.unigram_entropy(self.cfg.model.vocab_size),
            "steps": self.step, "tokens_seen": self.tokens_seen,
            "epochs": self.sampler.epochs(self.step, tc.batch_size), "wall_seconds": result.wall_seconds,
            "tokens_per_second": result.tokens_per_second, "world_size": self.dist.world_size,
            "skipped_steps": self.skipped_steps,
            "params": sum(p.numel() for p in self.model.parameters()),
            **self._summary_extra(), **provenance(self.cfg, self.data.corpus_fingerprint)}
        try:
            write_json(self.run_dir / "summary.json", summary)
        except OSError as err:
            raise PlelabError(f"cannot write {self.run_dir / 'summary.json'}: {err.strerror or err}; the final "
                              "checkpoint is saved — free space and rerun with --resume to write the summary") from None


def train(cfg: RunConfig, data: TokenData, out_dir: str | Path | None = None, progress: bool = True,
          resume: bool = False, log=print) -> TrainResult:
    """Build a :class:`Trainer` and run it to ``cfg.train.steps``."""
    return Trainer(cfg, data, out_dir, resume=resume, progress=progress, log=log).fit()
