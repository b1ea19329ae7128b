"""Token streams: deduplicated document split, one-time tokenisation, batches, validation windows.

- Split: exact-duplicate documents are removed first; then each document goes to validation
  iff ``sha256(text)`` falls below ``val_fraction`` — drawn across the whole corpus, not a
  tail cut, so validation is in-distribution and stable when documents are added.
- Streams: documents are tokenised once, joined with EOS, written to token shards and
  memory-mapped (:mod:`plelab.data.streaming`, which streams this split for large corpora).
- Batches: packed sequences, reshuffled each epoch; step ``k``'s batch is a function of
  ``(seed, k)`` alone (:class:`PackedSampler`), so paired arms, resumed runs and torchrun
  ranks all see the same data. The epoch order is a permutation of the ``n = (tokens - 1) // T``
  sequence starts held as int64, for the three most recent epochs: 24 bytes per sequence
  (10 B training tokens at T = 2048: 4.9 M sequences, 117 MB).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from plelab.data.shards import TokenStream, bincount
from plelab.errors import PlelabError
from plelab.runtime import EpochOrder

CHUNK_CHARS = 2_000  # a corpus too small to split by documents is split by pieces of about this many characters


def _hash_split(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], int]:
    seen: set[str] = set()
    train, val = [], []
    for doc in documents:
        if doc in seen:
            continue
        seen.add(doc)
        u = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:8], "little") / 2**64
        (val if u < val_fraction else train).append(doc)
    return train, val, len(documents) - len(seen)


def split_documents(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], int]:
    """Return ``(train_docs, val_docs, n_duplicates_removed)``, deterministic in the text alone: a distinct
    document goes to validation when the first 8 bytes of its sha256, read as a fraction, are below
    ``val_fraction``."""
    train, val, dups = _hash_split(documents, val_fraction)
    if not train or not val:
        raise PlelabError(f"cannot split {len(train) + len(val)} distinct documents into train and validation at "
                          f"data.val_fraction={val_fraction}; supply more text or change the fraction")
    return train, val, dups


def pieces(document: str, size: int = CHUNK_CHARS) -> list[str]:
    """``document`` cut into consecutive pieces of at most ``size`` characters, each ending at a line break or a
    space in the second half of its window where there is one; the pieces concatenate to the document."""
    out, start = [], 0
    while start < len(document):
        end = min(len(document), start + size)
        if end < len(document):
            cut = max(document.rfind("\n", start + size // 2, end), document.rfind(" ", start + size // 2, end))
            end = cut + 1 if cut >= 0 else end
        out.append(document[start:end])
        start = end
    return out


def split_for_training(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], int, int]:
    """:func:`split_documents`, and only where it fails — a corpus of few, long documents — the same hash split over
    their :func:`pieces`. Returns ``(train, val, n_duplicates_removed, n_pieces)``; ``n_pieces`` is 0 when the
    documents split as they are (every corpus that splits by documents splits exactly as before)."""
    train, val, dups = _hash_split(documents, val_fraction)
    if train and val:
        return train, val, dups, 0
    distinct = [*train, *val]
    cut = [p for doc in distinct for p in pieces(doc)]
    train, val, _ = _hash_split(cut, val_fraction)
    if not train or not val:
        raise PlelabError(f"cannot split {len(distinct)} distinct documents into train and validation at "
                          f"data.val_fraction={val_fraction}, even cut into {len(cut)} pieces of ≤ {CHUNK_CHARS:,} "
                          "characters; supply more text or raise data.val_fraction")
    return train, val, dups, len(cut)


@dataclass
class TokenData:
    """Train and validation token streams: memory-mapped shards (:class:`~plelab.data.shards.TokenStream`) or arrays.

    ``mixture`` (several sources): ``[(name, train stream, weight), ...]``; training samples them by weight
    (:class:`~plelab.data.mixture.MixtureSampler`) and ``train`` is their concatenation."""

    train: np.ndarray | TokenStream
    val: np.ndarray | TokenStream
    corpus_fingerprint: str
    corpus_name: str
    n_train_docs: int
    n_val_docs: int
    n_duplicates: int
    tokenizer_json: str | None = None  # the tokenizer the streams were made with (HF tokenizers JSON)
    n_pieces: int = 0  # > 0: too few documents to split, split as this many pieces (n_*_docs count pieces)
    unit: str = "documents"  # what n_train_docs / n_val_docs count: documents | pieces | blocks | shards
    mixture: list | None = None
    val_mixture: list | None = None  # [(name, validation stream, weight), ...] for a mixture
    location: str | list | None = None  # where the shards are (the ingest cache folder, or the user's token files)

    def train_counts(self, size: int) -> np.ndarray:
        """How often each id occurs in the training stream; ids >= ``size`` are counted at 0 (as the
        per-layer table maps them). A mixture's counts are weighted as training samples its sources."""
        if self.mixture:
            total = sum(len(s) for _, s, _ in self.mixture)
            counts = sum(bincount(s, size) * (w * total / max(len(s), 1)) for _, s, w in self.mixture)
            counts = np.rint(counts).astype(np.int64)
        else:
            counts = bincount(self.train, size)
        counts[0] += counts[size:].sum()
        return counts[:size]

    def unigram_entropy(self, vocab_size: int) -> float:
        """Entropy (nats) of the validation split's unigram distribution: a model that ignores
        context cannot beat it on that split."""
        counts = bincount(self.val, vocab_size).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())


