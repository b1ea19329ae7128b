"""Files: the cache folder and atomic writes (temp file in the same folder + rename), with the modes the umask implies.

``tempfile.mkstemp`` / ``mkdtemp`` create 0600 files and 0700 folders whatever the umask, so a file written through
them would be unreadable to a teammate on a shared machine; :func:`atomic_write` and :func:`temp_dir` give what an
ordinary ``open`` / ``mkdir`` would (0644 / 0755 under umask 022).

A rename is atomic against a crash of the process (``kill -9``), not against a power loss: the kernel may write the
new name to disk before the file's data, leaving an empty or short file under the final name. So every rename into
place here is preceded by an ``fsync`` of what is renamed (:func:`sync_tree` for a folder) and followed by one of
the folder holding the new name (:func:`sync_dir`); :func:`replace_synced` does both.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from plelab.errors import PlelabError


def cache_dir(*parts: str) -> Path:
    """``$PLELAB_CACHE`` (default ``~/.cache/plelab``) joined with ``parts``, created if missing."""
    root = Path(os.environ.get("PLELAB_CACHE") or Path.home() / ".cache" / "plelab")
    path = root.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlelabError(f"cannot create the cache folder {path}: {err.strerror or err}; "
                          "set PLELAB_CACHE to a writable folder") from None
    return path


def ensure_dir(path: str | os.PathLike, what: str = "output folder", fix: str = "choose another --out") -> Path:
    """Create the folder ``path`` (and its parents); a one-line :class:`PlelabError` if that is impossible
    (a file in the way, no permission, a read-only or full disk)."""
    path = check_folder_target(path, what, fix)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlelabError(f"cannot create {what} {path}: {os_reason(err)}; {fix}") from None
    return path


def check_folder_target(path: str | os.PathLike, what: str = "output folder",
                        fix: str = "choose another --out") -> Path:
    """Check, writing nothing, that ``path`` is or can become a writable folder: a one-line
    :class:`PlelabError` if it or one of its parents is a file, or the nearest existing folder is read-only."""
    path = Path(path)
    for folder in (path, *path.parents):
        if not folder.exists():
            continue
        if not folder.is_dir():
            if folder == path:
                raise PlelabError(f"{what} {path} is a file, not a folder; {fix}")
            raise PlelabError(f"{what} {path} cannot be created: {folder} is a file, not a folder; {fix}")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PlelabError(f"cannot write to {what} {path}: permission denied in {folder}; {fix}")
        break
    return path


def os_reason(err: OSError) -> str:
    """Why a file operation failed, in words (``Not a directory`` says a file sits where a folder is needed)."""
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        reason += " (a file is in the way where a folder is needed)"
    return reason


@contextlib.contextmanager
def naming(path: str | os.PathLike):
    """Inside the block, a failed write names ``path``: an ``OSError`` that names no file (what ``write()``,
    ``close()`` or ``fsync()`` raise on a full disk) gets ``path`` as its file name, and a Rust writer's failure
    carrying an OS error (tokenizers' ``Exception: File too large (os error 27)``) becomes that ``OSError`` on
    ``path`` — so the one line a command prints says which file (``cannot access PATH: No space left on device``)."""
    try:
        yield
    except OSError as err:
        if not err.filename:
            err.filename = str(path)
        raise
    except Exception as err:
        code = re.search(r"\(os error (\d+)\)", (str(err).splitlines() or [""])[0])
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from err


def write_failure(err: BaseException) -> str | None:
    """Why a write failed, in words, when ``err`` is a failed write (else None: a bug, to be raised as it is): an
    ``OSError``, a safetensors ``SafetensorError``, or another Rust writer's error carrying an OS error (tokenizers:
    ``No space left on device (os error 28)``)."""
    if isinstance(err, OSError):
        return os_reason(err)
    text = (str(err).splitlines() or [repr(err)])[0]
    return text if type(err).__name__ == "SafetensorError" or re.search(r"\(os error \d+\)", text) else None


def check_name(name: object, what: str) -> str:
    """``name`` if it is a plain name that stays inside its folder, else a one-line :class:`PlelabError`:
    no path separator, no ``..``, no leading dot, no control character, not empty."""
    if not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\\" in name \
            or any(ord(c) < 32 for c in name) or len(name) > 200:
        raise PlelabError(f"invalid {what} {name!r}: a name may not be empty, start with '.', or hold '/', '\\', "
                          "'..' or control characters (it names a folder inside the output folder)")
    return name


def umask() -> int:
    """The process's umask, read without changing it where the OS says it (Linux), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def temp_dir(parent: str | os.PathLike, prefix: str, suffix: str = "") -> Path:
    """A new uniquely named folder in ``parent`` (for a write renamed into place later), with the mode the umask
    implies rather than mkdtemp's 0700."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


def sync_file(path: str | os.PathLike) -> None:
    """``fsync`` the file ``path``: its data and size are on disk when this returns."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with naming(path):  # fsync's error names no file
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: str | os.PathLike) -> None:
    """``fsync`` the folder ``path``, so that the names created, renamed or removed in it are on disk. A no-op where
    the platform or the filesystem cannot sync a folder (Windows; some network filesystems say EINVAL)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # a folder cannot be opened for reading here (Windows): nothing to sync
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EOPNOTSUPP):
            err.filename = err.filename or str(path)
            raise
    finally:
        os.close(fd)


def sync_tree(root: str | os.PathLike) -> None:
    """``fsync`` every file under the folder ``root``, then every folder (deepest first, ``root`` last): before a
    folder is renamed into place, so that its new name never points at files still in the page cache only."""
    folders = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                sync_file(path)
        folders.append(folder)
    for folder in reversed(folders):
        sync_dir(folder)


def replace_synced(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``os.replace(src, dst)`` that survives a power loss: ``src`` (a file, or a folder and everything in it)
    synced first, the folder holding ``dst`` synced after."""
    if os.path.isdir(src) and not os.path.islink(src):
        sync_tree(src)
    else:
        sync_file(src)
    os.replace(src, dst)
    sync_dir(os.path.dirname(os.path.abspath(dst)))


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename onto ``path``: readers never see a half-written file, nor, after a
    power loss, an empty one (synced before and after the rename: :func:`replace_synced`). The file gets the mode
    the umask implies (as ``open`` would give it), not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with naming(path):  # a full disk's write or fsync names the file being written
            writer(Path(tmp))
            os.chmod(tmp, 0o666 & ~umask())
            replace_synced(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def save_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict | None = None) -> Path:
    """``safetensors.torch.save_file`` with the mode the umask implies (its writer creates 0600 files)."""
    from safetensors.torch import save_file  # loads torch: only where tensors are written

    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~umask())
    return Path(path)


def json_safe(obj: object) -> object:
    """``obj`` with every non-finite float replaced by ``None`` (JSON has no NaN / Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: str | os.PathLike, obj: object) -> Path:
    """Strict JSON (NaN / Infinity written as null), atomically."""
    text = json.dumps(json_safe(obj), indent=2, sort_keys=False, allow_nan=False) + "\n"
    return atomic_write(path, lambda p: p.write_text(text))
