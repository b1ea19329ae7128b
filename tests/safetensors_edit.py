"""Editing a safetensors file's header in place, as a hostile or careless tool would: the tests' lying checkpoints."""

from __future__ import annotations

import json
from pathlib import Path


def relabel(file: Path, key: str, dtype: str = "I32") -> None:
    """Rewrite the header of ``file`` so that tensor ``key`` claims ``dtype`` (same size per element: the data and
    every offset stay valid, so the file still reads — as the wrong numbers)."""
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    assert key in header, sorted(header)
    header[key]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    file.write_bytes(raw[:8] + text + b" " * (n - len(text)) + raw[8 + n:])
