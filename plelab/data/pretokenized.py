"""Pre-tokenized input: nanoGPT-style ``.bin`` (raw ids, declared dtype), ``.npy`` (1-D integer), folders of shards.

The shards are memory-mapped, never copied. Once per set of files (keyed by path, size and mtime,
like the text cache) they are scanned: a streamed sha256 over ``dtype`` and every file's bytes (the
corpus fingerprint) and each file's largest id, which must be below the vocabulary (the tokenizer's
with ``--tokenizer``, else ``model.vocab_size``). Validation: ``data.val_shard`` holds one shard out;
otherwise the concatenated stream is cut into contiguous blocks of ``block`` ids (``min(65 536,
max(1, tokens // 100))``, at least a run's ``seq_len + 1``) and a block is held out iff the sha256 of
its index, read as a fraction, is below ``data.val_fraction`` (at least one block each way). The blocks
of each split are read back to back, so a training sequence may span two blocks, as in any packed
stream it may span two documents.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from plelab.data.shards import TokenStream
from plelab.data.sources import Source, source_manifest
from plelab.data.tokens import TokenData
from plelab.errors import PlelabError
from plelab.io import cache_dir, write_json

VAL_BLOCK = 1 << 16
SCAN_VERSION = 1
DTYPE_FIX = "declare the dtype the shards were written with: --set data.token_dtype=uint16 (nanoGPT) or uint32"


def open_token_file(path: Path, declared: str | None) -> np.ndarray:
    """A 1-D memory map of ``path``; one-line errors for an empty, truncated or mistyped shard."""
    if path.suffix.lower() == ".npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            raise PlelabError(f"cannot read token shard {path}: {str(err).splitlines()[0]} (truncated or not a .npy "
                              "file?); re-create it") from None
        if not isinstance(arr, np.ndarray):
            raise PlelabError(f"token shard {path} is an .npz archive, not one .npy array; save each shard with "
                              "np.save")
        if arr.ndim != 1 or arr.dtype.kind not in "ui":
            raise PlelabError(f"token shard {path} holds a {arr.ndim}-D {arr.dtype} array; a shard is a 1-D array of "
                              "integer token ids")
        if declared and np.dtype(declared) != arr.dtype:
            raise PlelabError(f"token shard {path} holds {arr.dtype} ids but data.token_dtype={declared}; drop the "
                              "setting (a .npy file carries its own dtype) or re-create the shard")
    else:
        if declared is None:
            raise PlelabError(f"{path} is a raw .bin token shard whose id type is not recorded; {DTYPE_FIX}")
        size, item = path.stat().st_size, np.dtype(declared).itemsize
        if size % item:
            raise PlelabError(f"token shard {path} has {size:,} bytes, not a whole number of {declared} ids "
                              f"(truncated, or another dtype); {DTYPE_FIX}")
        arr = np.memmap(path, dtype=np.dtype(declared), mode="r") if size else np.zeros(0, dtype=declared)
    if len(arr) == 0:
        raise PlelabError(f"token shard {path} is empty; remove it or re-create it")
    return arr


def _scan(src: Source, arrays: list[np.ndarray], declared: str | None, rescan: bool = False) -> dict:
    """Fingerprint and largest id of every shard, cached by (paths, sizes, mtimes); ``rescan`` ignores the cache."""
    files = source_manifest(src)
    key = hashlib.sha256(json.dumps([SCAN_VERSION, str(src.path.resolve()), files, declared]).encode()).hexdigest()
    path = cache_dir("pretokenized") / f"{key[:20]}.json"
    if not rescan:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
    h = hashlib.sha256(str(arrays[0].dtype).encode())
    top = []
    for arr in arrays:
        m = -1
        for lo in range(0, len(arr), 1 << 24):
            chunk = np.asarray(arr[lo:lo + (1 << 24)])
            h.update(chunk.tobytes())
            m = max(m, int(chunk.max()))
            if chunk.min() < 0:
                raise PlelabError(f"token shard {src.files[len(top)]} holds negative ids; a token id is >= 0")
        top.append(m)
    record = {"fingerprint": h.hexdigest(), "max_id": top}
    write_json(path, record)
    return record


def _views(arrays: list[np.ndarray], starts: list[int], lo: int, hi: int) -> list[np.ndarray]:
    """Views of ``[lo, hi)`` of the concatenation of ``arrays`` (``starts``: each array's offset)."""
    out = []
    for arr, s in zip(arrays, starts):
        a, b = max(lo, s), min(hi, s + len(arr))
        if a < b:
            out.append(arr[a - s:b - s])
    return out


def block_split(arrays: list[np.ndarray], val_fraction: float,
                min_block: int = 1) -> tuple[list, list, int, int, int]:
    """``(train views, val views, n_train_blocks, n_val_blocks, block)`` over the concatenated stream; a block holds
    at least ``min_block`` ids (a run's ``seq_len + 1``, so that a validation window is not stitched from blocks)."""
    starts = np.cumsum([0] + [len(a) for a in arrays]).tolist()
    total = starts[-1]
    block = max(min_block, min(VAL_BLOCK, max(1, total // 100)))
    n = -(-total // block)
    u = np.array([int.from_bytes(hashlib.sha256(f"block:{i}".encode()).digest()[:8], "little") / 2**64
                  for i in range(n)])
    is_val = u < val_fraction
    if n < 2:
        raise PlelabError(f"the token shards hold {total} ids, too few to split into train and validation; "
                          "give more tokens")
    if not is_val.any():
        is_val[int(u.argmin())] = True
    if is_val.all():
        is_val[int(u.argmax())] = False
    parts: dict[bool, list] = {True: [], False: []}
    i = 0
    while i < n:  # runs of consecutive blocks of one split become one view each
        j = i
        while j + 1 < n and is_val[j + 1] == is_val[i]:
            j += 1
        parts[bool(is_val[i])] += _views(arrays, starts, i * block, min(total, (j + 1) * block))
        i = j + 1
    return parts[False], parts[True], int((~is_val).sum()), int(is_val.sum()), block


def pretokenized_data(src: Source, vocab_size: int, tok: Tokenizer | None, val_fraction: float,
                      declared: str | None = None, val_shard: str | None = None, rescan: bool = False,
                      min_block: int = 1) -> TokenData:
    """Token data over the shards of ``src`` (see the module docstring)."""
    arrays = [open_token_file(f, declared) for f in src.files]
    if len({a.dtype for a in arrays}) > 1:
        kinds = ", ".join(sorted({str(a.dtype) for a in arrays}))
        raise PlelabError(f"the token shards of {src.path} mix id types ({kinds}); give shards of one dtype")
    vocab, what = (tok.get_vocab_size(), f"the tokenizer's {tok.get_vocab_size():,} entries") if tok else \
        (vocab_size, f"model.vocab_size={vocab_size:,}")
    scan = _scan(src, arrays, declared, rescan)
    for f, m in zip(src.files, scan["max_id"]):
        if m >= vocab:
            fix = f", or {DTYPE_FIX}" if f.suffix == ".bin" else ""
            raise PlelabError(f"token shard {f} holds id {m:,}, beyond {what}; pass the tokenizer the shards were "
                              f"made with (--tokenizer) or raise --vocab-size to at least {m + 1:,}{fix}")
    tok_json = tok.to_str() if tok else None
    if val_shard is not None:
        names = [f.name for f in src.files]
        if val_shard not in names:
            raise PlelabError(f"data.val_shard={val_shard!r} is not one of the shards of {src.path} "
                              f"({', '.join(names[:5])}{'…' if len(names) > 5 else ''}); give one of their names")
        if len(names) < 2:
            raise PlelabError(f"data.val_shard={val_shard!r} is the only shard of {src.path}: nothing is left to "
                              "train on; add shards or drop data.val_shard (a fraction of blocks is held out)")
        k = names.index(val_shard)
        train = [a for i, a in enumerate(arrays) if i != k]
        return TokenData(TokenStream(train), TokenStream([arrays[k]]), scan["fingerprint"], src.name, len(train), 1,
                         0, tok_json, unit="shards", location=str(src.path))
    train, val, n_train, n_val, _ = block_split(arrays, val_fraction, min_block)
    return TokenData(TokenStream(train), TokenStream(val), scan["fingerprint"], src.name, n_train, n_val, 0,
                     tok_json, unit="blocks", location=str(src.path))


__all__ = ["block_split", "open_token_file", "pretokenized_data"]
