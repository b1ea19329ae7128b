"""The run folder as a trainer holds it: its lock, the sweep it answers to, the files written at the start and the
summary at the end.

A run folder is written by one process at a time: rank 0 holds its lock (:class:`plelab.locks.FolderLock`) from the
trainer's start (or, for a new folder, from its creation) to the end of the trainer's ``fit``; a second trainer on the
folder is refused in one line before it reads or writes anything there. A sweep's worker (started with the sweep's PID
in :data:`plelab.locks.PARENT_ENV`) watches that PID and stops once the sweep is gone.

Every method here that takes a ``dist`` is collective: every rank calls it and every rank raises if rank 0 fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from plelab.distributed import DistInfo, all_ranks_ok
from plelab.errors import PlelabError
from plelab.io import atomic_write, write_json
from plelab.locks import FolderBusy, FolderLock, ParentWatch


@dataclass
class TrainResult:
    """What :meth:`plelab.Trainer.fit` returns: the train losses of this call, the validation history (step, nats)
    of the whole run, and its throughput."""

    train_losses: list[float] = field(default_factory=list)
    val_history: list[tuple[int, float]] = field(default_factory=list)
    tokens_seen: int = 0
    wall_seconds: float = 0.0
    tokens_per_second: float = 0.0

    @property
    def final_val_loss(self) -> float:
        return self.val_history[-1][1]


def check_new_run(run: Path, resume: bool) -> None:
    """Refuse to start a new run (``resume`` False) in a folder that already holds one."""
    held = [n for n in ("config.json", "metrics.jsonl", "checkpoints") if (run / n).exists()]
    if held and not resume:
        raise PlelabError(f"{run} already holds a run ({held[0]}); pass --resume to continue it, or choose another "
                          "--out")


class RunFolder:
    """``path`` held by this process group (rank 0 holds the lock; the other ranks agree on every outcome)."""

    def __init__(self, path: str | Path, dist: DistInfo) -> None:
        self.path, self.dist = Path(path), dist
        self.lock: FolderLock | None = None
        # only a sweep's worker watches its parent (the sweep puts its PID in the environment)
        self.parent_watch = ParentWatch.from_env()

    def hold(self, at_start: bool = False) -> None:
        """Take the lock. At the start a folder not made yet (or one where a lock file cannot be created) is left to
        :meth:`write_start`, which locks it once made: a refused new run leaves no folder behind."""
        ok, why = True, ""
        if self.dist.is_main and self.lock is None and (not at_start or self.path.is_dir()):
            try:
                self.lock = FolderLock.acquire(self.path)
            except FolderBusy as err:
                ok, why = False, str(err)
            except OSError as err:
                if not at_start:
                    ok, why = False, f"cannot write to output folder {self.path}: {err.strerror or err}"
        if not all_ranks_ok(ok, self.dist):
            raise PlelabError(why if self.dist.is_main else f"rank 0 could not lock the run folder {self.path}")

    def release(self) -> None:
        """Let go of the lock. Idempotent."""
        lock, self.lock = self.lock, None
        if lock is not None:
            lock.release()

    def parent_gone(self) -> bool:
        """Whether the sweep that started this worker is gone (every rank agrees; False outside a sweep's worker)."""
        if self.parent_watch is None:
            return False
        return not all_ranks_ok(not self.parent_watch.gone(), self.dist)

    def write_start(self, resume: bool, config: dict, files: dict[str, str]) -> None:
        """Rank 0 makes the folder (locking a new one before writing) and writes ``config.json`` and ``files``
        (name -> text), each atomically."""
        ok, why = True, ""
        if self.dist.is_main:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                if self.lock is None:  # a folder made just now (or unlockable at the start): locked before writing
                    self.lock = FolderLock.acquire(self.path)
                    try:  # another new run took the folder meanwhile
                        check_new_run(self.path, resume)
                    except PlelabError as err:
                        raise FolderBusy(str(err)) from None
                write_json(self.path / "config.json", config)
                for name, text in files.items():
                    atomic_write(self.path / name, lambda p, text=text: p.write_text(text))
            except FolderBusy as err:
                ok, why = False, str(err)
            except OSError as err:
                ok, why = False, f"cannot write to output folder {self.path}: {err.strerror or err}"
        if not all_ranks_ok(ok, self.dist):
            raise PlelabError(why if self.dist.is_main else f"rank 0 could not write to {self.path}")

    def write_summary(self, summary: dict) -> None:
        """``summary.json`` (rank 0; the caller checks). A full disk is one line: the final checkpoint is saved."""
        try:
            write_json(self.path / "summary.json", summary)
        except OSError as err:
            raise PlelabError(f"cannot write {self.path / 'summary.json'}: {err.strerror or err}; the final "
                              "checkpoint is saved — free space and rerun with --resume to write the summary") from None
