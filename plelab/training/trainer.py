"""The trainer: one run of one task, single process or under torchrun (DDP / FSDP2).

What a kind of run is — model, parameter groups, batches, loss, evaluation, its own state — is the
:class:`~plelab.training.task.Task`'s; what watches the run (live and at-checkpoint diagnostics) are
:class:`~plelab.training.task.Observer` s. The trainer owns the rest: the loop, checkpoints, resume, metrics,
row counts and the NaN diagnosis.

A step: the task's micro-batches (fixed for the step) -> ``task.loss`` under bf16 autocast where it wins ->
``(loss / grad_accum).backward()`` per micro-batch -> mean loss across ranks -> finite? -> row counts,
observers -> clip -> AdamW (the task's groups, LR from warmup + cosine) -> ``task.after_step`` -> metrics row ->
every ``eval_every`` steps validation, every ``checkpoint_every`` steps an atomic checkpoint.

The run folder (its lock, the files written at the start, the summary) is a
:class:`~plelab.training.run_folder.RunFolder`, held from the trainer's start to the end of :meth:`Trainer.fit`. A
sweep's worker stops at its next step, with a checkpoint, once the sweep is gone.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from plelab.config import keys_tagged
from plelab.config.paths import portable
from plelab.distributed import DistInfo, all_ranks_ok, barrier, init_distributed, mean_across_ranks, sum_across_ranks
from plelab.errors import PlelabError
from plelab.faults import maybe_fault
from plelab.model.accounting import flops_per_token
from plelab.model.ple import TABLE_KEY, PLEModules
from plelab.precision import PrecisionChoice
from plelab.provenance import provenance
from plelab.runtime import available_cores, resolve_device, seed_everything, setup_torch
from plelab.training import checkpoint as ckpt
from plelab.training import sparse
from plelab.training.metrics import MetricSinks, gpu_peak_flops, step_line, truncate_jsonl
from plelab.training.nonfinite import skip_or_stop
from plelab.training.optim import adamw, lr_multiplier, set_lr
from plelab.training.parallel import fsdp_sharder, wrap_model
from plelab.training.rows import RowCounter
from plelab.training.run_folder import RunFolder, TrainResult, check_new_run
from plelab.training.run_precision import legacy_precision, run_precision, with_precision
from plelab.training.task import Batch, Observer, RunEnv, Task

__all__ = ["Trainer", "TrainResult", "check_new_run"]


class Trainer:
    """Runs ``task`` to ``task.cfg.train.steps`` (the task's resolved config is the run's config)."""

    def __init__(self, task: Task, run_dir: str | Path | None = None, *, resume: bool = False,
                 progress: bool = True, log=print, observers: Sequence[Observer] = (),
                 dist: DistInfo | None = None) -> None:
        """``dist``: the process group already joined (:func:`plelab.distributed.init_distributed`); joined here
        when not given."""
        # the run records its paths absolute (config.json, state, summary): its config works from any directory
        self.task, self.cfg, self.log, self.progress = task, portable(task.cfg), log, progress
        self.run_dir = Path(run_dir) if run_dir is not None else None
        device = resolve_device(task.cfg.train.device)
        self.dist = dist if dist is not None else init_distributed(device.type)
        self.folder = RunFolder(self.run_dir, self.dist) if self.run_dir is not None else None
        if self.folder is not None:
            self.folder.hold(at_start=True)  # before anything in the folder is read: another run may be writing it
        try:
            self._setup(task, device, resume, observers)
        except BaseException:
            self.release()  # a refused resume leaves the folder as it was, the lock file included
            raise

    def _setup(self, task: Task, device: torch.device, resume: bool, observers: Sequence[Observer]) -> None:
        cfg = task.cfg
        tc = cfg.train
        if task.single_process and self.dist.enabled:
            raise PlelabError("this kind of run is single-process for now; run it without torchrun")
        self.device = torch.device("cuda", self.dist.local_rank) if device.type == "cuda" else device
        setup_torch(tc.threads or max(1, available_cores() // self.dist.local_world_size))
        seed_everything(cfg.seed)
        per_step = self.dist.world_size * tc.grad_accum
        if tc.batch_size % per_step:
            raise PlelabError(f"train.batch_size={tc.batch_size} must be divisible by world size x grad_accum = "
                              f"{self.dist.world_size} x {tc.grad_accum}; change one of them")
        self.micro_batch = tc.batch_size // per_step
        self.precision = self._resolve_precision(resume)
        task.cfg = self.cfg  # one config: the run's, paths absolute and precision resolved (what config.json holds)
        cfg, tc = self.cfg, self.cfg.train
        self.env = RunEnv(self.device, self.dist, self.micro_batch, self.precision.bf16)
        task.bind(self.env)
        table_sparse = sparse.table_is_sparse(cfg, self.dist.enabled)
        self.sharded = self.dist.enabled and tc.parallel == "fsdp"
        shard = fsdp_sharder(self.env.bf16) if self.sharded else None
        self.model = task.build_model("cpu" if tc.table_device == "cpu" else None, table_sparse, shard)
        self.lm = task.language_model(self.model)
        self.sparse_table = PLEModules(self.lm).table if table_sparse else None
        self.rows = {name: RowCounter(n, self.device) for name, (n, _) in task.row_tables.items()}
        table_apart = self.sparse_table is not None or (cfg.ple.enabled and tc.table_device == "cpu")
        self.wrapped = wrap_model(self.model, tc.parallel, self.dist, self.device,
                                  ignore=[TABLE_KEY] if table_apart else [])
        self.opt = adamw(task.param_groups(self.model))
        self.forward = torch.compile(self.wrapped) if tc.compile else self.wrapped
        self.tokens_per_step = task.tokens_per_step
        self.flops_per_token = flops_per_token(cfg.model, cfg.ple, tc.seq_len, cfg.aux)
        self.peak_flops = gpu_peak_flops(self.device)
        self.step, self.tokens_seen, self.wall_before = 0, 0, 0.0
        self.val_history: list[tuple[int, float]] = []
        self.recent_losses: list[float] = []  # the last eval_every train losses (for the train–val gap)
        self.table_alpha = 1.0  # Π (1 − lr·wd) of the table group: how much of W_0 is left in W_t
        self.skipped_steps = 0  # steps skipped for a non-finite loss or gradient (train.skip_nonfinite)
        self.observers = list(observers)
        for observer in self.observers:
            observer.bind(self.model, self.env)
        self.sinks = None
        if self.run_dir is not None:
            self._open_run(resume)
        task.ready(self.step)

    def _resolve_precision(self, resume: bool) -> PrecisionChoice:
        """``train.precision`` resolved once (every rank agrees: bf16 only where all ranks' probes found it
        faster); ``self.cfg`` then holds the resolved value, which ``config.json`` records."""
        choice = run_precision(self.cfg, self.device, self.micro_batch, self.run_dir, resume)
        if self.dist.enabled and all_ranks_ok(choice.bf16, self.dist) != choice.bf16:
            choice = PrecisionChoice(choice.requested, "fp32", "auto: another rank's probe found bf16 no faster")
        self.cfg = with_precision(self.cfg, choice.resolved)
        return choice

    # ---- run folder, resume ------------------------------------------------------------------
    def release(self) -> None:
        """Let go of the run folder's lock (the end of :meth:`fit` does; so does a failed start). Idempotent."""
        if self.folder is not None:
            self.folder.release()

    def _open_run(self, resume: bool) -> None:
        """Check everything first (every rank, nothing written), then rank 0 writes."""
        run, main = self.run_dir, self.dist.is_main
        check_new_run(run, resume)
        latest = ckpt.latest_intact(run, self.log) if resume else None
        state = ckpt.read_state(latest) if latest is not None else None
        if state is not None:
            self._resume_from(latest, state)
            self.log(f"resumed {run} from {latest.name} (step {self.step})")
        elif resume:
            self.log(f"no checkpoint in {run} yet: starting from step 0")
        MetricSinks.check_available(self.cfg.train)
        barrier(self.dist)  # every rank has checked before rank 0 writes
        self.folder.write_start(resume, self.cfg.to_dict(), self.task.run_files())
        if main:
            if state is not None:
                truncate_jsonl(run / "metrics.jsonl", self.step)
            else:
                (run / "metrics.jsonl").unlink(missing_ok=True)
            self.sinks = MetricSinks(run, self.cfg.train.tensorboard, self.cfg.train.wandb_project, self.cfg.to_dict())
        barrier(self.dist)

    def _resume_from(self, latest: Path, state: dict) -> None:
        """The model, optimizer, row counts, task state and loop counters of checkpoint ``latest`` (whose state
        is ``state``), once it is known to belong to this run."""
        train = state["config"].get("train", {})
        if "precision" in train:  # a run from before precision was resolved recorded "auto"
            train["precision"] = legacy_precision(train["precision"], self.device)
        ckpt.check_resumable(self.run_dir, state, self.cfg, keys_tagged("resume"), self.data_fingerprint)
        # tensors first: a checkpoint that does not load leaves config.json as it was
        ckpt.load_model_weights(self.model, latest)
        # what its other tensors must be: the row counts whole, the task's by dtype (their shapes may grow)
        extra = {k: (v.dtype, None) for k, v in self.task.checkpoint_tensors().items()}
        extra.update({key: self.rows[name].counts for name, (_, key) in self.task.row_tables.items()})
        saved = ckpt.load_optimizer_state(self.model, self.opt, latest, extra)
        for name, (_, key) in self.task.row_tables.items():
            # this rank continues counting from the global total on rank 0 only, so the sum stays exact
            if key in saved and self.dist.is_main:
                self.rows[name].counts.copy_(saved[key].to(self.rows[name].counts.device))
        self.task.restore(saved, state.get("extra", {}))
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.val_history = [tuple(v) for v in state["val_history"]]
        self.recent_losses = list(state["recent_train_losses"])
        self.table_alpha = state.get("table_decay_alpha", 1.0)
        self.skipped_steps = state.get("skipped_steps", 0)
        self.wall_before = state["wall_seconds"]

    @property
    def data_fingerprint(self) -> str:
        return self.task.data.corpus_fingerprint

    def row_counts(self) -> dict[str, torch.Tensor]:
        """How often each row of each counted table was looked up so far (this rank)."""
        return {name: c.counts for name, c in self.rows.items()}

    def save_checkpoint(self) -> None:
        """A checkpoint of this step: gathered and written by rank 0, or, for a sharded (FSDP2) run, written by every
        rank, its own rows (collective either way: every rank calls it)."""
        if not self.sharded:
            model_t, opt_t = ckpt.gather_state(self.model, self.opt)
        extra = self.task.checkpoint_tensors()
        counts = {name: sum_across_ranks(c.counts, self.dist).cpu() for name, c in self.rows.items()}
        for name, (_, key) in self.task.row_tables.items():
            extra[key] = counts[name]
        diagnostics = None
        if self.dist.is_main:
            for observer in self.observers:
                diagnostics = observer.on_checkpoint(self.step, counts, self.table_alpha) or diagnostics
        state = {
            "tokens_seen": self.tokens_seen, "val_history": self.val_history, "config": self.cfg.to_dict(),
            "recent_train_losses": self.recent_losses, "table_decay_alpha": self.table_alpha,
            "skipped_steps": self.skipped_steps,
            "wall_seconds": self.wall_before + self._elapsed(), "corpus_fingerprint": self.data_fingerprint,
            "world_size": self.dist.world_size, "extra": self.task.checkpoint_state()}
        options = {"keep": self.cfg.train.keep_checkpoints, "extra_tensors": extra, "diagnostics": diagnostics,
                   "protect": self.cfg.train.early_checkpoint}
        if self.sharded:
            ckpt.save_sharded_checkpoint(self.run_dir, self.step, self.model, self.opt, state, info=self.dist,
                                         **options)
        elif self.dist.is_main:
            ckpt.save_checkpoint(self.run_dir, self.step, model_t, opt_t, state, **options)
        barrier(self.dist)

    # ---- steps -------------------------------------------------------------------------------
    def batches(self, step: int) -> list[Batch]:
        """This rank's micro-batches of ``step``, made once (a replay reuses them)."""
        tc = self.cfg.train
        out = []
        for m in range(tc.grad_accum):
            first = (self.dist.rank * tc.grad_accum + m) * self.micro_batch
            out.append(self.task.batch(step, m, slice(first, first + self.micro_batch)))
        return out

    def train_step(self) -> dict:
        tc, step = self.cfg.train, self.step
        set_lr(self.opt, lr_multiplier(step, tc))
        t0 = time.perf_counter()
        total = torch.zeros((), device=self.device)
        batches = self.batches(step)
        for m, batch in enumerate(batches):
            sync_off = m < tc.grad_accum - 1 and hasattr(self.wrapped, "no_sync")
            with contextlib.ExitStack() as stack:
                if sync_off:
                    stack.enter_context(self.wrapped.no_sync())
                stack.enter_context(self.env.autocast())
                for observer in self.observers:
                    stack.enter_context(observer.forward_context(step, m))
                loss = self.task.loss(self.forward, batch)
            (loss / tc.grad_accum).backward()
            total += loss.detach()
        if self.sparse_table is not None and self.sparse_table.grad is not None:
            sparse.coalesce_sparse_grads([self.sparse_table])
            if self.dist.enabled:
                sparse.all_reduce_sparse_grad(self.sparse_table, self.dist.world_size,
                                              self.device if self.device.type == "cuda" else torch.device("cpu"))
        loss = mean_across_ranks(total / tc.grad_accum, self.dist).item()
        if not math.isfinite(loss):
            return skip_or_stop(self, step, batches, f"the loss became {loss}")
        params = list(self.model.parameters())
        gnorm = sparse.grad_norm(params)  # before any clipping: a non-finite gradient is diagnosed as it is
        gnorm_value = (gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm).item()
        if not math.isfinite(gnorm_value):
            return skip_or_stop(self, step, batches, f"the gradient norm became {gnorm_value}",
                                loss_finite=True)
        for batch in batches:  # counted once the step is known to be finite
            for name, ids in batch.rows.items():
                self.rows[name].update(ids)
        extra: dict = {}
        for observer in self.observers:
            extra.update(observer.after_backward(step, self.rows))
        if tc.grad_clip > 0:
            sparse.clip_with_norm(params, tc.grad_clip, gnorm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for g in self.opt.param_groups:
            if g["name"] in ("ple_table", "aux_table"):  # the run's table, whatever its kind
                self.table_alpha *= 1 - g["lr"] * g["weight_decay"]
        self.task.after_step(step)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        tokens = self.tokens_per_step
        self.tokens_seen += tokens
        self.step += 1
        tps = tokens / dt
        return {"step": self.step, "loss": loss, "lr": self.opt.param_groups[0]["lr"], "grad_norm": gnorm_value,
                "tokens": self.tokens_seen, "epoch": self.task.epochs(self.step),
                "tokens_per_second": tps,
                "mfu": (tps * self.flops_per_token / (self.peak_flops * self.dist.world_size)
                        if self.peak_flops else None), **extra}

    def evaluate(self) -> float:
        """The task's validation loss (nats)."""
        return self.task.evaluate(self.model, self.step)

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train to ``train.steps``; the run folder's lock is let go when it returns or raises."""
        try:
            if self.folder is not None:
                self.folder.hold()  # taken again when fit runs a second time
                self._stop_if_orphaned(saved=True)
            return self._fit()
        finally:
            self.release()

    def _stop_if_orphaned(self, saved: bool) -> None:
        """A sweep's worker whose sweep is gone (``kill -9``: it could not stop its workers) stops here, with a
        checkpoint of this step (unless ``saved``), so that it trains no further into a folder that a rerun of the
        sweep will write: the rerun resumes the run from this step."""
        if not self.folder.parent_gone():
            return
        if not saved:
            self.save_checkpoint()
        raise PlelabError(f"the sweep that started this run (PID {self.folder.parent_watch.pid}) is gone: "
                          f"{self.run_dir} stopped at step {self.step} of {self.cfg.train.steps}; rerun the sweep to "
                          "resume it from there")

    def _fit(self) -> TrainResult:
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
                    row.update(self.task.other_evaluations(self.model, self.step))
                    self.val_history.append((self.step, row["val_loss"]))
                    if self.recent_losses:
                        row["train_val_gap"] = row["val_loss"] - sum(self.recent_losses) / len(self.recent_losses)
                    for observer in self.observers:
                        observer.on_eval(self.step, row["val_loss"])
                for observer in self.observers:
                    observer.on_step(row)
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
                if self.run_dir is not None:
                    saved = ((tc.checkpoint_every and self.step % tc.checkpoint_every == 0) or self.step == tc.steps
                             or self.step == tc.early_checkpoint)
                    if saved:
                        self.save_checkpoint()
                    if self.step < tc.steps:
                        self._stop_if_orphaned(saved)
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
        summary = {
            "final_train_loss": (result.train_losses or self.recent_losses or [None])[-1],
            "final_val_loss": self.val_history[-1][1] if self.val_history else None,
            "val_unigram_entropy": self.task.data.unigram_entropy(self.cfg.model.vocab_size),
            "steps": self.step, "tokens_seen": self.tokens_seen,
            "epochs": self.task.epochs(self.step), "wall_seconds": result.wall_seconds,
            "tokens_per_second": result.tokens_per_second, "world_size": self.dist.world_size,
            "skipped_steps": self.skipped_steps,
            "params": sum(p.numel() for p in self.model.parameters()), "precision": self.precision.to_dict(),
            **self.task.summary(self.model, self.step, self.row_counts()),
            **provenance(self.cfg, self.data_fingerprint)}
        self.folder.write_summary(summary)
