"""One training run end to end: its kind's data and task, the default observers, the trainer.

``plelab train``, the sweep runner, the demo and the visual study all start runs through here, and so can you:

    result = plelab.train(cfg, "runs/my-run")          # prepares the data, trains, writes the run folder

A run's kind (``text``, or ``visual`` when ``visual.enabled``) is looked up in the task registry of
:mod:`plelab.training.task`; ``plelab.visual`` registers its kind when imported (``plelab.training`` and the CLI
import it for you). The default observer of a run with a per-layer table is
:class:`~plelab.diagnostics.live.LiveDiagnostics`; pass more with ``observers=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from plelab.config.schema import RunConfig
from plelab.diagnostics.live import LiveDiagnostics
from plelab.distributed import init_distributed, shutdown
from plelab.runtime import resolve_device
from plelab.training import text_task  # noqa: F401  (registers the text kind)
from plelab.training.task import Observer, Task, task_kind
from plelab.training.trainer import Trainer, TrainResult


def prepare_data(cfg: RunConfig, progress: bool = True, dist=None):
    """The data a run of ``cfg`` reads (token streams, or image–caption features and IDs), cached on disk."""
    return task_kind(cfg).prepare_data(cfg, progress=progress, dist=dist)


def warm_caches(cfg: RunConfig) -> None:
    """Fill the on-disk caches a run needs once, so that parallel workers do not each build them."""
    task_kind(cfg).warm_caches(cfg)


def describe_data(cfg: RunConfig, data) -> str:
    return task_kind(cfg).describe_data(cfg, data)


def make_task(cfg: RunConfig, data) -> Task:
    return task_kind(cfg).make_task(cfg, data)


def default_observers(task: Task) -> list[Observer]:
    """Live and at-checkpoint diagnostics when the run has a per-layer table."""
    return [LiveDiagnostics(task)] if task.cfg.ple.enabled else []


def make_trainer(cfg: RunConfig, data, out_dir: str | Path | None = None, *, resume: bool = False,
                 progress: bool = True, log=print, observers: Sequence[Observer] = ()) -> Trainer:
    """A :class:`~plelab.training.trainer.Trainer` for ``cfg`` on ``data`` with the default observers (then yours)."""
    task = make_task(cfg, data)
    return Trainer(task, out_dir, resume=resume, progress=progress, log=log,
                   observers=[*default_observers(task), *observers])


def train(cfg: RunConfig, out_dir: str | Path | None = None, *, data=None, resume: bool = False,
          progress: bool = True, log=print, observers: Sequence[Observer] = ()) -> TrainResult:
    """Train one run of ``cfg`` to ``cfg.train.steps`` (into ``out_dir``: config.json, metrics.jsonl, checkpoints,
    summary.json; ``resume`` continues it). ``data`` defaults to :func:`prepare_data`. Under torchrun every
    process calls it."""
    cfg.validate()
    dist = init_distributed(resolve_device(cfg.train.device).type)
    say = log if dist.is_main else (lambda *a, **k: None)
    ok = False
    try:
        data = prepare_data(cfg, progress=progress, dist=dist) if data is None else data
        entropy = data.unigram_entropy(cfg.model.vocab_size)
        say(f"{cfg.preset} dP={cfg.ple.dim}: {describe_data(cfg, data)}; validation unigram entropy {entropy:.3f} nats")
        trainer = make_trainer(cfg, data, out_dir, resume=resume, progress=progress, log=say, observers=observers)
        say(f"precision {trainer.precision.resolved} ({trainer.precision.reason})")
        result = trainer.fit()
        if result.val_history:
            where = f"; run in {out_dir}" if out_dir is not None else ""
            say(f"final validation loss {result.final_val_loss:.4f} nats; unigram entropy {entropy:.3f} "
                f"({entropy - result.final_val_loss:+.3f} below it){where}")
        ok = True
        return result
    finally:
        shutdown(dist, ok)


__all__ = ["default_observers", "describe_data", "make_task", "make_trainer", "prepare_data", "train", "warm_caches"]
