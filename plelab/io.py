"""Files: the cache folder and atomic writes (temp file in the same folder + rename)."""

from __future__ import annotations

import json
import os
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


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename onto ``path``: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_json(path: str | os.PathLike, obj: object) -> Path:
    return atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n"))