class PackedSampler:
    """Packed fixed-length training sequences, reshuffled every epoch, addressed by step.

    The stream is cut into ``n = (len - 1) // T`` sequences of ``T + 1`` tokens starting at
    multiples of ``T`` (consecutive sequences share one boundary token, so no target is lost).
    Epoch ``e`` visits them in the order ``randperm(n)`` seeded by ``(seed, e)``; optimizer step
    ``k`` takes positions ``[k·G, (k+1)·G)`` of that endless sequence, ``G`` the global batch.
    The sampler's whole state is therefore the step number: a resumed run, every rank of a
    torchrun job and every dP arm of a paired study see exactly the same data.
    """

    def __init__(self, stream, seq_len: int, seed: int, tag: str = "epoch") -> None:
        self.stream, self.seq_len, self.seed = stream, seq_len, seed
        self.num_sequences = (len(stream) - 1) // seq_len
        if self.num_sequences < 1:
            raise PlelabError(f"the training split has {len(stream)} tokens, fewer than train.seq_len+1={seq_len + 1}; "
                              "supply more text or lower train.seq_len")
        self._order = EpochOrder(self.num_sequences, seed, lambda e: f"{tag}:{e}", keep=3)

    def _perm(self, epoch: int) -> np.ndarray:
        return self._order(epoch).numpy()

    def indices(self, step: int, global_batch: int) -> np.ndarray:
        """Sequence indices of the global batch of optimizer step ``step``."""
        pos = np.arange(step * global_batch, (step + 1) * global_batch)
        return np.array([self._perm(int(q))[int(r)] for q, r in zip(*np.divmod(pos, self.num_sequences))])

    def sequence(self, position: int) -> np.ndarray:
        """The sequence at ``position`` of the endless epoch order (step ``k``'s batch is positions
        ``[k·G, (k+1)·G)``), ``[T+1]`` int64."""
        q, r = divmod(position, self.num_sequences)
        i, T = int(self._perm(q)[r]), self.seq_len
        return np.asarray(self.stream[i * T:i * T + T + 1], dtype=np.int64)

    def batch(self, step: int, global_batch: int, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` ``[b, T]`` int64 for ``rows`` of step ``step``'s global batch."""
        T = self.seq_len
        seqs = [np.asarray(self.stream[i * T:i * T + T + 1], dtype=np.int64)
                for i in self.indices(step, global_batch)[rows]]
        t = torch.from_numpy(np.stack(seqs))
        return t[:, :-1], t[:, 1:]

    def epochs(self, steps_done: int, global_batch: int) -> float:
        return steps_done * global_batch / self.num_sequences


def _window_index(stream: np.ndarray, seq_len: int, max_windows: int) -> tuple[int, np.ndarray]:
    total = (len(stream) - 1) // seq_len
    if total < 1:
        raise PlelabError(f"the validation split has {len(stream)} tokens, fewer than train.seq_len+1={seq_len + 1}; "
                          "raise data.val_fraction or lower train.seq_len")
    return total, np.unique(np.linspace(0, total - 1, num=min(max_windows, total)).round().astype(np.int64))


def _rows(stream: np.ndarray, seq_len: int, idx: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.stack([np.asarray(stream[i * seq_len:i * seq_len + seq_len + 1], dtype=np.int64)
                                      for i in idx]))


def val_windows(stream: np.ndarray, seq_len: int, max_windows: int) -> torch.Tensor:
    """Up to ``max_windows`` non-overlapping windows of ``seq_len + 1``, spread evenly over the
    validation stream. Shape ``[N, T+1]``; the same for every run on the same data."""
    _, idx = _window_index(stream, seq_len, max_windows)
    return _rows(stream, seq_len, idx)


def disjoint_val_windows(stream: np.ndarray, seq_len: int, max_windows: int, avoid: int) -> torch.Tensor:
    """Up to ``max_windows`` windows ``[N, T+1]`` of the validation stream spread evenly over the slots that
    :func:`val_windows` ``(stream, seq_len, avoid)`` leaves out, sharing no token position with those windows
    (a window and its neighbour slot overlap by one token, so the neighbours of its windows are skipped too)."""
    total, taken = _window_index(stream, seq_len, avoid)
    near = np.zeros(total, dtype=bool)
    for k in (-1, 0, 1):
        near[np.clip(taken + k, 0, total - 1)] = True
    free = np.flatnonzero(~near)
    if len(free) == 0:
        raise PlelabError(f"the validation split ({len(stream):,} tokens) has no window outside the {len(taken)} the "
                          "evaluation reads; raise data.val_fraction or lower train.seq_len")
    pick = np.unique(np.linspace(0, len(free) - 1, num=min(max_windows, len(free))).round().astype(np.int64))
    return _rows(stream, seq_len, free[pick])


def data_val_windows(data: TokenData, seq_len: int, max_windows: int) -> torch.Tensor:
    """:func:`val_windows` of the data's validation split. For a mixture, source ``s`` gives ``round(n·w_s)`` windows
    (at least one), with ``n ≤ max_windows`` the largest count every source's validation split can supply at its
    weight, so that the mean loss over the windows weighs the sources as training does; the sources' windows are
    interleaved, so that any prefix (the diagnostics' first windows) mixes them too."""
    if not data.val_mixture:
        return val_windows(data.val, seq_len, max_windows)
    n = max_windows
    for name, stream, w in data.val_mixture:
        available = (len(stream) - 1) // seq_len
        if available < 1:
            raise PlelabError(f"mixture source {name}: the validation split has {len(stream)} tokens, fewer than "
                              f"train.seq_len+1={seq_len + 1}; raise data.val_fraction or lower train.seq_len")
        n = min(n, int(available / w))
    parts = [val_windows(stream, seq_len, max(1, round(n * w))) for _, stream, w in data.val_mixture]
    order = sorted(((i + 0.5) / len(p), k, i) for k, p in enumerate(parts) for i in range(len(p)))
    return torch.stack([parts[k][i] for _, k, i in order])


__all__ = ["PackedSampler", "TokenData", "data_val_windows", "disjoint_val_windows", "pieces", "split_documents", "split_for_training",
           "val_windows"]
