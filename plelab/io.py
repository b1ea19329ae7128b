"""Files: the cache folder and atomic writes (temp file in the same folder + rename)."""

from __future__ import annotations

import json
import math
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
