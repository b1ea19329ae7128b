"""One training run end to end: its kind's data and task, the default observers, the trainer.

``plelab train``, the sweep runner, the demo and the visual study all start runs through here, and so can you:

    result = plelab.train(cfg, "runs/my-run")          # prepares the data, trains, writes the run folder

A run's kind (``cfg.kind``: ``text`` or ``visual``) is looked up in the task registry of
:mod:`plelab.training.task`; ``plelab.visual`` registers its kind when imported (``plelab.training`` and the CLI
import it for you). The default observer of a run with a per-layer table is
:class:`~plelab.diagnostics.live.LiveDiagnostics`; pass more with ``observers=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from plelab.config.budget import check_run_budget, check_tokenizer_vocab
from plelab.config.schema import RunConfig
from plelab.data.pipeline import data_sources
from plelab.diagnostics.live import LiveDiagnostics
from plelab.distributed import DistInfo, init_distributed, launch_rank, shutdown
from plelab.integrations import hosts  # noqa: F401  (registers the HF and factory trunks)
from plelab.locks import RUN_LOCK, FolderLock
from plelab.runtime import resolve_device
from plelab.training import text_task  # noqa: F401  (registers the text kind)
from plelab.training.metrics import MetricSinks
from plelab.training.task import Observer, Task, task_kind
from plelab.training.trainer import Trainer, TrainResult, check_new_run


def _trains_bpe(cfg: RunConfig) -> bool:
    """Whether preparing ``cfg``'s data trains a BPE (text data without ``data.tokenizer``, not a visual run)."""
    return (task_kind(cfg).trains_bpe and cfg.data.tokenizer is None
            and any(src.kind != "tokens" for src, _ in data_sources(cfg.data)))


def check_budget(cfg: RunConfig, model: bool = True) -> None:
    """Refuse in one line, before any data or model is made, a run of ``cfg`` that cannot fit: a vocabulary its
    BPE cannot reach, and (``model``) parameters and per-layer inputs beyond the memory that would hold them
    (:mod:`plelab.config.budget`)."""
    if model:
        check_run_budget(cfg)
    check_tokenizer_vocab(cfg, lambda: _trains_bpe(cfg))


def prepare_data(cfg: RunConfig, progress: bool = True, dist=None):
    """The data a run of ``cfg`` reads (token streams, or image–caption features and IDs), cached on disk; a run
    that cannot fit is refused first (:func:`check_budget`)."""
    check_budget(cfg)
    return task_kind(cfg).prepare_data(cfg, progress=progress, dist=dist)


def warm_caches(cfg: RunConfig) -> None:
    """Fill the on-disk caches a run needs once, so that parallel workers do not each build them (a run that
    cannot fit is refused first: :func:`check_budget`)."""
    check_budget(cfg)
    task_kind(cfg).warm_caches(cfg)


def describe_data(cfg: RunConfig, data) -> str:
    return task_kind(cfg).describe_data(cfg, data)


def make_task(cfg: RunConfig, data) -> Task:
    return task_kind(cfg).make_task(cfg, data)


def default_observers(task: Task) -> list[Observer]:
    """Live and at-checkpoint diagnostics when the run has a table (PLE's, or another kind's)."""
    return [LiveDiagnostics(task)] if task.cfg.ple.enabled or task.cfg.aux.extra else []


def check_start(cfg: RunConfig, out_dir: str | Path | None, resume: bool) -> None:
    """What refuses a run before its data step (which can take minutes): a new run into a folder that holds one, a
    folder another plelab process is writing, an optional metrics sink that is not installed. The trainer checks them
    again when it opens the folder (under its lock). Under torchrun only rank 0 asks the lock (the rank that will hold
    it): ranks probing at once saw each other's half-written lock file, and a late rank saw rank 0's own lock."""
    MetricSinks.check_available(cfg.train)
    if out_dir is None:
        return
    run = Path(out_dir)
    check_new_run(run, resume)
    # FolderBusy names the holder; a stale file of a dead one is taken and let go
    if launch_rank() == 0 and (run / RUN_LOCK).exists():
        try:
            lock = FolderLock.acquire(run)
        except OSError:
            return  # unwritable: the trainer says so when it opens the folder
        if lock is not None:
            lock.release()


def make_trainer(cfg: RunConfig, data, out_dir: str | Path | None = None, *, resume: bool = False,
                 progress: bool = True, log=print, observers: Sequence[Observer] = (),
                 dist: DistInfo | None = None) -> Trainer:
    """A :class:`~plelab.training.trainer.Trainer` for ``cfg`` on ``data`` with the default observers (then yours);
    ``dist``: the process group already joined (else the trainer joins it)."""
    task = make_task(cfg, data)
    return Trainer(task, out_dir, resume=resume, progress=progress, log=log,
                   observers=[*default_observers(task), *observers], dist=dist)


def train(cfg: RunConfig, out_dir: str | Path | None = None, *, data=None, resume: bool = False,
          progress: bool = True, log=print, observers: Sequence[Observer] = ()) -> TrainResult:
    """Train one run of ``cfg`` to ``cfg.train.steps`` (into ``out_dir``: config.json, metrics.jsonl, checkpoints,
    summary.json; ``resume`` continues it). ``data`` defaults to :func:`prepare_data`. Under torchrun every
    process calls it."""
    cfg.validate()
    check_budget(cfg)
    check_start(cfg, out_dir, resume)
    dist = init_distributed(resolve_device(cfg.train.device).type)
    say = log if dist.is_main else (lambda *a, **k: None)
    ok = False
    try:
        data = prepare_data(cfg, progress=progress, dist=dist) if data is None else data
        entropy = data.unigram_entropy(cfg.model.vocab_size)
        say(f"{cfg.preset} dP={cfg.ple.dim}: {describe_data(cfg, data)}; validation unigram entropy {entropy:.3f} nats")
        trainer = make_trainer(cfg, data, out_dir, resume=resume, progress=progress, log=say, observers=observers,
                               dist=dist)
        say(f"precision {trainer.precision.resolved} ({trainer.precision.reason})")
        result = trainer.fit()
        if result.val_history:
            where = f"; run in {out_dir}" if out_dir is not None else ""
            gap = entropy - result.final_val_loss
            say(f"final validation loss {result.final_val_loss:.4f} nats; unigram entropy {entropy:.3f} "
                f"({abs(gap):.3f} {'below' if gap >= 0 else 'above'} it){where}")
        ok = True
        return result
    finally:
        shutdown(dist, ok)


__all__ = ["check_budget", "check_start", "default_observers", "describe_data", "make_task", "make_trainer",
           "prepare_data", "train", "warm_caches"]
