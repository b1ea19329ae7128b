"""Token shards on disk: an append-only writer, a memory-mapped reader over many shards, a 64-bit hash set.

- :class:`ShardWriter` appends token ids to ``<split>-NNNNN.bin`` files of at most ``shard_tokens`` ids
  (raw little-endian ``uint16`` when the vocabulary fits, else ``uint32``), and the start offset of every
  document to ``<split>.docs.bin`` (``uint64``), so document boundaries are kept.
- :class:`TokenStream` is one logical 1-D stream over memory-mapped pieces: ``len``, slicing across shard
  boundaries, and chunked ``bincount``/``max`` that never load the stream whole.
- :class:`HashSet64` holds the 64-bit hashes of the documents seen (dedup) in sorted numpy arrays of
  doubling size: 8 bytes per distinct document, plus at most as much again while two levels are merged.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

from plelab.io import naming

SHARD_TOKENS = 1 << 28  # ids per shard file: 512 MiB as uint16
CHUNK = 1 << 24  # ids per chunk when a whole stream is scanned


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id < ``vocab_size`` fits, else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class TokenStream:
    """A 1-D stream of token ids made of pieces (memory maps or arrays), read without loading it whole."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = [p for p in parts if len(p)]
        self._starts = np.cumsum([0] + [len(p) for p in self.parts]).tolist()

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype if self.parts else np.dtype(np.uint32)

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise TypeError("a TokenStream is read by slices: stream[a:b]")
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise TypeError("a TokenStream is read by contiguous slices")
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        i = bisect.bisect_right(self._starts, start) - 1
        out = []
        while start < stop:
            lo = start - self._starts[i]
            hi = min(stop, self._starts[i + 1]) - self._starts[i]
            out.append(self.parts[i][lo:hi])
            start = self._starts[i] + hi
            i += 1
        return out[0] if len(out) == 1 else np.concatenate(out)

    def chunks(self, size: int = CHUNK):
        for part in self.parts:
            for lo in range(0, len(part), size):
                yield np.asarray(part[lo:lo + size])

    def bincount(self, minlength: int) -> np.ndarray:
        """How often each id occurs (int64), computed chunk by chunk."""
        counts = np.zeros(minlength, dtype=np.int64)
        for chunk in self.chunks():
            c = np.bincount(chunk, minlength=len(counts))
            if len(c) > len(counts):
                counts = np.concatenate([counts, np.zeros(len(c) - len(counts), dtype=np.int64)])
            counts += c
        return counts

    def max(self) -> int:
        return max((int(c.max()) for c in self.chunks() if len(c)), default=-1)

    def __array__(self, dtype=None, copy=None):
        whole = np.concatenate([np.asarray(p) for p in self.parts]) if self.parts else np.zeros(0, self.dtype)
        return whole if dtype is None else whole.astype(dtype)


def bincount(stream, minlength: int) -> np.ndarray:
    """Id counts of a :class:`TokenStream` or an array."""
    if isinstance(stream, TokenStream):
        return stream.bincount(minlength)
    return np.bincount(np.asarray(stream), minlength=minlength).astype(np.int64)


class ShardWriter:
    """Append token ids (and document starts) of one split to shard files in ``folder``."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS) -> None:
        self.folder, self.split, self.dtype, self.shard_tokens = Path(folder), split, np.dtype(dtype), shard_tokens
        self.shards: list[dict] = []
        self.tokens = 0
        self.documents = 0
        self._file = None
        self._in_shard = 0
        self._docs = open(self.folder / f"{split}.docs.bin", "wb")

    def _next_shard(self) -> None:
        self._close_shard()
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._file = open(self.folder / name, "wb")
        self.shards.append({"file": name, "tokens": 0})
        self._in_shard = 0

    def _close_shard(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            with naming(file.name):  # close() flushes: it fails too on a full disk
                file.close()

    def write_documents(self, ids: np.ndarray, starts: np.ndarray) -> None:
        """``ids``: the ids of whole documents back to back; ``starts``: each document's offset inside ``ids``."""
        with naming(self._docs.name):  # a full disk's write names the file
            self._docs.write((np.asarray(starts, dtype=np.uint64) + np.uint64(self.tokens)).tobytes())
        self.documents += len(starts)
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            if self._file is None or self._in_shard >= self.shard_tokens:
                self._next_shard()
            take = ids[:self.shard_tokens - self._in_shard]
            with naming(self._file.name):
                self._file.write(take.tobytes())
            self._in_shard += len(take)
            self.shards[-1]["tokens"] += len(take)
            self.tokens += len(take)
            ids = ids[len(take):]

    def close(self) -> dict:
        self._close_shard()
        with naming(self._docs.name):
            self._docs.close()
        return {"shards": self.shards, "tokens": self.tokens, "documents": self.documents}


def open_split(folder: Path, entry: dict, dtype: str) -> TokenStream:
    """The memory-mapped stream of a split written by :class:`ShardWriter` (``entry``: its ``close()`` record)."""
    return TokenStream([np.memmap(Path(folder) / s["file"], dtype=np.dtype(dtype), mode="r", shape=(s["tokens"],))
                        for s in entry["shards"] if s["tokens"]])


class HashSet64:
    """A set of uint64 document hashes in sorted numpy levels of doubling size (8 bytes per member).

    :meth:`add_new` takes a batch and returns which of its members were not seen before (the first of
    equal members within the batch counts as new), so deduplication is vectorised per batch.
    """

    def __init__(self) -> None:
        self.levels: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(level) for level in self.levels)

    def _contains(self, keys: np.ndarray) -> np.ndarray:
        found = np.zeros(len(keys), dtype=bool)
        for level in self.levels:
            pos = np.searchsorted(level, keys).clip(max=len(level) - 1)
            found |= level[pos] == keys
        return found

    def add_new(self, keys: np.ndarray) -> np.ndarray:
        """Boolean mask over ``keys``: True where the key is new (added to the set)."""
        keys = np.asarray(keys, dtype=np.uint64)
        _, first = np.unique(keys, return_index=True)
        new = np.zeros(len(keys), dtype=bool)
        new[first] = True
        new &= ~self._contains(keys)
        level = np.sort(keys[new])
        while self.levels and len(self.levels[-1]) <= len(level):
            level = np.concatenate([self.levels.pop(), level])
            level.sort(kind="stable")  # in place: merges the two sorted runs
        if len(level):
            self.levels.append(level)
        return new
