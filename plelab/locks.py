"""Who may write a run folder: the per-run lock, and a sweep worker's watch on the sweep that started it.

:class:`FolderLock` is an OS advisory lock (``fcntl.flock``) on a lock file inside the folder, held for as long as a
process writes there: a second process is refused in one line naming the folder and the holder's PID and host. The
kernel drops the lock when its holder dies, however it dies (``kill -9`` included), so a dead holder's lock file
never blocks; the PID and host written into it are only for the message. A holder removes the file when it lets go
(while still holding the lock; a process that locked the file as it was being removed sees that it no longer has
the folder's file and tries again), so a run folder holds it only while a run writes.

:class:`ParentWatch` lets a sweep's worker (``plelab train`` started by :mod:`plelab.sweeps.runner`, which puts its
own PID in :data:`PARENT_ENV`) notice that the sweep is gone (``kill -9``: nothing could stop the workers), so that
it stops at its next step instead of training on, orphaned, into a folder a rerun of the sweep may write.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from pathlib import Path

from plelab.errors import PlelabError

RUN_LOCK = ".plelab-run.lock"
PARENT_ENV = "PLELAB_SWEEP_PID"
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
# a filesystem without working flock (some network mounts): the folder is written unlocked, as before locks existed
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL, errno.EBADF)


class FolderBusy(PlelabError):
    """Another live process holds the folder's lock."""


def holder_of(path: str | os.PathLike) -> str:
    """Who holds the lock file ``path``, in words (``PID 123 on host``), from what the holder wrote into it."""
    try:
        info = json.loads(Path(path).read_text())
        pid, host = int(info["pid"]), info["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not said its PID yet"
    if pid == os.getpid() and host == socket.gethostname():
        return f"PID {pid} on {host}: this process, whose earlier trainer on it has not finished (fit) or let go (release)"
    return f"PID {pid} on {host}"


class FolderLock:
    """An exclusive lock on ``folder`` (the lock file ``folder/name``), taken with :meth:`acquire`; let go with
    :meth:`release` (or when the object is collected, or the process ends)."""

    def __init__(self, folder: Path, name: str, fh) -> None:
        self.folder, self.path, self._fh = folder, folder / name, fh

    @classmethod
    def acquire(cls, folder: str | os.PathLike, name: str = RUN_LOCK, what: str = "run folder",
                fix: str = "wait for it to finish or stop it, then try again") -> FolderLock | None:
        """Lock the existing folder ``folder`` without waiting. :class:`FolderBusy` (one line naming the folder and
        the holder's PID) when another process holds it; ``None`` where the filesystem has no working ``flock``;
        an ``OSError`` when the lock file cannot be created (a read-only folder). Nothing is written in the folder
        by a refused call: the lock file exists already whenever someone holds it."""
        folder = Path(folder)
        path = folder / name
        for _ in range(100):  # another try only when the file was removed between our open and our lock
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            fh = os.fdopen(fd, "r+")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                fh.close()
                if err.errno in _BUSY:
                    raise FolderBusy(f"{what} {folder} is in use by another plelab process ({holder_of(path)}); "
                                     f"{fix}") from None
                if err.errno in _UNSUPPORTED:
                    return None
                raise
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file as we opened it: ours is no longer the folder's lock file
                fh.close()
                continue
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
            fh.flush()
            return cls(folder, name, fh)
        raise PlelabError(f"cannot lock {what} {folder}: its lock file {path} keeps disappearing")

    @property
    def held(self) -> bool:
        return self._fh is not None

    def release(self) -> None:
        """Remove the lock file (still holding it) and let go. Idempotent."""
        if self._fh is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder now: the kernel still drops the lock below, the stale file blocks no one
        self._fh.close()
        self._fh = None


class ParentWatch:
    """Whether the process with PID ``pid`` (the sweep that started this one) is still there.

    Its direct child asks ``os.getppid()`` (an orphan is adopted by another process: the answer changes, whatever
    PID the sweep's is later reused by); a process further down (a torchrun rank) asks whether ``pid`` is alive."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.direct = os.getppid() == pid

    @classmethod
    def from_env(cls) -> ParentWatch | None:
        """The watch on the PID in :data:`PARENT_ENV` (set by a sweep for its workers), else None."""
        try:
            pid = int(os.environ.get(PARENT_ENV, ""))
        except ValueError:
            return None
        return cls(pid) if pid > 0 else None

    def gone(self) -> bool:
        if self.direct:
            return os.getppid() != self.pid
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, another user's
        return False


__all__ = ["PARENT_ENV", "RUN_LOCK", "FolderBusy", "FolderLock", "ParentWatch", "holder_of"]
